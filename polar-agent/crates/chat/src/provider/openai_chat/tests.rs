use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::provider::fixtures::{self, sse_json, strategies};
use crate::provider::{ErrorKind, Framing, Protocol, Side, assemble, encode_all, events_of};

fn call() -> ModelCall {
    ModelCall {
        api: Api::OpenaiChat,
        framing: Framing::Sse,
        path_model: None,
    }
}

fn opts(include_usage: bool) -> ReplyOptions {
    ReplyOptions {
        created: 1_796_006_612,
        include_usage,
        compaction: false,
        framing: Framing::Sse,
        response_format: None,
    }
}

fn parse(body: &Value) -> ParsedRequest {
    crate::provider::parse_request_value(&call(), body).unwrap()
}

/// What a client accumulates from a chunk stream: the assistant message
/// (content, reasoning_content, tool_calls), finish reason, usage.
fn accumulate(bytes: &[u8]) -> Value {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = Value::Null;
    let mut usage = Value::Null;
    for (_, v) in sse_json(bytes) {
        if v == "[DONE]" {
            continue;
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
        let Some(choice) = v["choices"].get(0) else {
            continue;
        };
        let d = &choice["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if calls.len() <= i {
                calls.resize(i + 1, json!({"id": null, "name": null, "arguments": ""}));
            }
            if let Some(id) = tc.get("id") {
                calls[i]["id"] = id.clone();
            }
            if let Some(n) = tc["function"].get("name") {
                calls[i]["name"] = n.clone();
            }
            let a = calls[i]["arguments"].as_str().unwrap().to_owned();
            calls[i]["arguments"] = json!(a + tc["function"]["arguments"].as_str().unwrap_or(""));
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    json!({"content": content, "reasoning": reasoning, "tool_calls": calls, "finish": finish, "usage": usage})
}

fn usage() -> Usage {
    Usage {
        prompt_tokens: 10,
        completion_tokens: 5,
        cached_tokens: None,
    }
}

#[test]
fn parses_qwen_code_request() {
    let p = parse(&fixtures::request("qwen_turn2.json"));
    assert!(p.include_usage);
    let r = p.request;
    let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::User,
            Role::Assistant,
            Role::Tool
        ]
    );
    assert_eq!(
        r.messages[0].joined_text(),
        "You are Qwen Code, an interactive CLI agent."
    );
    let a = &r.messages[4];
    assert!(a.content.is_empty());
    assert_eq!(a.reasoning.as_ref().unwrap().text, "Use the shell tool.");
    assert_eq!(a.tool_calls[0].id, "call_0009ee802a36");
    assert_eq!(
        a.tool_calls[0].arguments,
        "{\"command\": \"echo hi > out.txt\"}"
    );
    let t = &r.messages[5];
    assert_eq!(t.tool_call_id.as_deref(), Some("call_0009ee802a36"));
    assert_eq!(t.joined_text(), "Command: echo hi > out.txt\nExit Code: 0");
    assert_eq!(r.tools.len(), 2);
    assert_eq!(r.tools[0].name, "run_shell_command");
    assert_eq!(r.sampling.max_tokens, Some(8192));
    assert!(r.extra.contains_key("metadata"));
    assert!(!r.extra.contains_key("stream_options"));
}

#[test]
fn parses_other_chat_shapes() {
    let body = json!({
        "model": "fake-model",
        "messages": [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA", "detail": "high"}},
            ]},
            {"role": "assistant", "content": "", "reasoning": "vllm style"},
        ],
        "max_tokens": 5,
        "max_completion_tokens": 7,
        "stop": "END",
        "tool_choice": {"type": "function", "function": {"name": "bash"}},
        "store": false,
        "stream": true,
    });
    let r = parse(&body).request;
    assert_eq!(r.messages[0].role, Role::Developer);
    assert!(
        matches!(&r.messages[1].content[1], Part::Image { media_type: Some(m), .. } if m == "image/png")
    );
    assert_eq!(
        r.messages[1].extra["part_extra"][0],
        json!({"index": 1, "detail": "high"})
    );
    assert_eq!(r.messages[2].reasoning.as_ref().unwrap().text, "vllm style");
    assert_eq!(r.sampling.max_tokens, Some(7));
    assert_eq!(r.sampling.stop, ["END"]);
    assert_eq!(
        r.tool_choice,
        Some(ToolChoice::Tool {
            name: "bash".into()
        })
    );
    assert_eq!(r.extra["store"], false);
    let err = crate::provider::parse_request_value(
        &call(),
        &json!({"model": "m", "messages": [{"role": "x"}]}),
    )
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);
}

#[test]
fn text_stream_matches_recording() {
    let events = vec![
        StreamEvent::Start {
            id: "chatcmpl_00105e6d6ed3".into(),
            model: "m".into(),
            prompt_tokens: Some(10),
        },
        StreamEvent::TextDelta {
            text: "Done: wrote out.txt".into(),
        },
        StreamEvent::Finish {
            finish_reason: FinishReason::Stop,
            usage: usage(),
        },
    ];
    let ours = encode_all(&mut OpenaiChat::encoder(&opts(true)), &events);
    let recorded = fixtures::response("chat_text_stream.body");
    assert_eq!(accumulate(&ours), accumulate(recorded));
    let ev = sse_json(&ours);
    let rec = sse_json(recorded);
    assert_eq!(ev.len(), rec.len());
    for ((_, a), (_, b)) in ev.iter().zip(&rec) {
        if a == "[DONE]" {
            assert_eq!(b, "[DONE]");
            continue;
        }
        assert_eq!(a["object"], b["object"]);
        assert_eq!(
            a["choices"].as_array().unwrap().len(),
            b["choices"].as_array().unwrap().len()
        );
        assert_eq!(a["choices"][0]["delta"], b["choices"][0]["delta"]);
        assert_eq!(a["id"], "chatcmpl-00105e6d6ed3");
    }
}

#[test]
fn tool_stream_matches_recording() {
    let events = vec![
        StreamEvent::Start {
            id: "x".into(),
            model: "m".into(),
            prompt_tokens: None,
        },
        StreamEvent::ToolCallStart {
            index: 0,
            id: "call_0009ee802a36".into(),
            name: "bash".into(),
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
    let ours = encode_all(&mut OpenaiChat::encoder(&opts(true)), &events);
    let mut a = accumulate(&ours);
    let b = accumulate(fixtures::response("chat_tool_stream.body"));
    // The recording sends `content: null` with the call; ours sends the
    // role chunk's empty content first: the same message.
    a["content"] = b["content"].clone();
    assert_eq!(a, b);
}

#[test]
fn finish_reason_never_shares_a_chunk_with_content() {
    let r = assemble(&[
        StreamEvent::TextDelta { text: "a".into() },
        StreamEvent::Finish {
            finish_reason: FinishReason::Length,
            usage: usage(),
        },
    ]);
    let ours = encode_all(&mut OpenaiChat::encoder(&opts(false)), &events_of(&r));
    let ev = sse_json(&ours);
    let fin = &ev[ev.len() - 2].1;
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    assert_eq!(fin["choices"][0]["delta"], json!({}));
    assert_eq!(ev.last().unwrap().1, "[DONE]");
    assert!(
        ev.iter().all(|(_, v)| v.get("usage").is_none()),
        "no usage chunk unless asked"
    );
}

#[test]
fn non_streamed_reply_matches_recording() {
    let rec: Value = serde_json::from_slice(fixtures::response("chat_text_nostream.body")).unwrap();
    let resp = ChatResponse {
        id: "chatcmpl_001111207299".into(),
        model: "m".into(),
        message: Message::text(Role::Assistant, "OK"),
        finish_reason: FinishReason::Stop,
        usage: usage(),
        tokens: Default::default(),
    };
    let ours = fixtures::reply_json(&OpenaiChat::response_body(&resp, &opts(false)));
    assert_eq!(ours["object"], rec["object"]);
    assert_eq!(ours["created"], rec["created"]);
    assert_eq!(ours["choices"][0]["message"], rec["choices"][0]["message"]);
    assert_eq!(
        ours["choices"][0]["finish_reason"],
        rec["choices"][0]["finish_reason"]
    );
    assert_eq!(ours["usage"], rec["usage"]);
}

#[test]
fn tool_ids_round_trip_across_turns() {
    let mut m = Message::text(Role::Assistant, "");
    m.content.clear();
    m.tool_calls = vec![ToolCall {
        id: "call_x1".into(),
        name: "bash".into(),
        arguments: "{\"command\":\"ls\"}".into(),
    }];
    let resp = ChatResponse {
        id: "r".into(),
        model: "m".into(),
        message: m,
        finish_reason: FinishReason::Stop,
        usage: usage(),
        tokens: Default::default(),
    };
    let native = fixtures::reply_json(&OpenaiChat::response_body(&resp, &opts(false)));
    assert_eq!(native["choices"][0]["finish_reason"], "tool_calls");
    let msg = native["choices"][0]["message"].clone();
    assert_eq!(msg["content"], Value::Null);
    let next = json!({"model": "m", "messages": [
        {"role": "user", "content": "go"},
        msg,
        {"role": "tool", "tool_call_id": native["choices"][0]["message"]["tool_calls"][0]["id"], "content": [{"type": "text", "text": "a b"}]},
    ]});
    let r = parse(&next).request;
    assert_eq!(r.messages[1].tool_calls[0].id, "call_x1");
    assert_eq!(r.messages[2].tool_call_id.as_deref(), Some("call_x1"));
}

#[test]
fn errors_in_openai_shape() {
    let err = ProviderError::new(Side::Backend, ErrorKind::BackendUnavailable, "no replica");
    let (status, body) = error_body(&err);
    assert_eq!(status, 502);
    assert_eq!(
        body,
        json!({"error": {"message": "no replica", "type": "server_error", "param": null, "code": "backend_unavailable"}})
    );
    let mut enc = OpenaiChat::encoder(&opts(true));
    let mut out = enc
        .push(&StreamEvent::TextDelta { text: "x".into() })
        .to_vec();
    out.extend_from_slice(&enc.error(&err));
    let ev = sse_json(&out);
    assert_eq!(ev[ev.len() - 2].1["error"]["code"], "backend_unavailable");
    assert_eq!(ev.last().unwrap().1, "[DONE]");
}

/// Order rules of a chat stream.
fn check_stream(bytes: &[u8], include_usage: bool) {
    let ev = sse_json(bytes);
    let n = ev.len();
    assert!(n >= 1);
    assert_eq!(ev[n - 1].1, "[DONE]");
    let mut started = std::collections::BTreeSet::new();
    let mut finished = false;
    let mut errored = false;
    for (i, (name, v)) in ev.iter().enumerate() {
        assert!(name.is_none());
        if v == "[DONE]" {
            assert_eq!(i, n - 1, "[DONE] is last and only once");
            continue;
        }
        if v.get("error").is_some() {
            errored = true;
            continue;
        }
        assert_eq!(v["object"], "chat.completion.chunk");
        let choices = v["choices"].as_array().unwrap();
        if choices.is_empty() {
            assert!(
                finished && include_usage,
                "usage chunk after the finish chunk"
            );
            continue;
        }
        assert!(!finished, "nothing after the finish chunk but usage");
        let c = &choices[0];
        if !c["finish_reason"].is_null() {
            assert_eq!(c["delta"], json!({}), "finish reason alone in its chunk");
            finished = true;
        }
        for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let idx = tc["index"].as_u64().unwrap();
            if tc.get("id").is_some() {
                assert!(tc["function"]["name"].is_string());
                assert!(started.insert(idx), "one start per call");
            } else {
                assert!(started.contains(&idx), "deltas only for started calls");
            }
        }
    }
    assert!(finished || errored);
}

proptest! {
    #[test]
    fn any_event_sequence_gives_a_valid_stream(events in strategies::events(), include_usage in any::<bool>()) {
        let mut enc = OpenaiChat::encoder(&opts(include_usage));
        let mut out = encode_all(&mut enc, &events).to_vec();
        if !enc.is_done() {
            out.extend_from_slice(&enc.error(&ProviderError::new(Side::Agent, ErrorKind::Internal, "cut")));
        }
        check_stream(&out, include_usage);
    }

    #[test]
    fn reply_reads_back_as_the_next_assistant_turn(r in strategies::response(), stream in any::<bool>()) {
        let msg = if stream {
            let bytes = encode_all(&mut OpenaiChat::encoder(&opts(false)), &events_of(&r));
            let acc = accumulate(&bytes);
            let calls: Vec<Value> = acc["tool_calls"].as_array().unwrap().iter().map(|c| json!({
                "id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]},
            })).collect();
            let mut m = json!({"role": "assistant", "content": acc["content"]});
            if r.message.reasoning.is_some() {
                m["reasoning_content"] = acc["reasoning"].clone();
            }
            if !calls.is_empty() {
                m["tool_calls"] = json!(calls);
            }
            m
        } else {
            fixtures::reply_json(&OpenaiChat::response_body(&r, &opts(false)))["choices"][0]["message"].clone()
        };
        let next = json!({"model": "m", "messages": [{"role": "user", "content": "q"}, msg]});
        let back = parse(&next).request.messages.pop().unwrap();
        prop_assert_eq!(back.joined_text(), r.message.joined_text());
        prop_assert_eq!(back.reasoning.map(|x| x.text), r.message.reasoning.clone().map(|x| x.text));
        prop_assert_eq!(&back.tool_calls, &r.message.tool_calls);
    }
}
