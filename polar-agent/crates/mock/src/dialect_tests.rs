//! The mock's dialects field by field against the real servers' published
//! protocol definitions: one test per field, each naming its source.
//!
//! - vLLM: `vllm/entrypoints/openai/protocol.py` (`ChatCompletionResponse`,
//!   `ChatCompletionResponseChoice`, `ChatMessage`,
//!   `ChatCompletionStreamResponse`, `ChatCompletionResponseStreamChoice`,
//!   `TokenizeResponse`; `entrypoints/openai/chat_completion/protocol.py`
//!   in newer releases);
//! - SGLang: `python/sglang/srt/entrypoints/openai/protocol.py`
//!   (`ChatCompletionResponse`, `ChatCompletionResponseChoice`,
//!   `ChatMessage`, `UsageInfo`, `TokenizeRequest`, `TokenizeResponse`) and
//!   `python/sglang/srt/entrypoints/openai/serving_chat.py`
//!   (`_build_chat_response`, `_process_messages`,
//!   `_convert_to_internal_request`).
//!
//! Also: structured output and tool choice over HTTP (see
//! [`super::constrain`]).

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::script::{Script, SessionScript, Turn};
use super::tests::request;
use super::*;

async fn mock(dialect: Dialect) -> MockHandle {
    start(MockConfig {
        dialect,
        ..MockConfig::default()
    })
    .await
    .unwrap()
}

async fn post(mock: &MockHandle, path: &str, body: &Value) -> (StatusCode, Value) {
    let (status, _, bytes) = request(
        Method::POST,
        &format!("{}{path}", mock.url()),
        Some(body),
        &[],
    )
    .await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "description": "Run",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "read", "description": "Read",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])
}

/// The body Polar's inference client sends to `dialect` (see
/// `polar_inference::request`), with tools (`with_tools`) or not.
fn body(dialect: Dialect, with_tools: bool) -> Value {
    let mut b = json!({
        "model": "asked-model", "stream": false,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"}],
        "logprobs": true,
    });
    if with_tools {
        b["tools"] = tools();
    }
    match dialect {
        Dialect::Vllm => {
            b["return_token_ids"] = json!(true);
            b["top_logprobs"] = json!(0);
        }
        Dialect::Sglang => {
            b["return_prompt_token_ids"] = json!(true);
            b["return_meta_info"] = json!(true);
        }
    }
    b
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The text a streamed chat reply of `body` carries at `pointer` of its
/// chunks' first delta, joined.
async fn streamed(m: &MockHandle, body: &Value, pointer: &str) -> String {
    let (_, _, bytes) = request(
        Method::POST,
        &format!("{}/v1/chat/completions", m.url()),
        Some(body),
        &[],
    )
    .await;
    std::str::from_utf8(&bytes)
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["delta"]
                .pointer(pointer)
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

/// A whole chat reply of `dialect` (with tools: the built-in policy's call).
async fn whole(dialect: Dialect, with_tools: bool) -> Value {
    let m = mock(dialect).await;
    let (status, v) = post(&m, "/v1/chat/completions", &body(dialect, with_tools)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    m.stop().await;
    v
}

// ---------------------------------------------------------------- vLLM

/// vLLM `ChatCompletionResponse.prompt_token_ids` (protocol.py): the prompt
/// ids, top level, equal to what `/tokenize` (`TokenizeResponse.tokens`)
/// gives for the same messages.
#[tokio::test]
async fn vllm_response_prompt_token_ids() {
    let m = mock(Dialect::Vllm).await;
    let (_, v) = post(&m, "/v1/chat/completions", &body(Dialect::Vllm, true)).await;
    let (_, t) = post(&m, "/tokenize", &body(Dialect::Vllm, true)).await;
    assert_eq!(ids(&v["prompt_token_ids"]), ids(&t["tokens"]));
    assert!(v["choices"][0].get("prompt_token_ids").is_none());
    m.stop().await;
}

/// vLLM `ChatCompletionResponseChoice.token_ids` (protocol.py: "useful for
/// tracing the tokens in agent scenarios"): the generated ids, one logprob
/// each, ending with the end-of-turn token.
#[tokio::test]
async fn vllm_choice_token_ids() {
    let v = whole(Dialect::Vllm, true).await;
    let c = &v["choices"][0];
    let out = ids(&c["token_ids"]);
    assert_eq!(
        out.len(),
        c["logprobs"]["content"].as_array().unwrap().len()
    );
    assert_eq!(out.last(), Some(&tokenizer::IM_END));
}

/// vLLM `ChatCompletionResponseChoice.stop_reason` (protocol.py, "included
/// in vLLM for legacy reasons"): present, `null` at an end-of-turn token.
#[tokio::test]
async fn vllm_choice_stop_reason() {
    let v = whole(Dialect::Vllm, false).await;
    assert_eq!(v["choices"][0].get("stop_reason"), Some(&Value::Null));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

/// vLLM `ChatCompletionResponse` optional fields (protocol.py):
/// `service_tier`, `system_fingerprint`, `prompt_logprobs`,
/// `kv_transfer_params`, serialized as `null`; `object` `chat.completion`.
#[tokio::test]
async fn vllm_response_optional_fields() {
    let v = whole(Dialect::Vllm, false).await;
    for key in [
        "service_tier",
        "system_fingerprint",
        "prompt_logprobs",
        "kv_transfer_params",
    ] {
        assert_eq!(v.get(key), Some(&Value::Null), "{key}");
    }
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
}

/// vLLM `ChatMessage` (protocol.py): `content`, `refusal`, `annotations`,
/// `audio`, `function_call`, `tool_calls` (a list, empty without calls),
/// and `reasoning` copied into the deprecated `reasoning_content`
/// (`handle_deprecated_reasoning_content`).
#[tokio::test]
async fn vllm_chat_message_fields() {
    let m = start(MockConfig {
        script: Some(Script {
            final_text: None,
            sessions: vec![SessionScript {
                id: "*".into(),
                turns: vec![Turn {
                    think: Some("hmm".into()),
                    text: Some("hi".into()),
                    ..Turn::default()
                }],
                ..SessionScript::default()
            }],
        }),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let (_, v) = post(&m, "/v1/chat/completions", &body(Dialect::Vllm, false)).await;
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["content"], "hi");
    assert_eq!(msg["reasoning"], "hmm");
    assert_eq!(msg["reasoning_content"], "hmm");
    assert_eq!(msg["tool_calls"], json!([]));
    for key in ["refusal", "annotations", "audio", "function_call"] {
        assert_eq!(msg.get(key), Some(&Value::Null), "{key}");
    }
    m.stop().await;
}

/// vLLM `UsageInfo` (protocol.py): `prompt_tokens`, `completion_tokens`,
/// `total_tokens`, the lengths of the ids.
#[tokio::test]
async fn vllm_usage_info() {
    let v = whole(Dialect::Vllm, true).await;
    let u = &v["usage"];
    let p = ids(&v["prompt_token_ids"]).len();
    let c = ids(&v["choices"][0]["token_ids"]).len();
    assert_eq!(u["prompt_tokens"], json!(p));
    assert_eq!(u["completion_tokens"], json!(c));
    assert_eq!(u["total_tokens"], json!(p + c));
}

/// vLLM `ChatCompletionStreamResponse.prompt_token_ids` and
/// `ChatCompletionResponseStreamChoice.token_ids` (protocol.py): the prompt
/// ids in the first chunk only, each chunk's own generated ids.
#[tokio::test]
async fn vllm_stream_prompt_and_chunk_token_ids() {
    let m = mock(Dialect::Vllm).await;
    let mut b = body(Dialect::Vllm, true);
    let (_, w) = post(&m, "/v1/chat/completions", &b).await;
    b["stream"] = json!(true);
    let (_, _, bytes) = request(
        Method::POST,
        &format!("{}/v1/chat/completions", m.url()),
        Some(&b),
        &[],
    )
    .await;
    let chunks: Vec<Value> = std::str::from_utf8(&bytes)
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(
        ids(&chunks[0]["prompt_token_ids"]),
        ids(&w["prompt_token_ids"])
    );
    assert!(
        chunks[1..]
            .iter()
            .all(|c| c.get("prompt_token_ids").is_none())
    );
    let streamed: Vec<u32> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).and_then(|c| c.get("token_ids")))
        .flat_map(ids)
        .collect();
    assert_eq!(streamed, ids(&w["choices"][0]["token_ids"]));
    m.stop().await;
}

/// vLLM `TokenizeResponse` (protocol.py): `count`, `max_model_len`,
/// `tokens`, `token_strs`; `TokenizeChatRequest.add_generation_prompt`
/// (default true) adds the assistant header.
#[tokio::test]
async fn vllm_tokenize_response_fields() {
    let m = mock(Dialect::Vllm).await;
    let mut b = body(Dialect::Vllm, false);
    let (_, t) = post(&m, "/tokenize", &b).await;
    assert_eq!(t["count"], json!(ids(&t["tokens"]).len()));
    assert_eq!(t["max_model_len"], 32_768);
    assert_eq!(t.get("token_strs"), Some(&Value::Null));
    b["add_generation_prompt"] = json!(false);
    let (_, without) = post(&m, "/tokenize", &b).await;
    assert!(without["count"].as_u64().unwrap() < t["count"].as_u64().unwrap());
    m.stop().await;
}

// ---------------------------------------------------------------- SGLang

/// SGLang `ChatCompletionResponseChoice.token_ids` (protocol.py: dropped
/// from the JSON when unset) is never set by `_build_chat_response`
/// (serving_chat.py): the chat reply carries no `token_ids`, even with
/// `return_meta_info`.
#[tokio::test]
async fn sglang_choice_has_no_token_ids() {
    let v = whole(Dialect::Sglang, true).await;
    assert!(v["choices"][0].get("token_ids").is_none(), "{v}");
    assert!(v["choices"][0].get("hidden_states").is_none());
}

/// SGLang `ChatCompletionResponseChoice.meta_info` (protocol.py), set by
/// `_build_chat_response` only with `return_meta_info`: its
/// `output_token_logprobs` are `[logprob, token_id, text]` triples, the
/// only place the response ids are; `prompt_tokens`, `completion_tokens`
/// and `weight_version` beside them.
#[tokio::test]
async fn sglang_choice_meta_info() {
    let m = mock(Dialect::Sglang).await;
    let mut b = body(Dialect::Sglang, false);
    let (_, v) = post(&m, "/v1/chat/completions", &b).await;
    let meta = &v["choices"][0]["meta_info"];
    let triples = meta["output_token_logprobs"].as_array().unwrap();
    assert!(
        triples
            .iter()
            .all(|t| t[0].as_f64().unwrap() <= 0.0 && t[1].is_u64() && t[2].is_string())
    );
    assert_eq!(triples.last().unwrap()[1], json!(tokenizer::IM_END));
    assert_eq!(meta["completion_tokens"], json!(triples.len()));
    assert_eq!(meta["weight_version"], "0");
    b["return_meta_info"] = json!(false);
    let (_, v) = post(&m, "/v1/chat/completions", &b).await;
    assert!(v["choices"][0].get("meta_info").is_none());
    m.stop().await;
}

/// SGLang `ChatCompletionResponseChoice.prompt_token_ids` (protocol.py),
/// only with `return_prompt_token_ids`; equal to what `/v1/tokenize`
/// (`TokenizeRequest` with `messages`) counts.
#[tokio::test]
async fn sglang_choice_prompt_token_ids_and_tokenize() {
    let m = mock(Dialect::Sglang).await;
    let mut b = body(Dialect::Sglang, true);
    let (_, v) = post(&m, "/v1/chat/completions", &b).await;
    let prompt = ids(&v["choices"][0]["prompt_token_ids"]);
    for path in ["/v1/tokenize", "/tokenize"] {
        let (status, t) = post(
            &m,
            path,
            &json!({"model": "m", "messages": b["messages"], "tools": b["tools"]}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(ids(&t["tokens"]), prompt, "{path}");
        assert_eq!(t["count"], json!(prompt.len()));
        assert_eq!(t["max_model_len"], 32_768);
    }
    b["return_prompt_token_ids"] = json!(false);
    let (_, v) = post(&m, "/v1/chat/completions", &b).await;
    assert!(v["choices"][0].get("prompt_token_ids").is_none());
    m.stop().await;
}

/// SGLang `TokenizeRequest.validate_tokenize_input` (protocol.py): exactly
/// one of `prompt` and `messages`; a list of prompts counts each.
#[tokio::test]
async fn sglang_tokenize_request_validation() {
    let m = mock(Dialect::Sglang).await;
    let (status, _) = post(&m, "/v1/tokenize", &json!({"model": "m"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = post(&m, "/v1/tokenize", &json!({"prompt": "a", "messages": []})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (_, t) = post(
        &m,
        "/v1/tokenize",
        &json!({"prompt": ["done", "done done"]}),
    )
    .await;
    assert_eq!(t["count"].as_array().unwrap().len(), 2);
    m.stop().await;
}

/// SGLang `ChatCompletionResponse.metadata` (protocol.py), set by
/// `_build_chat_response` to `{"weight_version": ...}`.
#[tokio::test]
async fn sglang_response_metadata_weight_version() {
    let v = whole(Dialect::Sglang, false).await;
    assert_eq!(v["metadata"], json!({"weight_version": "0"}));
}

/// SGLang `ChatCompletionResponse.model` (`_build_chat_response`:
/// `model=request.model`): the request's model name, echoed.
#[tokio::test]
async fn sglang_response_model_is_the_requested_one() {
    let v = whole(Dialect::Sglang, false).await;
    assert_eq!(v["model"], "asked-model");
}

/// SGLang `ChatMessage` (protocol.py) as `_build_chat_response` fills it:
/// `content` `""` rather than `null` ("to make sure retokenize
/// consistency"), `reasoning_content` and `tool_calls` `null` when none.
#[tokio::test]
async fn sglang_chat_message_fields() {
    let v = whole(Dialect::Sglang, true).await;
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["content"], "");
    assert_eq!(msg.get("reasoning_content"), Some(&Value::Null));
    assert_eq!(msg["tool_calls"][0]["function"]["name"], "bash");
    let v = whole(Dialect::Sglang, false).await;
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["content"], "done");
    assert_eq!(msg.get("tool_calls"), Some(&Value::Null));
}

/// SGLang `ChatCompletionResponseChoice.finish_reason` and `matched_stop`
/// (protocol.py): `_process_tool_calls` (serving_chat.py) turns a `stop`
/// with tool calls into `tool_calls` with no matched stop, in the choice
/// and in the shared `meta_info.finish_reason`; a plain stop names the
/// end-of-turn token.
#[tokio::test]
async fn sglang_finish_reason_and_matched_stop() {
    let v = whole(Dialect::Sglang, true).await;
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls");
    assert_eq!(c.get("matched_stop"), Some(&Value::Null));
    assert_eq!(
        c["meta_info"]["finish_reason"],
        json!({"type": "tool_calls", "matched": null})
    );
    let v = whole(Dialect::Sglang, false).await;
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["matched_stop"], json!(tokenizer::IM_END));
    assert_eq!(
        c["meta_info"]["finish_reason"]["matched"],
        json!(tokenizer::IM_END)
    );
}

/// SGLang `UsageInfo` (protocol.py): `prompt_tokens`, `completion_tokens`,
/// `total_tokens`, `reasoning_tokens`.
#[tokio::test]
async fn sglang_usage_info() {
    let v = whole(Dialect::Sglang, false).await;
    let u = &v["usage"];
    let p = ids(&v["choices"][0]["prompt_token_ids"]).len();
    assert_eq!(u["prompt_tokens"], json!(p));
    assert_eq!(u["reasoning_tokens"], 0);
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
}

/// SGLang `_convert_to_internal_request` (serving_chat.py):
/// `return_prompt_token_ids` and `return_meta_info` with `stream` are
/// refused.
#[tokio::test]
async fn sglang_ids_are_refused_with_streaming() {
    let m = mock(Dialect::Sglang).await;
    let mut b = body(Dialect::Sglang, false);
    b["stream"] = json!(true);
    let (status, v) = post(&m, "/v1/chat/completions", &b).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("not supported with streaming")
    );
    m.stop().await;
}

/// SGLang `_process_messages` (serving_chat.py): with `tool_choice: none`
/// the template renders no tools, with a named choice only that tool (vLLM
/// renders every tool either way).
#[tokio::test]
async fn sglang_template_tools_follow_the_tool_choice() {
    let count = |v: &Value| {
        v["choices"][0]["prompt_token_ids"]
            .as_array()
            .unwrap()
            .len()
    };
    let m = mock(Dialect::Sglang).await;
    let mut b = body(Dialect::Sglang, true);
    let (_, all) = post(&m, "/v1/chat/completions", &b).await;
    b["tool_choice"] = json!({"type": "function", "function": {"name": "read"}});
    let (_, named) = post(&m, "/v1/chat/completions", &b).await;
    let (_, t) = post(
        &m,
        "/v1/tokenize",
        &json!({"messages": b["messages"], "tools": b["tools"], "tool_choice": b["tool_choice"]}),
    )
    .await;
    assert_eq!(t["count"], json!(count(&named)));
    assert_eq!(
        named["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "read"
    );
    b["tool_choice"] = json!("none");
    let (_, none) = post(&m, "/v1/chat/completions", &b).await;
    assert!(count(&none) < count(&named) && count(&named) < count(&all));
    assert_eq!(none["choices"][0]["message"]["tool_calls"], Value::Null);
    m.stop().await;
    let m = mock(Dialect::Vllm).await;
    let mut b = body(Dialect::Vllm, true);
    let (_, all) = post(&m, "/v1/chat/completions", &b).await;
    b["tool_choice"] = json!("none");
    let (_, none) = post(&m, "/v1/chat/completions", &b).await;
    assert_eq!(all["prompt_token_ids"], none["prompt_token_ids"]);
    assert_eq!(none["choices"][0]["message"]["tool_calls"], json!([]));
    assert_eq!(none["choices"][0]["message"]["content"], "done");
    m.stop().await;
}

// ---------------------------------------------------------------- constrained decoding

/// `response_format` (`ResponseFormat` / `JsonSchemaResponseFormat` in
/// both protocol.py files): the reply is JSON valid against the schema, on
/// both dialects, whole and streamed; without it, the policy's tool call.
#[tokio::test]
async fn response_format_makes_the_reply_schema_valid_json() {
    let schema = json!({"type": "object", "properties": {
        "reasoning": {"type": "string"},
        "model_choice": {"type": "string", "enum": ["flash", "pro"]}},
        "required": ["reasoning", "model_choice"]});
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let m = mock(dialect).await;
        let mut b = body(dialect, true);
        let (_, plain) = post(&m, "/v1/chat/completions", &b).await;
        assert_eq!(
            plain["choices"][0]["finish_reason"], "tool_calls",
            "{dialect:?}"
        );
        b["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "router", "schema": schema}});
        let (status, v) = post(&m, "/v1/chat/completions", &b).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "stop", "{dialect:?}");
        let text: Value = serde_json::from_str(c["message"]["content"].as_str().unwrap()).unwrap();
        assert_eq!(
            text,
            json!({"reasoning": "polar reasoning", "model_choice": "flash"})
        );
        b["response_format"] = json!({"type": "json_object"});
        let (_, v) = post(&m, "/v1/chat/completions", &b).await;
        assert_eq!(v["choices"][0]["message"]["content"], "{}");
        b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x",
            "schema": {"type": "string", "pattern": "^a$"}}});
        let (status, v) = post(&m, "/v1/chat/completions", &b).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        m.stop().await;
    }
    let m = mock(Dialect::Vllm).await;
    let mut b = body(Dialect::Vllm, false);
    b["stream"] = json!(true);
    b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "t",
        "schema": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}}});
    let text = streamed(&m, &b, "/content").await;
    assert_eq!(text, "{\"title\":\"polar title\"}");
    m.stop().await;
}

/// `tool_choice` and `parallel_tool_calls` over HTTP: `required` forces a
/// call, an unknown named tool is refused, `parallel_tool_calls: false`
/// keeps one call.
#[tokio::test]
async fn tool_choice_over_http() {
    let m = start(MockConfig {
        script: Some(Script {
            final_text: None,
            sessions: vec![SessionScript {
                id: "*".into(),
                turns: vec![
                    Turn {
                        text: Some("no tools".into()),
                        ..Turn::default()
                    },
                    Turn {
                        tool_calls: vec![
                            script::ScriptedCall {
                                shell: Some("ls".into()),
                                ..script::ScriptedCall::default()
                            },
                            script::ScriptedCall {
                                shell: Some("pwd".into()),
                                ..script::ScriptedCall::default()
                            },
                        ],
                        ..Turn::default()
                    },
                ],
                ..SessionScript::default()
            }],
        }),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let mut b = body(Dialect::Vllm, true);
    b["tool_choice"] = json!("required");
    let (_, v) = post(&m, "/v1/chat/completions", &b).await;
    let calls = &v["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls[0]["function"]["name"], "bash", "{v}");
    assert_eq!(
        calls[0]["function"]["arguments"],
        "{\"command\":\"polar command\"}"
    );
    b["tool_choice"] = json!("auto");
    b["parallel_tool_calls"] = json!(false);
    let (_, v) = post(&m, "/v1/chat/completions", &b).await;
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    b["tool_choice"] = json!({"type": "function", "function": {"name": "nope"}});
    let (status, _) = post(&m, "/v1/chat/completions", &b).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    m.stop().await;
}

/// A forced tool call is generated as the backend's constrained decoding
/// makes it, not in the template's markup: vLLM (`serving_chat.py`) has a
/// named tool choice generate the arguments object alone, reported with
/// finish `stop`, and `required` an array of `{"name", "parameters"}`;
/// SGLang (`get_json_schema_constraint`) the array for both. Streamed, the
/// arguments arrive as the call's deltas, the same as whole.
#[tokio::test]
async fn forced_tool_calls_are_generated_as_constrained_json() {
    let named = json!({"type": "function", "function": {"name": "bash"}});
    let array = r#"[{"name":"bash","parameters":{"command":"echo polar > polar-demo.txt"}}]"#;
    let args = r#"{"command":"echo polar > polar-demo.txt"}"#;
    for (dialect, choice, text, finish) in [
        (Dialect::Vllm, named.clone(), args, "stop"),
        (Dialect::Vllm, json!("required"), array, "tool_calls"),
        (Dialect::Sglang, named.clone(), array, "tool_calls"),
    ] {
        let m = mock(dialect).await;
        let mut b = body(dialect, true);
        b["tool_choice"] = choice.clone();
        let (status, v) = post(&m, "/v1/chat/completions", &b).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let c = &v["choices"][0];
        let generated: Vec<u32> = match dialect {
            Dialect::Vllm => ids(&c["token_ids"]),
            Dialect::Sglang => c["meta_info"]["output_token_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t[1].as_u64().unwrap() as u32)
                .collect(),
        };
        let generated = tokenizer::decode(&generated).unwrap();
        assert_eq!(
            generated,
            format!("{text}<|im_end|>"),
            "{dialect:?} {choice}"
        );
        assert_eq!(c["finish_reason"], finish, "{dialect:?} {choice}");
        let call = &c["message"]["tool_calls"][0]["function"];
        assert_eq!(
            (call["name"].as_str(), call["arguments"].as_str()),
            (Some("bash"), Some(args))
        );
        assert!(
            c["message"]["content"].as_str().is_none_or(str::is_empty),
            "{c}"
        );
        b["stream"] = json!(true);
        if let Some(o) = b.as_object_mut() {
            // (SGLang refuses prompt ids and meta info with a stream.)
            o.remove("return_prompt_token_ids");
            o.remove("return_meta_info");
        }
        let text = streamed(&m, &b, "/tool_calls/0/function/arguments").await;
        assert_eq!(text, args, "{dialect:?} {choice}");
        m.stop().await;
    }
}
