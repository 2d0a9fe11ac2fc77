//! The mock over HTTP, on loopback: both dialects, streamed and whole, the
//! token-in endpoints, scripts, knobs and admin endpoints.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use polar_io::http::{ClientOptions, HttpClient};
use serde_json::{Value, json};

use super::script::{DEMO_COMMAND, Script, shell_call};
use super::template::NO_THINK_GLUE;
use super::*;
use polar_chat::Tool;

pub(crate) async fn request(
    method: Method,
    url: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Bytes) {
    let client: HttpClient = polar_io::http::client(&ClientOptions::new());
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let bytes = body.map(|v| Bytes::from(v.to_string())).unwrap_or_default();
    let resp = client
        .request(b.body(Full::new(bytes)).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

async fn post(url: &str, body: &Value) -> (StatusCode, Value) {
    let (status, _, bytes) = request(Method::POST, url, Some(body), &[]).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// The `data:` payloads of an SSE body; asserts it ends with `[DONE]`.
fn events(bytes: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).unwrap();
    let datas: Vec<&str> = text
        .split("\n\n")
        .filter(|s| !s.is_empty())
        .map(|s| s.strip_prefix("data: ").unwrap())
        .collect();
    assert_eq!(datas.last(), Some(&"[DONE]"));
    datas[..datas.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn bash_tool() -> Value {
    json!({"type": "function", "function": {"name": "bash", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}})
}

fn chat_body(stream: bool) -> Value {
    json!({
        "model": "whatever", "stream": stream, "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "make the demo file"}],
        "tools": [bash_tool()],
        "return_token_ids": true, "logprobs": true, "top_logprobs": 0,
    })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[tokio::test]
async fn vllm_chat_streams_ids_per_chunk() {
    let mock = start(MockConfig::default()).await.unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let (status, whole) = post(&url, &chat_body(false)).await;
    assert_eq!(status, StatusCode::OK);
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "bash");
    assert_eq!(
        call["function"]["arguments"],
        json!({"command": DEMO_COMMAND}).to_string()
    );
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    // Another server (a replica) makes up other ids, as real ones do.
    let other = start(MockConfig::default()).await.unwrap();
    let (_, again) = post(
        &format!("{}/v1/chat/completions", other.url()),
        &chat_body(false),
    )
    .await;
    assert_ne!(
        again["choices"][0]["message"]["tool_calls"][0]["id"],
        call["id"]
    );
    assert_ne!(again["id"], whole["id"]);
    other.stop().await;
    let response_ids = ids(&choice["token_ids"]);
    assert_eq!(
        response_ids.len(),
        choice["logprobs"]["content"].as_array().unwrap().len()
    );
    assert_eq!(response_ids.last(), Some(&tokenizer::IM_END));

    let (_, tokenized) = post(&format!("{}/tokenize", mock.url()), &chat_body(false)).await;
    assert_eq!(ids(&whole["prompt_token_ids"]), ids(&tokenized["tokens"]));

    let (_, _, bytes) = request(Method::POST, &url, Some(&chat_body(true)), &[]).await;
    let chunks = events(&bytes);
    assert!(chunks[0].get("prompt_token_ids").is_some());
    assert_eq!(
        ids(&chunks[0]["prompt_token_ids"]),
        ids(&whole["prompt_token_ids"])
    );
    assert!(
        chunks[1..]
            .iter()
            .all(|c| c.get("prompt_token_ids").is_none())
    );
    let token_chunks: Vec<&Value> = chunks[1..]
        .iter()
        .filter(|c| !c["choices"].as_array().unwrap().is_empty())
        .collect();
    let streamed: Vec<u32> = token_chunks
        .iter()
        .flat_map(|c| ids(&c["choices"][0]["token_ids"]))
        .collect();
    assert_eq!(streamed, response_ids);
    assert!(
        token_chunks
            .iter()
            .all(|c| ids(&c["choices"][0]["token_ids"]).len() == 1)
    );
    assert!(
        token_chunks
            .iter()
            .any(|c| c["choices"][0]["delta"] == json!({})),
        "a chunk without text"
    );
    let lps: usize = token_chunks
        .iter()
        .map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .unwrap()
                .len()
        })
        .sum();
    assert_eq!(lps, streamed.len());
    assert_eq!(
        token_chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], json!(response_ids.len()));
    let args: String = token_chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, json!({"command": DEMO_COMMAND}).to_string());
    mock.stop().await;
}

#[tokio::test]
async fn token_in_endpoints_round_trip() {
    let mock = start(MockConfig::default()).await.unwrap();
    let (_, tokenized) = post(&format!("{}/tokenize", mock.url()), &chat_body(false)).await;
    let prompt = ids(&tokenized["tokens"]);
    let (_, text) = post(
        &format!("{}/detokenize", mock.url()),
        &json!({"tokens": prompt}),
    )
    .await;
    assert!(
        text["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>assistant\n")
    );
    let (status, done) = post(
        &format!("{}/v1/completions", mock.url()),
        &json!({"model": "m", "prompt": prompt, "return_token_ids": true, "logprobs": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let choice = &done["choices"][0];
    assert_eq!(ids(&choice["prompt_token_ids"]), prompt);
    // The facts sniffed from the ids (tools offered, no result yet) give the same tool call.
    assert!(
        choice["text"]
            .as_str()
            .unwrap()
            .contains(r#"{"name": "bash""#)
    );
    assert_eq!(
        choice["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        ids(&choice["token_ids"]).len()
    );
    mock.stop().await;
}

/// The token-in endpoints take the dialect's constraint fields: the
/// output is JSON the schema allows (the script not consulted), and a
/// malformed or conflicting constraint is refused with 400.
#[tokio::test]
async fn token_in_endpoints_honour_constraints() {
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 2}}, "required": ["ok", "n"]});
    let vllm = start(MockConfig::default()).await.unwrap();
    let (_, tokenized) = post(&format!("{}/tokenize", vllm.url()), &chat_body(false)).await;
    let prompt = ids(&tokenized["tokens"]);
    let url = format!("{}/v1/completions", vllm.url());
    for constraint in [
        json!({"structured_outputs": {"json": schema}}),
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}),
    ] {
        let mut body = json!({"model": "m", "prompt": prompt, "max_tokens": 200});
        body.as_object_mut()
            .unwrap()
            .extend(constraint.as_object().unwrap().clone());
        let (status, done) = post(&url, &body).await;
        assert_eq!(status, StatusCode::OK, "{done}");
        let text = done["choices"][0]["text"].as_str().unwrap();
        let v: Value = serde_json::from_str(text.trim_end_matches("<|im_end|>").trim()).unwrap();
        assert_eq!(v, json!({"ok": false, "n": 2}), "{text}");
    }
    for bad in [
        json!({"structured_outputs": {"json": schema, "regex": "a"}}),
        json!({"structured_outputs": {"guided_json": schema}}),
        json!({"response_format": {"type": "json_schema"}}),
    ] {
        let mut body = json!({"model": "m", "prompt": prompt, "max_tokens": 20});
        body.as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        let (status, err) = post(&url, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {err}");
    }
    vllm.stop().await;
    let sglang = start(MockConfig {
        dialect: Dialect::Sglang,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/generate", sglang.url());
    let (status, done) = post(
        &url,
        &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 200, "json_schema": schema.to_string()}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let text = done["text"].as_str().unwrap();
    let v: Value = serde_json::from_str(text.trim_end_matches("<|im_end|>").trim()).unwrap();
    assert_eq!(v, json!({"ok": false, "n": 2}), "{text}");
    let (status, _) = post(
        &url,
        &json!({"input_ids": prompt, "sampling_params": {"json_schema": "{}", "ebnf": "root ::= \"a\""}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    sglang.stop().await;
}

#[tokio::test]
async fn sglang_ids_only_without_streaming() {
    let mock = start(MockConfig {
        dialect: Dialect::Sglang,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let mut body = chat_body(false);
    body["return_prompt_token_ids"] = json!(true);
    body["return_meta_info"] = json!(true);
    let (status, whole) = post(&url, &body).await;
    assert_eq!(status, StatusCode::OK);
    let choice = &whole["choices"][0];
    let prompt = ids(&choice["prompt_token_ids"]);
    assert!(choice.get("token_ids").is_none(), "real SGLang sends none");
    let triples = choice["meta_info"]["output_token_logprobs"]
        .as_array()
        .unwrap();
    let out: Vec<u32> = triples
        .iter()
        .map(|t| t[1].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(out.last(), Some(&tokenizer::IM_END));
    assert_eq!(choice["meta_info"]["weight_version"], "0");
    assert_eq!(choice["meta_info"]["finish_reason"]["type"], "tool_calls");

    body["stream"] = json!(true);
    let (status, _) = post(&url, &body).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "ids are refused with streaming"
    );
    body["return_prompt_token_ids"] = json!(false);
    body["return_meta_info"] = json!(false);
    let (_, _, bytes) = request(Method::POST, &url, Some(&body), &[]).await;
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(!text.contains("token_ids"));
    events(&bytes);

    let (_, generated) = post(
        &format!("{}/generate", mock.url()),
        &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 100}, "return_logprob": true}),
    )
    .await;
    assert_eq!(ids(&generated["output_ids"]), out);
    assert_eq!(generated["meta_info"]["prompt_tokens"], json!(prompt.len()));
    // The same session again: the simulated prefix cache holds the prompt.
    assert_eq!(generated["meta_info"]["cached_tokens"], json!(prompt.len()));

    let (_, _, bytes) = request(
        Method::POST,
        &format!("{}/generate", mock.url()),
        Some(&json!({"text": "hello", "stream": true, "sampling_params": {"max_new_tokens": 2}})),
        &[],
    )
    .await;
    let chunks = events(&bytes);
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[0]["text"], "don");
    assert_eq!(chunks[1]["text"], "done");
    assert_eq!(ids(&chunks[1]["output_ids"]).len(), 2);
    assert_eq!(chunks[0]["meta_info"]["finish_reason"], Value::Null);
    assert_eq!(chunks[1]["meta_info"]["finish_reason"]["type"], "length");
    mock.stop().await;
}

#[tokio::test]
async fn context_limits() {
    let mock = start(MockConfig {
        max_model_len: 40,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let (status, err) = post(&url, &chat_body(false)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 40")
    );
    let short = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100});
    let (status, ok) = post(&url, &short).await;
    assert_eq!(status, StatusCode::OK);
    // "done<|im_end|>" is three tokens: "don", "e", <|im_end|>.
    assert_eq!(ok["usage"]["completion_tokens"], 3);
    let (_, cut) = post(
        &url,
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    )
    .await;
    assert_eq!(cut["choices"][0]["finish_reason"], "length");
    assert_eq!(cut["usage"]["completion_tokens"], 1);
    mock.stop().await;
}

const SCRIPT: &str = r#"
final_text = "all done"

[[sessions]]
id = "s1"

[[sessions.turns]]
think = "Plan: write the file."
text = "Writing."
tool_calls = [{ shell = "echo hi > a.txt" }, { name = "note", arguments = { text = "x" } }]

[[sessions.turns]]
error = { status = 503, message = "overloaded" }

[[sessions.turns]]
text = "this reply is cut"
disconnect_after = 2

[[sessions.turns]]
text = "partial"
finish_reason = "length"

[[sessions.turns]]
text = "Step 3. <tool_call> never finished"
abort_after = 4

[[sessions]]
id = "*"
turns = [{ text = "hello from the wildcard" }]
"#;

#[tokio::test]
async fn scripted_turns_per_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.toml");
    std::fs::write(&path, SCRIPT).unwrap();
    let script = Script::load(&path).unwrap();
    let mock = start(MockConfig {
        script: Some(script),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let body = chat_body(false);
    let call = |h: &'static [(&'static str, &'static str)]| {
        let url = url.clone();
        let body = body.clone();
        async move { request(Method::POST, &url, Some(&body), h).await }
    };
    const S1: &[(&str, &str)] = &[("x-polar-session", "s1")];
    let (status, _, bytes) = call(S1).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning"], "Plan: write the file.");
    assert_eq!(m["content"], "Writing.");
    assert_eq!(
        m["tool_calls"][0]["function"]["arguments"],
        r#"{"command":"echo hi > a.txt"}"#
    );
    assert_eq!(m["tool_calls"][1]["function"]["name"], "note");
    assert_ne!(m["tool_calls"][0]["id"], m["tool_calls"][1]["id"]);

    let (status, _, bytes) = call(S1).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8_lossy(&bytes).contains("overloaded"));

    let client: HttpClient = polar_io::http::client(&ClientOptions::new());
    let req = Request::post(&url)
        .header("x-polar-session", "s1")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.into_body().collect().await.is_err(), "the body is cut");

    let (_, _, bytes) = call(S1).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_ne!(
        ids(&v["choices"][0]["token_ids"]).last(),
        Some(&tokenizer::IM_END)
    );

    // Aborted as SGLang and vLLM abort: HTTP 200, finish reason abort,
    // the tokens generated before it.
    let (status, _, bytes) = call(S1).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "abort");
    assert_eq!(ids(&v["choices"][0]["token_ids"]).len(), 4);
    assert_eq!(v["usage"]["completion_tokens"], 4);

    let (_, _, bytes) = call(S1).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "all done");

    // Any other session: the wildcard's turns, then the final text.
    let (_, _, bytes) = call(&[("x-polar-session", "other")]).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "hello from the wildcard"
    );
    mock.stop().await;
}

#[test]
fn scripts_load_from_json_and_reject_ambiguous_calls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    std::fs::write(
        &path,
        r#"{"sessions": [{"id": "*", "turns": [{"text": "hi", "delay_ms": 5}]}]}"#,
    )
    .unwrap();
    let s = Script::load(&path).unwrap();
    assert_eq!(s.sessions[0].turns[0].delay_ms, Some(5));
    std::fs::write(
        &path,
        r#"{"sessions": [{"id": "*", "turns": [{"tool_calls": [{"name": "a", "shell": "b"}]}]}]}"#,
    )
    .unwrap();
    assert!(matches!(
        Script::load(&path),
        Err(MockError::ScriptInvalid { .. })
    ));
    std::fs::write(&path, r#"{"sessions": [], "bogus": 1}"#).unwrap();
    assert!(matches!(
        Script::load(&path),
        Err(MockError::ScriptInvalid { .. })
    ));
}

#[test]
fn builtin_shell_call_follows_the_schema() {
    let tool = |name: &str, props: Value| Tool {
        name: name.into(),
        description: None,
        parameters: polar_json::RawJson::from_value(
            &json!({"type": "object", "properties": props}),
        ),
    };
    let (name, args) = shell_call(
        &[
            tool("read", json!({})),
            tool("exec_command", json!({"cmd": {"type": "string"}})),
        ],
        DEMO_COMMAND,
    );
    assert_eq!(
        (name.as_str(), args.as_str()),
        ("exec_command", r#"{"cmd":"echo polar > polar-demo.txt"}"#)
    );
    let (name, args) = shell_call(
        &[tool("shell", json!({"command": {"type": "array"}}))],
        DEMO_COMMAND,
    );
    assert_eq!(name, "shell");
    assert_eq!(
        args,
        json!({"command": ["bash", "-lc", DEMO_COMMAND]}).to_string()
    );
    let (name, args) = shell_call(
        &[
            tool("Write", json!({})),
            tool("Bash", json!({"command": {"type": "string"}})),
        ],
        "ls",
    );
    assert_eq!(
        (name.as_str(), args.as_str()),
        ("Bash", r#"{"command":"ls"}"#)
    );
    let (name, _) = shell_call(&[tool("first", json!({}))], "ls");
    assert_eq!(name, "first");
}

#[tokio::test]
async fn builtin_policy_answers_done_after_the_tool_result() {
    let mock = start(MockConfig::default()).await.unwrap();
    let mut body = chat_body(false);
    body["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_0", "content": ""}),
    ]);
    let (_, v) = post(&format!("{}/v1/chat/completions", mock.url()), &body).await;
    assert_eq!(v["choices"][0]["message"]["content"], "done");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    mock.stop().await;
}

#[tokio::test]
async fn template_switches_per_request() {
    let mock = start(MockConfig::default()).await.unwrap();
    let url = format!("{}/tokenize", mock.url());
    let glue = tokenizer::encode(NO_THINK_GLUE);
    let plain = ids(&post(&url, &chat_body(false)).await.1["tokens"]);
    let mut body = chat_body(false);
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    assert_eq!(
        ids(&post(&url, &body).await.1["tokens"]),
        [plain.clone(), glue.clone()].concat()
    );
    let header = [(
        "x-polar-mock-template",
        r#"{"generation_glue": "<think>\n\n</think>\n\n"}"#,
    )];
    let (_, _, bytes) = request(Method::POST, &url, Some(&chat_body(false)), &header).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(ids(&v["tokens"]), [plain.clone(), glue].concat());
    let mut body = chat_body(false);
    body["polar_mock"] = json!({"strip_reasoning": "sideways"});
    assert_eq!(post(&url, &body).await.0, StatusCode::BAD_REQUEST);
    mock.stop().await;
}

#[tokio::test]
async fn pause_holds_new_generations() {
    let mock = start(MockConfig::default()).await.unwrap();
    let base = mock.url();
    assert_eq!(
        post(&format!("{base}/pause_generation"), &json!({}))
            .await
            .1["is_paused"],
        true
    );
    let url = format!("{base}/v1/chat/completions");
    let pending = tokio::spawn(async move { post(&url, &chat_body(false)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pending.is_finished());
    let (_, _, paused) = request(Method::GET, &format!("{base}/is_paused"), None, &[]).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&paused).unwrap()["is_paused"],
        true
    );
    post(&format!("{base}/continue_generation"), &json!({})).await;
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    mock.stop().await;
}

#[tokio::test]
async fn admin_endpoints_and_metrics() {
    let mock = start(MockConfig {
        served_model: "qwen-mock".into(),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let base = mock.url();
    let (status, headers, _) = request(Method::GET, &format!("{base}/health"), None, &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-weight-version"], "0");
    let (_, _, models) = request(Method::GET, &format!("{base}/v1/models"), None, &[]).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&models).unwrap()["data"][0]["id"],
        "qwen-mock"
    );
    post(
        &format!("{base}/update_weight_version"),
        &json!({"new_version": "step-7"}),
    )
    .await;
    let (_, headers, version) = request(
        Method::GET,
        &format!("{base}/get_weight_version"),
        None,
        &[],
    )
    .await;
    assert_eq!(headers["x-weight-version"], "step-7");
    assert_eq!(
        serde_json::from_slice::<Value>(&version).unwrap()["weight_version"],
        "step-7"
    );
    post(&format!("{base}/v1/chat/completions"), &chat_body(false)).await;
    let (status, _, _) = request(Method::GET, &format!("{base}/nope"), None, &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, _, metrics) = request(Method::GET, &format!("{base}/metrics"), None, &[]).await;
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    assert!(
        metrics.contains("polar_mock_requests_total{path=\"/v1/chat/completions\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("polar_mock_errors_total 1"), "{metrics}");
    assert!(
        metrics.contains("polar_mock_requests_running 0"),
        "{metrics}"
    );
    mock.stop().await;
}

#[tokio::test]
async fn fail_rate_and_latency_knobs() {
    let mock = start(MockConfig {
        fail_rate: 1.0,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let (status, err) = post(
        &format!("{}/v1/chat/completions", mock.url()),
        &chat_body(false),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(err["object"], "error");
    mock.stop().await;

    let cfg = MockConfig {
        ttft: Duration::from_millis(100),
        token_latency: Duration::from_millis(5),
        ..MockConfig::default()
    };
    let mock = start(cfg).await.unwrap();
    let started = std::time::Instant::now();
    let (status, v) = post(
        &format!("{}/v1/chat/completions", mock.url()),
        &chat_body(false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as u128;
    assert!(started.elapsed().as_millis() >= 100 + 5 * (n - 1));
    mock.stop().await;
}

#[test]
fn args_convert_and_validate() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        mock: MockArgs,
    }
    use clap::Parser;
    let cli = Cli::try_parse_from([
        "polar",
        "--dialect",
        "sglang",
        "--strip-reasoning",
        "before-last-user",
        "--no-think-glue",
        "--ttft-ms",
        "5",
    ])
    .unwrap();
    let cfg = cli.mock.to_config().unwrap();
    assert_eq!(cfg.dialect, Dialect::Sglang);
    assert_eq!(
        cfg.template.strip_reasoning,
        template::StripReasoning::BeforeLastUser
    );
    assert_eq!(cfg.template.generation_glue, NO_THINK_GLUE);
    assert_eq!(cfg.ttft, Duration::from_millis(5));
    assert_eq!(cli.mock.listen.to_string(), "127.0.0.1:8000");
    let glue =
        Cli::try_parse_from(["polar", "--generation-glue", "<think>\\n\\n</think>\\n\\n"]).unwrap();
    assert_eq!(
        glue.mock.to_config().unwrap().template.generation_glue,
        NO_THINK_GLUE
    );
    let bad = Cli::try_parse_from(["polar", "--fail-rate", "2"]).unwrap();
    assert!(matches!(
        bad.mock.to_config(),
        Err(MockError::InvalidSetting(_))
    ));
}

#[tokio::test]
async fn run_refuses_non_loopback() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        mock: MockArgs,
    }
    use clap::Parser;
    let cli = Cli::try_parse_from(["polar", "--listen", "0.0.0.0:8000"]).unwrap();
    let r = run(&cli.mock, tokio_util::sync::CancellationToken::new()).await;
    assert!(matches!(r, Err(MockError::NotLoopback(_))));
}

#[test]
fn an_abort_inside_a_tool_call_streams_its_head_and_the_arguments_generated() {
    use super::generate::{DeltaSplitter, Finish, generate};
    let plan = super::script::Plan {
        text: "Writing it.".into(),
        tool_calls: vec![("bash".into(), r#"{"command":"echo hi > a.txt"}"#.into())],
        ..super::script::Plan::default()
    };
    let whole = generate(Vec::new(), &plan, 1000);
    let args_at = whole.text.find("\"arguments\": ").unwrap() + "\"arguments\": ".len();
    // The first token past the arguments' first five bytes.
    let at = whole
        .spans
        .iter()
        .position(|s| s.start >= args_at + 5)
        .unwrap();
    let aborted = generate(
        Vec::new(),
        &super::script::Plan {
            abort_after: Some(at),
            ..plan
        },
        1000,
    );
    assert_eq!(aborted.finish, Finish::Abort);
    assert_eq!(aborted.ids, whole.ids[..at]);
    // A whole reply: the cut text has no call (vLLM's and SGLang's
    // non-streaming tool parsers find none in it).
    assert!(aborted.parsed.tool_calls.is_empty());
    // Streamed: the text, the call's head, the arguments generated.
    let mut splitter = DeltaSplitter::new(&aborted);
    let (mut content, mut starts, mut args) = (String::new(), Vec::new(), String::new());
    for i in 0..at {
        let d = splitter.chunk(i..i + 1);
        content.push_str(&d.content);
        starts.extend(d.tool_starts);
        args.extend(d.tool_args.into_iter().map(|(_, a)| a));
    }
    assert_eq!(content.trim_end(), "Writing it.");
    assert_eq!(starts, [0]);
    assert_eq!(aborted.streamed().tool_calls[0].name, "bash");
    assert!(
        args.len() >= 5 && r#"{"command":"echo hi > a.txt"}"#.starts_with(&args),
        "{args:?}"
    );
}

#[test]
fn arguments_can_be_sent_as_json_dumps_writes_them() {
    use super::generate::{DeltaSplitter, arguments_as_sent, generate};
    let args = r#"{"a":"x, y: \"z\"","n":[1,2],"o":{"k":null}}"#;
    let dumped = arguments_as_sent(args, true);
    assert_eq!(
        dumped,
        r#"{"a": "x, y: \"z\"", "n": [1, 2], "o": {"k": null}}"#
    );
    assert_eq!(arguments_as_sent(args, false), args);
    // Streamed token by token: the same text.
    let g = generate(
        Vec::new(),
        &super::script::Plan {
            tool_calls: vec![("f".into(), args.into())],
            ..super::script::Plan::default()
        },
        1000,
    );
    let mut splitter = DeltaSplitter::new(&g).json_dumps_arguments(true);
    let streamed: String = (0..g.ids.len())
        .flat_map(|i| splitter.chunk(i..i + 1).tool_args)
        .map(|(_, a)| a)
        .collect();
    assert_eq!(streamed, dumped);
}
