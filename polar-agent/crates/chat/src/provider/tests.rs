use proptest::prelude::*;
use serde_json::json;

use super::fixtures::strategies;
use super::*;
use crate::{Role, Usage};

const NO_HEADERS: &[(&str, &str)] = &[];

fn model_call(d: Detected) -> ModelCall {
    match d {
        Detected::Model(c) => c,
        other => panic!("not a model call: {other:?}"),
    }
}

#[test]
fn detects_model_calls_by_path() {
    let stream = json!({"model": "m", "stream": true});
    let plain = json!({"model": "m"});
    let c = model_call(detect(
        "POST",
        "/v1/messages?beta=true",
        NO_HEADERS,
        &stream,
    ));
    assert_eq!((c.api, c.framing), (Api::AnthropicMessages, Framing::Sse));
    let c = model_call(detect("POST", "/v1/messages", NO_HEADERS, &plain));
    assert_eq!((c.api, c.framing), (Api::AnthropicMessages, Framing::Json));
    for p in [
        "/v1/chat/completions",
        "/compatible-mode/v1/chat/completions",
        "/api/openai/chat/completions",
    ] {
        assert_eq!(
            model_call(detect("POST", p, NO_HEADERS, &stream)).api,
            Api::OpenaiChat,
            "{p}"
        );
    }
    assert_eq!(
        model_call(detect("POST", "/v1/responses", NO_HEADERS, &stream)).api,
        Api::OpenaiResponses
    );
    let c = model_call(detect(
        "POST",
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
        NO_HEADERS,
        &json!({"contents": []}),
    ));
    assert_eq!(c.api, Api::Gemini);
    assert_eq!(c.framing, Framing::Sse);
    assert_eq!(c.path_model.as_deref(), Some("gemini-2.5-pro"));
    let c = model_call(detect(
        "POST",
        "/v1beta/models/gemini-3.5-flash-lite:generateContent",
        NO_HEADERS,
        &json!({}),
    ));
    assert_eq!(
        (c.framing, c.path_model.as_deref()),
        (Framing::Json, Some("gemini-3.5-flash-lite"))
    );
    let c = model_call(detect(
        "POST",
        "/v1beta/models/g:streamGenerateContent",
        NO_HEADERS,
        &json!({}),
    ));
    assert_eq!(c.framing, Framing::JsonArray);
}

#[test]
fn detects_side_calls() {
    let none = json!(null);
    assert_eq!(
        detect(
            "POST",
            "/v1/messages/count_tokens?beta=true",
            NO_HEADERS,
            &none
        ),
        Detected::Side(SideCall::CountTokens {
            api: Api::AnthropicMessages
        })
    );
    assert_eq!(
        detect("POST", "/v1beta/models/g:countTokens", NO_HEADERS, &none),
        Detected::Side(SideCall::CountTokens { api: Api::Gemini })
    );
    assert_eq!(
        detect("GET", "/v1/models", NO_HEADERS, &none),
        Detected::Side(SideCall::ListModels {
            api: Api::OpenaiChat
        })
    );
    assert_eq!(
        detect(
            "GET",
            "/v1/models",
            &[("Anthropic-Version", "2023-06-01")],
            &none
        ),
        Detected::Side(SideCall::ListModels {
            api: Api::AnthropicMessages
        })
    );
    assert_eq!(
        detect("GET", "/v1beta/models", NO_HEADERS, &none),
        Detected::Side(SideCall::ListModels { api: Api::Gemini })
    );
    let ws = [
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("OpenAI-Beta", "responses_websockets=2026-02-06"),
    ];
    assert_eq!(
        detect("GET", "/v1/responses", &ws, &none),
        Detected::Side(SideCall::ResponsesWebsocket)
    );
    for (m, p, b) in [
        ("HEAD", "/", json!(null)),
        ("HEAD", "/api/hello", json!(null)),
        ("POST", "/api/event_logging/v2/batch", json!({"events": []})),
        ("GET", "/api/claude_code/settings", json!(null)),
        ("POST", "/otlp/v1/metrics", json!(null)),
        (
            "POST",
            "/log?format=json&hasfast=true",
            json!({"log_event": []}),
        ),
        ("POST", "/", json!({"_v": 1, "app": {}, "events": []})),
    ] {
        assert_eq!(
            detect(m, p, NO_HEADERS, &b),
            Detected::Side(SideCall::Other),
            "{m} {p}"
        );
    }
}

#[test]
fn falls_back_to_headers_and_body_shape() {
    let anth = json!({"model": "c", "max_tokens": 10, "messages": []});
    let c = model_call(detect(
        "POST",
        "/proxy/x",
        &[("anthropic-version", "2023-06-01")],
        &anth,
    ));
    assert_eq!(c.api, Api::AnthropicMessages);
    let c = model_call(detect(
        "POST",
        "/x",
        NO_HEADERS,
        &json!({"model": "m", "messages": []}),
    ));
    assert_eq!(c.api, Api::OpenaiChat);
    let c = model_call(detect(
        "POST",
        "/backend-api/codex/responses",
        NO_HEADERS,
        &json!({"model": "m", "input": []}),
    ));
    assert_eq!(c.api, Api::OpenaiResponses);
    let c = model_call(detect(
        "POST",
        "/x",
        &[("x-goog-api-key", "k")],
        &json!({"contents": []}),
    ));
    assert_eq!(c.api, Api::Gemini);
}

#[test]
fn statuses_per_kind() {
    use ErrorKind as K;
    for (kind, want) in [
        (K::InvalidRequest, 400),
        (K::Unsupported, 400),
        (
            K::ContextOverflow {
                prompt: 2,
                completion: None,
                max: 1,
            },
            400,
        ),
        (K::TooLarge, 413),
        (K::NotFound, 404),
        (K::BackendUnavailable, 502),
        (K::BackendError, 502),
        (K::BackendTimeout, 504),
        (K::Overloaded, 503),
        (K::Internal, 500),
    ] {
        assert_eq!(kind.status(Api::OpenaiChat), want, "{kind:?}");
    }
    // An overload is answered as each API's own servers answer one: never
    // 429, which Codex CLI (OpenAI Responses) does not retry.
    for (api, want) in [
        (Api::AnthropicMessages, 529),
        (Api::OpenaiChat, 503),
        (Api::OpenaiResponses, 503),
        (Api::Gemini, 503),
    ] {
        assert_eq!(K::Overloaded.status(api), want, "{api:?}");
    }
    let err = ProviderError::new(Side::Backend, K::BackendTimeout, "slow");
    assert_eq!(err.to_string(), "backend timeout (backend side): slow");
    for api in [
        Api::AnthropicMessages,
        Api::OpenaiChat,
        Api::OpenaiResponses,
        Api::Gemini,
    ] {
        let (status, body) = error_response(api, &err);
        assert_eq!(status, 504);
        assert!(body.to_string().contains("slow"));
    }
}

/// A request over the context is told in the words each API's servers use,
/// the ones its harnesses act on: Claude Code compacts on Anthropic's
/// "prompt is too long: P tokens > M maximum" (and lowers `max_tokens` on
/// "input length and `max_tokens` exceed context limit"), OpenAI clients
/// look for the code `context_length_exceeded`.
#[test]
fn context_overflow_in_each_apis_words() {
    let over = |completion| {
        ProviderError::new(
            Side::Backend,
            ErrorKind::ContextOverflow {
                prompt: 300_000,
                completion,
                max: 262_144,
            },
            "the request does not fit",
        )
    };
    let cases = [
        (
            Api::AnthropicMessages,
            "/error/message",
            "prompt is too long: 300000 tokens > 262144 maximum",
        ),
        (
            Api::OpenaiChat,
            "/error/message",
            "This model's maximum context length is 262144 tokens. However, your messages resulted in 300000 tokens. Please reduce the length of the messages.",
        ),
        (
            Api::OpenaiResponses,
            "/error/code",
            "context_length_exceeded",
        ),
        (
            Api::Gemini,
            "/error/message",
            "The input token count (300000) exceeds the maximum number of tokens allowed (262144).",
        ),
    ];
    for (api, pointer, want) in cases {
        let (status, body) = error_response(api, &over(None));
        assert_eq!(status, 400, "{api:?}");
        assert_eq!(body.pointer(pointer), Some(&json!(want)), "{api:?}: {body}");
    }
    let fits = ProviderError::new(
        Side::Backend,
        ErrorKind::ContextOverflow {
            prompt: 3_500,
            completion: Some(1_000),
            max: 4_096,
        },
        "max_tokens too large",
    );
    let (_, body) = error_response(Api::AnthropicMessages, &fits);
    assert_eq!(
        body["error"]["message"],
        "input length and `max_tokens` exceed context limit: 3500 + 1000 > 4096, decrease input length or `max_tokens` and try again"
    );
    let (_, body) = error_response(Api::OpenaiChat, &fits);
    assert!(
        body["error"]["message"].as_str().is_some_and(|m| m
            .contains("you requested 4500 tokens (3500 in the messages, 1000 in the completion)")),
        "{body}"
    );
    assert_eq!(body["error"]["code"], "context_length_exceeded");
}

#[test]
fn assemble_folds_a_stream() {
    let events = vec![
        StreamEvent::Start {
            id: "r1".into(),
            model: "m".into(),
            prompt_tokens: Some(7),
        },
        StreamEvent::ReasoningDelta { text: "th".into() },
        StreamEvent::ReasoningDelta { text: "ink".into() },
        StreamEvent::ReasoningDone {
            signature: Some("s".into()),
        },
        StreamEvent::TextDelta { text: "Hel".into() },
        StreamEvent::TextDelta { text: "lo".into() },
        StreamEvent::ToolCallStart {
            index: 1,
            id: "b".into(),
            name: "g".into(),
        },
        StreamEvent::ToolCallStart {
            index: 0,
            id: "a".into(),
            name: "f".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "{\"x\":".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 1,
            arguments: "{}".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "1}".into(),
        },
        StreamEvent::Finish {
            finish_reason: FinishReason::ToolCalls,
            usage: Usage {
                prompt_tokens: 0,
                completion_tokens: 3,
                cached_tokens: None,
            },
        },
    ];
    let r = assemble(&events);
    assert_eq!(r.id, "r1");
    assert_eq!(r.message.joined_text(), "Hello");
    let reasoning = r.message.reasoning.clone().unwrap();
    assert_eq!(
        (reasoning.text.as_str(), reasoning.signature.as_deref()),
        ("think", Some("s"))
    );
    assert_eq!(r.message.tool_calls[0].id, "a");
    assert_eq!(r.message.tool_calls[0].arguments, "{\"x\":1}");
    assert_eq!(r.message.tool_calls[1].id, "b");
    assert_eq!(r.usage.prompt_tokens, 7);
    assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    assert_eq!(assemble(&[]).finish_reason, FinishReason::Abort);
}

/// Found by the `request_gemini` fuzz target: a sampling value written as
/// many digits (`topP` 0.00000000004000…095) read back one ULP off
/// (4.0000000000000004e-11) from the record's JSON, because serde_json's
/// default float parser is not correctly rounded; the workspace enables
/// its `float_roundtrip`, so a record reads back as it was written.
#[test]
fn a_request_reads_back_from_its_json_bit_for_bit() {
    let body = br#"{"contents": [{"role": "user", "parts": [{"text": "x"}]}],
        "generationConfig": {"temperature": 1, "topK": 64,
        "topP": 0.0000000000400000000000000000000000000000000000000000000000000000000000000000095}}"#;
    let doc = polar_json::Doc::parse(body).unwrap();
    let call = ModelCall {
        api: Api::Gemini,
        framing: Framing::Json,
        path_model: Some("gemini-2.5-pro".into()),
    };
    let parsed = parse_request(&call, doc.root()).unwrap();
    let back: ChatRequest =
        serde_json::from_slice(&serde_json::to_vec(&parsed.request).unwrap()).unwrap();
    assert_eq!(back, parsed.request);
    assert_eq!(
        back.sampling.top_p.map(f64::to_bits),
        Some(4e-11_f64.to_bits())
    );
}

#[test]
fn history_prepends_stored_conversation() {
    let mut instr_old = Message::text(Role::System, "old instructions");
    instr_old
        .extra
        .insert(SOURCE_KEY.into(), json!("instructions"));
    let prior = vec![
        instr_old,
        Message::text(Role::User, "q1"),
        Message::text(Role::Assistant, "a1"),
    ];
    let body = json!({
        "model": "gpt-5",
        "instructions": "new instructions",
        "previous_response_id": "resp_1",
        "input": [{"type": "message", "role": "user", "content": "q2"}],
    });
    let call = model_call(detect("POST", "/v1/responses", NO_HEADERS, &body));
    let parsed = parse_request_value(&call, &body).unwrap();
    assert_eq!(parsed.previous_response_id.as_deref(), Some("resp_1"));
    let full = with_history(&prior, parsed.request);
    let texts: Vec<String> = full.messages.iter().map(Message::joined_text).collect();
    assert_eq!(texts, ["new instructions", "q1", "a1", "q2"]);

    let resp = assemble(&events_of(&ChatResponse {
        id: "r".into(),
        model: "m".into(),
        message: Message::text(Role::Assistant, "a2"),
        finish_reason: FinishReason::Stop,
        usage: Usage::default(),
        tokens: Default::default(),
    }));
    let stored = conversation_after(&full, &resp);
    assert_eq!(stored.len(), 5);
    assert_eq!(stored[4].joined_text(), "a2");
}

#[test]
fn helpers() {
    assert_eq!(prefixed_id("msg_", "msg_x"), "msg_x");
    assert_eq!(prefixed_id("msg_", "chatcmpl-a.b"), "msg_ab");
    assert_eq!(prefixed_id("resp_", ""), "resp_0");
    assert_eq!(
        parse_data_url("data:image/png;base64,AAA"),
        Some(("image/png".into(), "AAA".into()))
    );
    assert_eq!(arguments_object(""), json!({}));
    assert_eq!(arguments_object("[1]"), json!({"arguments": "[1]"}));
    assert_eq!(
        arguments_object("{\"b\":1,\"a\":2}").to_string(),
        "{\"b\":1,\"a\":2}"
    );
}

#[test]
fn long_tool_names_are_kept() {
    let name = "mcp__very_long_server_name__".to_owned() + &"x".repeat(60);
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": name, "parameters": {}}}],
    });
    let call = model_call(detect("POST", "/v1/chat/completions", NO_HEADERS, &body));
    let r = parse_request_value(&call, &body).unwrap().request;
    assert!(r.tools[0].name.len() > 64);
    assert_eq!(r.tools[0].name, name);
}

proptest! {
    #[test]
    fn request_parsers_never_panic(body in strategies::json()) {
        for api in [Api::AnthropicMessages, Api::OpenaiChat, Api::OpenaiResponses, Api::Gemini] {
            let call = ModelCall { api, framing: Framing::Sse, path_model: Some("g".into()) };
            let _ = parse_request_value(&call, &body);
            let wrapped = json!({"model": "m", "messages": [body.clone()], "input": [body.clone()], "contents": [body.clone()]});
            let _ = parse_request_value(&call, &wrapped);
        }
        let _ = detect("POST", "/x", NO_HEADERS, &body);
    }

    #[test]
    fn assemble_inverts_events_of(r in strategies::response()) {
        prop_assert_eq!(assemble(&events_of(&r)), r);
    }

    #[test]
    fn assemble_never_panics(events in strategies::events()) {
        let _ = assemble(&events);
    }
}
