//! One attempt at a time per session on a node: a newer attempt pushed to
//! the node that still holds an older one (the server was told the old one
//! failed, and this is its only node) stops the old attempt and starts
//! only once the old one is torn down; an older attempt than the one held
//! is refused (409); the server records why attempt 1 ended. A session
//! whose work panics on the node is run again and frees its slot. The node
//! is the real gateway node with scripted work.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use tokio_util::sync::CancellationToken;

use super::*;
use polar_gateway::stages::{InitError, Job, Reached, Report, Work};
use polar_rollout_api::{SampleStatus, SessionResult};

/// Logs `init N`, `run N`, `down N` (after a 300 ms tear-down).
#[derive(Default)]
struct Logged(Arc<Mutex<Vec<String>>>);

impl Logged {
    fn log(&self, what: &str, job: &Job) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{what} {}", job.assignment.attempt));
    }
}

impl Work for Logged {
    type Prepared = ();
    type Ran = ();

    async fn init(&self, job: &Arc<Job>, _stop: CancellationToken) -> Result<(), InitError> {
        self.log("init", job);
        Ok(())
    }

    async fn run(&self, job: &Arc<Job>, _p: &mut (), stop: CancellationToken) {
        self.log("run", job);
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
    }

    async fn postrun(&self, job: &Arc<Job>, _p: Option<()>, _r: Reached<()>) -> Report {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.log("down", job);
        Report::new(SampleStatus::Cancelled)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_attempt_starts_after_the_old_one_is_torn_down() {
    let e = env();
    let server = start(&e.cfg).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let node = node_a(&server, Logged(Arc::clone(&log))).await;
    let c = client(&server);
    c.submit(&task("t", 1)).await.unwrap();
    let l = Arc::clone(&log);
    until("attempt 1 runs", Duration::from_secs(5), || {
        l.lock().unwrap().contains(&"run 1".to_owned())
    })
    .await;
    // The server is told attempt 1 failed (retry) while the node still
    // runs it: the only node gets attempt 2 of the same session.
    let as_node = RolloutClient::new(server.url(), Some(NODE_TOKEN.into()));
    let failed = SessionResult {
        node_id: "node-a".into(),
        attempt: 1,
        status: SampleStatus::Error,
        reward: None,
        trajectory_uri: None,
        tokens: Default::default(),
        error: Some("forced re-dispatch".into()),
        stats: None,
        retry: true,
        infra_fault: false,
        node_unfit: false,
    };
    as_node.result("t-s0", &failed).await.unwrap();
    let l = Arc::clone(&log);
    until("attempt 2 runs", Duration::from_secs(5), || {
        l.lock().unwrap().contains(&"run 2".to_owned())
    })
    .await;
    assert_eq!(
        log.lock().unwrap()[..4],
        ["init 1", "run 1", "down 1", "init 2"].map(String::from),
        "attempt 2 began before attempt 1 was torn down"
    );
    assert_eq!(node.holding(), 1);
    // An older attempt than the one held is refused.
    let as_server = RolloutClient::new(node.address(), Some(GATEWAY_TOKEN.into()));
    let mut old = polar_gateway::sim::sample_assignment("t", 0, 60);
    old.attempt = 1;
    let (status, body) = as_server
        .raw(
            Method::POST,
            "/v1/sessions",
            Some(serde_json::to_vec(&old).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{body:?}");
    let v = c.task("t").await.unwrap();
    let s0 = &v.samples[0];
    assert_eq!(s0.state.assignment(), Some(("node-a", 2)), "{s0:?}");
    assert_eq!(s0.ended_attempts.len(), 1, "{s0:?}");
    assert!(
        s0.ended_attempts[0].reason.contains("forced re-dispatch"),
        "{s0:?}"
    );
    node.stop().await;
    server.shutdown().await;
}

/// Panics in RUNNING on a session's first attempt; completes later ones.
struct PanicsOnce;

impl Work for PanicsOnce {
    type Prepared = ();
    type Ran = ();

    async fn init(&self, _job: &Arc<Job>, _stop: CancellationToken) -> Result<(), InitError> {
        Ok(())
    }

    async fn run(&self, job: &Arc<Job>, _p: &mut (), _stop: CancellationToken) {
        assert!(job.assignment.attempt > 1, "a bug in the work");
    }

    async fn postrun(&self, _job: &Arc<Job>, _p: Option<()>, _r: Reached<()>) -> Report {
        Report {
            reward: Some(1.0),
            ..Report::new(SampleStatus::Completed)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_work_panics_is_run_again_and_frees_its_slot() {
    let mut e = env();
    // Each panic prints its backtrace from the runtime's threads: on a
    // loaded machine six of them can hold the node's heartbeats past the
    // tests' 400 ms, and the node would be lost rather than report the
    // panics, which are what this test is about.
    e.cfg.heartbeat_timeout = Duration::from_secs(30);
    let server = start(&e.cfg).await;
    let node = node_a(&server, PanicsOnce).await;
    let c = client(&server);
    // More samples than the node's 4 slots: a slot a panic kept would
    // leave the task unfinished.
    c.submit(&task("p", 6)).await.unwrap();
    let v = finished(&c, "p", Duration::from_secs(20)).await;
    assert_completed(&v, 6);
    for s in &v.samples {
        assert_eq!(s.state.assignment(), None, "{s:?}");
        assert_eq!(s.ended_attempts.len(), 1, "{s:?}");
        let reason = &s.ended_attempts[0].reason;
        assert!(
            reason.contains(
                "the gateway's work for this session panicked (a bug): a bug in the work"
            ),
            "{s:?}"
        );
    }
    until("the node holds nothing", Duration::from_secs(5), || {
        node.holding() == 0
    })
    .await;
    node.stop().await;
    server.shutdown().await;
}
