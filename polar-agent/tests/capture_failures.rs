//! Backend failures through the capture stage, for every harness API,
//! streamed and not, with one replica and no output parser (so nothing can
//! be resumed: `capture_resume.rs` has the failover): a refused
//! connection, HTTP 500, HTTP 503, a stream cut in the middle, an `abort`
//! finish with tokens before it (and without: sent again, served), a
//! backend slower than its timeout. Each time the harness gets a
//! well-formed error in its own API (an error status before streaming,
//! with the status its harnesses retry; the API's error event after), the
//! capture log records the failed call with its side, and the next call is
//! served.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use polar_mock::script::{Script, ScriptedError, SessionScript, Turn};
use polar_mock::{self as mock, MockConfig};
use polar_record::CallStatus;
use serde_json::Value;

/// Checks `reply` is an error in `h`'s API: `status` before streaming, or a
/// 200 stream ending in the API's error event. Returns whether it streamed.
fn check_error(h: Harness, reply: &Reply, status: StatusCode) -> bool {
    if reply.status != StatusCode::OK {
        assert_eq!(reply.status, status, "{h:?}: {}", reply.text());
        let v = reply.json();
        match h {
            Harness::Claude => {
                assert_eq!(v["type"], "error", "{v}");
                assert!(v["error"]["type"].is_string());
            }
            Harness::Qwen | Harness::Codex => assert!(v["error"]["message"].is_string(), "{v}"),
            Harness::Gemini => {
                assert_eq!(v["error"]["code"], status.as_u16(), "{v}");
                assert!(v["error"]["status"].is_string());
            }
        }
        return false;
    }
    let events = reply.events();
    let last = events.last().unwrap();
    match h {
        Harness::Claude => {
            assert_eq!(last.event.as_deref(), Some("error"));
            assert_eq!(last.json().unwrap()["type"], "error");
            assert_eq!(events[0].event.as_deref(), Some("message_start"));
        }
        Harness::Qwen => {
            assert_eq!(last.data, "[DONE]");
            let err = events[events.len() - 2].json().unwrap();
            assert!(err["error"]["message"].is_string(), "{err}");
        }
        Harness::Codex => {
            let v = last.json().unwrap();
            assert_eq!(v["type"], "response.failed", "{v}");
            assert_eq!(v["response"]["status"], "failed");
            let seqs: Vec<Value> = events
                .iter()
                .map(|e| e.json().unwrap()["sequence_number"].clone())
                .collect();
            assert!(seqs.iter().enumerate().all(|(i, s)| *s == i));
        }
        Harness::Gemini => {
            assert!(last.json().unwrap()["error"]["message"].is_string());
        }
    }
    true
}

fn script(turns: Vec<Turn>) -> Script {
    Script {
        final_text: Some("recovered".into()),
        sessions: vec![SessionScript {
            id: "*".into(),
            turns,
            ..SessionScript::default()
        }],
    }
}

/// Whether a failure reaches a streaming harness inside its stream.
#[derive(Clone, Copy, PartialEq)]
enum Streams {
    /// Inside the stream when the harness asked for one (output was sent).
    AsAsked,
    /// Never: the failure came before any output, the harness gets a status.
    Never,
}

/// The status every API answers with.
fn all(status: StatusCode) -> impl Fn(Harness) -> StatusCode {
    move |_| status
}

/// An overload: Anthropic's 529, everyone else's 503 (never 429: Codex CLI
/// does not retry it).
fn overload(h: Harness) -> StatusCode {
    match h {
        Harness::Claude => StatusCode::from_u16(529).unwrap(),
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// Runs one failing call then one good call per API and framing, each in
/// its own session; checks the error, the failed record, the recovery.
async fn fail_then_serve(
    agent: &TestAgent,
    name: &str,
    status: impl Fn(Harness) -> StatusCode,
    streams: Streams,
) {
    for h in HARNESSES {
        for stream in [false, true] {
            let session = format!("{name}-{h:?}-{stream}").to_lowercase();
            agent.session(&session, "t");
            let reply = send(h.request(agent.addr, &session, h.fixture(), stream)).await;
            let streamed = check_error(h, &reply, status(h));
            match streams {
                Streams::AsAsked => assert_eq!(streamed, stream, "{name} {h:?} {stream}"),
                Streams::Never => assert!(!streamed, "{name} {h:?} {stream}"),
            }
            let (records, problems) = agent.calls(&session);
            assert!(problems.is_empty());
            assert_eq!(records.len(), 1, "{name} {h:?} {stream}");
            match &records[0].status {
                CallStatus::Failed { side, error } => {
                    assert_eq!(side, "backend");
                    assert!(!error.is_empty());
                }
                other => panic!("{name} {h:?}: {other:?}"),
            }
            assert!(records[0].finish_reason.is_none());

            let ok = send(h.request(agent.addr, &session, h.first_turn(), stream)).await;
            h.check_reply(&ok, stream);
            let (records, _) = agent.calls(&session);
            assert_eq!(records.len(), 2);
            assert_eq!(records[1].seq, 1);
            check_tokens(agent.backend(), &records[1]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_500_from_the_backend() {
    let mock = mock::start(MockConfig {
        script: Some(script(vec![Turn {
            error: Some(ScriptedError {
                status: 500,
                message: Some("injected".into()),
            }),
            ..Turn::default()
        }])),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    fail_then_serve(
        &agent,
        "http500",
        all(StatusCode::BAD_GATEWAY),
        Streams::Never,
    )
    .await;
    let (records, _) = agent.calls("http500-qwen-false");
    let CallStatus::Failed { error, .. } = &records[0].status else {
        panic!()
    };
    assert!(error.contains("HTTP 500"), "{error}");
    assert_eq!(records[0].backend.name, "mock");
    // The replica answered: it is named, with the model it was asked for.
    assert_eq!(records[0].backend.replica, mock.url());
    assert_eq!(records[0].backend.served_model, "polar-mock");
    assert!(records[0].token_ids_missing);
    agent.stop().await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_503_from_the_backend_is_each_apis_own_overload() {
    let mock = mock::start(MockConfig {
        script: Some(script(vec![Turn {
            error: Some(ScriptedError {
                status: 503,
                message: Some("overloaded".into()),
            }),
            ..Turn::default()
        }])),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    fail_then_serve(&agent, "http503", overload, Streams::Never).await;
    let (records, _) = agent.calls("http503-codex-true");
    assert_eq!(records[0].backend.replica, mock.url());
    agent.stop().await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_the_backend_refuses_is_recorded_on_the_harness_side() {
    let mock = mock::start(MockConfig {
        script: Some(script(vec![Turn {
            error: Some(ScriptedError {
                status: 400,
                message: Some("maximum context length is 40".into()),
            }),
            ..Turn::default()
        }])),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    for h in HARNESSES {
        let session = format!("refused400-{h:?}").to_lowercase();
        agent.session(&session, "t");
        let reply = send(h.request(agent.addr, &session, h.fixture(), true)).await;
        assert!(!check_error(h, &reply, StatusCode::BAD_REQUEST));
        let (records, _) = agent.calls(&session);
        // The policy's doing (its context overflowed), not an
        // infrastructure fault that would end the session as one.
        assert!(
            matches!(&records[0].status, CallStatus::Failed { side, error } if side == "harness" && error.contains("context length")),
            "{h:?}: {:?}",
            records[0].status
        );
    }
    agent.stop().await;
    mock.stop().await;
}

/// A turn the backend aborts after `tokens` generated tokens.
fn aborted_after(tokens: u32) -> Script {
    script(vec![Turn {
        text: Some("Step 3. <tool_call> that never finishes".into()),
        abort_after: Some(tokens),
        ..Turn::default()
    }])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_finish_is_never_relayed_as_an_end_of_turn() {
    // Tokens before the abort: a streaming harness has them, then the
    // API's error event; a whole reply is the API's overload status.
    let mock = mock::start(MockConfig {
        script: Some(aborted_after(4)),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    fail_then_serve(&agent, "abort", overload, Streams::AsAsked).await;
    for h in HARNESSES {
        for stream in [false, true] {
            let (records, _) = agent.calls(&format!("abort-{h:?}-{stream}").to_lowercase());
            let r = &records[0];
            assert!(
                matches!(&r.status, CallStatus::Failed { side, error } if side == "backend" && error.contains("aborted")),
                "{h:?} {stream}: {:?}",
                r.status
            );
            // The partial reply is kept, its usage counting the ids.
            assert_eq!(r.response_token_ids.as_ref().map(Vec::len), Some(4));
            let usage = r.response.as_ref().map(|p| p.usage.completion_tokens);
            assert_eq!(usage, Some(4), "{h:?} {stream}");
        }
    }
    agent.stop().await;
    mock.stop().await;

    // No token before the abort: nothing reached the harness, so the
    // request is sent again (to the same replica: the only one), and the
    // harness never sees the abort.
    let mock = mock::start(MockConfig {
        script: Some(aborted_after(0)),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    for h in HARNESSES {
        for stream in [false, true] {
            let session = format!("abort0-{h:?}-{stream}").to_lowercase();
            agent.session(&session, "t");
            let reply = send(h.request(agent.addr, &session, h.fixture(), stream)).await;
            h.check_reply(&reply, stream);
            let (records, _) = agent.calls(&session);
            let r = &records[0];
            assert_eq!(r.status, CallStatus::Completed, "{h:?} {stream}");
            let resumed = r.resumed.as_ref().unwrap();
            assert_eq!(resumed.replicas, vec![mock.url(), mock.url()]);
            assert_eq!(resumed.part_tokens[0], 0);
            assert!(resumed.faults[0].contains("aborted"), "{resumed:?}");
            check_tokens(agent.backend(), r);
        }
    }
    agent.stop().await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_in_the_middle() {
    let mock = mock::start(MockConfig {
        script: Some(script(vec![Turn {
            text: Some("a long answer that never arrives whole at all".into()),
            disconnect_after: Some(4),
            ..Turn::default()
        }])),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    fail_then_serve(
        &agent,
        "cut",
        all(StatusCode::BAD_GATEWAY),
        Streams::AsAsked,
    )
    .await;
    // The partial reply and its tokens are kept for diagnosis.
    let (records, _) = agent.calls("cut-claude-true");
    let r = &records[0];
    let partial = r.response.as_ref().unwrap();
    assert!(partial.message.joined_text().starts_with("a long"));
    assert_eq!(r.response_token_ids.as_ref().unwrap().len(), 4);
    agent.stop().await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_slower_than_its_timeout() {
    let mock = mock::start(MockConfig {
        script: Some(script(vec![Turn {
            text: Some("too late".into()),
            delay_ms: Some(1500),
            ..Turn::default()
        }])),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 300)).await;
    fail_then_serve(
        &agent,
        "slow",
        all(StatusCode::GATEWAY_TIMEOUT),
        Streams::Never,
    )
    .await;
    let (records, _) = agent.calls("slow-gemini-false");
    let CallStatus::Failed { error, .. } = &records[0].status else {
        panic!()
    };
    assert!(error.contains("nothing within"), "{error}");
    agent.stop().await;
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_then_the_backend_comes_up() {
    // A port nobody listens on (yet).
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let agent = TestAgent::start(&backend_toml("mock", &format!("http://{addr}"), 2000)).await;
    for h in HARNESSES {
        for stream in [false, true] {
            let session = format!("refused-{h:?}-{stream}").to_lowercase();
            agent.session(&session, "t");
            let reply = send(h.request(agent.addr, &session, h.fixture(), stream)).await;
            assert!(!check_error(h, &reply, StatusCode::BAD_GATEWAY));
            let (records, _) = agent.calls(&session);
            assert_eq!(records.len(), 1);
            assert!(
                matches!(&records[0].status, CallStatus::Failed { side, error } if side == "backend" && error.contains("unreachable"))
            );
            assert!(records[0].response.is_none());
        }
    }
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(mock::serve(listener, MockConfig::default(), token.clone()));
    for h in HARNESSES {
        let session = format!("refused-{h:?}-true").to_lowercase();
        let mut served = None;
        // The replica was marked unhealthy; it is retried on the next call.
        for _ in 0..20 {
            let r = send(h.request(agent.addr, &session, h.first_turn(), true)).await;
            if r.status == StatusCode::OK {
                served = Some(r);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        h.check_reply(&served.expect("served once the backend is up"), true);
    }
    agent.stop().await;
    token.cancel();
    let _ = server.await;
}
