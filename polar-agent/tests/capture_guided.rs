//! Constrained output, token-faithfully, end to end through the real proxy
//! code path (base-URL mode on loopback) against the mock backend serving
//! Qwen3's real files (`cargo xtask chat-models`) as vLLM and SGLang serve
//! them, the agent's backend with `model_dir`: a session makes a normal
//! call, a `response_format` json_schema call, a forced tool call and the
//! call after it, and every one is served token-in
//! (`backend.serving.mode = "token_in"` in the capture log), each
//! extending the one before with the ids the model generated; the
//! structured reply satisfies the schema and the forced call reaches the
//! harness as a tool call in its API's shape (OpenAI chat; Anthropic
//! Messages, whose `tool_choice: {type: tool}` is a named choice).
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::traj::{prompt, response, seq, shell};
use common::*;
use polar_mock::real::RealModel;
use polar_mock::script::{Script, SessionScript, Turn};
use polar_mock::{self as mock, Dialect, MockConfig, MockHandle};
use polar_record::CompletionRecord;
use serde_json::{Value, json};

/// Qwen3's real files, as `cargo xtask chat-models` installs them.
fn qwen3_dir() -> PathBuf {
    let dir = std::env::var_os("POLAR_CHAT_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.polar-cache/chat-models")
        })
        .join("qwen3");
    assert!(
        dir.join("tokenizer.json").is_file(),
        "Qwen3's model files are missing from {}: install them with `cargo xtask chat-models`",
        dir.display()
    );
    dir
}

/// The mock serving Qwen3 for `session` with `turns`, and an agent whose
/// backend serves token-faithfully in front of it.
async fn start(session: &str, turns: Vec<Turn>, dialect: Dialect) -> (MockHandle, TestAgent) {
    let dir = qwen3_dir();
    let mock = mock::start(MockConfig {
        dialect,
        model: Some(Arc::new(RealModel::load(&dir).unwrap())),
        script: Some(Script {
            final_text: None,
            sessions: vec![SessionScript {
                id: session.into(),
                turns,
                ..SessionScript::default()
            }],
        }),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let toml = format!(
        "{}output_parser = \"qwen3\"\nmodel_dir = \"{}\"\n",
        backend_toml("mock", &mock.url(), 10_000).replace(
            "dialect = \"vllm\"",
            &format!("dialect = \"{}\"", dialect.as_str()),
        ),
        dir.display()
    );
    let agent = TestAgent::start(&toml).await;
    agent.session(session, "t");
    (mock, agent)
}

/// Every call after the first extends the one before with its prompt and
/// generated ids, and all are served token-in.
fn assert_one_chain(records: &[CompletionRecord], what: &str) {
    let serving = |r: &CompletionRecord| serde_json::to_value(&r.backend.serving).unwrap();
    assert_eq!(serving(&records[0])["mode"], "token_in", "{what}");
    for k in 1..records.len() {
        let before = seq(&records[k - 1]);
        let p = prompt(&records[k]);
        assert!(
            p.len() > before.len() && p[..before.len()] == before[..],
            "{what} call {k}: extends the last call's prompt and generated ids"
        );
        assert!(
            !response(&records[k]).is_empty(),
            "{what} call {k}: generated ids"
        );
        let s = serving(&records[k]);
        assert_eq!(s["mode"], "token_in", "{what} call {k}: {s}");
        assert_eq!(s["prompt"]["kind"], "extends", "{what} call {k}: {s}");
        assert_eq!(s["prompt"]["kept"], before.len(), "{what} call {k}: {s}");
    }
    // Prefix merging makes it one main trace: a structured or forced turn
    // the conversation goes on from is one of its calls.
    let traj = common::traj::build(&polar_trajectory::Builder::default(), records, what);
    assert_eq!(traj.traces.len(), 1, "{what}: {:?}", traj.traces);
    assert_eq!(
        traj.traces[0].role,
        polar_trajectory::ChainRole::Main,
        "{what}"
    );
    assert!(
        traj.traces[0].labels.is_empty(),
        "{what}: {:?}",
        traj.traces[0].labels
    );
}

fn report_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "summary": {"type": "string", "minLength": 4},
            "files": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        },
        "required": ["summary", "files"],
        "additionalProperties": false,
    })
}

async fn post(agent: &TestAgent, session: &str, h: Harness, body: &Value) -> Value {
    let reply = send(h.request(agent.addr, session, body.clone(), false)).await;
    assert_eq!(reply.status, http::StatusCode::OK, "{}", reply.text());
    reply.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chat_structured_and_forced_calls_keep_the_chain() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let session = format!("guided-openai-{}", dialect.as_str());
        let (mock, agent) = start(&session, vec![shell("ls"), shell("make test")], dialect).await;
        let h = Harness::Qwen;
        let mut body = h.first_turn();
        let add = |body: &mut Value, m: Value| body["messages"].as_array_mut().unwrap().push(m);
        // A normal call: the script's tool call.
        let first = post(&agent, &session, h, &body).await;
        let msg = first["choices"][0]["message"].clone();
        let id = msg["tool_calls"][0]["id"].as_str().unwrap().to_owned();
        add(&mut body, msg);
        add(
            &mut body,
            json!({"role": "tool", "tool_call_id": id, "content": "Makefile\nsrc"}),
        );
        // Structured output.
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "report", "strict": true, "schema": report_schema()}});
        let structured = post(&agent, &session, h, &body).await;
        let msg = structured["choices"][0]["message"].clone();
        let text = msg["content"].as_str().unwrap();
        let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(
            v["summary"]
                .as_str()
                .is_some_and(|s| s.chars().count() >= 4),
            "{v}"
        );
        assert!(
            v["files"]
                .as_array()
                .is_some_and(|f| !f.is_empty() && f.iter().all(Value::is_string)),
            "{v}"
        );
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
        assert!(
            msg.get("tool_calls")
                .is_none_or(|c| c.as_array().is_none_or(Vec::is_empty)),
            "{msg}"
        );
        body.as_object_mut().unwrap().remove("response_format");
        add(&mut body, msg);
        add(
            &mut body,
            json!({"role": "user", "content": "Run the tests."}),
        );
        // A forced (named) tool call.
        body["tool_choice"] =
            json!({"type": "function", "function": {"name": "run_shell_command"}});
        let forced = post(&agent, &session, h, &body).await;
        let choice = &forced["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{forced}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{forced}");
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "run_shell_command");
        let args: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args["command"].is_string(), "{args}");
        let forced_id = calls[0]["id"].as_str().unwrap().to_owned();
        assert_ne!(forced_id, id, "a fresh call id");
        body.as_object_mut().unwrap().remove("tool_choice");
        add(&mut body, choice["message"].clone());
        add(
            &mut body,
            json!({"role": "tool", "tool_call_id": forced_id, "content": "3 passed"}),
        );
        // The call after it.
        let next = post(&agent, &session, h, &body).await;
        assert!(next["choices"][0]["message"].is_object(), "{next}");
        let (records, problems) = agent.calls(&session);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(records.len(), 4);
        assert_one_chain(&records, &session);
        common::traj::stop(mock, agent).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_tool_choice_tool_is_a_forced_call_in_the_chain() {
    let session = "guided-anthropic";
    let (mock, agent) = start(session, vec![shell("ls"), shell("make")], Dialect::Vllm).await;
    let h = Harness::Claude;
    let mut body = h.first_turn();
    let first = post(&agent, session, h, &body).await;
    let tool_use = first["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .cloned()
        .unwrap_or_else(|| panic!("{first}"));
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": first["content"]}));
    messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "Makefile"}]}));
    body["tool_choice"] = json!({"type": "tool", "name": "Bash"});
    let forced = post(&agent, session, h, &body).await;
    assert_eq!(forced["stop_reason"], "tool_use", "{forced}");
    let blocks = forced["content"].as_array().unwrap();
    let calls: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "tool_use").collect();
    assert_eq!(calls.len(), 1, "{forced}");
    assert_eq!(calls[0]["name"], "Bash");
    assert!(calls[0]["input"]["command"].is_string(), "{forced}");
    assert_ne!(calls[0]["id"], tool_use["id"], "a fresh call id");
    assert!(
        blocks.iter().all(|b| b["type"] != "text" || b["text"].as_str().is_some_and(|t| t.trim().is_empty())),
        "no text beside the forced call: {forced}"
    );
    let id = calls[0]["id"].clone();
    body.as_object_mut().unwrap().remove("tool_choice");
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": forced["content"]}));
    messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "ok"}]}));
    post(&agent, session, h, &body).await;
    let (records, problems) = agent.calls(session);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(records.len(), 3);
    assert_one_chain(&records, session);
    common::traj::stop(mock, agent).await;
}

/// Streamed, as Claude Code asks: the forced call arrives as one
/// `tool_use` block in a valid event stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_forced_call_is_a_tool_use_block() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let session = format!("guided-stream-{}", dialect.as_str());
        let (mock, agent) = start(&session, vec![shell("ls")], dialect).await;
        let h = Harness::Claude;
        let mut body = h.first_turn();
        body["tool_choice"] = json!({"type": "tool", "name": "Bash"});
        let reply = send(h.request(agent.addr, &session, body, true)).await;
        let ids = h.check_reply(&reply, true);
        assert_eq!(ids.len(), 1, "{dialect:?}: {}", reply.text());
        let text = reply.text();
        assert!(text.contains(r#""name":"Bash""#), "{text}");
        assert!(text.contains(r#""stop_reason":"tool_use""#), "{text}");
        let (records, _) = agent.calls(&session);
        let serving = serde_json::to_value(&records[0].backend.serving).unwrap();
        assert_eq!(serving["mode"], "token_in", "{serving}");
        common::traj::stop(mock, agent).await;
    }
}

/// A structured-output check asked with the main conversation and a
/// question after it (Gemini CLI's next-speaker check) is served token-in
/// and branches off: the main chain's next call extends the main call,
/// and the one after extends that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_structured_side_check_branches_off_the_main_chain() {
    let session = "guided-side";
    let (mock, agent) = start(session, vec![shell("ls"), shell("make")], Dialect::Vllm).await;
    let h = Harness::Qwen;
    let mut body = h.first_turn();
    let add = |body: &mut Value, m: Value| body["messages"].as_array_mut().unwrap().push(m);
    let first = post(&agent, session, h, &body).await;
    let msg = first["choices"][0]["message"].clone();
    let id = msg["tool_calls"][0]["id"].as_str().unwrap().to_owned();
    add(&mut body, msg);
    let mut check = body.clone();
    add(
        &mut check,
        json!({"role": "user", "content": "Who speaks next? Answer in JSON."}),
    );
    check["response_format"] = json!({"type": "json_object"});
    post(&agent, session, h, &check).await;
    add(
        &mut body,
        json!({"role": "tool", "tool_call_id": id, "content": "Makefile"}),
    );
    let second = post(&agent, session, h, &body).await;
    let msg = second["choices"][0]["message"].clone();
    let id = msg["tool_calls"][0]["id"].as_str().unwrap().to_owned();
    add(&mut body, msg);
    add(
        &mut body,
        json!({"role": "tool", "tool_call_id": id, "content": "ok"}),
    );
    post(&agent, session, h, &body).await;
    let (records, problems) = agent.calls(session);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(records.len(), 4);
    let serving: Vec<Value> = records
        .iter()
        .map(|r| serde_json::to_value(&r.backend.serving).unwrap())
        .collect();
    assert_eq!(serving[1]["prompt"]["kind"], "extends", "{serving:?}");
    assert_eq!(
        serving[2]["prompt"]["call"], 0,
        "the main call: {serving:?}"
    );
    assert_eq!(serving[3]["prompt"]["call"], 2, "{serving:?}");
    // The trajectory: the main agent's three calls one main trace, the
    // check a side trace of its own.
    let traj = common::traj::build(&polar_trajectory::Builder::default(), &records, session);
    let ids = |t: &polar_trajectory::Trace| t.call_ids.clone();
    let call = |i: usize| records[i].call_id.clone();
    let main: Vec<_> = traj
        .traces
        .iter()
        .filter(|t| t.role == polar_trajectory::ChainRole::Main)
        .collect();
    assert_eq!(main.len(), 1, "{:?}", traj.traces);
    assert_eq!(ids(main[0]), vec![call(0), call(2), call(3)]);
    let side: Vec<_> = traj
        .traces
        .iter()
        .filter(|t| t.role == polar_trajectory::ChainRole::Side)
        .collect();
    assert_eq!(side.len(), 1, "{:?}", traj.traces);
    assert_eq!(ids(side[0]), vec![call(1)]);
    common::traj::stop(mock, agent).await;
}
