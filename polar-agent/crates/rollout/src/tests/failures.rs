//! Failures: a gateway killed mid-task, a server restarted mid-task.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use polar_gateway::sim::{SimOutcome, default_outcome};
use polar_rollout_types::{SampleStatus, SessionState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_has_its_sessions_dispatched_again() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    // a holds its sessions for a minute; b finishes them quickly.
    let mut a = gw_config(&server, "node-a");
    a.max_sessions = 4;
    a.session_time = Duration::from_secs(60);
    let a = gateway(a).await;
    let mut b = gw_config(&server, "node-b");
    b.max_sessions = 2;
    b.session_time = Duration::from_millis(30);
    let b = gateway(b).await;
    c.submit(&task("kill", 8)).await.unwrap();
    until("node-a holds sessions", Duration::from_secs(5), || {
        a.holding() > 0
    })
    .await;
    let held: Vec<String> = a
        .received()
        .into_iter()
        .map(|r| r.assignment.session_id)
        .collect();
    a.kill();
    let v = finished(&c, "kill", Duration::from_secs(20)).await;
    assert_completed(&v, 8);
    for s in &v.samples {
        let SessionState::Done { node, attempt, .. } = &s.state else {
            panic!("{s:?}");
        };
        assert_eq!(node, "node-b");
        if held.contains(&s.session_id) {
            assert!(*attempt >= 2, "{s:?} was on node-a");
        }
    }
    let nodes = c.nodes().await.unwrap();
    let a_view = nodes.nodes.iter().find(|n| n.node_id == "node-a").unwrap();
    assert_eq!(a_view.health.as_str(), "unhealthy");
    assert_eq!(a_view.assigned, 0);
    b.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_without_retries_left_fails_its_sessions_and_the_task_ends() {
    let mut e = env();
    e.cfg.max_retries = 0;
    e.cfg.no_node_timeout = Duration::from_millis(500);
    let server = start(&e.cfg).await;
    let c = client(&server);
    let mut a = gw_config(&server, "node-a");
    a.max_sessions = 3;
    a.session_time = Duration::from_secs(60);
    let a = gateway(a).await;
    c.submit(&task("lost", 5)).await.unwrap();
    until("node-a holds 3 sessions", Duration::from_secs(5), || {
        a.holding() == 3
    })
    .await;
    // The server saw them running there: the node's loss, not a lost
    // answer to a push, is what ends them.
    task_until(
        &c,
        "lost",
        "running 3 on node-a",
        Duration::from_secs(10),
        |v| {
            v.samples
                .iter()
                .filter(
                    |s| matches!(&s.state, SessionState::Running { node, .. } if node == "node-a"),
                )
                .count()
                == 3
        },
    )
    .await;
    a.kill();
    let v = finished(&c, "lost", Duration::from_secs(10)).await;
    assert_eq!(v.status, TaskStatus::Failed);
    assert_eq!(v.counts.failed, 5);
    let errors: Vec<String> = v
        .samples
        .iter()
        .map(|s| match &s.state {
            SessionState::Failed { error } => error.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        errors
            .iter()
            .filter(|e| e.contains("node node-a lost"))
            .count(),
        3,
        "{errors:?}"
    );
    assert_eq!(
        errors
            .iter()
            .filter(|e| e.contains("no healthy node"))
            .count(),
        2,
        "{errors:?}"
    );
    server.shutdown().await;
}

/// [`env`] on a fixed port, so gateways find a restarted server where the
/// old one was.
fn restartable_env() -> Env {
    let mut e = env();
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    e.cfg.listen = probe.local_addr().unwrap();
    drop(probe);
    e
}

/// Drops `server` mid-task (background work stops where it stands), keeps
/// it down for a moment (the gateways' reports and heartbeats fail), and
/// starts it again on the same database and port.
async fn restart(server: RolloutServer, e: &Env) -> RolloutServer {
    drop(server);
    tokio::time::sleep(Duration::from_millis(150)).await;
    start(&e.cfg).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_loses_nothing() {
    let e = restartable_env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let mut g = gw_config(&server, "node-a");
    g.max_sessions = 3;
    // Sample 0 finishes before the restart; the others run across it.
    g.outcome = Arc::new(|a| SimOutcome {
        run_for: Some(if a.sample_index == 0 {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(600)
        }),
        ..default_outcome(a)
    });
    let gw = gateway(g).await;
    c.submit(&task("survive", 8)).await.unwrap();
    c.submit(&task("queued-only", 2)).await.unwrap();
    until("one sample done", Duration::from_secs(5), || {
        gw.reported() >= 1
    })
    .await;
    let before = c.task("survive").await.unwrap();
    assert!(!before.status.is_finished());
    let server = restart(server, &e).await;
    let c = client(&server);
    let v = finished(&c, "survive", Duration::from_secs(30)).await;
    assert_completed(&v, 8);
    assert_eq!(v.group_id, "group-survive");
    let q = finished(&c, "queued-only", Duration::from_secs(30)).await;
    assert_completed(&q, 2);
    // Every sample reached the gateway.
    let mut reported: Vec<String> = gw
        .received()
        .into_iter()
        .map(|r| r.assignment.session_id)
        .collect();
    reported.sort();
    reported.dedup();
    assert_eq!(reported.len(), 10);
    gw.stop().await;
    server.shutdown().await;
    drop(e.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_remembers_which_nodes_cannot_run_a_session() {
    let e = restartable_env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    // node-b holds one session at a time and is busy with a long one.
    let mut b = gw_config(&server, "node-b");
    b.max_sessions = 1;
    b.outcome = Arc::new(|a| SimOutcome {
        run_for: Some(if a.task_id == "long" {
            Duration::from_millis(3000)
        } else {
            Duration::from_millis(10)
        }),
        ..default_outcome(a)
    });
    let gw_b = gateway(b).await;
    c.submit(&task("long", 1)).await.unwrap();
    until(
        "node-b runs the long session",
        Duration::from_secs(5),
        || !gw_b.received().is_empty(),
    )
    .await;
    // node-a cannot run anything: the session it gets waits for node-b.
    let mut a = gw_config(&server, "node-a");
    a.outcome = Arc::new(|a| SimOutcome {
        status: SampleStatus::Error,
        retry: true,
        node_unfit: true,
        run_for: Some(Duration::from_millis(10)),
        ..default_outcome(a)
    });
    let gw_a = gateway(a).await;
    c.submit(&task("picky", 1)).await.unwrap();
    until(
        "node-a reports it cannot run it",
        Duration::from_secs(5),
        || gw_a.reported() >= 1,
    )
    .await;
    // A restart while the session waits: node-a, idle, must not get it
    // again.
    let server = restart(server, &e).await;
    let c = client(&server);
    let v = finished(&c, "picky", Duration::from_secs(30)).await;
    assert_completed(&v, 1);
    let to_a = gw_a
        .received()
        .into_iter()
        .filter(|r| r.assignment.task_id == "picky")
        .count();
    assert_eq!(to_a, 1, "node-a got the session again after the restart");
    assert!(
        v.samples[0]
            .ended_attempts
            .iter()
            .any(|x| x.node == "node-a" && x.reason.contains("cannot run")),
        "{:?}",
        v.samples[0].ended_attempts
    );
    assert_completed(&finished(&c, "long", Duration::from_secs(30)).await, 1);
    gw_a.stop().await;
    gw_b.stop().await;
    server.shutdown().await;
    drop(e.dir);
}
