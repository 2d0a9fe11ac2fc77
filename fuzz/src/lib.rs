//! Checks shared by the fuzz targets (each target is a `fuzz_targets/`
//! binary; see `cargo xtask fuzz`).
//!
//! Panics are the findings: every check here asserts a property, and a
//! crash input becomes a regression test in the crate that owns the
//! parser.
#![forbid(unsafe_code)]

pub mod mutate;

use arbitrary::Unstructured;
use polar_chat::provider::{
    self, Detected, Framing, ModelCall, ProviderError, ReplyOptions, Side, StreamEncoder, detect,
    parse_request,
};
use polar_chat::{Api, ChatRequest, FinishReason, ResponseFormat, StreamEvent, Usage, assemble};
use polar_evaluate::judge::{self, Criterion};
use polar_evaluate::{Parser, TestOutcomes};
use polar_json::{Doc, Json};
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
        check_parsed(&call, doc.root());
    }
}

/// `call`'s parser on `body`: a body it refuses is the harness's fault,
/// with a message; the normalized request reads back equal from the text
/// the capture log holds.
fn check_parsed(call: &ModelCall, body: Json<'_>) {
    match parse_request(call, body) {
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

/// A request as the proxy has it once hyper has read its head, from
/// `data` as text (the seeds are readable requests): `METHOD PATH`, then
/// `name: value` lines, an empty line and the body. Its classification
/// (`provider::detect`, done for every request a sandbox sends) is the
/// same with the body read by `polar_json` and by `serde_json`; what the
/// head alone says, which the proxy's early errors speak, the body never
/// contradicts; a model call's framing and model fit its API; and the
/// parser detection picks, with the model the path names, holds
/// [`check_request`]'s properties.
pub fn check_detect(data: &[u8]) {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(end) => (&data[..end], &data[end + 2..]),
        None => (data, &[][..]),
    };
    let head = String::from_utf8_lossy(head);
    let mut lines = head.split('\n');
    let (method, path) = lines
        .next()
        .and_then(|line| line.split_once(' '))
        .unwrap_or(("POST", "/"));
    let headers: Vec<(&str, &str)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim(), value.trim()))
        .collect();
    let doc = Doc::parse(body).ok();
    let root = doc.as_ref().map_or_else(Json::null, Doc::root);
    let detected = detect(method, path, headers.as_slice(), &root);

    if let (Some(_), Ok(value)) = (&doc, serde_json::from_slice::<Value>(body)) {
        assert_eq!(detect(method, path, headers.as_slice(), &value), detected);
    }
    let early = detect(method, path, headers.as_slice(), &Value::Null);
    let Detected::Model(call) = detected else {
        assert!(
            !matches!(early, Detected::Model(_)),
            "the head says {early:?}, the body makes it a side call"
        );
        return;
    };
    if let Detected::Model(early) = early {
        assert_eq!((early.api, &early.path_model), (call.api, &call.path_model));
    }
    if call.framing == Framing::JsonArray || call.path_model.is_some() {
        assert_eq!(call.api, Api::Gemini, "{call:?}");
    }
    if let Some(model) = &call.path_model {
        assert!(
            path.contains(model.as_str()),
            "{model:?} is not in {path:?}"
        );
    }
    check_parsed(&call, root);
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
/// stream cut anywhere and ended by the API's error event (of any kind and
/// message) instead; the reply the events make, written as a complete
/// body, and the error's body are each one JSON object.
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

    // Cut before the end and ended with the API's error event. Where and
    // with which error come from what the events left of the input; an
    // input with nothing left (as the corpus's first inputs were made) is
    // cut in the middle by a backend error.
    let (cut, err) = if u.is_empty() {
        let err = ProviderError::new(
            Side::Backend,
            provider::ErrorKind::BackendError,
            "the backend failed",
        );
        (events.len() / 2, err)
    } else {
        let cut = u.int_in_range(0..=events.len()).unwrap_or(0);
        (cut, provider_error(&mut u))
    };
    let mut enc = provider::encoder(*api, &opts);
    let mut bytes = provider::encode_all(&mut enc, &events[..cut]).to_vec();
    if !enc.is_done() {
        bytes.extend_from_slice(&enc.error(&err));
    }
    check_framed(framing, &bytes);
    // The same error before any stream: one JSON object, with the status
    // the error's kind has in the API.
    let (status, body) = provider::error_response(*api, &err);
    assert_eq!(status, err.kind.status(*api));
    assert!(body.is_object(), "{body}");
}

/// An error of any kind, its message any text: a backend's words and a
/// request's field names reach the harness in it.
fn provider_error(u: &mut Unstructured<'_>) -> ProviderError {
    use provider::ErrorKind as K;
    let kind = match u.int_in_range(0u8..=9).unwrap_or(0) {
        0 => K::InvalidRequest,
        1 => K::TooLarge,
        2 => K::ContextOverflow {
            prompt: u.arbitrary().unwrap_or(0),
            completion: u.arbitrary().unwrap_or(None),
            max: u.arbitrary().unwrap_or(0),
        },
        3 => K::Unsupported,
        4 => K::NotFound,
        5 => K::BackendUnavailable,
        6 => K::BackendTimeout,
        7 => K::BackendError,
        8 => K::Overloaded,
        _ => K::Internal,
    };
    ProviderError::new(Side::Backend, kind, text(u))
}

/// A test command's output, any text (the command runs the policy's code
/// in the sandbox), read by the `test_output` evaluator's `pytest` and
/// `unittest` parsers: never a panic; every test reported by a trimmed,
/// non-empty name that is its own canonical name (what a `fail_to_pass`
/// or `pass_to_pass` entry is matched by, so every test the output reports
/// can be named in a spec); and `pytest`, which reads each line alone,
/// reports for the whole output what it reports for its two parts split
/// at the line break nearest the middle, each test with the worse of its
/// two statuses.
pub fn check_test_output(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for parser in [Parser::Pytest, Parser::Unittest] {
        for name in parser.parse(&text).keys() {
            assert!(!name.is_empty() && name.trim() == name, "{name:?}");
            assert_eq!(&parser.canonical_name(name), name);
        }
    }
    let middle = text.len() / 2;
    let Some(at) = text
        .bytes()
        .enumerate()
        .filter(|(_, b)| *b == b'\n')
        .map(|(i, _)| i)
        .min_by_key(|i| i.abs_diff(middle))
    else {
        return;
    };
    let mut parts: TestOutcomes = Parser::Pytest.parse(&text[..at]);
    for (name, status) in Parser::Pytest.parse(&text[at + 1..]) {
        let kept = parts.entry(name).or_insert(status);
        *kept = (*kept).max(status);
    }
    assert_eq!(Parser::Pytest.parse(&text), parts);
}

/// An `llm_judge` evaluator's answer, any text (the judge reads the
/// policy's diff and transcript, which may steer what it writes), read
/// against a rubric of three weighted criteria: never a panic; an answer
/// read gives every criterion a score in 0 to 10, in the rubric's order,
/// and a reward that is their weighted mean in 0 to 1.
pub fn check_judge_answer(data: &[u8]) {
    let answer = String::from_utf8_lossy(data);
    let rubric: Vec<Criterion> = [("correctness", 3.0), ("tests", 1.0), ("style", 0.5)]
        .into_iter()
        .map(|(name, weight)| Criterion {
            name: name.to_owned(),
            description: String::new(),
            weight,
        })
        .collect();
    let Ok(scored) = judge::score(&rubric, &answer) else {
        return;
    };
    assert_eq!(scored.scores.len(), rubric.len());
    assert!(
        scored
            .scores
            .iter()
            .all(|s| (0.0..=judge::MAX_SCORE).contains(s)),
        "{scored:?}"
    );
    assert!((0.0..=1.0).contains(&scored.reward), "{scored:?}");
    let total: f64 = rubric.iter().map(|c| c.weight).sum();
    let mean: f64 = rubric
        .iter()
        .zip(&scored.scores)
        .map(|(c, s)| c.weight * s)
        .sum::<f64>()
        / (total * judge::MAX_SCORE);
    assert!((scored.reward - mean).abs() < 1e-12, "{scored:?}");
}
