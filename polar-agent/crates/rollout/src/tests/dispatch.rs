//! Dispatch: one gateway, three gateways, priority order, early stop.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::*;
use polar_gateway::sim::{SimOutcome, default_outcome};
use polar_rollout_types::{SampleStatus, SessionState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_samples_on_one_gateway_arrive_with_rewards_and_group_id() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let gw = gateway(gw_config(&server, "node-a")).await;
    let reply = c.submit(&task("t8", 8)).await.unwrap();
    assert_eq!(reply.session_ids.len(), 8);
    assert_eq!(reply.session_ids[3], "t8-s3");
    let v = finished(&c, "t8", Duration::from_secs(20)).await;
    assert_completed(&v, 8);
    assert_eq!(v.group_id, "group-t8");
    assert_eq!(v.policy_version.as_deref(), Some("v7"));
    for s in &v.samples {
        let SessionState::Done { node, result, .. } = &s.state else {
            panic!("{s:?}");
        };
        assert_eq!(node, "node-a");
        assert_eq!(result.status, SampleStatus::Completed);
        assert_eq!(result.reward, Some(1.0 / f64::from(1 + s.sample_index)));
        assert_eq!(result.tokens.response, 50 + u64::from(s.sample_index));
        assert_eq!(
            result.trajectory_uri.as_deref(),
            Some(format!("sim://node-a/t8-s{}.json", s.sample_index).as_str())
        );
    }
    let got = gw.received();
    assert_eq!(got.len(), 8);
    for r in &got {
        let a = &r.assignment;
        assert_eq!(a.metadata.group_id.as_deref(), Some("group-t8"));
        assert_eq!(a.metadata.policy_version.as_deref(), Some("v7"));
        assert_eq!(a.agent.harness, "shell");
        assert_eq!(a.runtime["kind"], "docker");
        assert!(a.deadline_unix_ms > polar_rollout_api::now_ms());
    }
    // The trainer's views: list, status, metrics.
    let list = c.tasks(Some(TaskStatus::Completed)).await.unwrap();
    assert_eq!(list.tasks.len(), 1);
    assert!(list.tasks[0].samples.is_empty());
    let st = c.status().await.unwrap();
    assert_eq!(st.tasks["completed"], 1);
    assert_eq!(st.sessions["done"], 8);
    assert_eq!(st.nodes.len(), 1);
    let (code, metrics) = c.raw(http::Method::GET, "/metrics", None).await.unwrap();
    assert_eq!(code, StatusCode::OK);
    let text = String::from_utf8_lossy(&metrics);
    for want in [
        "polar_rollout_tasks{status=\"completed\"} 1",
        "polar_rollout_sessions{state=\"done\"} 8",
        "polar_rollout_nodes{health=\"healthy\"} 1",
        "polar_rollout_dispatch_latency_seconds_count 8",
    ] {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }
    gw.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_the_samples() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let mut gws = Vec::new();
    for id in ["node-a", "node-b", "node-c"] {
        let mut g = gw_config(&server, id);
        g.max_sessions = 4;
        g.session_time = Duration::from_millis(150);
        gws.push(gateway(g).await);
    }
    c.submit(&task("spread", 8)).await.unwrap();
    let v = finished(&c, "spread", Duration::from_secs(20)).await;
    assert_completed(&v, 8);
    let mut all = BTreeSet::new();
    for g in &gws {
        let got: Vec<String> = g
            .received()
            .into_iter()
            .map(|r| r.assignment.session_id)
            .collect();
        assert!(!got.is_empty(), "{} got nothing", g.node_id());
        assert!(
            got.len() <= 3,
            "{} got {got:?}: not the least loaded",
            g.node_id()
        );
        all.extend(got);
    }
    assert_eq!(all.len(), 8);
    for g in gws {
        g.stop().await;
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_tasks_are_dispatched_first() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let mut low = task("low", 2);
    low["priority"] = json!(0);
    let mut high = task("high", 2);
    high["priority"] = json!(10);
    let mut later = task("later", 1);
    later["priority"] = json!(0);
    c.submit(&low).await.unwrap();
    c.submit(&high).await.unwrap();
    c.submit(&later).await.unwrap();
    // One slot: the order of arrival is the dispatch order.
    let mut g = gw_config(&server, "node-a");
    g.max_sessions = 1;
    g.session_time = Duration::from_millis(10);
    let gw = gateway(g).await;
    for id in ["low", "high", "later"] {
        finished(&c, id, Duration::from_secs(20)).await;
    }
    let order: Vec<String> = gw
        .received()
        .into_iter()
        .map(|r| r.assignment.session_id)
        .collect();
    assert_eq!(
        order,
        ["high-s0", "high-s1", "low-s0", "low-s1", "later-s0"]
    );
    gw.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_stop_cancels_the_remaining_sessions() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let mut g = gw_config(&server, "node-a");
    g.max_sessions = 8;
    // Samples 0-2 finish at once; the others would run for a minute.
    g.outcome = Arc::new(|a| SimOutcome {
        run_for: Some(if a.sample_index < 3 {
            Duration::from_millis(20)
        } else {
            Duration::from_secs(60)
        }),
        ..default_outcome(a)
    });
    let gw = gateway(g).await;
    let mut t = task("early", 8);
    t["early_stop_after"] = json!(3);
    c.submit(&t).await.unwrap();
    let v = finished(&c, "early", Duration::from_secs(10)).await;
    assert_eq!(v.status, TaskStatus::Completed);
    assert_eq!(
        (v.counts.done, v.counts.cancelled),
        (3, 5),
        "{:?}",
        v.counts
    );
    assert_eq!(v.reason.as_deref(), Some("early stop: 3 usable samples"));
    // The gateway was told to stop the five long sessions (by the cancel
    // the server sends, and again by a heartbeat's reply if one came
    // between).
    until(
        "cancellations reach the gateway",
        Duration::from_secs(5),
        || {
            let mut c = gw.cancelled();
            c.sort();
            c.dedup();
            c.len() == 5
        },
    )
    .await;
    until("the gateway drops them", Duration::from_secs(5), || {
        gw.holding() == 0
    })
    .await;
    gw.stop().await;
    server.shutdown().await;
}
