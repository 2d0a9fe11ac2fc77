//! Canned answers for the side calls a harness needs answered to proceed:
//! token counts (the backend's count, or an estimate, marked with where it
//! comes from; [`count_request`] reads what to count), model lists in each
//! API's shape, and the refusal of Codex's WebSocket upgrade.

use bytes::Bytes;
use serde_json::{Value, json};

use super::{Framing, ModelCall, ProviderError};
use crate::{Api, ChatRequest};

/// Header saying where a token count comes from: [`CountSource::Backend`]
/// (`backend`: the inference backend's tokenizer and chat template) or
/// [`CountSource::Estimate`] (`estimate-bytes/4`: the backend could not
/// answer).
pub const TOKEN_COUNT_HEADER: &str = "x-polar-token-count";

/// Where a token count comes from (the value of [`TOKEN_COUNT_HEADER`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountSource {
    /// The backend's tokenizer with its served chat template.
    Backend,
    /// [`estimate_tokens`], when the backend cannot count.
    Estimate,
}

impl CountSource {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Backend => "backend",
            Self::Estimate => "estimate-bytes/4",
        }
    }
}

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
/// its compact JSON, at least 1. Only the fallback for a backend that
/// cannot count (no tokenize endpoint, unreachable).
pub fn estimate_tokens(body: &Value) -> u64 {
    let bytes = body.to_string().len() as u64;
    bytes.div_ceil(4).max(1)
}

/// The answer to a token-count call (Anthropic `count_tokens`, Gemini
/// `countTokens`) of `n` tokens, marked with [`TOKEN_COUNT_HEADER`].
pub fn count_tokens(api: Api, n: u64, source: CountSource) -> CannedResponse {
    let value = match api {
        Api::Gemini => json!({ "totalTokens": n }),
        _ => json!({ "input_tokens": n }),
    };
    CannedResponse::json(
        200,
        &value,
        vec![(TOKEN_COUNT_HEADER, source.as_str().to_owned())],
    )
}

/// The conversation a token-count call counts, as the normalized request
/// its model call would be: Anthropic's body is a Messages request without
/// `max_tokens`; Gemini's is `{contents, ...}` or
/// `{generateContentRequest: {model, contents, ...}}`, the model named in
/// `path` (`.../models/{model}:countTokens`) or in the request.
pub fn count_request(api: Api, path: &str, body: &Value) -> Result<ChatRequest, ProviderError> {
    let (body, path_model) = match api {
        Api::Gemini => {
            let inner = body.get("generateContentRequest").unwrap_or(body);
            let path = path.split('?').next().unwrap_or(path);
            let model = path
                .rsplit_once(':')
                .and_then(|(before, _)| before.rsplit_once("/models/"))
                .map(|(_, m)| m.to_owned());
            (inner, model)
        }
        _ => (body, None),
    };
    let call = ModelCall {
        api,
        framing: Framing::Json,
        path_model,
    };
    Ok(super::parse_request_value(&call, body)?.request)
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
    fn count_tokens_says_where_the_count_comes_from() {
        let req = json!({"model": "m", "messages": [{"role": "user", "content": "hello there"}]});
        let n = estimate_tokens(&req);
        assert!(n >= 1);
        let r = count_tokens(Api::AnthropicMessages, n, CountSource::Estimate);
        assert_eq!(r.status, 200);
        assert_eq!(body(&r)["input_tokens"], n);
        assert!(
            r.headers
                .contains(&(TOKEN_COUNT_HEADER, "estimate-bytes/4".to_owned()))
        );
        let g = count_tokens(Api::Gemini, 42, CountSource::Backend);
        assert_eq!(body(&g)["totalTokens"], 42);
        assert!(
            g.headers
                .contains(&(TOKEN_COUNT_HEADER, "backend".to_owned()))
        );
    }

    #[test]
    fn count_requests_are_read_as_model_calls() {
        let a = count_request(
            Api::AnthropicMessages,
            "/v1/messages/count_tokens?beta=true",
            &json!({"model": "claude-x", "system": "rules",
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"name": "bash", "input_schema": {"type": "object"}}]}),
        )
        .unwrap();
        assert_eq!(a.model, "claude-x");
        assert_eq!(a.messages.len(), 2);
        assert_eq!(a.tools[0].name, "bash");
        let contents = json!([{"role": "user", "parts": [{"text": "hi"}]}]);
        let g = count_request(
            Api::Gemini,
            "/v1beta/models/gemini-2.5-pro:countTokens",
            &json!({"contents": contents}),
        )
        .unwrap();
        assert_eq!(g.model, "gemini-2.5-pro");
        assert_eq!(g.messages.len(), 1);
        let wrapped = count_request(
            Api::Gemini,
            "/v1beta/models/gemini-2.5-pro:countTokens",
            &json!({"generateContentRequest": {"model": "models/gemini-2.5-flash", "contents": contents}}),
        )
        .unwrap();
        assert_eq!(wrapped.messages, g.messages);
        assert!(count_request(Api::Gemini, "/v1beta/models/m:countTokens", &json!({})).is_err());
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
