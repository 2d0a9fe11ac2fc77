//! Test fixtures: recorded harness responses and real-shaped requests from
//! `polar-agent/crates/chat/tests/fixtures/providers/` (see its README).

use serde_json::Value;

use super::sse::EventJson as _;
use super::{ModelCall, ParsedRequest};

macro_rules! fixture {
    ($dir:literal, $name:expr, [$($file:literal),* $(,)?]) => {
        match $name {
            $($file => include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/providers/", $dir, "/", $file)).as_slice(),)*
            other => panic!("no fixture {other}"),
        }
    };
}

/// Exact response bytes a harness accepted.
pub fn response(name: &str) -> &'static [u8] {
    fixture!(
        "responses",
        name,
        [
            "anthropic_text_nostream.body",
            "anthropic_text_stream.body",
            "anthropic_tool_stream.body",
            "anthropic_count_tokens.body",
            "chat_text_nostream.body",
            "chat_text_stream.body",
            "chat_tool_stream.body",
            "gemini_json_classifier.body",
            "gemini_text_sse.body",
            "gemini_tool_sse.body",
            "responses_text_nostream.body",
            "responses_text_stream.body",
            "responses_tool_stream.body",
        ]
    )
}

/// `text` translated as the agent reads bodies (from its own text), after
/// checking that serde_json's reading of the same text translates the same.
pub fn parse_text(call: &ModelCall, text: &str) -> ParsedRequest {
    let doc = polar_json::Doc::parse(text.as_bytes()).unwrap();
    let ours = super::parse_request(call, doc.root()).unwrap();
    let value: Value = serde_json::from_str(text).unwrap();
    assert_eq!(ours, super::parse_request_value(call, &value).unwrap());
    ours
}

/// A real-shaped request body.
pub fn request(name: &str) -> Value {
    let bytes = fixture!(
        "requests",
        name,
        [
            "claude_code_turn2.json",
            "codex_turn2.json",
            "qwen_turn2.json",
            "gemini_cli_turn2.json",
            "pi_gemini_two_calls.json",
        ]
    );
    serde_json::from_slice(bytes).unwrap()
}

/// A complete (non-streamed) reply body read as JSON.
pub fn reply_json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("bad JSON {:?}: {e}", String::from_utf8_lossy(body)))
}

/// The events of an SSE body as (event name, JSON data); `[DONE]` is kept as
/// the string "[DONE]".
pub fn sse_json(bytes: &[u8]) -> Vec<(Option<String>, Value)> {
    polar_sse::parse_all(bytes)
        .unwrap()
        .into_iter()
        .map(|e| {
            let v = if e.data == "[DONE]" {
                Value::String(e.data.clone())
            } else {
                e.json()
                    .unwrap_or_else(|err| panic!("bad JSON {:?}: {err}", e.data))
            };
            (e.event, v)
        })
        .collect()
}

pub mod strategies {
    //! proptest strategies over the normalized model.
    use proptest::prelude::*;

    use crate::{
        ChatResponse, FinishReason, Message, Reasoning, Role, StreamEvent, ToolCall, Usage,
    };

    pub fn finish_reason() -> impl Strategy<Value = FinishReason> {
        prop_oneof![
            Just(FinishReason::Stop),
            Just(FinishReason::Length),
            Just(FinishReason::ToolCalls),
            Just(FinishReason::ContentFilter),
            Just(FinishReason::Abort),
            "[a-z]{1,8}".prop_map(FinishReason::Other),
        ]
    }

    pub fn usage() -> impl Strategy<Value = Usage> {
        (0u32..100_000, 0u32..10_000, proptest::option::of(0u32..100)).prop_map(|(p, c, cached)| {
            Usage {
                prompt_tokens: p + cached.unwrap_or(0),
                completion_tokens: c,
                cached_tokens: cached,
            }
        })
    }

    /// Arbitrary JSON, biased towards the keys request parsers look at.
    pub fn json() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let key = prop_oneof![
            Just("model".to_owned()),
            Just("messages".to_owned()),
            Just("role".to_owned()),
            Just("content".to_owned()),
            Just("type".to_owned()),
            Just("text".to_owned()),
            Just("input".to_owned()),
            Just("contents".to_owned()),
            Just("parts".to_owned()),
            Just("tools".to_owned()),
            Just("tool_calls".to_owned()),
            Just("functionCall".to_owned()),
            Just("functionResponse".to_owned()),
            "[a-z_]{1,8}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            prop_oneof![
                Just("user".to_owned()),
                Just("assistant".to_owned()),
                Just("tool_use".to_owned()),
                Just("tool_result".to_owned()),
                Just("function_call".to_owned()),
                Just("message".to_owned()),
                Just("model".to_owned()),
                ".{0,6}",
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Arbitrary events in arbitrary order, including malformed sequences.
    pub fn events() -> impl Strategy<Value = Vec<StreamEvent>> {
        let ev = prop_oneof![
            (
                "[a-z0-9]{0,6}",
                "[a-z-]{1,6}",
                proptest::option::of(0u32..50)
            )
                .prop_map(|(id, model, p)| {
                    StreamEvent::Start {
                        id,
                        model,
                        prompt_tokens: p,
                    }
                }),
            ".{0,12}".prop_map(|text| StreamEvent::ReasoningDelta { text }),
            proptest::option::of("[A-Za-z0-9+/=]{1,12}")
                .prop_map(|signature| StreamEvent::ReasoningDone { signature }),
            ".{0,12}".prop_map(|text| StreamEvent::TextDelta { text }),
            (0u32..3, "[a-z0-9_]{1,8}", "[a-zA-Z_]{1,10}")
                .prop_map(|(index, id, name)| { StreamEvent::ToolCallStart { index, id, name } }),
            (0u32..3, ".{0,10}")
                .prop_map(|(index, arguments)| StreamEvent::ToolCallDelta { index, arguments }),
            (finish_reason(), usage()).prop_map(|(finish_reason, usage)| StreamEvent::Finish {
                finish_reason,
                usage
            }),
        ];
        proptest::collection::vec(ev, 0..24)
    }

    fn args() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            ("[a-z]{1,6}", "[ -~]{0,12}")
                .prop_map(|(k, v)| serde_json::json!({ k: v }).to_string()),
            ("[a-z]{1,4}", 0i64..1000, any::<bool>()).prop_map(|(k, n, b)| {
                serde_json::json!({ "zeta": n, k: { "flag": b, "list": [1, "two"] } }).to_string()
            }),
        ]
    }

    /// Replies that every API can express (one text part at most, reasoning
    /// without `encrypted`, arguments that are JSON objects or empty).
    pub fn response() -> impl Strategy<Value = ChatResponse> {
        let calls = proptest::collection::vec(
            ("[a-z0-9]{1,10}", "[a-zA-Z_][a-zA-Z0-9_]{0,9}", args()),
            0..3,
        );
        (
            "[a-z0-9]{1,10}",
            "[a-z0-9.-]{1,12}",
            proptest::option::of("[^\u{0}]{1,30}"),
            proptest::option::of((
                "[^\u{0}]{0,20}",
                proptest::option::of("[A-Za-z0-9+/]{4,16}"),
            )),
            calls,
            finish_reason(),
            usage(),
        )
            .prop_map(
                |(id, model, text, reasoning, calls, finish_reason, usage)| {
                    let mut message = Message::text(Role::Assistant, text.unwrap_or_default());
                    if message.joined_text().is_empty() {
                        message.content.clear();
                    }
                    // Empty reasoning without a signature is no reasoning.
                    message.reasoning = reasoning
                        .filter(|(text, signature)| !text.is_empty() || signature.is_some())
                        .map(|(text, signature)| Reasoning {
                            text,
                            signature,
                            encrypted: None,
                        });
                    // Unique call ids, as every API requires.
                    message.tool_calls = calls
                        .into_iter()
                        .enumerate()
                        .map(|(i, (id, name, arguments))| ToolCall {
                            id: format!("c{i}_{id}"),
                            name,
                            arguments,
                        })
                        .collect();
                    ChatResponse {
                        id,
                        model,
                        message,
                        finish_reason,
                        usage,
                        tokens: Default::default(),
                    }
                },
            )
    }
}
