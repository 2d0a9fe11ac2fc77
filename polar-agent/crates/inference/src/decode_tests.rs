use serde_json::{Value, json};

use super::*;

fn feed(d: &mut ChunkDecoder, chunks: &[serde_json::Value]) -> Vec<StreamEvent> {
    let mut out = VecDeque::new();
    for c in chunks {
        d.on_data(&c.to_string(), &mut out).unwrap();
    }
    d.on_data("[DONE]", &mut out).unwrap();
    out.into()
}

#[test]
fn tool_call_fragments_become_start_and_deltas() {
    let mut d = ChunkDecoder::new("shown");
    let events = feed(
        &mut d,
        &[
            json!({"id": "r1", "model": "m", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"delta": {"reasoning_content": "hmm"}, "token_ids": [7], "logprobs": {"content": [{"logprob": -0.5}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\""}}]}, "token_ids": [8]}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_x", "type": "function", "function": {"name": "bash"}}]}, "token_ids": [9]}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}, {"index": 1, "function": {"name": "ls", "arguments": "{}"}}]}, "token_ids": [10], "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1}}}),
        ],
    );
    assert_eq!(
        events,
        vec![
            StreamEvent::Start {
                id: "r1".into(),
                model: "shown".into(),
                prompt_tokens: Some(2)
            },
            StreamEvent::ReasoningDelta { text: "hmm".into() },
            StreamEvent::ReasoningDone { signature: None },
            StreamEvent::ToolCallStart {
                index: 0,
                id: "call_x".into(),
                name: "bash".into()
            },
            StreamEvent::ToolCallDelta {
                index: 0,
                arguments: "{\"a\"".into()
            },
            StreamEvent::ToolCallDelta {
                index: 0,
                arguments: ":1}".into()
            },
            StreamEvent::ToolCallStart {
                index: 1,
                id: "r1-call-1".into(),
                name: "ls".into()
            },
            StreamEvent::ToolCallDelta {
                index: 1,
                arguments: "{}".into()
            },
            StreamEvent::Finish {
                finish_reason: FinishReason::ToolCalls,
                usage: Usage {
                    prompt_tokens: 2,
                    completion_tokens: 4,
                    cached_tokens: Some(1)
                },
            },
        ]
    );
    let t = d.tokens.tokens();
    assert_eq!(t.prompt_token_ids, Some(vec![1, 2]));
    assert_eq!(t.response_token_ids, Some(vec![7, 8, 9, 10]));
    assert_eq!(
        t.response_logprobs, None,
        "one logprob for four tokens cannot be aligned"
    );
}

#[test]
fn prompt_ids_are_versioned_and_response_tokens_only_grow() {
    let mut d = ChunkDecoder::new("m");
    let mut out = VecDeque::new();
    let mut push = |d: &mut ChunkDecoder, v: serde_json::Value| {
        d.on_data(&v.to_string(), &mut out).unwrap();
    };
    // The first chunk without prompt ids: not known yet.
    push(
        &mut d,
        json!({"id": "r", "choices": [{"delta": {"role": "assistant"}}]}),
    );
    assert_eq!((d.tokens.prompt(), d.tokens.prompt_version()), (None, 0));
    push(&mut d, json!({"choices": [{"delta": {}, "token_ids": []}]}));
    assert_eq!(d.tokens.prompt_version(), 0, "no ids, no new version");
    // Known from a later chunk; then kept, whatever later chunks say.
    push(
        &mut d,
        json!({"prompt_token_ids": [1, 2], "choices": [{"delta": {"content": "a"}, "token_ids": [7], "logprobs": {"content": [{"logprob": -0.5}]}}]}),
    );
    assert_eq!(d.tokens.prompt(), Some(&[1, 2][..]));
    assert_eq!(d.tokens.prompt_version(), 1);
    let before: (Vec<u32>, Vec<f32>) = {
        let (ids, lps) = d.tokens.response();
        (ids.to_vec(), lps.to_vec())
    };
    push(
        &mut d,
        json!({"prompt_token_ids": [3], "choices": [{"delta": {"content": "b"}, "token_ids": [8, 9], "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]}}]}),
    );
    assert_eq!(d.tokens.prompt(), Some(&[1, 2][..]));
    assert_eq!(d.tokens.prompt_version(), 1);
    let (ids, lps) = d.tokens.response();
    assert_eq!((ids, lps), (&[7, 8, 9][..], &[-0.5, -1.0, -2.0][..]));
    assert!(ids.starts_with(&before.0) && lps.starts_with(&before.1));

    // A whole reply: its prompt ids set once.
    let w = decode_whole(
        json!({"prompt_token_ids": [4], "choices": [{"message": {"content": "x"}, "token_ids": [5], "finish_reason": "stop"}]})
            .to_string()
            .as_bytes(),
        "m",
    )
    .unwrap();
    assert_eq!(
        (w.tokens.prompt(), w.tokens.prompt_version()),
        (Some(&[4][..]), 1)
    );
    assert_eq!(w.tokens.response().0, &[5]);
}

#[test]
fn replies_without_ids_give_none() {
    let mut d = ChunkDecoder::new("m");
    feed(
        &mut d,
        &[
            json!({"id": "r", "choices": [{"delta": {"role": "assistant"}}]}),
            json!({"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}),
        ],
    );
    assert_eq!(d.tokens.tokens(), Tokens::default());
}

#[test]
fn errors_and_early_ends() {
    let mut d = ChunkDecoder::new("m");
    let mut out = VecDeque::new();
    d.on_data(&json!({"id": "r", "choices": []}).to_string(), &mut out)
        .unwrap();
    let err = d.on_data(
        &json!({"error": {"message": "engine died"}}).to_string(),
        &mut out,
    );
    assert_eq!(
        err,
        Err(DecodeError::Cut(
            "backend error in stream: engine died".into()
        ))
    );
    let mut d = ChunkDecoder::new("m");
    d.on_data(
        &json!({"id": "r", "choices": [{"delta": {"content": "x"}}]}).to_string(),
        &mut out,
    )
    .unwrap();
    assert!(matches!(d.end(&mut out), Err(DecodeError::Cut(_))));
    assert!(matches!(
        ChunkDecoder::new("m").on_data("{not json", &mut out),
        Err(DecodeError::Malformed(_))
    ));
}

#[test]
fn whole_sglang_reply_with_meta_info_only() {
    let body = json!({
        "id": "x", "model": "served",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok", "reasoning_content": null, "tool_calls": null},
                     "finish_reason": "stop", "prompt_token_ids": [1, 2, 3],
                     "meta_info": {"output_token_logprobs": [[-0.1, 40, "o"], [-0.2, 2, null]], "weight_version": "v3", "cached_tokens": 2}}],
    });
    let w = decode_whole(body.to_string().as_bytes(), "shown").unwrap();
    let t = w.tokens.tokens();
    assert_eq!(t.prompt_token_ids, Some(vec![1, 2, 3]));
    assert_eq!(t.response_token_ids, Some(vec![40, 2]));
    assert_eq!(t.response_logprobs, Some(vec![-0.1, -0.2]));
    assert_eq!(w.weight_version.as_deref(), Some("v3"));
    assert_eq!(
        w.events.last(),
        Some(&StreamEvent::Finish {
            finish_reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: Some(2)
            }
        })
    );
    assert!(matches!(
        decode_whole(b"{\"choices\": []}", "m"),
        Err(DecodeError::Malformed(_))
    ));
}

/// SGLang's chat replies carry the weight version in a top-level
/// `metadata` object (`ChatCompletionResponse.metadata` in
/// `sglang/srt/entrypoints/openai/protocol.py`); `meta_info`'s wins.
#[test]
fn whole_sglang_reply_with_top_level_metadata_weight_version() {
    let reply = |meta_info: Value| {
        json!({
            "id": "x", "model": "served",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                         "finish_reason": "stop", "prompt_token_ids": [1],
                         "meta_info": meta_info}],
            "metadata": {"weight_version": "w-7"},
        })
        .to_string()
    };
    let out = json!({"output_token_logprobs": [[-0.1, 40, "o"]]});
    let w = decode_whole(reply(out.clone()).as_bytes(), "m").unwrap();
    assert_eq!(w.weight_version.as_deref(), Some("w-7"));
    let mut both = out;
    both["weight_version"] = json!("w-8");
    let w = decode_whole(reply(both).as_bytes(), "m").unwrap();
    assert_eq!(w.weight_version.as_deref(), Some("w-8"));
}

/// What the reply's text spells: strings are unescaped (with or without
/// escapes), a repeated key reads as its last occurrence (as
/// `serde_json::Value` reads it), arguments that are not a string are
/// passed on as their compact JSON, and an error without a message is
/// shown as its compact JSON.
#[test]
fn escapes_repeated_keys_and_non_string_arguments_read_as_serde_json_reads_them() {
    let mut d = ChunkDecoder::new("m");
    let mut out = VecDeque::new();
    let chunks = [
        r#"{"id": "r\u0031", "id": "r\"2", "choices": [{"delta": {"content": "a\nb \u00e9\ud83d\ude00"}, "token_ids": [5]}]}"#,
        r#"{"choices": [{"delta": {"content": ""}, "token_ids": [6], "finish_reason": "length", "finish_reason": "stop"}]}"#,
        "[DONE]",
    ];
    for c in chunks {
        d.on_data(c, &mut out).unwrap();
    }
    let events: Vec<StreamEvent> = out.into();
    assert_eq!(
        events,
        vec![
            StreamEvent::Start {
                id: "r\"2".into(),
                model: "m".into(),
                prompt_tokens: None
            },
            StreamEvent::TextDelta {
                text: "a\nb \u{e9}\u{1f600}".into()
            },
            StreamEvent::Finish {
                finish_reason: FinishReason::Stop,
                usage: Usage {
                    prompt_tokens: 0,
                    completion_tokens: 2,
                    cached_tokens: None
                }
            },
        ]
    );
    assert_eq!(d.tokens.tokens().response_token_ids, Some(vec![5, 6]));

    let body = br#"{"id": "w", "choices": [{"message": {"content": null, "tool_calls": [
        {"id": "c1", "function": {"name": "b\u0061sh", "arguments": {"cmd":  "ls",  "n": 1.50e1}}},
        {"function": {"name": "ls"}}]}, "finish_reason": "tool_calls"}]}"#;
    let w = decode_whole(body, "m").unwrap();
    assert_eq!(
        w.events[1..3],
        [
            StreamEvent::ToolCallStart {
                index: 0,
                id: "c1".into(),
                name: "bash".into()
            },
            StreamEvent::ToolCallDelta {
                index: 0,
                arguments: r#"{"cmd":"ls","n":15.0}"#.into()
            },
        ]
    );
    assert_eq!(
        w.events[3],
        StreamEvent::ToolCallStart {
            index: 1,
            id: String::new(),
            name: "ls".into()
        }
    );

    let err = ChunkDecoder::new("m").on_data(
        r#"{"error": {"code": 500,  "type": "x"}}"#,
        &mut VecDeque::new(),
    );
    assert_eq!(
        err,
        Err(DecodeError::Cut(
            r#"backend error in stream: {"code":500,"type":"x"}"#.into()
        ))
    );
}
