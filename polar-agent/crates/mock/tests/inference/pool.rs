//! The pool against mock replicas: affinity, moving off a dead replica,
//! sending again a request that got no reply, pause/resume, health checks.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use polar_inference::*;
use polar_mock::{self as mock, MockConfig, MockHandle};

use super::{backend, drain, request};
use polar_io::tasks::Tasks;

async fn replicas(n: usize) -> Vec<MockHandle> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(mock::start(MockConfig::default()).await.unwrap());
    }
    out
}

/// A loopback address nobody listens on.
async fn dead_url() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

/// Waits up to 5 s for `cond`.
async fn eventually(cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A session whose first choice in `pool` is `url`.
fn session_on(pool: &Pool, url: &str) -> String {
    (0..10_000)
        .map(|i| format!("sess-{i}"))
        .find(|s| pool.pick(s).as_deref() == Some(url))
        .unwrap()
}

#[tokio::test]
async fn a_session_stays_on_its_replica() {
    let mocks = replicas(3).await;
    let client = Client::new(backend(
        Dialect::Vllm,
        mocks.iter().map(MockHandle::url).collect(),
    ))
    .unwrap();
    let mut seen = BTreeSet::new();
    for _ in 0..100 {
        let done = client
            .chat("sticky", &request(true))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        seen.insert(done.backend.replica);
    }
    assert_eq!(seen.len(), 1);
    // Its replica goes away (its pooled connection with it): the session moves.
    let home = seen.pop_first().unwrap();
    let mut mocks: Vec<MockHandle> = mocks;
    let at = mocks.iter().position(|m| m.url() == home).unwrap();
    mocks.remove(at).stop().await;
    let moved = client
        .chat("sticky", &request(true))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_ne!(moved.backend.replica, home);
    assert_eq!(moved.backend.attempts, 2);
    for _ in 0..10 {
        let again = client
            .chat("sticky", &request(true))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(again.backend.replica, moved.backend.replica);
    }
    let used: BTreeSet<String> = (0..30)
        .filter_map(|i| client.pool().pick(&format!("s{i}")))
        .collect();
    assert!(used.len() >= 2, "sessions spread over replicas: {used:?}");
    for m in mocks {
        m.stop().await;
    }
}

#[tokio::test]
async fn a_dead_replica_is_skipped_and_the_session_moves() {
    let mocks = replicas(2).await;
    let dead = dead_url().await;
    let mut urls: Vec<String> = mocks.iter().map(MockHandle::url).collect();
    urls.push(dead.clone());
    let client = Client::new(backend(Dialect::Vllm, urls)).unwrap();
    let session = session_on(client.pool(), &dead);
    let first = client
        .chat(&session, &request(true))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(first.backend.attempts, 2);
    assert_ne!(first.backend.replica, dead);
    let stats = client.pool().stats();
    let dead_stats = stats.replicas.iter().find(|r| r.url == dead).unwrap();
    assert!(!dead_stats.healthy);
    assert_eq!(dead_stats.connect_failures, 1);
    for _ in 0..20 {
        let again = client
            .chat(&session, &request(true))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(again.backend.replica, first.backend.replica);
        assert_eq!(again.backend.attempts, 1);
    }
    // Other sessions keep their replicas: only the dead one's sessions moved.
    let other = session_on(client.pool(), &mocks[0].url());
    assert_eq!(
        client.pool().pick(&other).as_deref(),
        Some(mocks[0].url().as_str())
    );
    for m in mocks {
        m.stop().await;
    }
}

#[tokio::test]
async fn all_replicas_dead_is_unreachable() {
    let client = Client::new(backend(
        Dialect::Vllm,
        vec![dead_url().await, dead_url().await],
    ))
    .unwrap();
    match client.chat("s", &request(true)).await {
        Err(e @ InferenceError::Unreachable { attempts: 2, .. }) => assert!(!e.reached_backend()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_request_lost_before_its_reply_began_goes_to_the_next_replica() {
    let healthy = mock::start(MockConfig::default()).await.unwrap();
    // A replica that takes the request and closes without answering.
    let black_hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_url = format!("http://{}", black_hole.local_addr().unwrap());
    let hole = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = black_hole.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
        }
    });
    let client = Client::new(backend(
        Dialect::Vllm,
        vec![hole_url.clone(), healthy.url()],
    ))
    .unwrap();
    let session = session_on(client.pool(), &hole_url);
    // No output of it reached anyone: it is sent again, to the other one.
    let done = client
        .chat(&session, &request(true))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(done.backend.replica, healthy.url());
    assert_eq!(done.backend.attempts, 2);
    let stats = client.pool().stats();
    assert_eq!(stats.replicas[1].requests, 1);
    assert_eq!(stats.replicas[0].failures, 1);
    assert!(
        stats.replicas[0].healthy,
        "a replica that took the request is not marked unreachable"
    );
    // With no other replica, the failure is the caller's.
    let alone = Client::new(backend(Dialect::Vllm, vec![hole_url])).unwrap();
    let err = alone.chat("s", &request(true)).await.unwrap_err();
    assert!(
        matches!(err, InferenceError::Disconnected { .. }),
        "{err:?}"
    );
    hole.abort();
    healthy.stop().await;
}

#[tokio::test]
async fn pause_holds_new_calls_and_lets_running_ones_finish() {
    let cfg = MockConfig {
        token_latency: Duration::from_millis(10),
        ..MockConfig::default()
    };
    let mock = mock::start(cfg).await.unwrap();
    let client = Client::new(backend(Dialect::Vllm, vec![mock.url()])).unwrap();
    let mut running = client.chat("a", &request(true)).await.unwrap();
    assert!(running.next().await.unwrap().is_ok());
    client.pool().pause();
    let c2 = client.clone();
    let held = tokio::spawn(async move {
        c2.chat("b", &request(true))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap()
    });
    let (events, err) = drain(&mut running).await;
    assert!(err.is_none());
    assert!(matches!(
        events.last(),
        Some(polar_chat::StreamEvent::Finish { .. })
    ));
    drop(running);
    tokio::time::timeout(Duration::from_secs(2), client.pool().wait_idle())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!held.is_finished());
    let stats = client.pool().stats();
    assert!(stats.paused);
    assert_eq!(stats.waiting, 1);
    assert_eq!(stats.in_flight, 0);
    client.pool().resume();
    let done = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .unwrap()
        .unwrap();
    assert!(done.timings.paused >= Duration::from_millis(100));
    assert_eq!(client.pool().stats().waiting, 0);
    mock.stop().await;
}

#[tokio::test]
async fn health_checks_mark_replicas_down_and_up() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let url = format!("http://{addr}");
    let mut cfg = backend(Dialect::Vllm, vec![url.clone()]);
    cfg.health_check_interval_ms = 50;
    let client = Client::new(cfg).unwrap();
    let tasks = Tasks::new();
    client.pool().spawn_health_checks(&tasks);
    let healthy = || client.pool().stats().replicas[0].healthy;
    eventually(|| !healthy()).await;
    let listener = TcpListener::bind(addr).await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(polar_mock::serve(
        listener,
        MockConfig::default(),
        shutdown.clone(),
    ));
    eventually(healthy).await;
    assert!(tasks.drain(Duration::from_secs(2)).await);
    shutdown.cancel();
    server.await.unwrap();
}
