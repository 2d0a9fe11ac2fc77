use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::provider::fixtures::{self, sse_json, strategies};
use crate::provider::{ErrorKind, Framing, Protocol, Side, encode_all, events_of};

fn call() -> ModelCall {
    ModelCall {
        api: Api::AnthropicMessages,
        framing: Framing::Sse,
        path_model: None,
    }
}

fn opts() -> ReplyOptions {
    ReplyOptions {
        created: 1_796_006_612,
        include_usage: false,
        compaction: false,
        framing: Framing::Sse,
        response_format: None,
    }
}

fn parse(body: &Value) -> ChatRequest {
    crate::provider::parse_request_value(&call(), body)
        .unwrap()
        .request
}

/// The shape of a stream: event name, block kind / delta kind and index.
fn shape(bytes: &[u8]) -> Vec<String> {
    sse_json(bytes)
        .into_iter()
        .map(|(name, v)| {
            let name = name.unwrap_or_default();
            assert_eq!(v["type"], name.as_str(), "event name matches data type");
            let kind = v["content_block"]["type"]
                .as_str()
                .or_else(|| v["delta"]["type"].as_str())
                .unwrap_or("");
            match v.get("index") {
                Some(i) => format!("{name}:{kind}@{i}"),
                None => name,
            }
        })
        .collect()
}

fn text_events(text: &str) -> Vec<StreamEvent> {
    vec![
        StreamEvent::Start {
            id: "msg_1".into(),
            model: "claude-x".into(),
            prompt_tokens: Some(10),
        },
        StreamEvent::TextDelta { text: text.into() },
        StreamEvent::Finish {
            finish_reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                cached_tokens: None,
            },
        },
    ]
}

#[test]
fn parses_claude_code_request() {
    let r = parse(&fixtures::request("claude_code_turn2.json"));
    assert_eq!(r.model, "claude-opus-4-8");
    assert!(r.stream);
    // The billing line leaves the prompt and is kept aside.
    assert!(
        r.extra["anthropic_billing_header"]
            .as_str()
            .unwrap()
            .starts_with(BILLING_PREFIX)
    );
    let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::System,
            Role::Assistant,
            Role::Tool,
            Role::User
        ]
    );
    assert_eq!(
        r.messages[0].joined_text(),
        "You are Claude Code, Anthropic's official CLI for Claude."
    );
    assert_eq!(r.messages[0].extra["block_extra"][0]["index"], 0);
    assert_eq!(
        r.messages[0].extra["block_extra"][0]["cache_control"]["type"],
        "ephemeral"
    );
    assert_eq!(
        r.messages[2].joined_text(),
        "Reminder: the working directory is /work."
    );
    let a = &r.messages[3];
    assert_eq!(a.joined_text(), "Running it.");
    let reasoning = a.reasoning.clone().unwrap();
    assert_eq!(reasoning.text, "I should run a shell command.");
    assert_eq!(reasoning.signature.as_deref(), Some("sig-abc"));
    assert_eq!(a.tool_calls[0].id, "toolu_001379568b55");
    assert_eq!(a.tool_calls[0].name, "Bash");
    assert_eq!(
        a.tool_calls[0].arguments,
        r#"{"command":"echo hi > out.txt","description":"Write hi to out.txt"}"#
    );
    let t = &r.messages[4];
    assert_eq!(t.tool_call_id.as_deref(), Some("toolu_001379568b55"));
    assert_eq!(t.name.as_deref(), Some("Bash"));
    assert_eq!(t.joined_text(), "(no output)");
    assert!(!t.is_error);
    assert_eq!(t.extra["cache_control"]["type"], "ephemeral");
    assert_eq!(r.messages[5].joined_text(), "continue");
    assert_eq!(r.tools.len(), 2);
    assert_eq!(r.tools[0].parameters.to_value()["required"][0], "command");
    assert_eq!(r.tool_choice, Some(ToolChoice::Auto));
    assert_eq!(r.sampling.max_tokens, Some(32000));
    assert_eq!(r.sampling.temperature, Some(1.0));
    assert_eq!(r.sampling.stop, ["\n\nHuman:"]);
    for k in [
        "thinking",
        "context_management",
        "output_config",
        "metadata",
    ] {
        assert!(r.extra.contains_key(k), "{k} kept");
    }
}

#[test]
fn accepts_string_content_error_results_and_images() {
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "system": "be brief",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "false"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "exit 1", "is_error": true},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
            ]},
        ],
        "tool_choice": {"type": "tool", "name": "bash", "disable_parallel_tool_use": true},
    });
    let r = parse(&body);
    assert_eq!(r.messages[0].joined_text(), "be brief");
    assert_eq!(r.messages[1].joined_text(), "hi");
    assert!(
        matches!(&r.messages[2].content[0], Part::Other { value } if value["type"] == "redacted_thinking")
    );
    assert!(r.messages[3].is_error);
    assert_eq!(r.messages[3].joined_text(), "exit 1");
    assert!(matches!(&r.messages[4].content[0], Part::Image { data: Some(d), .. } if d == "AAA"));
    assert_eq!(
        r.tool_choice,
        Some(ToolChoice::Tool {
            name: "bash".into()
        })
    );
    assert_eq!(r.extra["parallel_tool_calls"], false);
}

#[test]
fn rejects_malformed_requests() {
    for body in [
        json!([]),
        json!({"messages": []}),
        json!({"model": "m"}),
        json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
        json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}),
    ] {
        let err = crate::provider::parse_request_value(&call(), &body).unwrap_err();
        assert_eq!(
            (err.side, err.kind),
            (Side::Harness, ErrorKind::InvalidRequest),
            "{body}"
        );
    }
}

#[test]
fn text_stream_matches_recording() {
    let mut enc = Anthropic::encoder(&opts());
    let ours = encode_all(&mut enc, &text_events("Done: wrote out.txt"));
    assert!(enc.is_done());
    let recorded = fixtures::response("anthropic_text_stream.body");
    assert_eq!(shape(&ours), shape(recorded));
    let evs = sse_json(&ours);
    assert_eq!(evs[0].1["message"]["id"], "msg_1");
    assert_eq!(evs[0].1["message"]["model"], "claude-x");
    assert_eq!(evs[2].1["delta"]["text"], "Done: wrote out.txt");
    assert_eq!(evs[4].1["delta"]["stop_reason"], "end_turn");
    assert_eq!(evs[4].1["usage"]["output_tokens"], 5);
}

#[test]
fn tool_stream_matches_recording() {
    let events = vec![
        StreamEvent::Start {
            id: "x".into(),
            model: "claude-x".into(),
            prompt_tokens: None,
        },
        StreamEvent::ToolCallStart {
            index: 0,
            id: "toolu_001379568b55".into(),
            name: "Bash".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "{\"command\": \"echo hi > out.txt\"}".into(),
        },
        StreamEvent::Finish {
            finish_reason: FinishReason::ToolCalls,
            usage: Usage::default(),
        },
    ];
    let ours = encode_all(&mut Anthropic::encoder(&opts()), &events);
    let recorded = fixtures::response("anthropic_tool_stream.body");
    assert_eq!(shape(&ours), shape(recorded));
    let evs = sse_json(&ours);
    let rec = sse_json(recorded);
    assert_eq!(evs[1].1["content_block"], rec[1].1["content_block"]);
    assert_eq!(evs[2].1["delta"], rec[2].1["delta"]);
    assert_eq!(evs[4].1["delta"], rec[4].1["delta"]);
}

#[test]
fn thinking_then_text_then_tools() {
    let events = vec![
        StreamEvent::ReasoningDelta { text: "hmm".into() },
        StreamEvent::ReasoningDone {
            signature: Some("sig".into()),
        },
        StreamEvent::TextDelta { text: "ok".into() },
        StreamEvent::ToolCallStart {
            index: 0,
            id: "a".into(),
            name: "f".into(),
        },
        StreamEvent::ToolCallStart {
            index: 1,
            id: "b".into(),
            name: "g".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "{}".into(),
        },
        StreamEvent::Finish {
            finish_reason: FinishReason::Stop,
            usage: Usage::default(),
        },
    ];
    let ours = encode_all(&mut Anthropic::encoder(&opts()), &events);
    assert_eq!(
        shape(&ours),
        [
            "message_start",
            "content_block_start:thinking@0",
            "content_block_delta:thinking_delta@0",
            "content_block_delta:signature_delta@0",
            "content_block_stop:@0",
            "content_block_start:text@1",
            "content_block_delta:text_delta@1",
            "content_block_stop:@1",
            "content_block_start:tool_use@2",
            "content_block_start:tool_use@3",
            "content_block_delta:input_json_delta@2",
            "content_block_stop:@2",
            "content_block_stop:@3",
            "message_delta",
            "message_stop",
        ]
    );
    let evs = sse_json(&ours);
    assert_eq!(evs[13].1["delta"]["stop_reason"], "tool_use");
}

#[test]
fn non_streamed_reply_matches_recording() {
    let rec: Value =
        serde_json::from_slice(fixtures::response("anthropic_text_nostream.body")).unwrap();
    let resp = crate::provider::assemble(&text_events("OK"));
    let ours = fixtures::reply_json(&Anthropic::response_body(&resp, &opts()));
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&ours), keys(&rec));
    assert_eq!(ours["content"], rec["content"]);
    assert_eq!(ours["stop_reason"], rec["stop_reason"]);
    assert_eq!(keys(&ours["usage"]), keys(&rec["usage"]));
}

#[test]
fn tool_ids_round_trip_across_turns() {
    let resp = ChatResponse {
        id: "chatcmpl-9".into(),
        model: "claude-x".into(),
        message: {
            let mut m = Message::text(Role::Assistant, "");
            m.content.clear();
            m.tool_calls = vec![
                ToolCall {
                    id: "call_a".into(),
                    name: "Bash".into(),
                    arguments: r#"{"command":"ls"}"#.into(),
                },
                ToolCall {
                    id: "call_b".into(),
                    name: "Bash".into(),
                    arguments: r#"{"command":"pwd"}"#.into(),
                },
            ];
            m
        },
        finish_reason: FinishReason::ToolCalls,
        usage: Usage::default(),
        tokens: Default::default(),
    };
    let native = fixtures::reply_json(&Anthropic::response_body(&resp, &opts()));
    assert_eq!(native["id"], "msg_9");
    let results: Vec<Value> = native["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| json!({"type": "tool_result", "tool_use_id": b["id"], "content": "done"}))
        .collect();
    let next = json!({
        "model": "claude-x",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": native["content"]},
            {"role": "user", "content": results},
        ],
    });
    let r = parse(&next);
    let ids: Vec<&str> = r.messages[1]
        .tool_calls
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(ids, ["call_a", "call_b"]);
    let answered: Vec<&str> = r.messages[2..]
        .iter()
        .map(|m| m.tool_call_id.as_deref().unwrap())
        .collect();
    assert_eq!(answered, ids);
}

#[test]
fn errors_in_anthropic_shape() {
    let err = ProviderError::new(Side::Backend, ErrorKind::Overloaded, "busy");
    let (status, body) = error_body(&err);
    assert_eq!(status, 529);
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    );
    let (status, body) = error_body(&ProviderError::invalid("bad"));
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );

    let mut enc = Anthropic::encoder(&opts());
    let mut out = enc.push(&text_events("x")[0]).to_vec();
    out.extend_from_slice(&enc.push(&StreamEvent::TextDelta { text: "par".into() }));
    out.extend_from_slice(&enc.error(&err));
    assert!(enc.is_done());
    assert!(
        enc.push(&StreamEvent::TextDelta {
            text: "late".into()
        })
        .is_empty()
    );
    let evs = sse_json(&out);
    let last = evs.last().unwrap();
    assert_eq!(last.0.as_deref(), Some("error"));
    assert_eq!(last.1["error"]["type"], "overloaded_error");
}

/// Order rules of an Anthropic stream.
fn check_stream(bytes: &[u8]) {
    let evs = sse_json(bytes);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert!(
        matches!(names.first(), Some(&("message_start" | "error"))),
        "{names:?}"
    );
    let mut open = std::collections::BTreeSet::new();
    let mut next = 0;
    let mut ended = false;
    for (name, v) in &evs {
        assert!(!ended, "nothing after message_stop / error");
        let i = v["index"].as_u64();
        match name.as_deref().unwrap() {
            "content_block_start" => {
                assert_eq!(i, Some(next));
                next += 1;
                open.insert(i);
            }
            "content_block_delta" => assert!(open.contains(&i)),
            "content_block_stop" => assert!(open.remove(&i)),
            "message_delta" => assert!(open.is_empty()),
            "message_stop" | "error" => ended = true,
            "message_start" => {}
            other => panic!("unexpected event {other}"),
        }
    }
}

proptest! {
    #[test]
    fn any_event_sequence_gives_a_valid_stream(events in strategies::events(), fail in any::<bool>()) {
        let mut enc = Anthropic::encoder(&opts());
        let mut out = encode_all(&mut enc, &events).to_vec();
        if fail || !enc.is_done() {
            out.extend_from_slice(&enc.error(&ProviderError::new(Side::Backend, ErrorKind::BackendError, "x")));
        }
        check_stream(&out);
    }

    #[test]
    fn reply_reads_back_as_the_next_assistant_turn(r in strategies::response(), stream in any::<bool>()) {
        let native = if stream {
            // Rebuild the message from the stream, as the SDK does.
            let bytes = encode_all(&mut Anthropic::encoder(&opts()), &events_of(&r));
            let mut blocks: Vec<Value> = Vec::new();
            for (_, v) in sse_json(&bytes) {
                match v["type"].as_str().unwrap() {
                    "content_block_start" => blocks.push(v["content_block"].clone()),
                    "content_block_delta" => {
                        let b = &mut blocks[v["index"].as_u64().unwrap() as usize];
                        let d = &v["delta"];
                        let (key, add) = match d["type"].as_str().unwrap() {
                            "text_delta" => ("text", &d["text"]),
                            "thinking_delta" => ("thinking", &d["thinking"]),
                            "signature_delta" => ("signature", &d["signature"]),
                            _ => ("partial", &d["partial_json"]),
                        };
                        let old = b.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
                        b[key] = json!(old + add.as_str().unwrap());
                    }
                    _ => {}
                }
            }
            for b in &mut blocks {
                if let Some(p) = b.get("partial").and_then(Value::as_str).map(str::to_owned) {
                    b["input"] = crate::provider::arguments_object(&p);
                    b.as_object_mut().unwrap().remove("partial");
                }
            }
            json!({"content": blocks})
        } else {
            fixtures::reply_json(&Anthropic::response_body(&r, &opts()))
        };
        let next = json!({
            "model": "m", "max_tokens": 1,
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": native["content"]}],
        });
        let back = parse(&next).messages.pop().unwrap();
        prop_assert_eq!(back.joined_text(), r.message.joined_text());
        prop_assert_eq!(back.reasoning, r.message.reasoning.clone());
        prop_assert_eq!(back.tool_calls.len(), r.message.tool_calls.len());
        for (b, o) in back.tool_calls.iter().zip(&r.message.tool_calls) {
            prop_assert_eq!(&b.id, &o.id);
            prop_assert_eq!(&b.name, &o.name);
            let parsed: Value = serde_json::from_str(&b.arguments).unwrap();
            prop_assert_eq!(parsed, crate::provider::arguments_object(&o.arguments));
        }
    }
}
