//! Requests read from their own text (escapes in text and keys, number
//! forms, repeated keys, unknown fields as written) translate as
//! serde_json's reading of the same text does, and the backend body the
//! client writes carries the escaped text and schemas as the harness wrote
//! them while reading as the same JSON as the reference body
//! (`request::chat_body`). The provider tests of `polar-chat` cannot see
//! the inference client, so these live here.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

use polar_chat::Api;
use polar_chat::provider::{Framing, ModelCall, ParsedRequest, parse_request, parse_request_value};
use polar_inference::{BackendConfig, Dialect, SamplingMode, request, wire};
use serde_json::{Value, json};

/// `text` translated as the agent reads bodies (from its own text), after
/// checking that serde_json's reading of the same text translates the same.
fn parse_text(api: Api, text: &str) -> ParsedRequest {
    let call = ModelCall {
        api,
        framing: Framing::Sse,
        path_model: None,
    };
    let doc = polar_json::Doc::parse(text.as_bytes()).unwrap();
    let ours = parse_request(&call, doc.root()).unwrap();
    let value: Value = serde_json::from_str(text).unwrap();
    assert_eq!(ours, parse_request_value(&call, &value).unwrap());
    ours
}

/// The backend body the agent writes for `req`, after checking that it
/// reads as the same JSON as the reference tree (`request::chat_body`).
fn backend_body(req: &polar_chat::ChatRequest) -> String {
    let cfg = BackendConfig::new("b", Dialect::Vllm, vec![], "served");
    let mode = SamplingMode::Train;
    let body = String::from_utf8(wire::chat_body_bytes(&cfg, req, mode)).unwrap();
    let reference = request::chat_body(&cfg, req, mode);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), reference);
    body
}

/// Read from its own text (escapes in text and keys, number forms, repeated
/// keys, unknown fields as written), a Claude Code turn translates as
/// serde_json's reading of the same text does; its escaped text and schema
/// reach the backend body as written.
#[test]
fn anthropic_reads_escapes_numbers_and_unknown_fields_from_the_text() {
    let text = r#"{
        "mod\u0065l": "claude-opus-4-8", "max_tokens": 32000, "stream": true, "temperature": 1E0,
        "top_k": 40.0, "metadata": {"user_id": "u\/1"},
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1;"},
                   {"type": "text", "text": "You are\n\t\"Claude\" \u00e9", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "fix it\n\ud83d\ude00", "k": 1, "k": 2},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan\n", "signature": "s\/g"},
                {"type": "text", "text": "Running"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash",
                 "input": {"command": "ls -la\n", "timeout": 1.50, "n": -0}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false,
                 "content": [{"type": "text", "text": "a.txt\nb\u0001.txt\n"}]},
                {"type": "text", "text": "next", "cache_control": {"type": "ephemeral"}}
            ]}
        ],
        "tools": [{"name": "Bash", "description": "Run\na command",
                   "input_schema": {"type": "object", "properties": {"command": {"type": "string", "maxLength": 1.0e3}}},
                   "cache_control": {"type": "ephemeral"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}
    }"#;
    let ours = parse_text(Api::AnthropicMessages, text);
    let r = &ours.request;
    assert_eq!(r.model, "claude-opus-4-8");
    assert_eq!(
        r.extra["anthropic_billing_header"],
        "x-anthropic-billing-header: cc=1;"
    );
    assert_eq!(r.messages[0].joined_text(), "You are\n\t\"Claude\" é");
    assert_eq!(r.messages[1].joined_text(), "fix it\n😀");
    assert_eq!(r.messages[1].extra["k"], json!(2));
    let call0 = &r.messages[2].tool_calls[0];
    assert_eq!(
        call0.arguments,
        json!({"command": "ls -la\n", "timeout": 1.5, "n": -0.0}).to_string()
    );
    assert_eq!(r.messages[3].joined_text(), "a.txt\nb\u{1}.txt\n");
    assert_eq!(r.sampling.top_k, None);
    // The backend body: the text and the schema as the harness wrote them,
    // the same JSON as the reference body.
    let body = backend_body(r);
    assert!(body.contains(r#""You are\n\t\"Claude\" \u00e9""#), "{body}");
    assert!(body.contains(r#""maxLength": 1.0e3"#), "{body}");
}

/// Read from its own text (escapes, number forms, repeated keys, unknown
/// fields as written), a request translates as serde_json's reading of the
/// same text does, and its escaped text reaches the backend body as written.
#[test]
fn openai_chat_reads_escapes_numbers_and_unknown_fields_from_the_text() {
    let text = r#"{
        "mod\u0065l": "qwen3-coder", "stream": true, "temperature": 5e-1, "top_p": 0.950,
        "max_tokens": 100, "max_completion_tokens": 2048, "top_k": 4.0, "seed": -0,
        "stream_options": {"include_usage": true, "x": [1e2]},
        "messages": [
            {"role": "system", "content": "Be \"brief\"\n\t\u00e9 \ud83d\ude00 a\/b", "tag": {"k": 1, "k": 2}},
            {"role": "user", "content": [
                {"type": "text", "text": "line\none", "cache": {"t": "eph"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR", "detail": "low"}},
                {"type": "input_audio", "x": 1.50}
            ]},
            {"role": "assistant", "content": null, "reasoning_content": "think\n",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "run", "arguments": "{\"cmd\": \"ls\\n\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "out\u0001"}]}
        ],
        "tools": [{"type": "function", "function": {"name": "run", "description": "Run\n",
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string", "maxLength": 1.0e3}}},
                   "strict": true}},
                  {"type": "web_search"}],
        "tool_choice": {"type": "function", "function": {"name": "run"}}
    }"#;
    let ours = parse_text(Api::OpenaiChat, text);
    let r = &ours.request;
    assert!(ours.include_usage);
    assert_eq!(r.model, "qwen3-coder");
    assert_eq!(r.sampling.max_tokens, Some(2048));
    assert_eq!(r.sampling.temperature, Some(0.5));
    assert_eq!(r.sampling.top_k, None);
    assert_eq!(r.messages[0].joined_text(), "Be \"brief\"\n\té 😀 a/b");
    assert_eq!(r.messages[0].extra["tag"], json!({"k": 2}));
    assert_eq!(
        r.messages[2].tool_calls[0].arguments,
        "{\"cmd\": \"ls\\n\"}"
    );
    assert_eq!(r.messages[3].joined_text(), "out\u{1}");
    assert_eq!(r.extra["seed"], json!(-0.0));
    // The backend body carries the text as the harness escaped it, and
    // reads as the same JSON as the reference body.
    let body = backend_body(r);
    assert!(
        body.contains(r#""Be \"brief\"\n\t\u00e9 \ud83d\ude00 a\/b""#),
        "{body}"
    );
}
