//! Canned answers for the side calls a harness needs answered to proceed:
//! token counts (an estimate, marked as such), model lists in each API's
//! shape, and the refusal of Codex's WebSocket upgrade.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::Api;

/// Header marking a token count as an estimate (value: the method).
pub const ESTIMATE_HEADER: &str = "x-polar-token-count";

/// A complete HTTP answer: status, headers, body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CannedResponse {
    /// HTTP status.
    pub status: u16,
    /// Headers besides `Content-Length`.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Bytes,
}

impl CannedResponse {
    fn json(status: u16, body: &Value, extra: Vec<(&'static str, String)>) -> Self {
        let mut headers = vec![("content-type", "application/json".to_owned())];
        headers.extend(extra);
        Self {
            status,
            headers,
            body: Bytes::from(body.to_string()),
        }
    }
}

/// An estimate of the tokens in a request body: one token per four bytes of
/// its compact JSON, at least 1. Only an estimate: the proxy has no tokenizer
/// for the harness's model, and the backend's count would cost a call.
pub fn estimate_tokens(body: &Value) -> u64 {
    let bytes = body.to_string().len() as u64;
    bytes.div_ceil(4).max(1)
}

/// The answer to a token-count call (Anthropic `count_tokens`, Gemini
/// `countTokens`), marked with [`ESTIMATE_HEADER`]`: estimate-bytes/4`.
pub fn count_tokens(api: Api, body: &Value) -> CannedResponse {
    let n = estimate_tokens(body);
    let value = match api {
        Api::Gemini => json!({ "totalTokens": n }),
        _ => json!({ "input_tokens": n }),
    };
    CannedResponse::json(
        200,
        &value,
        vec![(ESTIMATE_HEADER, "estimate-bytes/4".to_owned())],
    )
}

/// The answer to a model listing, in `api`'s shape (OpenAI Chat and
/// Responses share one).
pub fn list_models(api: Api, names: &[String]) -> CannedResponse {
    let value = match api {
        Api::AnthropicMessages => json!({
            "data": names.iter().map(|n| json!({
                "type": "model",
                "id": n,
                "display_name": n,
                "created_at": "1970-01-01T00:00:00Z",
            })).collect::<Vec<_>>(),
            "has_more": false,
            "first_id": names.first(),
            "last_id": names.last(),
        }),
        Api::Gemini => json!({
            "models": names.iter().map(|n| json!({
                "name": format!("models/{n}"),
                "baseModelId": n,
                "version": "polar",
                "displayName": n,
                "description": "served through Polar",
                "inputTokenLimit": 1_048_576,
                "outputTokenLimit": 65_536,
                "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
            })).collect::<Vec<_>>(),
        }),
        Api::OpenaiChat | Api::OpenaiResponses => json!({
            "object": "list",
            "data": names.iter().map(|n| json!({
                "id": n,
                "object": "model",
                "created": 0,
                "owned_by": "polar",
            })).collect::<Vec<_>>(),
            // Codex's model catalogue endpoint reads `models`; an empty list
            // lets it fall back to its built-in catalogue.
            "models": [],
        }),
    };
    CannedResponse::json(200, &value, Vec::new())
}

/// The answer to Codex's `GET /v1/responses` WebSocket upgrade: 426 Upgrade
/// Required with an OpenAI error body, no upgrade. Codex then falls back to
/// `POST /v1/responses` with SSE.
pub fn websocket_refusal() -> CannedResponse {
    let value = json!({
        "error": {
            "message": "WebSocket transport is not available here; use HTTP streaming",
            "type": "invalid_request_error",
            "param": null,
            "code": "websocket_not_supported",
        }
    });
    CannedResponse::json(426, &value, vec![("connection", "close".to_owned())])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(r: &CannedResponse) -> Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    #[test]
    fn count_tokens_is_marked_estimate() {
        let req = json!({"model": "m", "messages": [{"role": "user", "content": "hello there"}]});
        let r = count_tokens(Api::AnthropicMessages, &req);
        assert_eq!(r.status, 200);
        assert!(body(&r)["input_tokens"].as_u64().unwrap() >= 1);
        assert!(r.headers.iter().any(|(k, _)| *k == ESTIMATE_HEADER));
        let g = count_tokens(Api::Gemini, &req);
        assert_eq!(body(&g)["totalTokens"], body(&r)["input_tokens"]);
    }

    #[test]
    fn model_lists_in_each_shape() {
        let names = vec!["a".to_owned(), "b".to_owned()];
        let o = body(&list_models(Api::OpenaiChat, &names));
        assert_eq!(o["object"], "list");
        assert_eq!(o["data"][1]["id"], "b");
        let a = body(&list_models(Api::AnthropicMessages, &names));
        assert_eq!(a["data"][0]["type"], "model");
        assert_eq!(a["last_id"], "b");
        let g = body(&list_models(Api::Gemini, &names));
        assert_eq!(g["models"][0]["name"], "models/a");
    }

    #[test]
    fn websocket_refusal_is_426() {
        let r = websocket_refusal();
        assert_eq!(r.status, 426);
        assert_eq!(body(&r)["error"]["code"], "websocket_not_supported");
    }
}
