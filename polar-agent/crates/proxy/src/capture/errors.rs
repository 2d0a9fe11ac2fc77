//! Failures of the capture stage as the harness sees them: inference
//! errors classified into the provider layer's kinds (short messages, no
//! backend bodies), and error responses in the harness's API shape.

use bytes::Bytes;
use http::{Response, StatusCode};

use polar_chat::Api;
use polar_chat::provider::{self, ErrorKind, ProviderError, Side};
use polar_inference::InferenceError;

use super::super::body::ProxyBody;
use super::super::error::json_response;

/// Counts a failure at the backend's side in the capture counters, by
/// kind (`backend_timeout`, `backend_unavailable`, `overloaded`, ...).
pub fn count_backend(stats: &polar_capture::CaptureStats, err: &ProviderError) {
    if err.side == Side::Backend {
        stats.backend_error(&err.kind.to_string().replace(' ', "_"));
    }
}

/// How an inference failure is reported to the harness: unreachable 502,
/// timeout 504, overloaded (HTTP 429/503 from the backend) and an `abort`
/// finish (the backend stopped generating: paused for a weight update,
/// aborted) as the API's own overload (503; 529 for Anthropic, see
/// [`ErrorKind::status`]), a request the backend refused (400/413/422,
/// a prompt over the context, told in each API's words) 400, anything
/// else 502. Every backend
/// failure but a refused request is answered with a status all six
/// harness CLIs retry.
pub fn provider_error(e: &InferenceError) -> ProviderError {
    let backend = |kind, message: String| ProviderError::new(Side::Backend, kind, message);
    if let Some(o) = e.context_overflow() {
        let asked = o
            .completion
            .map(|c| format!(" + {c} to generate"))
            .unwrap_or_default();
        return backend(
            ErrorKind::ContextOverflow {
                prompt: o.prompt,
                completion: o.completion,
                max: o.max,
            },
            format!(
                "the request does not fit the model's context: {} prompt tokens{asked}, {} at most",
                o.prompt, o.max
            ),
        );
    }
    match e {
        InferenceError::Config { backend: b, .. } => ProviderError::new(
            Side::Agent,
            ErrorKind::Internal,
            format!("backend {b} is misconfigured"),
        ),
        InferenceError::Unreachable { backend: b, .. } => backend(
            ErrorKind::BackendUnavailable,
            format!("inference backend {b} is unreachable"),
        ),
        InferenceError::Status {
            backend: b,
            status,
            body,
            ..
        } => {
            let kind = match status {
                429 | 503 => ErrorKind::Overloaded,
                400 | 413 | 422 => ErrorKind::InvalidRequest,
                _ => ErrorKind::BackendError,
            };
            let detail = if kind == ErrorKind::InvalidRequest {
                // The backend's reason (e.g. the context length) helps the
                // harness decide to compact; keep it short.
                format!(": {}", short(body))
            } else {
                String::new()
            };
            backend(
                kind,
                format!("inference backend {b} answered HTTP {status}{detail}"),
            )
        }
        InferenceError::Timeout {
            backend: b,
            timeout,
            ..
        } => backend(
            ErrorKind::BackendTimeout,
            format!("inference backend {b} did not answer within {timeout:?}"),
        ),
        InferenceError::Disconnected { backend: b, .. }
        | InferenceError::StreamCut { backend: b, .. } => backend(
            ErrorKind::BackendError,
            format!("inference backend {b} dropped the connection mid-reply"),
        ),
        InferenceError::Aborted { backend: b, .. } => backend(
            ErrorKind::Overloaded,
            format!("inference backend {b} stopped generating before the end of the turn"),
        ),
        InferenceError::Unsupported {
            backend: b,
            feature,
        } => ProviderError::new(
            Side::Harness,
            ErrorKind::Unsupported,
            format!("the inference backend {b} cannot honour {feature}"),
        ),
        InferenceError::Malformed { backend: b, .. } => backend(
            ErrorKind::BackendError,
            format!("inference backend {b} sent a malformed reply"),
        ),
        InferenceError::Unrenderable { reason, .. } => ProviderError::new(
            Side::Harness,
            ErrorKind::InvalidRequest,
            format!("the model's chat template cannot render this request: {reason}"),
        ),
        InferenceError::Tokenizer { backend: b, .. } => ProviderError::new(
            Side::Agent,
            ErrorKind::Internal,
            format!("the tokenizer of backend {b}'s model failed"),
        ),
        // Told above, as a context overflow.
        InferenceError::PromptTooLong { backend: b, .. } => backend(
            ErrorKind::InvalidRequest,
            format!("the prompt does not fit backend {b}'s model"),
        ),
    }
}

/// The message of an error body: its `message`/`error.message` field when
/// it is JSON, else its start.
fn short(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.get("message")
            .or_else(|| v.get("error").and_then(|e| e.get("message")))
            .and_then(serde_json::Value::as_str)
    });
    let text = message.unwrap_or(body);
    text.chars().take(300).collect()
}

/// The error response for `err` in `api`'s shape.
pub(super) fn respond(api: Api, err: &ProviderError) -> Response<ProxyBody> {
    let (status, body) = provider::error_response(api, err);
    json_response(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Bytes::from(body.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn statuses_fit_the_failure() {
        let status = |e: InferenceError, api| provider_error(&e).kind.status(api);
        let s = |code: u16, body: &str| InferenceError::Status {
            backend: "b".into(),
            replica: "r".into(),
            status: code,
            body: body.into(),
        };
        assert_eq!(
            status(
                InferenceError::Unreachable {
                    backend: "b".into(),
                    attempts: 1,
                    last: "x".into()
                },
                Api::OpenaiChat
            ),
            502
        );
        assert_eq!(status(s(500, "boom"), Api::OpenaiChat), 502);
        // A backend's 503 (and 429) is the API's overload: 503 where its
        // servers use it (Codex CLI retries it, not a 429), 529 for
        // Anthropic (Claude Code retries it).
        for (code, api, want) in [
            (503, Api::AnthropicMessages, 529),
            (503, Api::OpenaiResponses, 503),
            (503, Api::OpenaiChat, 503),
            (503, Api::Gemini, 503),
            (429, Api::OpenaiResponses, 503),
            (429, Api::Gemini, 503),
            (500, Api::OpenaiResponses, 502),
            (502, Api::AnthropicMessages, 502),
        ] {
            assert_eq!(status(s(code, ""), api), want, "{code} on {api:?}");
        }
        let aborted = || InferenceError::Aborted {
            backend: "b".into(),
            replica: "r".into(),
            events: 3,
        };
        assert_eq!(status(aborted(), Api::OpenaiResponses), 503);
        assert_eq!(status(aborted(), Api::AnthropicMessages), 529);
        assert_eq!(provider_error(&aborted()).side, Side::Backend);
        let e = provider_error(&s(400, r#"{"object":"error","message":"too long"}"#));
        assert_eq!(e.kind.status(Api::OpenaiChat), 400);
        assert!(e.message.ends_with("HTTP 400: too long"), "{}", e.message);
        assert_eq!(
            status(
                InferenceError::Timeout {
                    backend: "b".into(),
                    replica: "r".into(),
                    timeout: Duration::from_secs(1),
                    waiting_for: "reply head",
                    events: 0
                },
                Api::OpenaiResponses
            ),
            504
        );
        let e = provider_error(&s(500, "secret body"));
        assert!(!e.message.contains("secret"), "no backend bodies");
        // Constrained decoding asked of a backend without it: the
        // harness's request, 400 in its API's shape, never a silent drop.
        let unsupported = InferenceError::Unsupported {
            backend: "b".into(),
            feature: "a named tool choice",
        };
        let e = provider_error(&unsupported);
        assert_eq!((e.side, e.kind), (Side::Harness, ErrorKind::Unsupported));
        for api in [
            Api::AnthropicMessages,
            Api::OpenaiChat,
            Api::OpenaiResponses,
            Api::Gemini,
        ] {
            assert_eq!(e.kind.status(api), 400, "{api:?}");
            let (_, body) = provider::error_response(api, &e);
            assert!(
                body.to_string()
                    .contains("cannot honour a named tool choice"),
                "{body}"
            );
        }
    }
}
