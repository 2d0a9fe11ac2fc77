use serde_json::json;

use super::super::OpenaiResponses;
use super::*;
use crate::provider::fixtures::{self, sse_json};
use crate::provider::{
    Framing, ModelCall, Protocol, ReplyOptions, encode_all, parse_request_value,
};
use crate::{Api, ChatResponse, FinishReason, StreamEvent, Tokens, Usage};

fn call() -> ModelCall {
    ModelCall {
        api: Api::OpenaiResponses,
        framing: Framing::Sse,
        path_model: None,
    }
}

fn opts(compaction: bool) -> ReplyOptions {
    ReplyOptions {
        created: 1,
        include_usage: false,
        framing: Framing::Sse,
        response_format: None,
        compaction,
    }
}

fn usage() -> Usage {
    Usage {
        prompt_tokens: 900,
        completion_tokens: 12,
        cached_tokens: None,
    }
}

fn trigger_request() -> serde_json::Value {
    json!({
        "model": "gpt-5", "stream": true, "store": false,
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the test"}]},
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.rs"},
            {"type": "compaction_trigger"},
        ],
    })
}

#[test]
fn a_trigger_becomes_a_summary_request_without_tools() {
    let p = parse_request_value(&call(), &trigger_request()).unwrap();
    assert!(p.compaction);
    assert!(p.reply_options(&call(), 1).compaction);
    let r = &p.request;
    assert!(r.tools.is_empty(), "a summary is offered no tools");
    assert_eq!(r.tool_choice, None);
    let last = r.messages.last().unwrap();
    assert_eq!(last.role, Role::User);
    assert_eq!(last.joined_text(), INSTRUCTIONS);
    assert_eq!(last.extra[SOURCE_KEY], TRIGGER);
    // The conversation before it is kept as it was.
    assert_eq!(r.messages.len(), 4);
    assert_eq!(r.messages[1].tool_calls[0].id, "c1");

    let mut misplaced = trigger_request();
    let input = misplaced["input"].as_array_mut().unwrap();
    input.swap(2, 3);
    let err = parse_request_value(&call(), &misplaced).unwrap_err();
    assert!(
        err.message
            .contains("input[2]: compaction_trigger must be the last"),
        "{}",
        err.message
    );

    let plain = parse_request_value(&call(), &json!({"model": "m", "input": "hi"})).unwrap();
    assert!(!plain.compaction);
}

#[test]
fn the_reply_is_exactly_one_compaction_item_streamed_or_whole() {
    let events = vec![
        StreamEvent::Start {
            id: "resp_7".into(),
            model: "gpt-5".into(),
            prompt_tokens: Some(900),
        },
        StreamEvent::ReasoningDelta {
            text: "let me think".into(),
        },
        StreamEvent::TextDelta {
            text: "The test ".into(),
        },
        StreamEvent::TextDelta {
            text: "fails in a.rs.".into(),
        },
        StreamEvent::Finish {
            finish_reason: FinishReason::Stop,
            usage: usage(),
        },
    ];
    let bytes = encode_all(&mut OpenaiResponses::encoder(&opts(true)), &events);
    let ev = sse_json(&bytes);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_deref().unwrap_or("")).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (i, (_, v)) in ev.iter().enumerate() {
        assert_eq!(v["sequence_number"], i);
    }
    assert_eq!(ev[2].1["item"]["type"], ITEM);
    let item = &ev[3].1["item"];
    assert_eq!(item["type"], ITEM);
    assert_eq!(item["id"], ev[2].1["item"]["id"]);
    assert_eq!(item["encrypted_content"], encode("The test fails in a.rs."));
    let done = &ev[4].1["response"];
    assert_eq!(done["output"], json!([item]));
    assert_eq!(done["status"], "completed");
    assert_eq!(done["usage"]["input_tokens"], 900);

    let whole = ChatResponse {
        id: "resp_7".into(),
        model: "gpt-5".into(),
        message: crate::Message::text(Role::Assistant, "The test fails in a.rs."),
        finish_reason: FinishReason::Stop,
        usage: usage(),
        tokens: Tokens::default(),
    };
    let body = fixtures::reply_json(&OpenaiResponses::response_body(&whole, &opts(true)));
    let output = body["output"].as_array().unwrap();
    assert_eq!(output.len(), 1);
    assert_eq!(output[0]["type"], ITEM);
    assert_eq!(
        output[0]["encrypted_content"],
        encode("The test fails in a.rs.")
    );
    // Without the trigger, the same reply is a message.
    let body = fixtures::reply_json(&OpenaiResponses::response_body(&whole, &opts(false)));
    assert_eq!(body["output"][0]["type"], "message");
}

#[test]
fn a_compaction_item_expands_into_its_summary_and_a_foreign_one_is_kept_aside() {
    let body = json!({
        "model": "gpt-5",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the test"}]},
            {"type": "compaction", "id": "cmp_1", "encrypted_content": encode("The test fails in a.rs.")},
            {"type": "compaction", "id": "cmp_2", "encrypted_content": "gAAAA-not-ours"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]},
        ],
    });
    let p = parse_request_value(&call(), &body).unwrap();
    assert!(!p.compaction);
    let m = &p.request.messages;
    assert_eq!(m.len(), 3);
    assert_eq!(m[1].role, Role::User);
    assert_eq!(m[1].joined_text(), "The test fails in a.rs.");
    assert_eq!(m[1].extra[SOURCE_KEY], ITEM);
    assert_eq!(m[2].joined_text(), "go on");
    assert_eq!(
        p.request.extra["input_other"],
        json!([{"index": 2, "item": body["input"][2]}])
    );
    assert_eq!(decode("gAAAA-not-ours"), None);
}
