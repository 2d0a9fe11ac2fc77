//! The agent's metrics page after a sample rollout through the real capture
//! path (base-URL mode on loopback, the mock backend): every harness API,
//! streamed and not, a backend failure then a good call in each session,
//! and a request the harness got wrong. The rendered counters equal what
//! the capture logs on disk hold (records by outcome and side, token ids),
//! and the backend latency histogram counted every call that reached the
//! backend.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

mod common;

use std::collections::BTreeMap;

use bytes::Bytes;
use common::*;
use http::Method;
use polar_agent::metrics::{AgentMetrics, render};
use polar_mock::script::{Script, ScriptedError, SessionScript, Turn};
use polar_mock::{self as mock, MockConfig};
use polar_record::CallStatus;

/// The value of the sample `series` (name and labels exactly) in `text`.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_equal_what_the_capture_logs_hold() {
    let mock = mock::start(MockConfig {
        script: Some(Script {
            final_text: Some("done".into()),
            sessions: vec![SessionScript {
                id: "*".into(),
                turns: vec![Turn {
                    error: Some(ScriptedError {
                        status: 500,
                        message: Some("injected".into()),
                    }),
                    ..Turn::default()
                }],
                ..SessionScript::default()
            }],
        }),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let agent = TestAgent::start(&backend_toml("mock", &mock.url(), 5000)).await;
    let mut sessions = Vec::new();
    for h in HARNESSES {
        for stream in [false, true] {
            let session = format!("m-{h:?}-{stream}").to_lowercase();
            agent.session(&session, "task-m");
            send(h.request(agent.addr, &session, h.fixture(), stream)).await;
            send(h.request(agent.addr, &session, h.first_turn(), stream)).await;
            sessions.push(session);
        }
    }
    // A body that is not JSON: the harness's fault.
    agent.session("m-bad", "task-m");
    send(request(
        agent.addr,
        "m-bad",
        Method::POST,
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        Bytes::from_static(b"{not json"),
    ))
    .await;
    sessions.push("m-bad".into());

    // What the logs on disk hold.
    let (mut completed, mut prompt, mut response) = (0u64, 0u64, 0u64);
    let mut failed: BTreeMap<String, u64> = BTreeMap::new();
    let mut lines = 0u64;
    for s in &sessions {
        let (records, problems) = agent.calls(s);
        assert!(problems.is_empty(), "{problems:?}");
        lines += records.len() as u64;
        for r in &records {
            match &r.status {
                CallStatus::Completed => completed += 1,
                CallStatus::Failed { side, .. } => *failed.entry(side.clone()).or_default() += 1,
            }
            prompt += r.prompt_token_ids.as_ref().map_or(0, |v| v.len() as u64);
            response += r.response_token_ids.as_ref().map_or(0, |v| v.len() as u64);
        }
    }
    assert_eq!(lines, 17);
    assert_eq!(completed, 8);
    assert_eq!(failed.get("backend"), Some(&8));
    assert_eq!(failed.get("harness"), Some(&1));
    assert!(prompt > 0 && response > 0);

    let capture = agent.parts.capture.as_ref().unwrap();
    let text = render(&AgentMetrics {
        capture: Some(capture.store().stats()),
        proxy: Some(&agent.parts.proxy.stats),
        sessions_by_stage: &[("running", sessions.len() as u64)],
        ..AgentMetrics::default()
    });
    assert_eq!(sample(&text, "polar_capture_calls_total"), completed);
    for side in ["harness", "backend", "agent"] {
        assert_eq!(
            sample(
                &text,
                &format!("polar_capture_calls_failed_total{{side=\"{side}\"}}")
            ),
            failed.get(side).copied().unwrap_or(0),
            "{side}"
        );
    }
    assert_eq!(
        sample(&text, "polar_capture_tokens_total{kind=\"prompt\"}"),
        prompt
    );
    assert_eq!(
        sample(&text, "polar_capture_tokens_total{kind=\"response\"}"),
        response
    );
    // Every call that reached the backend is in the latency histogram.
    assert_eq!(
        sample(&text, "polar_backend_latency_seconds_count"),
        completed + failed["backend"]
    );
    assert_eq!(
        sample(&text, "polar_backend_latency_seconds_bucket{le=\"+Inf\"}"),
        completed + failed["backend"]
    );
    // HTTP 500 from the backend is a `backend_error`.
    assert_eq!(
        sample(&text, "polar_backend_errors_total{kind=\"backend_error\"}"),
        failed["backend"]
    );
    assert_eq!(sample(&text, "polar_sessions{stage=\"running\"}"), 9);
    // Base-URL connections count like transparent ones: one client, so one
    // connection, per request.
    assert_eq!(sample(&text, "polar_proxy_connections_total"), 17);
    assert_eq!(
        sample(&text, "polar_proxy_decisions_total{action=\"model\"}"),
        17
    );
    agent.stop().await;
    mock.stop().await;
}
