use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::provider::fixtures::{self, sse_json, strategies};
use crate::provider::{ErrorKind, Framing, Protocol, Side, StreamEncoder, encode_all, events_of};
use crate::{FinishReason, StreamEvent, Usage};

fn call() -> ModelCall {
    ModelCall {
        api: Api::OpenaiResponses,
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

fn parse(body: &Value) -> ParsedRequest {
    crate::provider::parse_request_value(&call(), body).unwrap()
}

fn usage() -> Usage {
    Usage {
        prompt_tokens: 10,
        completion_tokens: 5,
        cached_tokens: Some(0),
    }
}

fn names(bytes: &[u8]) -> Vec<String> {
    sse_json(bytes)
        .into_iter()
        .map(|(n, v)| {
            let n = n.unwrap();
            assert_eq!(v["type"], n.as_str());
            n
        })
        .collect()
}

#[test]
fn parses_codex_request() {
    let p = parse(&fixtures::request("codex_turn2.json"));
    assert_eq!(p.previous_response_id, None);
    let r = p.request;
    assert_eq!(r.model, "gpt-5");
    let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::Developer,
            Role::Developer,
            Role::User,
            Role::User,
            Role::Assistant,
            Role::Tool
        ]
    );
    assert_eq!(
        r.messages[0].joined_text(),
        "You are Codex, a coding agent."
    );
    let a = &r.messages[4];
    let reasoning = a.reasoning.clone().unwrap();
    assert_eq!(reasoning.text, "Need a shell call.");
    assert_eq!(reasoning.encrypted.as_deref(), Some("gAAAAenc"));
    assert_eq!(a.tool_calls[0].id, "call_0003e146efb4");
    assert_eq!(a.tool_calls[0].name, "exec_command");
    assert_eq!(
        a.tool_calls[0].arguments,
        "{\"cmd\": \"echo hi > out.txt\"}"
    );
    let items = a.extra["item_extra"].as_array().unwrap();
    assert_eq!(
        items[0],
        json!({"index": 4, "type": "reasoning", "id": "rs_01"})
    );
    assert_eq!(items[1], json!({"index": 5, "id": "fc_0002dfd08450"}));
    let t = &r.messages[5];
    assert_eq!(t.tool_call_id.as_deref(), Some("call_0003e146efb4"));
    assert_eq!(t.name.as_deref(), Some("exec_command"));
    assert_eq!(t.joined_text(), "Process exited with code 0");
    assert!(t.extra.is_empty());
    let names: Vec<&str> = r.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["exec_command", "write_stdin"]);
    assert_eq!(r.extra["tools_other"], json!([{"type": "web_search"}]));
    assert_eq!(
        r.extra["tool_extra"][0],
        json!({"name": "exec_command", "strict": false})
    );
    assert_eq!(r.tool_choice, Some(ToolChoice::Auto));
    for k in [
        "store",
        "include",
        "prompt_cache_key",
        "reasoning",
        "client_metadata",
        "parallel_tool_calls",
    ] {
        assert!(r.extra.contains_key(k), "{k} kept");
    }
    assert!(r.stream);
}

#[test]
fn parses_opencode_pi_and_odd_items() {
    let body = json!({
        "model": "gpt-5",
        "instructions": "sys",
        "previous_response_id": "resp_prev",
        "input": [
            {"type": "additional_tools", "role": "developer", "tools": [{"type": "function", "name": "hidden", "parameters": {"type": "object"}}]},
            {"role": "developer", "content": "dev"},
            {"role": "user", "content": [{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
            {"type": "local_shell_call", "id": "lsh_1", "call_id": "c1", "status": "completed", "action": {"type": "exec", "command": ["ls"]}},
            {"type": "local_shell_call_output", "call_id": "c1", "output": "a"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
            {"type": "item_reference", "id": "x"},
        ],
        "max_output_tokens": 100,
        "tool_choice": {"type": "function", "name": "hidden"},
    });
    let p = parse(&body);
    assert_eq!(p.previous_response_id.as_deref(), Some("resp_prev"));
    let r = p.request;
    assert_eq!(
        r.messages[0].extra[crate::provider::SOURCE_KEY],
        "instructions"
    );
    assert_eq!(r.messages[1].role, Role::Developer);
    assert!(
        matches!(&r.messages[2].content[1], Part::Image { url: Some(u), .. } if u == "https://x/y.png")
    );
    let a = &r.messages[3];
    assert_eq!(a.joined_text(), "ok");
    assert_eq!(a.tool_calls[0].name, "local_shell");
    assert_eq!(
        a.tool_calls[0].arguments,
        r#"{"type":"exec","command":["ls"]}"#
    );
    assert_eq!(r.messages[4].extra["type"], "local_shell_call_output");
    assert_eq!(r.messages[5].tool_calls[0].arguments, "*** Begin Patch");
    assert_eq!(r.messages[6].tool_call_id.as_deref(), Some("c2"));
    assert_eq!(r.messages[6].name.as_deref(), Some("apply_patch"));
    assert_eq!(r.tools[0].name, "hidden");
    assert_eq!(r.extra["additional_tools"][0]["type"], "additional_tools");
    assert_eq!(r.extra["input_other"][0]["index"], 8);
    assert_eq!(
        r.tool_choice,
        Some(ToolChoice::Tool {
            name: "hidden".into()
        })
    );
    assert_eq!(r.sampling.max_tokens, Some(100));

    let s = parse(&json!({"model": "m", "input": "hi"})).request;
    assert_eq!(s.messages, [Message::text(Role::User, "hi")]);
}

#[test]
fn text_stream_matches_recording() {
    let events = vec![
        StreamEvent::Start {
            id: "resp_0004e05b4106".into(),
            model: "gpt-5".into(),
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
    let ours = encode_all(&mut OpenaiResponses::encoder(&opts()), &events);
    let recorded = fixtures::response("responses_text_stream.body");
    assert_eq!(names(&ours), names(recorded));
    let ev = sse_json(&ours);
    let rec = sse_json(recorded);
    for (i, ((_, a), (_, b))) in ev.iter().zip(&rec).enumerate() {
        assert_eq!(a["sequence_number"], i, "sequence numbers count from 0");
        for k in ["output_index", "content_index", "delta", "text", "part"] {
            assert_eq!(a.get(k), b.get(k), "{k} of event {i}");
        }
    }
    let done = &ev.last().unwrap().1["response"];
    let rec_done = &rec.last().unwrap().1["response"];
    assert_eq!(done["id"], "resp_0004e05b4106");
    assert_eq!(done["status"], "completed");
    assert_eq!(done["usage"], rec_done["usage"]);
    assert_eq!(
        done["output"][0]["content"],
        rec_done["output"][0]["content"]
    );
    for k in rec_done.as_object().unwrap().keys() {
        assert!(done.get(k).is_some(), "response has {k}");
    }
}

#[test]
fn tool_stream_matches_recording() {
    let events = vec![
        StreamEvent::Start {
            id: "resp_1".into(),
            model: "gpt-5".into(),
            prompt_tokens: None,
        },
        StreamEvent::ToolCallStart {
            index: 0,
            id: "call_0003e146efb4".into(),
            name: "exec_command".into(),
        },
        StreamEvent::ToolCallDelta {
            index: 0,
            arguments: "{\"cmd\": \"echo hi > out.txt\"}".into(),
        },
        StreamEvent::Finish {
            finish_reason: FinishReason::ToolCalls,
            usage: usage(),
        },
    ];
    let ours = encode_all(&mut OpenaiResponses::encoder(&opts()), &events);
    let recorded = fixtures::response("responses_tool_stream.body");
    assert_eq!(names(&ours), names(recorded));
    let ev = sse_json(&ours);
    let rec = sse_json(recorded);
    let item = &ev[5].1["item"];
    let rec_item = &rec[5].1["item"];
    for k in ["type", "call_id", "name", "arguments", "status"] {
        assert_eq!(item[k], rec_item[k], "{k}");
    }
    let item_id = item["id"].as_str().unwrap();
    assert!(item_id.starts_with("fc_"));
    for (_, v) in &ev[2..6] {
        let id = v.get("item_id").or_else(|| v["item"].get("id")).unwrap();
        assert_eq!(id, item_id, "one id throughout");
    }
}

#[test]
fn reasoning_and_incomplete() {
    let events = vec![
        StreamEvent::ReasoningDelta { text: "th".into() },
        StreamEvent::ReasoningDelta { text: "ink".into() },
        StreamEvent::TextDelta {
            text: "partial".into(),
        },
        StreamEvent::Finish {
            finish_reason: FinishReason::Length,
            usage: usage(),
        },
    ];
    let ours = encode_all(&mut OpenaiResponses::encoder(&opts()), &events);
    assert_eq!(
        names(&ours),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",
        ]
    );
    let last = sse_json(&ours).pop().unwrap().1;
    assert_eq!(last["response"]["status"], "incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(last["response"]["output"][0]["summary"][0]["text"], "think");
    assert_eq!(
        last["response"]["output"][1]["content"][0]["text"],
        "partial"
    );
}

#[test]
fn non_streamed_reply_matches_recording() {
    let rec: Value =
        serde_json::from_slice(fixtures::response("responses_text_nostream.body")).unwrap();
    let resp = ChatResponse {
        id: "resp_00067c0f2467".into(),
        model: "gpt-5".into(),
        message: Message::text(Role::Assistant, "OK"),
        finish_reason: FinishReason::Stop,
        usage: usage(),
        tokens: Default::default(),
    };
    let ours = fixtures::reply_json(&OpenaiResponses::response_body(&resp, &opts()));
    for k in rec.as_object().unwrap().keys() {
        assert!(ours.get(k).is_some(), "has {k}");
    }
    for k in ["id", "object", "created_at", "status", "model", "usage"] {
        assert_eq!(ours[k], rec[k], "{k}");
    }
    assert_eq!(ours["output"][0]["content"], rec["output"][0]["content"]);
    assert_eq!(ours["output"][0]["role"], "assistant");
}

#[test]
fn tool_ids_round_trip_across_turns() {
    let mut m = Message::text(Role::Assistant, "checking");
    m.tool_calls = vec![
        ToolCall {
            id: "call_1".into(),
            name: "exec_command".into(),
            arguments: "{\"cmd\":\"ls\"}".into(),
        },
        ToolCall {
            id: "call_2".into(),
            name: "exec_command".into(),
            arguments: "{\"cmd\":\"pwd\"}".into(),
        },
    ];
    let resp = ChatResponse {
        id: "resp_9".into(),
        model: "gpt-5".into(),
        message: m,
        finish_reason: FinishReason::ToolCalls,
        usage: usage(),
        tokens: Default::default(),
    };
    let native = fixtures::reply_json(&OpenaiResponses::response_body(&resp, &opts()));
    let mut input = vec![json!({"type": "message", "role": "user", "content": "go"})];
    input.extend(native["output"].as_array().unwrap().iter().cloned());
    for o in native["output"].as_array().unwrap() {
        if o["type"] == "function_call" {
            input.push(
                json!({"type": "function_call_output", "call_id": o["call_id"], "output": "ok"}),
            );
        }
    }
    let r = parse(&json!({"model": "gpt-5", "input": input})).request;
    assert_eq!(r.messages.len(), 4);
    let ids: Vec<&str> = r.messages[1]
        .tool_calls
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(ids, ["call_1", "call_2"]);
    assert_eq!(r.messages[1].joined_text(), "checking");
    assert_eq!(r.messages[2].tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(r.messages[3].tool_call_id.as_deref(), Some("call_2"));
}

#[test]
fn errors_in_openai_shape() {
    let err = ProviderError::new(Side::Backend, ErrorKind::Overloaded, "busy");
    let (status, body) = error_body(&err);
    assert_eq!(status, 503, "Codex CLI retries 5xx, not 429");
    assert_eq!(body["error"]["code"], "server_is_overloaded");
    let mut enc = OpenaiResponses::encoder(&opts());
    let mut out = enc
        .push(&StreamEvent::TextDelta { text: "x".into() })
        .to_vec();
    out.extend_from_slice(&enc.error(&err));
    let ev = sse_json(&out);
    let last = &ev.last().unwrap().1;
    assert_eq!(last["type"], "response.failed");
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(last["response"]["error"]["code"], "server_is_overloaded");
}

/// A body with escapes in text and keys, numbers in several forms, a
/// repeated key and unknown fields, read from its text (not re-serialized):
/// the request is the one written out here, and the one `serde_json`'s
/// reading of the same text gives.
#[test]
fn raw_text_with_escapes_and_numbers() {
    let body = r#"{
      "mod\u0065l": "gpt-5",
      "instructions": "Be \"brief\"\n\u00e9",
      "in\u0070ut": [
        {"role": "user", "content": [
          {"type": "input_text", "text": "tab\there \ud83d\ude00 \/ end", "x\u002dnote": "k\u00e9y"},
          {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K"}
        ]},
        {"t\u0079pe": "reasoning", "id": "rs_1",
         "summary": [{"type": "summary_text", "text": "step \"one\""}, {"type": "summary_text", "text": "two"}],
         "encrypted_content": "enc\u002b"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_\u0031", "name": "shell",
         "arguments": "{\"cmd\": \"ls -l\"}", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1",
         "output": {"ok" : true, "n": [1, -2, 3.50, 1e2, 18446744073709551615, -9223372036854775808], "m": "a\u0022b"}},
        {"type": "local_shell_call", "call_id": "ls_1",
         "action": {"command": ["echo", "a\u0062"], "timeout_ms": 1.0e3}},
        {"type": "local_shell_call_output", "call_id": "ls_1", "output": 42},
        {"type": "custom_tool_call", "call_id": "ct_1", "name": "apply_patch", "input": {"a": [1, 2]}},
        {"type": "custom_tool_call_output", "call_id": "ct_1", "output": [{"type": "input_text", "text": "d\u006fne", "extra": 0.25}]},
        {"type": "item_reference", "id": "ref_\u0031", "score": -0.0}
      ],
      "tools": [
        {"type": "function", "name": "shell", "description": "Run \u0060cmd\u0060",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string", "maxLength": 1E3}}},
         "strict": true},
        {"type": "web_search", "filters": {"allowed_domains": ["example.com"]}}
      ],
      "tool_choice": "a\u0075to",
      "max_output_tokens": 2048,
      "temperature": 5e-1,
      "top_p": 1E0,
      "top_k": 4.0,
      "stream": true,
      "previous_response_id": "resp_\u0041bc",
      "seed": -0,
      "big": 18446744073709551615,
      "metadata": {"k\u00e9y": "v\u00e4l", "n": 0.1},
      "seed": 7
    }"#;
    let p = fixtures::parse_text(&call(), body);

    let extra = |v: Value| v.as_object().cloned().unwrap();
    let msg = |role, content: Vec<Part>, extra_fields: Value| Message {
        content,
        extra: extra(extra_fields),
        ..Message::text(role, "")
    };
    let text = |t: &str| Part::Text { text: t.into() };
    let tool_call = |id: &str, name: &str, arguments: &str| ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    };
    let expected = ChatRequest {
        model: "gpt-5".into(),
        messages: vec![
            msg(
                Role::System,
                vec![text("Be \"brief\"\né")],
                json!({crate::provider::SOURCE_KEY: "instructions"}),
            ),
            msg(
                Role::User,
                vec![
                    text("tab\there \u{1F600} / end"),
                    Part::Image {
                        media_type: Some("image/png".into()),
                        data: Some("iVBORw0K".into()),
                        url: None,
                    },
                ],
                json!({"part_extra": [{"index": 0, "x-note": "kéy"}]}),
            ),
            Message {
                reasoning: Some(Reasoning {
                    text: "step \"one\"\n\ntwo".into(),
                    signature: None,
                    encrypted: Some("enc+".into()),
                }),
                tool_calls: vec![tool_call("call_1", "shell", r#"{"cmd": "ls -l"}"#)],
                ..msg(
                    Role::Assistant,
                    Vec::new(),
                    json!({"item_extra": [
                        {"index": 1, "type": "reasoning", "id": "rs_1"},
                        {"index": 2, "id": "fc_1", "status": "completed"},
                    ]}),
                )
            },
            Message {
                tool_call_id: Some("call_1".into()),
                name: Some("shell".into()),
                ..msg(
                    Role::Tool,
                    vec![text(
                        r#"{"ok":true,"n":[1,-2,3.5,100.0,18446744073709551615,-9223372036854775808],"m":"a\"b"}"#,
                    )],
                    json!({}),
                )
            },
            Message {
                tool_calls: vec![tool_call(
                    "ls_1",
                    "local_shell",
                    r#"{"command":["echo","ab"],"timeout_ms":1000.0}"#,
                )],
                ..msg(
                    Role::Assistant,
                    Vec::new(),
                    json!({"item_extra": [{"index": 4, "type": "local_shell_call"}]}),
                )
            },
            Message {
                tool_call_id: Some("ls_1".into()),
                name: Some("local_shell".into()),
                ..msg(
                    Role::Tool,
                    vec![text("42")],
                    json!({"type": "local_shell_call_output"}),
                )
            },
            Message {
                tool_calls: vec![tool_call("ct_1", "apply_patch", r#"{"a":[1,2]}"#)],
                ..msg(
                    Role::Assistant,
                    Vec::new(),
                    json!({"item_extra": [{"index": 6, "type": "custom_tool_call"}]}),
                )
            },
            Message {
                tool_call_id: Some("ct_1".into()),
                name: Some("apply_patch".into()),
                ..msg(
                    Role::Tool,
                    vec![text("done")],
                    json!({
                        "part_extra": [{"index": 0, "extra": 0.25}],
                        "type": "custom_tool_call_output",
                    }),
                )
            },
        ],
        tools: vec![Tool {
            name: "shell".into(),
            description: Some("Run `cmd`".into()),
            parameters: polar_json::RawJson::from_value(
                &json!({"type": "object", "properties": {"cmd": {"type": "string", "maxLength": 1000.0}}}),
            ),
        }],
        tool_choice: Some(ToolChoice::Auto),
        response_format: None,
        sampling: Sampling {
            max_tokens: Some(2048),
            temperature: Some(0.5),
            top_p: Some(1.0),
            top_k: None,
            stop: Vec::new(),
            seed: None,
        },
        stream: true,
        extra: extra(json!({
            "seed": 7,
            "big": 18_446_744_073_709_551_615_u64,
            "metadata": {"kéy": "väl", "n": 0.1},
            "input_other": [{"index": 8, "item": {"type": "item_reference", "id": "ref_1", "score": -0.0}}],
            "tools_other": [{"type": "web_search", "filters": {"allowed_domains": ["example.com"]}}],
            "tool_extra": [{"name": "shell", "strict": true}],
        })),
    };
    assert_eq!(
        p,
        ParsedRequest {
            request: expected,
            previous_response_id: Some("resp_Abc".into()),
            include_usage: false,
            compaction: false,
        }
    );
}

/// Order rules of a Responses stream.
fn check_stream(bytes: &[u8]) {
    let ev = sse_json(bytes);
    let mut seq = None;
    let mut items: Vec<(String, bool)> = Vec::new();
    let mut terminal = false;
    for (i, (name, v)) in ev.iter().enumerate() {
        let name = name.as_deref().unwrap();
        assert_eq!(v["type"], name);
        assert!(!terminal, "nothing after the terminal event");
        let s = v["sequence_number"].as_u64().unwrap();
        assert!(seq.is_none_or(|p| s > p), "sequence_number increases");
        seq = Some(s);
        match name {
            "response.created" => assert_eq!(i, 0),
            "response.in_progress" => assert_eq!(i, 1),
            "response.output_item.added" => {
                assert_eq!(v["output_index"].as_u64().unwrap() as usize, items.len());
                items.push((v["item"]["id"].as_str().unwrap().to_owned(), false));
            }
            "response.output_item.done" => {
                let k = v["output_index"].as_u64().unwrap() as usize;
                assert_eq!(items[k].0, v["item"]["id"].as_str().unwrap());
                assert!(!items[k].1, "done once");
                items[k].1 = true;
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                terminal = true;
                if name != "response.failed" {
                    assert!(items.iter().all(|(_, d)| *d), "all items done");
                    let out = v["response"]["output"].as_array().unwrap();
                    let ids: Vec<&str> = out.iter().map(|o| o["id"].as_str().unwrap()).collect();
                    let want: Vec<&str> = items.iter().map(|(id, _)| id.as_str()).collect();
                    assert_eq!(ids, want);
                }
            }
            _ => {
                let k = v["output_index"].as_u64().unwrap() as usize;
                assert_eq!(
                    items[k].0,
                    v["item_id"].as_str().unwrap(),
                    "{name} names its item"
                );
                assert!(!items[k].1, "{name} before the item is done");
            }
        }
    }
    assert!(terminal);
}

proptest! {
    #[test]
    fn any_event_sequence_gives_a_valid_stream(events in strategies::events()) {
        let mut enc = OpenaiResponses::encoder(&opts());
        let mut out = encode_all(&mut enc, &events).to_vec();
        if !enc.is_done() {
            out.extend_from_slice(&enc.error(&ProviderError::new(Side::Backend, ErrorKind::BackendTimeout, "t")));
        }
        check_stream(&out);
    }

    #[test]
    fn reply_reads_back_as_the_next_input(r in strategies::response(), stream in any::<bool>()) {
        let output = if stream {
            let bytes = encode_all(&mut OpenaiResponses::encoder(&opts()), &events_of(&r));
            let last = sse_json(&bytes).pop().unwrap().1;
            last["response"]["output"].clone()
        } else {
            fixtures::reply_json(&OpenaiResponses::response_body(&r, &opts()))["output"].clone()
        };
        let mut input = vec![json!({"role": "user", "content": "q"})];
        input.extend(output.as_array().unwrap().iter().cloned());
        let mut msgs = parse(&json!({"model": "m", "input": input})).request.messages;
        let back = if msgs.len() > 1 { msgs.pop().unwrap() } else { Message::text(Role::Assistant, "") };
        prop_assert_eq!(back.joined_text(), r.message.joined_text());
        prop_assert_eq!(
            back.reasoning.clone().map(|x| (x.text, x.encrypted)),
            r.message.reasoning.clone().map(|x| (x.text, x.signature))
        );
        prop_assert_eq!(&back.tool_calls, &r.message.tool_calls);
    }
}

/// A reply echoes the requested `text.format` (whole and streamed, in
/// `response.completed`), as the Responses API does; `text` without one.
#[test]
fn replies_echo_the_requested_text_format() {
    let schema = json!({"type": "object", "properties": {"title": {"type": "string"}}});
    let req = parse(&json!({"model": "m", "input": "q",
        "text": {"format": {"type": "json_schema", "name": "title", "schema": schema, "strict": true}}}));
    let mut o = req.reply_options(&call(), 1);
    let r = ChatResponse {
        id: "r".into(),
        model: "m".into(),
        message: Message::text(Role::Assistant, "{\"title\":\"x\"}"),
        finish_reason: FinishReason::Stop,
        usage: usage(),
        tokens: crate::Tokens::default(),
    };
    let echoed = json!({"type": "json_schema", "name": "title", "schema": schema, "strict": true});
    assert_eq!(
        fixtures::reply_json(&OpenaiResponses::response_body(&r, &o))["text"]["format"],
        echoed
    );
    let bytes = encode_all(&mut OpenaiResponses::encoder(&o), &events_of(&r));
    let last = sse_json(&bytes).pop().unwrap().1;
    assert_eq!(last["response"]["text"]["format"], echoed);
    o.response_format = Some(crate::ResponseFormat::JsonObject);
    assert_eq!(
        fixtures::reply_json(&OpenaiResponses::response_body(&r, &o))["text"]["format"],
        json!({"type": "json_object"})
    );
    assert_eq!(
        fixtures::reply_json(&OpenaiResponses::response_body(&r, &opts()))["text"]["format"],
        json!({"type": "text"})
    );
}
