//! Durability: the `polar proxy` binary serving sessions is killed with
//! SIGKILL while replies stream; every call whose reply had completed is in
//! its session's log, intact (the calls cut short leave at most a torn
//! last line and request parts without completion, reported and skipped),
//! and a restarted agent continues the logs. Both
//! `agent.capture_durability` modes promise this (`process` writes without
//! syncing: the page cache outlives the process); what only `power`
//! promises, a power loss, is simulated in `polar-capture`'s `sync_tests`.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use polar_capture::LogProblem;
use polar_inference::BackendConfig;
use polar_mock::{self as mock, MockConfig};
use polar_record::CallStatus;

const SESSIONS: usize = 6;

fn start_proxy(config: &std::path::Path) -> (Child, SocketAddr) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_polar"));
    cmd.arg("proxy")
        .arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0", "--task", "kill-test"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for i in 0..SESSIONS {
        cmd.args(["--session", &format!("k-{i}")]);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    (child, addr)
}

/// One call; `Some(api index)` when the reply arrived complete and valid.
async fn one_call(addr: SocketAddr, session: &str, n: usize) -> Option<usize> {
    let h = HARNESSES[n % 4];
    let stream = n.is_multiple_of(2);
    let resp = client()
        .request(h.request(addr, session, h.first_turn(), stream))
        .await
        .ok()?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.ok()?.to_bytes();
    let reply = Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    };
    // A reply cut by the kill fails these checks (or panics inside them,
    // which the caller treats the same way).
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.check_reply(&reply, stream)
    }))
    .is_ok();
    ok.then_some(n % 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_streams_loses_no_completed_call() {
    sigkill_during_streams("power").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_streams_loses_no_completed_call_in_process_mode() {
    sigkill_during_streams("process").await;
}

async fn sigkill_during_streams(durability: &str) {
    let mock = mock::start(MockConfig {
        token_latency: Duration::from_millis(1),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let config = state.path().join("polar.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = \"{}\"\ncapture_durability = \"{durability}\"\n{}",
            state.path().display(),
            backend_toml("mock", &mock.url(), 5000)
        ),
    )
    .unwrap();
    let (mut child, addr) = start_proxy(&config);

    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..SESSIONS {
        let stop = Arc::clone(&stop);
        clients.push(tokio::spawn(async move {
            let session = format!("k-{i}");
            let mut completed = Vec::new();
            let mut n = i;
            while !stop.load(Ordering::Relaxed) {
                match one_call(addr, &session, n).await {
                    Some(api) => completed.push(api),
                    None => break,
                }
                n += 1;
            }
            completed
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    let _ = child.wait();
    stop.store(true, Ordering::Relaxed);

    let backend = BackendConfig::new(
        "mock",
        polar_inference::Dialect::Vllm,
        vec![mock.url()],
        "polar-mock",
    );
    let mut total = 0;
    for (i, c) in clients.into_iter().enumerate() {
        let completed = c.await.unwrap();
        let (records, problems) = calls_in(state.path(), &format!("k-{i}"));
        // A torn last line, and request parts of calls the kill cut short.
        assert!(
            problems.iter().all(|p| matches!(
                p,
                LogProblem::TornTail { .. } | LogProblem::Unfinished { .. }
            )),
            "{problems:?}"
        );
        assert!(
            records.len() == completed.len() || records.len() == completed.len() + 1,
            "session k-{i}: {} records, {} completed replies",
            records.len(),
            completed.len()
        );
        for (k, r) in records.iter().enumerate() {
            assert_eq!(r.seq, k as u64);
            assert_eq!(r.task_id.as_deref(), Some("kill-test"));
            if let Some(api) = completed.get(k) {
                assert_eq!(r.native_request.api, HARNESSES[*api].api());
                check_tokens(&backend, r);
            } else {
                // Recorded, but the kill came before its reply ended.
                assert!(matches!(
                    r.status,
                    CallStatus::Completed | CallStatus::Failed { .. }
                ));
            }
        }
        total += completed.len();
    }
    eprintln!("{total} calls completed before the kill");
    assert!(
        total >= SESSIONS,
        "some calls completed before the kill ({total})"
    );

    // A restarted agent continues every session's log.
    let (mut child, addr) = start_proxy(&config);
    for i in 0..SESSIONS {
        let session = format!("k-{i}");
        let before = calls_in(state.path(), &session).0.len();
        assert!(one_call(addr, &session, 0).await.is_some());
        let (records, problems) = calls_in(state.path(), &session);
        // The torn tail was cut; the killed calls' request parts stay.
        assert!(
            problems
                .iter()
                .all(|p| matches!(p, LogProblem::Unfinished { .. })),
            "{problems:?}"
        );
        assert_eq!(records.len(), before + 1);
        assert_eq!(records[before].seq, before as u64);
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    mock.stop().await;
}
