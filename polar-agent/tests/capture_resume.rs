//! Failover inside a call, through the capture stage: a replica that cuts
//! its stream or aborts the generation after output reached the harness is
//! resumed on the other replica from the tokens generated so far (vLLM
//! `/v1/completions`, SGLang `/generate`), and the harness gets one
//! well-formed reply with the same text and tool calls as a call that
//! never failed; the record holds both parts' ids and logprobs (the same as
//! the unfaulted call's), marked `resumed` with both replicas. Faults in the
//! reasoning, the text and a tool call's arguments, in both dialects. A fault
//! before any output is sent again, whole. When every replica is down the
//! harness gets a retryable error and the call is recorded as failed.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

mod common;

use common::*;
use http::StatusCode;
use polar_mock::script::{Script, ScriptedCall, SessionScript, Turn};
use polar_mock::{self as mock, Dialect, MockConfig, MockHandle};
use polar_record::{CallStatus, CompletionRecord};
use serde_json::Value;

/// The `[[backend]]` over `urls`, with the output parser.
fn backend(dialect: Dialect, urls: &[String]) -> String {
    let replicas: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        "[[backend]]\nname = \"mock\"\ndialect = \"{}\"\nreplicas = [{}]\n\
         served_model = \"polar-mock\"\nrequest_timeout_ms = 5000\nconnect_timeout_ms = 200\n\
         output_parser = \"qwen3\"\n",
        dialect.as_str(),
        replicas.join(", ")
    )
}

/// Reasoning, text and a call of the shell tool: about 90 tokens.
fn turn() -> Turn {
    Turn {
        think: Some("I will list the files first, then answer.".into()),
        text: Some("Listing the files now.".into()),
        tool_calls: vec![ScriptedCall {
            shell: Some("ls -la && echo listed".into()),
            ..ScriptedCall::default()
        }],
        ..Turn::default()
    }
}

fn script(turn: Turn) -> Script {
    Script {
        final_text: Some("recovered".into()),
        sessions: vec![SessionScript {
            id: "*".into(),
            turns: vec![turn],
            ..SessionScript::default()
        }],
    }
}

async fn mocks(dialect: Dialect, turn: &Turn, down_after_fault: bool, n: usize) -> Vec<MockHandle> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            mock::start(MockConfig {
                dialect,
                script: Some(script(turn.clone())),
                down_after_fault,
                ..MockConfig::default()
            })
            .await
            .unwrap(),
        );
    }
    out
}

/// What the harness sees of a reply: its text and its tool calls (name,
/// arguments as JSON), whatever the API and framing.
fn visible(h: Harness, reply: &Reply, stream: bool) -> (String, Vec<(String, Value)>) {
    let mut text = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    let args = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    if !stream {
        let v = reply.json();
        let mut out = Vec::new();
        match h {
            Harness::Claude => {
                for b in v["content"].as_array().unwrap() {
                    match b["type"].as_str() {
                        Some("text") => text.push_str(b["text"].as_str().unwrap()),
                        Some("tool_use") => {
                            out.push((b["name"].as_str().unwrap().to_owned(), b["input"].clone()))
                        }
                        _ => {}
                    }
                }
            }
            Harness::Qwen => {
                let m = &v["choices"][0]["message"];
                text.push_str(m["content"].as_str().unwrap_or_default());
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    out.push((
                        c["function"]["name"].as_str().unwrap().to_owned(),
                        args(c["function"]["arguments"].as_str().unwrap()),
                    ));
                }
            }
            Harness::Codex => {
                for item in v["output"].as_array().unwrap() {
                    collect_codex_item(item, &mut text, &mut out);
                }
            }
            Harness::Gemini => {
                for p in v["candidates"][0]["content"]["parts"].as_array().unwrap() {
                    collect_gemini_part(p, &mut text, &mut out);
                }
            }
        }
        return (text, out);
    }
    let values: Vec<Value> = reply
        .events()
        .iter()
        .filter_map(|e| e.json().ok())
        .collect();
    let mut out = Vec::new();
    match h {
        Harness::Claude => {
            for v in &values {
                match (v["type"].as_str(), v["delta"]["type"].as_str()) {
                    (Some("content_block_start"), _)
                        if v["content_block"]["type"] == "tool_use" =>
                    {
                        calls.push((
                            v["content_block"]["name"].as_str().unwrap().to_owned(),
                            String::new(),
                        ));
                    }
                    (Some("content_block_delta"), Some("text_delta")) => {
                        text.push_str(v["delta"]["text"].as_str().unwrap());
                    }
                    (Some("content_block_delta"), Some("input_json_delta")) => {
                        calls
                            .last_mut()
                            .unwrap()
                            .1
                            .push_str(v["delta"]["partial_json"].as_str().unwrap());
                    }
                    _ => {}
                }
            }
        }
        Harness::Qwen => {
            for v in &values {
                let d = &v["choices"][0]["delta"];
                text.push_str(d["content"].as_str().unwrap_or_default());
                for c in d["tool_calls"].as_array().into_iter().flatten() {
                    let i = c["index"].as_u64().unwrap() as usize;
                    if calls.len() <= i {
                        calls.resize(i + 1, (String::new(), String::new()));
                    }
                    if let Some(n) = c["function"]["name"].as_str() {
                        calls[i].0.push_str(n);
                    }
                    calls[i]
                        .1
                        .push_str(c["function"]["arguments"].as_str().unwrap_or_default());
                }
            }
        }
        Harness::Codex => {
            for v in values
                .iter()
                .filter(|v| v["type"] == "response.output_item.done")
            {
                collect_codex_item(&v["item"], &mut text, &mut out);
            }
        }
        Harness::Gemini => {
            for v in &values {
                for p in v["candidates"][0]["content"]["parts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    collect_gemini_part(p, &mut text, &mut out);
                }
            }
        }
    }
    out.extend(calls.into_iter().map(|(n, a)| (n, args(&a))));
    (text, out)
}

fn collect_codex_item(item: &Value, text: &mut String, out: &mut Vec<(String, Value)>) {
    match item["type"].as_str() {
        Some("message") => {
            for c in item["content"].as_array().into_iter().flatten() {
                text.push_str(c["text"].as_str().unwrap_or_default());
            }
        }
        Some("function_call") => out.push((
            item["name"].as_str().unwrap().to_owned(),
            serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap(),
        )),
        _ => {}
    }
}

fn collect_gemini_part(p: &Value, text: &mut String, out: &mut Vec<(String, Value)>) {
    if p["thought"] == true {
        return;
    }
    if let Some(t) = p["text"].as_str() {
        text.push_str(t);
    }
    if p["functionCall"].is_object() {
        out.push((
            p["functionCall"]["name"].as_str().unwrap().to_owned(),
            p["functionCall"]["args"].clone(),
        ));
    }
}

/// One call per API and framing against `agent`; the replies.
async fn one_call_each(agent: &TestAgent, name: &str) -> Vec<(Harness, bool, String, Reply)> {
    let mut out = Vec::new();
    for h in HARNESSES {
        for stream in [false, true] {
            let session = format!("{name}-{h:?}-{stream}").to_lowercase();
            agent.session(&session, "t");
            let reply = send(h.request(agent.addr, &session, h.first_turn(), stream)).await;
            out.push((h, stream, session, reply));
        }
    }
    out
}

fn only_record(agent: &TestAgent, session: &str) -> CompletionRecord {
    let (mut records, problems) = agent.calls(session);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(records.len(), 1, "{session}");
    records.remove(0)
}

/// The replies and records of a call that never failed, per API and
/// framing (the reference).
async fn unfaulted(dialect: Dialect) -> Vec<((String, Vec<(String, Value)>), CompletionRecord)> {
    let m = mocks(dialect, &turn(), false, 1).await;
    let agent = TestAgent::start(&backend(dialect, &[m[0].url()])).await;
    let mut out = Vec::new();
    for (h, stream, session, reply) in one_call_each(&agent, "plain").await {
        h.check_reply(&reply, stream);
        let record = only_record(&agent, &session);
        assert!(record.resumed.is_none());
        out.push((visible(h, &reply, stream), record));
    }
    agent.stop().await;
    for m in m {
        m.stop().await;
    }
    out
}

/// Faults the turn with `fault` on every replica's first attempt; checks
/// each reply is the unfaulted one and each record is resumed on the other
/// replica with the unfaulted ids and logprobs; returns the records.
async fn resumed_like_unfaulted(
    dialect: Dialect,
    name: &str,
    fault: Turn,
) -> Vec<CompletionRecord> {
    let reference = unfaulted(dialect).await;
    let m = mocks(dialect, &fault, false, 2).await;
    let urls: Vec<String> = m.iter().map(MockHandle::url).collect();
    let agent = TestAgent::start(&backend(dialect, &urls)).await;
    let mut records = Vec::new();
    let calls = one_call_each(&agent, name).await;
    for ((h, stream, session, reply), (seen, plain)) in calls.into_iter().zip(reference) {
        let what = format!("{name} {h:?} stream={stream}");
        h.check_reply(&reply, stream);
        assert_eq!(visible(h, &reply, stream), seen, "{what}");
        let r = only_record(&agent, &session);
        assert_eq!(r.status, CallStatus::Completed, "{what}");
        check_tokens(agent.backend(), &r);
        assert_eq!(r.prompt_token_ids, plain.prompt_token_ids, "{what}");
        assert_eq!(r.response_token_ids, plain.response_token_ids, "{what}");
        assert_eq!(r.response_logprobs, plain.response_logprobs, "{what}");
        assert_eq!(r.finish_reason, plain.finish_reason, "{what}");
        let (got, want) = (
            r.response.as_ref().unwrap(),
            plain.response.as_ref().unwrap(),
        );
        assert_eq!(
            got.message.joined_text(),
            want.message.joined_text(),
            "{what}"
        );
        assert_eq!(
            got.message.reasoning.as_ref().map(|x| &x.text),
            want.message.reasoning.as_ref().map(|x| &x.text),
            "{what}"
        );
        let calls = |m: &polar_chat::Message| -> Vec<(String, String)> {
            m.tool_calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect()
        };
        assert_eq!(calls(&got.message), calls(&want.message), "{what}");
        let resumed = r
            .resumed
            .clone()
            .unwrap_or_else(|| panic!("{what}: not marked resumed"));
        assert_eq!(resumed.replicas.len(), 2, "{what}: {resumed:?}");
        assert_ne!(
            resumed.replicas[0], resumed.replicas[1],
            "{what}: the other replica"
        );
        assert!(resumed.replicas.iter().all(|u| urls.contains(u)));
        assert_eq!(r.backend.replica, resumed.replicas[1]);
        assert_eq!(
            resumed.part_tokens.iter().sum::<u32>() as usize,
            r.response_token_ids.as_ref().unwrap().len(),
            "{what}: {resumed:?}"
        );
        assert_eq!(resumed.faults.len(), 1);
        records.push(r);
    }
    agent.stop().await;
    for m in m {
        m.stop().await;
    }
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_cuts_are_resumed_in_reasoning_text_and_tool_calls() {
    for at in [6, 35, 80] {
        let records = resumed_like_unfaulted(
            Dialect::Vllm,
            &format!("cut{at}"),
            Turn {
                disconnect_after: Some(at),
                ..turn()
            },
        )
        .await;
        for r in records {
            let resumed = r.resumed.unwrap();
            assert_eq!(resumed.part_tokens[0], at, "{resumed:?}");
            assert!(resumed.faults[0].contains("cut"), "{resumed:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_aborts_are_resumed() {
    // In the reasoning and in the text (inside a tool call's arguments:
    // `aborts_inside_a_tool_calls_arguments_are_resumed`).
    for at in [12, 35] {
        let records = resumed_like_unfaulted(
            Dialect::Vllm,
            &format!("abort{at}"),
            Turn {
                abort_after: Some(at),
                ..turn()
            },
        )
        .await;
        for r in records {
            let resumed = r.resumed.unwrap();
            assert_eq!(resumed.part_tokens[0], at);
            assert!(resumed.faults[0].contains("aborted"), "{resumed:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborts_inside_a_tool_calls_arguments_are_resumed() {
    // After 80 generated tokens: inside the shell call's arguments whatever
    // the API names the tool (they begin after 63 to 69 tokens, end after
    // 84 or more). A streamed vLLM reply had sent the call's head and part
    // of its arguments (as vLLM's streaming tool parser does); SGLang's
    // whole reply had sent nothing.
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        let name = format!("{}argabort", dialect.as_str());
        let fault = Turn {
            abort_after: Some(80),
            ..turn()
        };
        for r in resumed_like_unfaulted(dialect, &name, fault).await {
            let resumed = r.resumed.unwrap();
            assert_eq!(resumed.part_tokens[0], 80, "{dialect:?}: {resumed:?}");
            assert!(resumed.faults[0].contains("abort"), "{resumed:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_a_server_re_serialized_are_resumed_from_the_models_text() {
    // The replicas send tool call arguments as vLLM's hermes parser does,
    // re-serialized the way `json.dumps` writes them; the model wrote them
    // compact. A cut inside them (80 ids) is resumed from the model's own
    // text: the harness gets the same arguments, as JSON, and the record
    // the unfaulted call's ids and logprobs.
    let dumps = |turn: Turn| MockConfig {
        script: Some(script(turn)),
        json_dumps_arguments: true,
        ..MockConfig::default()
    };
    let plain = mock::start(dumps(turn())).await.unwrap();
    let agent = TestAgent::start(&backend(Dialect::Vllm, &[plain.url()])).await;
    let mut reference = Vec::new();
    for (h, stream, session, reply) in one_call_each(&agent, "dumps").await {
        let r = only_record(&agent, &session);
        let sent = &r.response.as_ref().unwrap().message.tool_calls[0].arguments;
        assert!(sent.contains("\": \""), "{h:?}: {sent}");
        reference.push((visible(h, &reply, stream), r));
    }
    agent.stop().await;
    plain.stop().await;
    let cut = Turn {
        disconnect_after: Some(80),
        ..turn()
    };
    let (a, b) = (
        mock::start(dumps(cut.clone())).await.unwrap(),
        mock::start(dumps(cut)).await.unwrap(),
    );
    let agent = TestAgent::start(&backend(Dialect::Vllm, &[a.url(), b.url()])).await;
    let calls = one_call_each(&agent, "dumpscut").await;
    for ((h, stream, session, reply), (seen, plain)) in calls.into_iter().zip(reference) {
        let what = format!("{h:?} stream={stream}");
        h.check_reply(&reply, stream);
        assert_eq!(visible(h, &reply, stream), seen, "{what}");
        let r = only_record(&agent, &session);
        assert_eq!(r.status, CallStatus::Completed, "{what}");
        assert_eq!(r.response_token_ids, plain.response_token_ids, "{what}");
        assert_eq!(r.response_logprobs, plain.response_logprobs, "{what}");
        let resumed = r.resumed.unwrap();
        assert_eq!(resumed.part_tokens[0], 80, "{what}: {resumed:?}");
    }
    agent.stop().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_aborts_are_resumed_and_cuts_sent_again() {
    // An abort after tokens: resumed through /generate with input_ids.
    for r in resumed_like_unfaulted(
        Dialect::Sglang,
        "sgabort",
        Turn {
            abort_after: Some(40),
            ..turn()
        },
    )
    .await
    {
        assert_eq!(r.resumed.unwrap().part_tokens[0], 40);
    }
    // A reply cut before any of it arrived (SGLang replies come whole): the
    // request is sent again to the other replica; no token of the first
    // part is kept.
    for r in resumed_like_unfaulted(
        Dialect::Sglang,
        "sgcut",
        Turn {
            disconnect_after: Some(40),
            ..turn()
        },
    )
    .await
    {
        assert_eq!(r.resumed.unwrap().part_tokens[0], 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_set_that_is_down_fails_the_call_with_a_retryable_error() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        for h in HARNESSES {
            for stream in [false, true] {
                let what = format!("{dialect:?} {h:?} stream={stream}");
                // The replica dies after its fault; the other one never
                // listens.
                let fault = Turn {
                    abort_after: Some(20),
                    ..turn()
                };
                let m = mocks(dialect, &fault, true, 1).await;
                let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let dead = format!("http://{}", probe.local_addr().unwrap());
                drop(probe);
                let agent = TestAgent::start(&backend(dialect, &[m[0].url(), dead])).await;
                agent.session("down", "t");
                let reply = send(h.request(agent.addr, "down", h.first_turn(), stream)).await;
                if stream && dialect == Dialect::Vllm {
                    // Output was streamed: the API's error event ends it
                    // (SGLang's whole reply ending in an abort yields none
                    // of its output: a status).
                    assert_eq!(reply.status, StatusCode::OK, "{what}");
                    let last = reply
                        .events()
                        .into_iter()
                        .rev()
                        .find(|e| e.data != "[DONE]")
                        .unwrap();
                    let text = last.data.to_lowercase();
                    assert!(
                        text.contains("error") || text.contains("failed"),
                        "{what}: {text}"
                    );
                } else {
                    let status = reply.status.as_u16();
                    assert!(matches!(status, 503 | 529), "{what}: {status}");
                }
                let r = only_record(&agent, "down");
                assert!(
                    matches!(&r.status, CallStatus::Failed { side, .. } if side == "backend"),
                    "{what}: {:?}",
                    r.status
                );
                assert!(r.resumed.is_none(), "{what}");
                assert_eq!(
                    r.response_token_ids.as_ref().map(Vec::len),
                    Some(20),
                    "{what}"
                );
                agent.stop().await;
                for m in m {
                    m.stop().await;
                }
            }
        }
    }
}
