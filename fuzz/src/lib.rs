//! Checks shared by the fuzz targets (each target is a `fuzz_targets/`
//! binary; see `cargo xtask fuzz`).
//!
//! Panics are the findings: every check here asserts a property, and a
//! crash input becomes a regression test in the crate that owns the
//! parser.

pub mod mutate;

use arbitrary::Unstructured;
use polar_chat::provider::{
    self, Framing, ModelCall, ProviderError, ReplyOptions, Side, StreamEncoder, parse_request,
};
use polar_chat::{Api, ChatRequest, FinishReason, ResponseFormat, StreamEvent, Usage, assemble};
use polar_json::Doc;
use serde_json::Value;

/// A request body of `api` from the sandbox: the parser never panics; a
/// body it refuses is the harness's fault (never the agent's), with a
/// message; the normalized request it makes is written into the capture
/// log and reads back from it equal.
pub fn check_request(api: Api, data: &[u8]) {
    let Ok(doc) = Doc::parse(data) else {
        return;
    };
    for framing in [Framing::Json, Framing::Sse] {
        let call = ModelCall {
            api,
            framing,
            path_model: (api == Api::Gemini).then(|| "gemini-2.5-pro".to_owned()),
        };
        match parse_request(&call, doc.root()) {
            Ok(parsed) => {
                let text = serde_json::to_vec(&parsed.request).expect("a request serializes");
                let back: ChatRequest =
                    serde_json::from_slice(&text).expect("a serialized request reads back");
                assert_eq!(back, parsed.request);
            }
            Err(ProviderError { side, message, .. }) => {
                assert_eq!(side, Side::Harness, "{message}");
                assert!(!message.is_empty());
            }
        }
    }
}

fn text(u: &mut Unstructured<'_>) -> String {
    u.arbitrary().unwrap_or_default()
}

fn event(u: &mut Unstructured<'_>) -> arbitrary::Result<StreamEvent> {
    Ok(match u.int_in_range(0u8..=5)? {
        0 => StreamEvent::TextDelta { text: text(u) },
        1 => StreamEvent::ReasoningDelta { text: text(u) },
        2 => StreamEvent::ReasoningDone {
            signature: u.arbitrary()?,
        },
        3 => StreamEvent::ToolCallStart {
            index: u.int_in_range(0..=3)?,
            id: text(u),
            name: text(u),
        },
        4 => StreamEvent::ToolCallDelta {
            index: u.int_in_range(0..=3)?,
            arguments: text(u),
        },
        _ => finish(u)?,
    })
}

fn finish(u: &mut Unstructured<'_>) -> arbitrary::Result<StreamEvent> {
    let finish_reason = match u.int_in_range(0u8..=5)? {
        0 => FinishReason::Stop,
        1 => FinishReason::Length,
        2 => FinishReason::ToolCalls,
        3 => FinishReason::ContentFilter,
        4 => FinishReason::Abort,
        _ => FinishReason::Other(text(u)),
    };
    Ok(StreamEvent::Finish {
        finish_reason,
        usage: Usage {
            prompt_tokens: u.arbitrary()?,
            completion_tokens: u.arbitrary()?,
            cached_tokens: u.arbitrary()?,
        },
    })
}

/// Asserts `bytes` are a well-formed stream in `framing`.
fn check_framed(framing: Framing, bytes: &[u8]) {
    match framing {
        Framing::Sse => {
            let events = polar_sse::parse_all(bytes).expect("the encoders write whole SSE events");
            for e in events {
                if e.data != "[DONE]" {
                    serde_json::from_str::<Value>(&e.data)
                        .unwrap_or_else(|err| panic!("data {:?} is not JSON: {err}", e.data));
                }
            }
        }
        Framing::JsonArray => {
            let v: Value = serde_json::from_slice(bytes).expect("a Gemini stream is JSON");
            assert!(v.is_array(), "{v}");
        }
        Framing::Json => unreachable!("not a stream framing"),
    }
}

/// Stream events from `data` (a `Start`, then any deltas and tool calls,
/// then a `Finish`, as the backend client gives them) encoded in an API,
/// framing and reply options (structured output, compaction) `data`
/// chooses: the bytes are a well-formed stream, and so are those of a
/// stream ended by the API's error event instead; the reply the events
/// make, written as a complete body, is one JSON object.
pub fn check_stream(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(api) = u.choose(&[
        Api::AnthropicMessages,
        Api::OpenaiChat,
        Api::OpenaiResponses,
        Api::Gemini,
    ]) else {
        return;
    };
    let framing = if *api == Api::Gemini && u.arbitrary().unwrap_or(false) {
        Framing::JsonArray
    } else {
        Framing::Sse
    };
    // The options added after the corpus was made come from the input's
    // last byte, so the corpus's inputs still read as the same events.
    let last = data.last().copied().unwrap_or(0);
    let opts = ReplyOptions {
        created: u.arbitrary().unwrap_or(0),
        include_usage: u.arbitrary().unwrap_or(false),
        framing,
        response_format: match (last >> 1) & 3 {
            2 => Some(ResponseFormat::JsonObject),
            3 => Some(ResponseFormat::JsonSchema {
                name: "answer".into(),
                schema: serde_json::json!({"type": "object", "required": ["a"]}),
                strict: (last & 8 != 0).then_some(true),
            }),
            _ => None,
        },
        // A compaction reply (the Responses API's; the others ignore it).
        compaction: last & 1 == 1,
    };
    let mut events = vec![StreamEvent::Start {
        id: text(&mut u),
        model: text(&mut u),
        prompt_tokens: None,
    }];
    // The backend's stream ends at its `Finish` (the agent stops there).
    while !u.is_empty() && events.len() < 64 {
        match event(&mut u) {
            Ok(e) => {
                let last = matches!(e, StreamEvent::Finish { .. });
                events.push(e);
                if last {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    if !matches!(events.last(), Some(StreamEvent::Finish { .. })) {
        events.push(StreamEvent::Finish {
            finish_reason: FinishReason::Stop,
            usage: Usage::default(),
        });
    }
    let mut enc = provider::encoder(*api, &opts);
    let whole = provider::encode_all(&mut enc, &events);
    check_framed(framing, &whole);

    // The same reply as the complete (non-streamed) body: one JSON object.
    let body = provider::response_body(*api, &assemble(&events), &opts);
    let body: Value = serde_json::from_slice(&body).expect("a reply body is JSON");
    assert!(body.is_object(), "{body}");

    // Cut before the end and ended with the API's error event.
    let cut = events.len() / 2;
    let mut enc = provider::encoder(*api, &opts);
    let mut bytes = provider::encode_all(&mut enc, &events[..cut]).to_vec();
    if !enc.is_done() {
        let err = ProviderError::new(
            Side::Backend,
            provider::ErrorKind::BackendError,
            "the backend failed",
        );
        bytes.extend_from_slice(&enc.error(&err));
    }
    check_framed(framing, &bytes);
}
