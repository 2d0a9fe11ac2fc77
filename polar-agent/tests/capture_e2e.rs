//! The capture stage end to end through the real proxy code path (base-URL
//! mode on loopback, no sandbox, no root) against the mock backend: all
//! four harness APIs, streamed and not; token ids in the capture log equal
//! to the mock's tokenizer; tool-call ids across turns; Responses
//! `previous_response_id`, also after a restart; side calls (token counts
//! by the backend's tokenizer, the labelled estimate when it cannot); gzip
//! bodies.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use polar_chat::Api;
use polar_chat::Role;
use polar_mock::script::{Script, SessionScript, Turn};
use polar_mock::{self as mock, MockConfig};
use polar_record::CallStatus;
use serde_json::{Value, json};

async fn mock_default() -> mock::MockHandle {
    mock::start(MockConfig::default()).await.unwrap()
}

/// Every API, streamed and not, on both dialects: the record's prompt and
/// response ids are the mock's own tokenization (on SGLang the response ids
/// come from `meta_info.output_token_logprobs`, as real SGLang sends them:
/// its chat replies carry no `token_ids`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_streamed_and_not_with_token_ids_in_the_log() {
    for dialect in [polar_mock::Dialect::Vllm, polar_mock::Dialect::Sglang] {
        let mock = mock::start(MockConfig {
            dialect,
            ..MockConfig::default()
        })
        .await
        .unwrap();
        let toml = backend_toml("mock", &mock.url(), 5000).replace(
            "dialect = \"vllm\"",
            &format!("dialect = \"{}\"", dialect.as_str()),
        );
        let agent = TestAgent::start(&toml).await;
        for h in HARNESSES {
            for stream in [false, true] {
                let session = format!("s-{h:?}-{stream}-{}", dialect.as_str()).to_lowercase();
                agent.session(&session, "task-1");
                let reply = send(h.request(agent.addr, &session, h.fixture(), stream)).await;
                let ids = h.check_reply(&reply, stream);
                let (records, problems) = agent.calls(&session);
                assert!(problems.is_empty(), "{problems:?}");
                assert_eq!(records.len(), 1, "{h:?} {stream}");
                let r = &records[0];
                assert_eq!(r.seq, 0);
                assert_eq!(r.session_id, session);
                assert_eq!(r.task_id.as_deref(), Some("task-1"));
                assert_eq!(r.native_request.api, h.api());
                assert_eq!(r.native_request.method, "POST");
                assert_eq!(r.request.stream, stream, "{h:?}");
                assert_eq!(r.backend.name, "mock");
                assert_eq!(r.backend.weight_version.as_deref(), Some("0"));
                check_tokens(agent.backend(), r);
                let resp = r.response.as_ref().unwrap();
                let recorded: Vec<&str> = resp
                    .message
                    .tool_calls
                    .iter()
                    .map(|c| c.id.as_str())
                    .collect();
                assert_eq!(
                    ids, recorded,
                    "{h:?} {stream} {dialect:?}: ids the harness saw"
                );
            }
        }
        agent.stop().await;
        mock.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_ids_round_trip_across_two_turns() {
    let mock = mock_default().await;
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    for h in HARNESSES {
        let session = format!("tools-{h:?}").to_lowercase();
        agent.session(&session, "t");
        let first = h.first_turn();
        let r1 = send(h.request(agent.addr, &session, first.clone(), false)).await;
        let ids1 = h.check_reply(&r1, false);
        assert_eq!(ids1.len(), 1, "{h:?}: {}", r1.text());
        let second = second_turn(h, first, &r1.json());
        let r2 = send(h.request(agent.addr, &session, second, true)).await;
        let ids2 = h.check_reply(&r2, true);
        assert!(
            ids2.is_empty(),
            "{h:?}: the mock answers a tool result with text"
        );

        let (records, problems) = agent.calls(&session);
        assert!(problems.is_empty());
        assert_eq!(records.len(), 2);
        for r in &records {
            check_tokens(agent.backend(), r);
        }
        let call = &records[0].response.as_ref().unwrap().message.tool_calls[0];
        assert_eq!(call.id, ids1[0]);
        let req2 = &records[1].request;
        let assistant = req2
            .messages
            .iter()
            .find(|m| m.role == Role::Assistant && !m.tool_calls.is_empty())
            .unwrap();
        assert_eq!(assistant.tool_calls[0].id, ids1[0], "{h:?}");
        assert_eq!(assistant.tool_calls[0].name, call.name);
        let result = req2.messages.iter().find(|m| m.role == Role::Tool).unwrap();
        assert_eq!(result.tool_call_id.as_deref(), Some(ids1[0].as_str()));
        // The second prompt extends the first prompt and response (the
        // mock's template preserves prefixes).
        let p1 = records[0].prompt_token_ids.clone().unwrap();
        let g1 = records[0].response_token_ids.clone().unwrap();
        let p2 = records[1].prompt_token_ids.clone().unwrap();
        let earlier: Vec<u32> = p1.into_iter().chain(g1).collect();
        assert_eq!(&p2[..earlier.len()], earlier.as_slice(), "{h:?}");
        assert_eq!(records[1].seq, 1);
    }
    agent.stop().await;
    mock.stop().await;
}

fn responses_continuation(prev: &str, call_id: &str) -> Value {
    json!({
        "model": "gpt-5",
        "previous_response_id": prev,
        "input": [{"type": "function_call_output", "call_id": call_id, "output": "ok"}],
        "tools": Harness::Codex.first_turn()["tools"],
        "store": true,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_response_id_continues_from_the_session_history() {
    let mock = mock_default().await;
    let toml = backend_toml("mock", &mock.url(), 5000);
    let agent = TestAgent::start(&toml).await;
    let h = Harness::Codex;
    let session = "codex-prev";
    agent.session(session, "t");
    let r1 = send(h.request(agent.addr, session, h.first_turn(), true)).await;
    let call_ids = h.check_reply(&r1, true);
    let completed = r1.events().last().unwrap().json().unwrap();
    let resp_id = completed["response"]["id"].as_str().unwrap().to_owned();
    assert!(resp_id.starts_with("resp_"));

    let r2 = send(h.request(
        agent.addr,
        session,
        responses_continuation(&resp_id, &call_ids[0]),
        false,
    ))
    .await;
    h.check_reply(&r2, false);
    let (records, _) = agent.calls(session);
    assert_eq!(records.len(), 2);
    check_tokens(agent.backend(), &records[1]);
    let p1 = records[0].prompt_token_ids.clone().unwrap();
    let g1 = records[0].response_token_ids.clone().unwrap();
    let p2 = records[1].prompt_token_ids.clone().unwrap();
    assert_eq!(&p2[..p1.len() + g1.len()], [p1, g1].concat().as_slice());
    let kinds: Vec<Role> = records[1].request.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        kinds,
        [Role::Developer, Role::User, Role::Assistant, Role::Tool]
    );

    // An id the session never produced: 400 in OpenAI's shape, recorded.
    let bad = send(h.request(
        agent.addr,
        session,
        responses_continuation("resp_nope", "call_x"),
        false,
    ))
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(
        bad.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("resp_nope")
    );
    let (records, _) = agent.calls(session);
    assert_eq!(records.len(), 3);
    assert!(matches!(&records[2].status, CallStatus::Failed { side, .. } if side == "harness"));

    // After a restart the history is rebuilt from the log.
    let second_id = r2.json()["id"].as_str().unwrap().to_owned();
    let state = agent.stop().await;
    let agent = TestAgent::start_in(state, &toml).await;
    agent.session(session, "t");
    let r3 = send(h.request(
        agent.addr,
        session,
        json!({"model": "gpt-5", "previous_response_id": second_id,
               "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]}]}),
        true,
    ))
    .await;
    h.check_reply(&r3, true);
    let (records, problems) = agent.calls(session);
    assert!(problems.is_empty());
    assert_eq!(records.len(), 4);
    assert_eq!(records[3].seq, 3, "seq continues after a restart");
    assert_eq!(records[3].request.messages.len(), 6);
    agent.stop().await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_calls_are_answered_in_the_api_shape() {
    let mock = mock_default().await;
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    let s = "side";
    agent.session(s, "t");
    let a = &[("anthropic-version", "2023-06-01")];
    let count = send(request(
        agent.addr,
        s,
        Method::POST,
        "/v1/messages/count_tokens",
        a,
        Bytes::from(Harness::Claude.fixture().to_string()),
    ))
    .await;
    assert_eq!(count.status, StatusCode::OK);
    assert!(count.json()["input_tokens"].as_u64().unwrap() > 10);
    assert_eq!(count.headers["x-polar-token-count"], "backend");

    let models = send(request(
        agent.addr,
        s,
        Method::GET,
        "/v1/models",
        a,
        Bytes::new(),
    ))
    .await;
    assert_eq!(models.json()["data"][0]["id"], "polar-mock");
    assert_eq!(models.json()["data"][0]["type"], "model");
    let models = send(request(
        agent.addr,
        s,
        Method::GET,
        "/v1beta/models",
        &[],
        Bytes::new(),
    ))
    .await;
    assert_eq!(models.json()["models"][0]["name"], "models/polar-mock");

    let ws = send(request(
        agent.addr,
        s,
        Method::GET,
        "/v1/responses",
        &[],
        Bytes::new(),
    ))
    .await;
    assert_eq!(ws.status, StatusCode::UPGRADE_REQUIRED);

    let head = send(request(agent.addr, s, Method::HEAD, "/", &[], Bytes::new())).await;
    assert_eq!(head.status, StatusCode::OK);

    let other = send(request(
        agent.addr,
        s,
        Method::POST,
        "/api/event_logging/batch",
        a,
        Bytes::from_static(b"{}"),
    ))
    .await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    assert_eq!(other.json()["type"], "error", "Anthropic's error shape");

    let bad = send(request(
        agent.addr,
        s,
        Method::POST,
        "/v1/chat/completions",
        &[],
        Bytes::from_static(b"{\"model\": "),
    ))
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.json()["error"]["message"].is_string());
    let bad = send(request(
        agent.addr,
        s,
        Method::POST,
        "/v1/messages",
        a,
        Bytes::from(json!({"model": "m", "max_tokens": 5}).to_string()),
    ))
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.json()["error"]["type"], "invalid_request_error");

    // Side calls leave no records; the two refused model calls do.
    let (records, _) = agent.calls(s);
    assert_eq!(records.len(), 2);
    assert!(
        records
            .iter()
            .all(|r| matches!(&r.status, CallStatus::Failed { side, .. } if side == "harness"))
    );
    assert_eq!(records[0].native_request.api, Api::OpenaiChat);
    agent.stop().await;
    mock.stop().await;
}

/// Anthropic `count_tokens` and Gemini `countTokens` are answered by the
/// backend's tokenizer with its chat template (the mock's `/tokenize`, on
/// both dialects): the count equals the prompt length of the real call
/// with the same conversation, labelled `x-polar-token-count: backend`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counts_equal_the_prompt_of_the_real_call() {
    for dialect in [polar_mock::Dialect::Vllm, polar_mock::Dialect::Sglang] {
        let mock = mock::start(MockConfig {
            dialect,
            ..MockConfig::default()
        })
        .await
        .unwrap();
        let toml = backend_toml("mock", &mock.url(), 5000).replace(
            "dialect = \"vllm\"",
            &format!("dialect = \"{}\"", dialect.as_str()),
        );
        let agent = TestAgent::start(&toml).await;
        for h in [Harness::Claude, Harness::Gemini] {
            let s = format!("count-{h:?}-{}", dialect.as_str()).to_lowercase();
            agent.session(&s, "t");
            let (path, headers): (&str, &[(&str, &str)]) = match h {
                Harness::Claude => (
                    "/v1/messages/count_tokens?beta=true",
                    &[("anthropic-version", "2023-06-01")],
                ),
                _ => ("/v1beta/models/gemini-2.5-pro:countTokens", &[]),
            };
            let count = send(request(
                agent.addr,
                &s,
                Method::POST,
                path,
                headers,
                Bytes::from(h.fixture().to_string()),
            ))
            .await;
            assert_eq!(count.status, StatusCode::OK, "{h:?}: {}", count.text());
            assert_eq!(count.headers["x-polar-token-count"], "backend", "{h:?}");
            let n = match h {
                Harness::Claude => count.json()["input_tokens"].as_u64().unwrap(),
                _ => count.json()["totalTokens"].as_u64().unwrap(),
            };
            let reply = send(h.request(agent.addr, &s, h.fixture(), false)).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
            let (records, _) = agent.calls(&s);
            assert_eq!(records.len(), 1, "the count is no model call");
            check_tokens(agent.backend(), &records[0]);
            let prompt = records[0].prompt_token_ids.as_ref().unwrap();
            assert_eq!(n, prompt.len() as u64, "{h:?} {dialect:?}");
            let usage = &records[0].response.as_ref().unwrap().usage;
            assert_eq!(usage.prompt_tokens as u64, n, "usage is the backend's");
        }
        agent.stop().await;
        mock.stop().await;
    }
}

/// A count goes where a chat request would: past a replica that answers
/// 503 (overloaded, restarting) to the next one, still the backend's count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counts_go_past_an_overloaded_replica() {
    let mock = mock_default().await;
    let overloaded = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bad = format!("http://{}", overloaded.local_addr().unwrap());
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = hits.clone();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut conn, _)) = overloaded.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut buf = vec![0u8; 64 << 10];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 10\r\nconnection: close\r\n\r\noverloaded")
                .await;
        }
    });
    let toml = backend_toml("mock", &mock.url(), 5000).replace(
        &format!("[\"{}\"]", mock.url()),
        &format!("[\"{bad}\", \"{}\"]", mock.url()),
    );
    let agent = TestAgent::start(&toml).await;
    // Rendezvous hashing over ports picked at random: choose the sessions
    // whose first replica is the overloaded one, so that every run tries it.
    let pool = polar_inference::Pool::new(&agent.config.backends[0]).unwrap();
    let names = (0..).map(|i| format!("count-past-{i}"));
    let ranks_bad_first = |s: &String| pool.pick(s).as_deref() == Some(bad.as_str());
    let mut sessions: Vec<String> = names.clone().filter(ranks_bad_first).take(4).collect();
    let first_tries = sessions.len();
    sessions.extend(names.filter(|s| !ranks_bad_first(s)).take(2));
    for s in &sessions {
        agent.session(s, "t");
        let count = send(request(
            agent.addr,
            s,
            Method::POST,
            "/v1/messages/count_tokens",
            &[("anthropic-version", "2023-06-01")],
            Bytes::from(Harness::Claude.fixture().to_string()),
        ))
        .await;
        assert_eq!(count.status, StatusCode::OK, "{}", count.text());
        assert_eq!(count.headers["x-polar-token-count"], "backend", "{s}");
    }
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::Relaxed),
        first_tries,
        "each count whose session ranks the overloaded replica first tries it once, the others never"
    );
    agent.stop().await;
    server.abort();
    mock.stop().await;
}

/// A backend that cannot count (here an SGLang backend whose server has no
/// `/v1/tokenize`) leaves the estimate, labelled as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counts_fall_back_to_a_labelled_estimate() {
    let mock = mock_default().await;
    let toml = backend_toml("mock", &mock.url(), 5000)
        .replace("dialect = \"vllm\"", "dialect = \"sglang\"");
    let agent = TestAgent::start(&toml).await;
    agent.session("est", "t");
    let body = Harness::Claude.fixture();
    let count = send(request(
        agent.addr,
        "est",
        Method::POST,
        "/v1/messages/count_tokens",
        &[("anthropic-version", "2023-06-01")],
        Bytes::from(body.to_string()),
    ))
    .await;
    assert_eq!(count.status, StatusCode::OK);
    assert_eq!(count.headers["x-polar-token-count"], "estimate-bytes/4");
    assert_eq!(
        count.json()["input_tokens"].as_u64().unwrap(),
        polar_chat::provider::canned::estimate_tokens(&body)
    );
    let bad = send(request(
        agent.addr,
        "est",
        Method::POST,
        "/v1/messages/count_tokens",
        &[("anthropic-version", "2023-06-01")],
        Bytes::from(json!({"model": "m", "messages": "nope"}).to_string()),
    ))
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.json()["type"], "error", "Anthropic's error shape");
    agent.stop().await;
    mock.stop().await;
}

/// Structured output end to end: a Responses `text.format` and a Chat
/// `response_format` reach the backend's constrained decoding (the mock
/// answers schema-valid JSON only because it was asked), the Responses
/// reply echoes the format; a backend configured with
/// `constrained_decoding = false` refuses it with 400 in the API's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_output_through_the_proxy() {
    let mock = mock_default().await;
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    agent.session("json", "t");
    let schema = json!({"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]});
    let mut codex = Harness::Codex.fixture();
    codex["text"] = json!({"format": {"type": "json_schema", "name": "title", "schema": schema, "strict": true}});
    for stream in [false, true] {
        let reply = send(Harness::Codex.request(agent.addr, "json", codex.clone(), stream)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let response = if stream {
            let text = reply.text();
            let done = text
                .split("\n\n")
                .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
                .map(|d| serde_json::from_str::<Value>(d).unwrap())
                .find(|v| v["type"] == "response.completed")
                .unwrap();
            done["response"].clone()
        } else {
            reply.json()
        };
        assert_eq!(response["text"]["format"]["type"], "json_schema");
        assert_eq!(response["text"]["format"]["schema"], schema);
        let message = response["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["type"] == "message")
            .unwrap();
        let text = message["content"][0]["text"].as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(text).unwrap(),
            json!({"title": "polar title"})
        );
    }
    let mut chat = Harness::Qwen.fixture();
    chat["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "title", "schema": schema}});
    let reply = send(Harness::Qwen.request(agent.addr, "json", chat.clone(), false)).await;
    let content = reply.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        serde_json::from_str::<Value>(&content).unwrap(),
        json!({"title": "polar title"})
    );
    let (records, _) = agent.calls("json");
    assert!(
        records.iter().all(|r| r.request.response_format.is_some()),
        "the record keeps the constraint"
    );
    agent.stop().await;

    let toml = format!(
        "{}constrained_decoding = false\n",
        backend_toml("mock", &mock.url(), 5000)
    );
    let agent = TestAgent::start(&toml).await;
    agent.session("plain", "t");
    let refused = send(Harness::Qwen.request(agent.addr, "plain", chat, false)).await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{}",
        refused.text()
    );
    assert_eq!(refused.json()["error"]["type"], "invalid_request_error");
    assert!(
        refused.text().contains("cannot honour structured output"),
        "{}",
        refused.text()
    );
    let (records, _) = agent.calls("plain");
    assert!(matches!(&records[0].status, CallStatus::Failed { side, .. } if side == "harness"));
    let plain =
        send(Harness::Qwen.request(agent.addr, "plain", Harness::Qwen.fixture(), false)).await;
    assert_eq!(
        plain.status,
        StatusCode::OK,
        "calls without a constraint still pass"
    );
    agent.stop().await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_request_bodies_are_inflated() {
    let mock = mock_default().await;
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    let s = "gzip";
    agent.session(s, "t");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(Harness::Claude.fixture().to_string().as_bytes())
        .unwrap();
    let body = Bytes::from(enc.finish().unwrap());
    let reply = send(request(
        agent.addr,
        s,
        Method::POST,
        "/v1/messages?beta=true",
        &[
            ("anthropic-version", "2023-06-01"),
            ("content-encoding", "gzip"),
            ("content-type", "application/json"),
        ],
        body,
    ))
    .await;
    Harness::Claude.check_reply(&reply, true);
    let (records, _) = agent.calls(s);
    assert_eq!(
        records[0].native_request.body.to_value()["model"],
        "claude-opus-4-8"
    );
    check_tokens(agent.backend(), &records[0]);
    agent.stop().await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_reach_the_harness_as_generated() {
    let turn = Turn {
        think: Some("let me think about it".into()),
        text: Some("one two three four five six seven eight nine ten".into()),
        ..Turn::default()
    };
    let mock = mock::start(MockConfig {
        token_latency: Duration::from_millis(15),
        script: Some(Script {
            final_text: None,
            sessions: vec![SessionScript {
                id: "*".into(),
                turns: vec![turn],
                ..SessionScript::default()
            }],
        }),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    for h in HARNESSES {
        let s = &format!("live-{h:?}").to_lowercase();
        agent.session(s, "t");
        let started = Instant::now();
        let resp = client()
            .request(h.request(agent.addr, s, h.first_turn(), true))
            .await
            .unwrap();
        let mut body = resp.into_body();
        let mut first = None;
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(d) = frame.unwrap().into_data() {
                first.get_or_insert_with(|| started.elapsed());
                bytes.extend_from_slice(&d);
            }
        }
        let total = started.elapsed();
        let first = first.unwrap();
        assert!(
            total - first >= Duration::from_millis(15 * 8),
            "{h:?}: first bytes at {first:?}, end at {total:?}: not streamed"
        );
        h.check_reply(
            &Reply {
                status: StatusCode::OK,
                headers: {
                    let mut m = http::HeaderMap::new();
                    m.insert("content-type", "text/event-stream".parse().unwrap());
                    m.insert("cache-control", "no-cache".parse().unwrap());
                    m
                },
                body: Bytes::from(bytes),
            },
            true,
        );
    }
    agent.stop().await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_leaving_mid_stream_is_recorded() {
    let mock = mock::start(MockConfig {
        token_latency: Duration::from_millis(20),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    let s = "leaver";
    agent.session(s, "t");
    let h = Harness::Qwen;
    let resp = client()
        .request(h.request(agent.addr, s, h.first_turn(), true))
        .await
        .unwrap();
    let mut body = resp.into_body();
    let _ = body.frame().await;
    drop(body);
    let mut records = Vec::new();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        records = agent.calls(s).0;
        if !records.is_empty() {
            break;
        }
    }
    assert_eq!(records.len(), 1);
    assert!(
        matches!(&records[0].status, CallStatus::Failed { side, .. } if side == "harness"),
        "{:?}",
        records[0].status
    );
    // The agent keeps serving.
    let r = send(h.request(agent.addr, s, h.first_turn(), false)).await;
    h.check_reply(&r, false);
    agent.stop().await;
    mock.stop().await;
}

/// The kinds of a log's lines: `request`, `completion`, or `whole`. A
/// completion carries no prompt ids of its own (the stream's are the ones
/// its request part holds).
fn line_kinds(agent: &TestAgent, session: &str) -> Vec<String> {
    let path = agent
        .state
        .path()
        .join("sessions")
        .join(session)
        .join("calls.jsonl");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let kind = v["part"].as_str().unwrap_or("whole").to_owned();
            if kind == "completion" {
                assert!(v.get("prompt_token_ids").is_none(), "{v}");
            }
            kind
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_streamed_by_the_backend_are_logged_in_two_parts() {
    // vLLM streams with the prompt ids in its first chunk: the request part
    // of a big request is written while it generates; the end adds the
    // completion. A small request (serialized on the spot) is written whole
    // at the end: one write instead of two.
    let mock = mock::start(MockConfig {
        token_latency: Duration::from_millis(5),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    let h = Harness::Claude;
    let mut big = h.first_turn();
    big["system"][0]["text"] =
        json!("You are Claude Code. ".repeat(polar_capture::INLINE_REQUEST_BYTES / 20));
    for stream in [true, false] {
        let session = format!("parts-{stream}");
        agent.session(&session, "t");
        for body in [big.clone(), big.clone(), h.first_turn()] {
            let reply = send(h.request(agent.addr, &session, body, stream)).await;
            h.check_reply(&reply, stream);
        }
        assert_eq!(
            line_kinds(&agent, &session),
            ["request", "completion", "request", "completion", "whole"],
            "stream {stream}"
        );
        let (records, problems) = agent.calls(&session);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(records.len(), 3);
        for (k, r) in records.iter().enumerate() {
            assert_eq!(r.seq, k as u64);
            assert_eq!(r.native_request.api, h.api());
            assert!(!r.request.messages.is_empty());
            check_tokens(agent.backend(), r);
        }
    }
    agent.stop().await;
    mock.stop().await;

    // SGLang answers whole (the prompt ids come with the end): one line.
    let mock = mock::start(MockConfig {
        dialect: polar_mock::Dialect::Sglang,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let toml = backend_toml("mock", &mock.url(), 5000).replace("\"vllm\"", "\"sglang\"");
    let agent = TestAgent::start(&toml).await;
    agent.session("whole", "t");
    let reply = send(h.request(agent.addr, "whole", h.first_turn(), true)).await;
    h.check_reply(&reply, true);
    assert_eq!(line_kinds(&agent, "whole"), ["whole"]);
    let (records, problems) = agent.calls("whole");
    assert!(problems.is_empty(), "{problems:?}");
    assert!(records[0].prompt_token_ids.is_some());
    agent.stop().await;
    mock.stop().await;
}

/// Two agents on one state directory (`polar sandbox run`s side by side):
/// the second's start-up replay leaves the first's live journal alone,
/// both capture every call, and each clean stop removes its own journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_on_one_state_directory_journal_apart() {
    let mock = mock_default().await;
    let toml = backend_toml("mock", &mock.url(), 5000);
    let first = TestAgent::start(&toml).await;
    let call = |agent: &TestAgent, s: &str| {
        agent.session(s, "t");
        send(Harness::Claude.request(agent.addr, s, Harness::Claude.fixture(), false))
    };
    assert_eq!(call(&first, "one-a").await.status, StatusCode::OK);
    let second = TestAgent::start_in(std::sync::Arc::clone(&first.state), &toml).await;
    for (agent, s) in [(&second, "two-a"), (&first, "one-b"), (&second, "two-b")] {
        let reply = call(agent, s).await;
        assert_eq!(reply.status, StatusCode::OK, "{s}: {}", reply.text());
    }
    let journals = |state: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(state.join(polar_capture::JOURNAL_DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .collect()
    };
    assert_eq!(journals(first.state.path()).len(), 2, "one journal each");
    let backend = first.backend().clone();
    let state = first.stop().await;
    assert_eq!(journals(state.path()).len(), 1);
    second.stop().await;
    assert_eq!(journals(state.path()), Vec::<std::path::PathBuf>::new());
    for s in ["one-a", "one-b", "two-a", "two-b"] {
        let (records, problems) = calls_in(state.path(), s);
        assert!(problems.is_empty(), "{s}: {problems:?}");
        assert_eq!(records.len(), 1, "{s}");
        check_tokens(&backend, &records[0]);
    }
    mock.stop().await;
}
