//! The scripted policy stepped by the conversation's progress, and
//! `GET /served`, over HTTP on loopback.

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::{PROGRESS_NOTE, Script, progress_note, shell_call};
use crate::tests::request;
use crate::{MockConfig, start, tokenizer};
use polar_chat::Tool;

const STEPPED: &str = r#"
final_text = "finished"

[[sessions]]
id = "*"
step_by = "tool_results"
turns = [
  { tool_calls = [{ shell = "step one" }] },
  { tool_calls = [{ shell = "step two" }] },
  { text = "thinking it over", tool_calls = [{ shell = "step three" }] },
]
"#;

fn tool() -> Value {
    json!({"type": "function", "function": {"name": "bash", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}})
}

/// A conversation: the task, then `results` tool calls with their results,
/// then `tail` (more messages).
fn body(results: usize, tools: bool, tail: &[Value]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "do the steps"})];
    for i in 0..results {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("c{i}"), "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}));
        messages
            .push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "exit 1"}));
    }
    messages.extend_from_slice(tail);
    let mut b =
        json!({"model": "m", "messages": messages, "return_token_ids": true, "logprobs": true});
    if tools {
        b["tools"] = json!([tool()]);
    }
    b
}

async fn load(text: &str) -> Script {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.toml");
    std::fs::write(&path, text).unwrap();
    Script::load(&path).unwrap()
}

/// The reply's shell command, or its text.
fn answer(v: &Value) -> String {
    let m = &v["choices"][0]["message"];
    match m["tool_calls"][0]["function"]["arguments"].as_str() {
        Some(args) => serde_json::from_str::<Value>(args).unwrap()["command"]
            .as_str()
            .unwrap()
            .to_owned(),
        None => m["content"].as_str().unwrap().to_owned(),
    }
}

#[tokio::test]
async fn a_stepped_script_follows_the_conversation_not_the_request_count() {
    let mock = start(MockConfig {
        script: Some(load(STEPPED).await),
        record_served: true,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let ask = |b: Value| {
        let url = url.clone();
        async move {
            let (status, _, bytes) =
                request(Method::POST, &url, Some(&b), &[("x-polar-session", "s")]).await;
            assert_eq!(status, StatusCode::OK);
            answer(&serde_json::from_slice(&bytes).unwrap())
        }
    };
    assert_eq!(ask(body(0, true, &[])).await, "step one");
    // The same request again (a retry) and a side call do not move it on.
    assert_eq!(ask(body(0, true, &[])).await, "step one");
    assert_eq!(
        ask(body(1, false, &[])).await,
        format!("Steps done: 1. {PROGRESS_NOTE}1")
    );
    assert_eq!(ask(body(1, true, &[])).await, "step two");
    assert_eq!(ask(body(2, true, &[])).await, "step three");
    assert_eq!(ask(body(3, true, &[])).await, "finished");
    // After a compaction the summary's note carries the count on: two
    // steps summarized, one tool result since.
    let summary =
        json!({"role": "user", "content": format!("Summary: Steps done: 2. {PROGRESS_NOTE}2")});
    let mut compacted = body(0, true, std::slice::from_ref(&summary));
    assert_eq!(ask(compacted.clone()).await, "step three");
    compacted["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c9", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "c9", "content": "ok"}),
    ]);
    assert_eq!(ask(compacted).await, "finished");

    // The token-in endpoint sniffs the same progress from the prompt text.
    let parsed = crate::openai::ChatIn::parse(
        body(2, true, &[]).to_string().as_bytes(),
        crate::HistoryReasoning::Either,
    )
    .unwrap();
    let prompt = crate::template::render_prompt(
        &parsed.messages,
        &parsed.tools,
        &crate::template::TemplateOptions::default(),
        true,
    );
    let (status, _, bytes) = request(
        Method::POST,
        &format!("{}/v1/completions", mock.url()),
        Some(&json!({"prompt": tokenizer::encode(&prompt), "max_tokens": 200})),
        &[("x-polar-session", "s")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .contains("step three"),
        "{v}"
    );
    mock.stop().await;
}

#[tokio::test]
async fn served_lists_every_generation_with_its_ids_and_logprobs() {
    let mock = start(MockConfig {
        record_served: true,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let mut replies = Vec::new();
    for session in ["a", "b"] {
        let (_, _, bytes) = request(
            Method::POST,
            &url,
            Some(&body(0, true, &[])),
            &[("x-polar-session", session)],
        )
        .await;
        replies.push(serde_json::from_slice::<Value>(&bytes).unwrap());
    }
    let (status, _, bytes) =
        request(Method::GET, &format!("{}/served", mock.url()), None, &[]).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    let served = v["served"].as_array().unwrap();
    assert_eq!(served.len(), 2);
    assert_eq!(v["dropped"], 0);
    for (s, (r, session)) in served.iter().zip(replies.iter().zip(["a", "b"])) {
        assert_eq!(s["session"], session);
        assert_eq!(s["prompt_token_ids"], r["prompt_token_ids"]);
        assert_eq!(s["token_ids"], r["choices"][0]["token_ids"]);
        let logprobs: Vec<&Value> = r["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["logprob"])
            .collect();
        assert_eq!(
            s["logprobs"].as_array().unwrap().iter().collect::<Vec<_>>(),
            logprobs
        );
        assert_eq!(s["finish_reason"], "tool_calls");
    }
    mock.stop().await;

    let plain = start(MockConfig::default()).await.unwrap();
    let (status, _, bytes) =
        request(Method::GET, &format!("{}/served", plain.url()), None, &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&bytes).contains("--record-served"));
    plain.stop().await;
}

#[test]
fn progress_notes_are_read_from_the_last_one() {
    assert_eq!(progress_note("nothing here"), None);
    assert_eq!(progress_note(&format!("{PROGRESS_NOTE}3")), Some(3));
    assert_eq!(
        progress_note(&format!("{PROGRESS_NOTE}1 and then {PROGRESS_NOTE}12.")),
        Some(12)
    );
    assert_eq!(progress_note(&format!("{PROGRESS_NOTE}x")), None);
}

/// A script whose context fills after two tool results.
const FILLS: &str = r#"
[[sessions]]
id = "*"
step_by = "tool_results"
context_fills_after = 2
context_tokens = 5000
turns = [{ tool_calls = [{ shell = "one" }] }, { tool_calls = [{ shell = "two" }] }, { tool_calls = [{ shell = "three" }] }]
"#;

#[tokio::test]
async fn a_context_that_fills_reports_its_tokens_until_a_summary() {
    let script = load(FILLS).await;
    let mock = start(MockConfig {
        script: Some(script),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let usage = |b: Value| {
        let url = url.clone();
        async move {
            let (_, _, bytes) = request(Method::POST, &url, Some(&b), &[]).await;
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            let real = v["prompt_token_ids"].as_array().unwrap().len();
            (
                v["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
                real,
                answer(&v),
            )
        }
    };
    let (reported, real, _) = usage(body(1, true, &[])).await;
    assert_eq!(reported, real);
    let (reported, _, said) = usage(body(2, true, &[])).await;
    assert_eq!((reported, said.as_str()), (5000, "three"));
    // The harness asks for a summary (tools still offered, a system note
    // after the ask, as Claude Code sends it): the progress note, and the
    // summary request itself is not filled.
    let ask = json!({"role": "user", "content": "Summarize the conversation so far."});
    let note = json!({"role": "system", "content": "Deferred tools are available."});
    let (reported, real, said) = usage(body(2, true, &[ask, note])).await;
    assert_eq!(
        (reported, said),
        (real, format!("Steps done: 2. {PROGRESS_NOTE}2"))
    );
    // After the compaction the context is small again.
    let summary = json!({"role": "user", "content": format!("Summary: {PROGRESS_NOTE}2")});
    let (reported, real, said) = usage(body(0, true, &[summary])).await;
    assert_eq!((reported, said.as_str()), (real, "three"));
    mock.stop().await;

    // Filled past the model's context: refused as vLLM refuses a prompt
    // that long.
    let mock = start(MockConfig {
        script: Some(load(&FILLS.replace("5000", "40000")).await),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let (status, _, _) = request(Method::POST, &url, Some(&body(1, true, &[])), &[]).await;
    assert_eq!(status, 200);
    let (status, _, bytes) = request(Method::POST, &url, Some(&body(2, true, &[])), &[]).await;
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("This model's maximum context length is 32768 tokens. However, your request has 40000 input tokens."),
        "{text}"
    );
    mock.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[[sessions]]\nid = \"*\"\nstep_by = \"tool_results\"\ncontext_fills_after = 2\n",
    )
    .unwrap();
    assert!(matches!(
        Script::load(&path),
        Err(crate::MockError::ScriptInvalid { .. })
    ));
}

#[test]
fn the_shell_tool_is_found_by_name_before_the_first_tool() {
    // Hermes Agent offers its browser tools first and runs commands with
    // `terminal {command}`.
    let tools: Vec<Tool> = serde_json::from_value(json!([
        {"name": "browser_back", "parameters": {"type": "object", "properties": {}}},
        {"name": "terminal", "parameters": {"type": "object",
            "properties": {"command": {"type": "string"}}}},
    ]))
    .unwrap();
    let (name, args) = shell_call(&tools, "true");
    assert_eq!(name, "terminal");
    assert_eq!(args, r#"{"command":"true"}"#);
}
