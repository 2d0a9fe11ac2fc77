use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::provider::fixtures::{self, sse_json, strategies};
use crate::provider::{Protocol, Side, arguments_object, encode_all, events_of};

fn call(framing: Framing) -> ModelCall {
    ModelCall {
        api: Api::Gemini,
        framing,
        path_model: Some("gemini-2.5-pro".into()),
    }
}

fn opts(framing: Framing) -> ReplyOptions {
    ReplyOptions {
        created: 0,
        include_usage: false,
        compaction: false,
        framing,
        response_format: None,
    }
}

fn parse(body: &Value) -> ChatRequest {
    crate::provider::parse_request_value(&call(Framing::Sse), body)
        .unwrap()
        .request
}

fn usage() -> Usage {
    Usage {
        prompt_tokens: 10,
        completion_tokens: 5,
        cached_tokens: None,
    }
}

/// What a client makes of a stream of chunks: the model turn's parts merged
/// (texts joined, thoughts joined, calls listed), the last finish reason and
/// usage.
fn accumulate(chunks: &[Value]) -> Value {
    let mut text = String::new();
    let mut thought = String::new();
    let mut calls = Vec::new();
    let mut sigs = Vec::new();
    let mut finish = Value::Null;
    let mut usage = Value::Null;
    for c in chunks {
        let cand = &c["candidates"][0];
        for p in cand["content"]["parts"].as_array().into_iter().flatten() {
            if let Some(s) = p.get("thoughtSignature") {
                sigs.push(s.clone());
            }
            if let Some(fc) = p.get("functionCall") {
                calls.push(fc.clone());
            } else if p["thought"] == true {
                thought.push_str(p["text"].as_str().unwrap());
            } else {
                text.push_str(p["text"].as_str().unwrap_or(""));
            }
        }
        if let Some(f) = cand.get("finishReason") {
            finish = f.clone();
        }
        if let Some(u) = c.get("usageMetadata") {
            usage = u.clone();
        }
    }
    json!({"text": text, "thought": thought, "calls": calls, "signatures": sigs, "finish": finish, "usage": usage})
}

fn chunks(bytes: &[u8]) -> Vec<Value> {
    sse_json(bytes).into_iter().map(|(_, v)| v).collect()
}

#[test]
fn parses_gemini_cli_request() {
    let body = fixtures::request("gemini_cli_turn2.json");
    let r = parse(&body);
    assert_eq!(r.model, "gemini-2.5-pro");
    assert!(r.stream);
    assert!(
        !crate::provider::parse_request_value(&call(Framing::Json), &body)
            .unwrap()
            .request
            .stream
    );
    let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::System, Role::User, Role::Assistant, Role::Tool]
    );
    assert_eq!(
        r.messages[0].joined_text(),
        "You are Gemini CLI, an interactive CLI agent."
    );
    let a = &r.messages[2];
    assert_eq!(a.tool_calls[0].id, "gc-run-1");
    assert_eq!(
        a.tool_calls[0].arguments,
        r#"{"command":"echo hi > out.txt"}"#
    );
    assert_eq!(
        a.reasoning.as_ref().unwrap().signature.as_deref(),
        Some("c2lnLWdlbWluaQ==")
    );
    let t = &r.messages[3];
    assert_eq!(t.tool_call_id.as_deref(), Some("gc-run-1"));
    assert_eq!(t.name.as_deref(), Some("run_shell_command"));
    assert_eq!(
        t.joined_text(),
        r#"{"output":"Command: echo hi > out.txt\nExit Code: 0"}"#
    );
    assert_eq!(r.tools[0].parameters.to_value()["type"], "object");
    assert_eq!(
        r.tools[1].parameters.to_value()["properties"]["absolute_path"]["type"],
        "string"
    );
    assert_eq!(r.sampling.max_tokens, Some(65536));
    assert_eq!(r.sampling.top_k, Some(64));
    assert_eq!(r.sampling.top_p, Some(0.95));
    assert_eq!(
        r.extra["generationConfig"]["thinkingConfig"]["includeThoughts"],
        true
    );
}

#[test]
fn synthesizes_unique_ids_and_matches_responses_by_name_order() {
    let r = parse(&fixtures::request("pi_gemini_two_calls.json"));
    let a = &r.messages[2];
    let ids: Vec<&str> = a.tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        ["gemini-call-1-0", "gemini-call-1-1", "gemini-call-1-2"]
    );
    let answers: Vec<(&str, &str)> = r.messages[3..6]
        .iter()
        .map(|m| {
            (
                m.name.as_deref().unwrap(),
                m.tool_call_id.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        answers,
        [
            ("read", "gemini-call-1-2"),
            ("bash", "gemini-call-1-0"),
            ("bash", "gemini-call-1-1")
        ]
    );
    assert_eq!(r.messages[6].tool_calls[0].id, "gemini-call-3-0");
    assert_eq!(
        r.messages[7].tool_call_id.as_deref(),
        Some("gemini-call-3-0")
    );
    assert!(r.messages[7].is_error);
    assert_eq!(r.sampling.stop, ["END"]);
    // `text/plain` is no constraint; the structured-output keys are read
    // into `response_format`, not kept in `extra`.
    assert_eq!(r.response_format, None);
    assert!(
        r.extra
            .get("generationConfig")
            .and_then(|g| g.get("responseMimeType"))
            .is_none()
    );
    // An answer that matches no call still gets a unique id.
    let lone = parse(
        &json!({"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "x", "response": {}}}]}]}),
    );
    assert_eq!(
        lone.messages[0].tool_call_id.as_deref(),
        Some("gemini-result-0-0")
    );
}

#[test]
fn text_stream_matches_recording() {
    let events = vec![
        StreamEvent::Start {
            id: "gresp_001883534581".into(),
            model: "gemini-2.5-pro".into(),
            prompt_tokens: Some(10),
        },
        StreamEvent::TextDelta {
            text: "Done: ".into(),
        },
        StreamEvent::TextDelta {
            text: "wrote out.txt".into(),
        },
        StreamEvent::Finish {
            finish_reason: FinishReason::Stop,
            usage: usage(),
        },
    ];
    let ours = encode_all(&mut Gemini::encoder(&opts(Framing::Sse)), &events);
    assert!(!String::from_utf8_lossy(&ours).contains("[DONE]"));
    let ours = chunks(&ours);
    let rec = chunks(fixtures::response("gemini_text_sse.body"));
    assert_eq!(accumulate(&ours), accumulate(&rec));
    for c in &ours {
        assert_eq!(c["modelVersion"], rec[0]["modelVersion"]);
        assert_eq!(c["responseId"], rec[0]["responseId"]);
        assert_eq!(c["candidates"][0]["content"]["role"], "model");
    }
}

#[test]
fn tool_stream_matches_recording_with_whole_calls() {
    let events = vec![
        StreamEvent::Start {
            id: "gresp_001701d00444".into(),
            model: "gemini-2.5-pro".into(),
            prompt_tokens: None,
        },
        StreamEvent::ToolCallStart {
            index: 0,
            id: "call_1".into(),
            name: "run_shell_command".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "{\"command\": ".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "\"echo hi > out.txt\"}".into(),
        },
        StreamEvent::Finish {
            finish_reason: FinishReason::ToolCalls,
            usage: usage(),
        },
    ];
    let ours = chunks(&encode_all(
        &mut Gemini::encoder(&opts(Framing::Sse)),
        &events,
    ));
    let rec = chunks(fixtures::response("gemini_tool_sse.body"));
    assert_eq!(
        ours.len(),
        rec.len(),
        "the call goes out whole, in the last chunk"
    );
    let mut ours = accumulate(&ours);
    assert_eq!(ours["calls"][0]["id"], "call_1");
    ours["calls"][0].as_object_mut().unwrap().remove("id");
    assert_eq!(ours, accumulate(&rec));
}

#[test]
fn non_streamed_reply_and_json_array_framing() {
    let rec: Value =
        serde_json::from_slice(fixtures::response("gemini_json_classifier.body")).unwrap();
    let text = rec["candidates"][0]["content"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    let resp = ChatResponse {
        id: "gresp_0019d921f9d0".into(),
        model: "gemini-2.5-flash-lite".into(),
        message: Message::text(Role::Assistant, text),
        finish_reason: FinishReason::Stop,
        usage: usage(),
        tokens: Default::default(),
    };
    assert_eq!(
        fixtures::reply_json(&Gemini::response_body(&resp, &opts(Framing::Json))),
        rec
    );

    let array = encode_all(
        &mut Gemini::encoder(&opts(Framing::JsonArray)),
        &events_of(&resp),
    );
    let v: Value = serde_json::from_slice(&array).unwrap();
    assert_eq!(accumulate(v.as_array().unwrap()), accumulate(&[rec]));
    let mut enc = Gemini::encoder(&opts(Framing::JsonArray));
    let err = enc.error(&ProviderError::new(
        Side::Backend,
        ErrorKind::BackendError,
        "x",
    ));
    let v: Value = serde_json::from_slice(&err).unwrap();
    assert_eq!(v[0]["error"]["status"], "INTERNAL");
}

#[test]
fn signature_and_thoughts_round_trip() {
    let mut m = Message::text(Role::Assistant, "");
    m.content.clear();
    m.reasoning = Some(Reasoning {
        text: "plan".into(),
        signature: Some("sig".into()),
        encrypted: None,
    });
    m.tool_calls = vec![
        ToolCall {
            id: "a".into(),
            name: "bash".into(),
            arguments: "{\"command\":\"ls\"}".into(),
        },
        ToolCall {
            id: "b".into(),
            name: "bash".into(),
            arguments: "{\"command\":\"pwd\"}".into(),
        },
    ];
    let resp = ChatResponse {
        id: "g".into(),
        model: "gemini-2.5-pro".into(),
        message: m,
        finish_reason: FinishReason::ToolCalls,
        usage: usage(),
        tokens: Default::default(),
    };
    let native = fixtures::reply_json(&Gemini::response_body(&resp, &opts(Framing::Json)));
    let parts = &native["candidates"][0]["content"]["parts"];
    assert_eq!(parts[0], json!({"text": "plan", "thought": true}));
    assert_eq!(parts[1]["thoughtSignature"], "sig");
    assert_eq!(native["candidates"][0]["finishReason"], "STOP");
    let next = json!({"contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        native["candidates"][0]["content"],
        {"role": "user", "parts": [
            {"functionResponse": {"id": "a", "name": "bash", "response": {"output": "x"}}},
            {"functionResponse": {"id": "b", "name": "bash", "response": {"output": "y"}}},
        ]},
    ]});
    let r = parse(&next);
    assert_eq!(r.messages[1].reasoning, resp.message.reasoning);
    assert_eq!(r.messages[1].tool_calls, resp.message.tool_calls);
    assert_eq!(r.messages[2].tool_call_id.as_deref(), Some("a"));
    assert_eq!(r.messages[3].tool_call_id.as_deref(), Some("b"));
}

#[test]
fn errors_in_gemini_shape() {
    for (kind, status, name) in [
        (ErrorKind::InvalidRequest, 400, "INVALID_ARGUMENT"),
        (ErrorKind::NotFound, 404, "NOT_FOUND"),
        (ErrorKind::Overloaded, 503, "UNAVAILABLE"),
        (ErrorKind::BackendTimeout, 504, "DEADLINE_EXCEEDED"),
        (ErrorKind::BackendUnavailable, 502, "UNAVAILABLE"),
    ] {
        let (s, body) = error_body(&ProviderError::new(Side::Backend, kind, "m"));
        assert_eq!(s, status);
        assert_eq!(
            body,
            json!({"error": {"code": status, "message": "m", "status": name}})
        );
    }
    let mut enc = Gemini::encoder(&opts(Framing::Sse));
    let mut out = enc
        .push(&StreamEvent::TextDelta { text: "a".into() })
        .to_vec();
    out.extend_from_slice(&enc.error(&ProviderError::invalid("bad")));
    let c = chunks(&out);
    assert_eq!(c.last().unwrap()["error"]["code"], 400);
}

/// Rules of a Gemini stream: JSON chunks, no `[DONE]`, the finish reason
/// only on the last chunk, calls whole with object args and an id.
fn check_chunks(all: &[Value]) {
    assert!(!all.is_empty());
    for (i, c) in all.iter().enumerate() {
        let last = i == all.len() - 1;
        if c.get("error").is_some() {
            assert!(last, "an error ends the stream");
            continue;
        }
        let cand = &c["candidates"][0];
        assert_eq!(
            cand.get("finishReason").is_some(),
            last,
            "finishReason only at the end"
        );
        assert_eq!(c.get("usageMetadata").is_some(), last);
        for p in cand["content"]["parts"].as_array().unwrap() {
            if let Some(fc) = p.get("functionCall") {
                assert!(fc["args"].is_object());
                assert!(fc["name"].is_string() && fc["id"].is_string());
            }
        }
    }
}

proptest! {
    #[test]
    fn any_event_sequence_gives_a_valid_stream(events in strategies::events(), array in any::<bool>()) {
        let framing = if array { Framing::JsonArray } else { Framing::Sse };
        let mut enc = Gemini::encoder(&opts(framing));
        let mut out = encode_all(&mut enc, &events).to_vec();
        if !enc.is_done() {
            out.extend_from_slice(&enc.error(&ProviderError::new(Side::Backend, ErrorKind::BackendError, "x")));
        }
        let all = if array {
            serde_json::from_slice::<Vec<Value>>(&out).unwrap()
        } else {
            let text = String::from_utf8(out.clone()).unwrap();
            prop_assert!(!text.contains("data: [DONE]"));
            chunks(&out)
        };
        check_chunks(&all);
    }

    #[test]
    fn reply_reads_back_as_the_next_model_turn(r in strategies::response(), stream in any::<bool>()) {
        let content = if stream {
            let c = chunks(&encode_all(&mut Gemini::encoder(&opts(Framing::Sse)), &events_of(&r)));
            let parts: Vec<Value> = c.iter().flat_map(|c| c["candidates"][0]["content"]["parts"].as_array().unwrap().clone()).collect();
            json!({"role": "model", "parts": parts})
        } else {
            fixtures::reply_json(&Gemini::response_body(&r, &opts(Framing::Json)))["candidates"][0]["content"].clone()
        };
        let next = json!({"contents": [{"role": "user", "parts": [{"text": "q"}]}, content]});
        let back = parse(&next).messages.pop().unwrap();
        prop_assert_eq!(back.joined_text(), r.message.joined_text());
        prop_assert_eq!(back.reasoning, r.message.reasoning.clone());
        prop_assert_eq!(back.tool_calls.len(), r.message.tool_calls.len());
        for (b, o) in back.tool_calls.iter().zip(&r.message.tool_calls) {
            prop_assert_eq!(&b.id, &o.id);
            prop_assert_eq!(&b.name, &o.name);
            prop_assert_eq!(serde_json::from_str::<Value>(&b.arguments).unwrap(), arguments_object(&o.arguments));
        }
    }
}

/// A request whose text spells things the long way: escapes in strings and
/// keys (`te\u0078t` is `text`), numbers as `1.0e1`, `-0`, `9.5E-1`, an
/// integer too big for `u64`, a repeated key (the last one counts), and
/// fields nobody knows. Read from its own bytes, not from a re-serialized
/// `Value`.
const SPELLED_OUT: &str = r#"{
  "model": "models/ignored",
  "contents": [
    {"role": "user", "parts": [
      {"te\u0078t": "caf\u00e9 \"quoted\"\n\ttab \ud83d\ude00 slash\/"},
      {"inlineData": {"mime\u0054ype": "image/png", "data": "iVBOR"}, "x-part": 1.50},
      {"unknownPart": {"a": [1, 2.0, -3e2]}},
      "loose"
    ], "turnTag": "t\u0031"},
    {"role": "mod\u0065l", "parts": [
      {"text": "pondering \u2192", "thought": true, "thoughtSignature": "sig\/1"},
      {"functionCall": {"name": "run", "args": {"cmd": "echo \"hi\"", "n": 10, "f": 1.0e1, "neg": -0, "big": 12345678901234567890123, "u": "\u00e9"}, "extra\u005fkey": true}, "partNote": null},
      {"function_call": {"name": "run", "args": { "n" : 7 , "s": "a b" }}, "thought_signature": "s2"},
      {"text": "", "thoughtSignature": "s3"},
      42
    ]},
    {"role": "user", "parts": [
      {"functionResponse": {"name": "r\u0075n", "response": {"output": "ok \u0001", "code": 0}, "willContinue": false}},
      {"function_response": {"id": "gemini-call-1-2", "name": "run", "response": {"error": "bad"}}}
    ]}
  ],
  "systemInstruction": {"parts": [{"text": "Be \u0022brief\u0022"}], "role": "system", "note": 5},
  "tools": [{"functionDeclarations": [
      {"name": "run", "description": "Run\u0021", "parameters": {"type": "OBJECT", "properties": {"cmd": {"type": "STRING", "minLength": 1E0}}, "required": ["cmd"]}},
      {"name": "read", "parameters_json_schema": {"type": "object", "properties": {"p": {"type": "String"}}}}
    ], "googleSearch": {}}],
  "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["r\u0075n"]}},
  "generationConfig": {"maxOutputTokens": 8192, "temperature": 0.5e0, "topP": 9.5E-1, "topK": 3,
    "stopSequences": "EN\u0044", "thinkingConfig": {"thinkingBudget": -1}, "topK": 40.0},
  "safetySettings": [{"category": "HARM", "threshold": "BLOCK_NONE"}],
  "cachedContent": "cache\/1"
}"#;

#[test]
fn reads_escapes_number_forms_and_unknown_fields_from_the_text() {
    let doc = polar_json::Doc::parse(SPELLED_OUT.as_bytes()).unwrap();
    let r = Gemini::parse_request(&call(Framing::Sse), doc.root())
        .unwrap()
        .request;

    let mut system = Message::text(Role::System, "Be \"brief\"");
    system.extra.insert("note".into(), json!(5));
    let mut user = Message::text(Role::User, "café \"quoted\"\n\ttab 😀 slash/");
    user.content.extend([
        Part::Image {
            media_type: Some("image/png".into()),
            data: Some("iVBOR".into()),
            url: None,
        },
        Part::Other {
            value: json!({"unknownPart": {"a": [1, 2.0, -300.0]}}),
        },
        Part::Other {
            value: json!("loose"),
        },
    ]);
    user.extra
        .insert("part_extra".into(), json!([{"index": 1, "x-part": 1.5}]));
    user.extra.insert("turnTag".into(), json!("t1"));
    let mut model = Message::text(Role::Assistant, "");
    model.content = vec![Part::Other { value: json!(42) }];
    model.reasoning = Some(Reasoning {
        text: "pondering →".into(),
        signature: Some("sig/1".into()),
        encrypted: None,
    });
    model.tool_calls = vec![
        ToolCall {
            id: "gemini-call-1-1".into(),
            name: "run".into(),
            arguments:
                r#"{"cmd":"echo \"hi\"","n":10,"f":10.0,"neg":-0.0,"big":1.2345678901234568e+22,"u":"é"}"#
                    .into(),
        },
        ToolCall {
            id: "gemini-call-1-2".into(),
            name: "run".into(),
            arguments: r#"{"n":7,"s":"a b"}"#.into(),
        },
    ];
    model.extra.insert(
        "part_extra".into(),
        json!([{"index": 1, "partNote": null, "extra_key": true}]),
    );
    model.extra.insert(
        "thought_signatures".into(),
        json!([{"index": 2, "signature": "s2"}, {"index": 3, "signature": "s3"}]),
    );
    let mut answer = Message::text(Role::Tool, r#"{"output":"ok \u0001","code":0}"#);
    answer.tool_call_id = Some("gemini-call-1-1".into());
    answer.name = Some("run".into());
    answer.extra.insert("willContinue".into(), json!(false));
    let mut failure = Message::text(Role::Tool, r#"{"error":"bad"}"#);
    failure.tool_call_id = Some("gemini-call-1-2".into());
    failure.name = Some("run".into());
    failure.is_error = true;

    let mut extra = Map::new();
    extra.insert(
        "safetySettings".into(),
        json!([{"category": "HARM", "threshold": "BLOCK_NONE"}]),
    );
    extra.insert("cachedContent".into(), json!("cache/1"));
    extra.insert("tools_other".into(), json!([{"googleSearch": {}}]));
    extra.insert(
        "toolConfig".into(),
        json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["run"]}}),
    );
    extra.insert(
        "generationConfig".into(),
        json!({"thinkingConfig": {"thinkingBudget": -1}}),
    );
    let expected = ChatRequest {
        model: "gemini-2.5-pro".into(),
        messages: vec![system, user, model, answer, failure],
        tools: vec![
            Tool {
                name: "run".into(),
                description: Some("Run!".into()),
                parameters: polar_json::RawJson::from_value(
                    &json!({"type": "object", "properties": {"cmd": {"type": "string", "minLength": 1.0}}, "required": ["cmd"]}),
                ),
            },
            Tool {
                name: "read".into(),
                description: None,
                parameters: polar_json::RawJson::from_value(
                    &json!({"type": "object", "properties": {"p": {"type": "String"}}}),
                ),
            },
        ],
        tool_choice: Some(ToolChoice::Tool { name: "run".into() }),
        response_format: None,
        sampling: Sampling {
            max_tokens: Some(8192),
            temperature: Some(0.5),
            top_p: Some(0.95),
            top_k: None,
            stop: vec!["END".into()],
            seed: None,
        },
        stream: true,
        extra,
    };
    assert_eq!(r, expected);
    // The same request written out plainly (as serde_json writes it) reads
    // the same.
    let value: Value = serde_json::from_str(SPELLED_OUT).unwrap();
    assert_eq!(parse(&value), expected);
}

#[test]
fn rejects_malformed_requests() {
    for (body, message) in [
        (json!([]), "request body must be a JSON object"),
        (json!({"contents": {}}), "contents: field required"),
        (
            json!({"contents": [{"parts": []}, 7]}),
            "contents[1]: must be an object",
        ),
        (
            json!({"contents": [{"role": "robot", "parts": []}]}),
            "contents[0].role: unknown role \"robot\"",
        ),
        (
            json!({"contents": [], "systemInstruction": null}),
            "systemInstruction: must be a string or a content object",
        ),
    ] {
        let err = crate::provider::parse_request_value(&call(Framing::Sse), &body).unwrap_err();
        assert_eq!(
            (err.side, err.kind, err.message.as_str()),
            (Side::Harness, ErrorKind::InvalidRequest, message)
        );
    }
}
