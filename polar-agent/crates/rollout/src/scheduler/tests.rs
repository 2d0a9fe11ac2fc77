//! Scheduler unit tests: dispatch order, load balancing, loss and retries,
//! early stop, deadlines, stale reports (no I/O, explicit clocks).

use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use polar_rollout_types::{
    Heartbeat, NodeCapacity, NodeHealth, SampleStatus, SessionProgress, SessionResult, TokenUsage,
};

fn limits() -> Limits {
    Limits {
        heartbeat_timeout: Duration::from_secs(1),
        max_retries: 1,
        result_grace: Duration::from_secs(1),
        no_node_timeout: Duration::from_secs(10),
        retention: None,
    }
}

fn task(id: &str, n: u32) -> TaskRequest {
    task_p(id, n, 0)
}

fn task_p(id: &str, n: u32, priority: i32) -> TaskRequest {
    serde_json::from_value(json!({
        "task_id": id, "instruction": "x", "num_samples": n, "timeout_secs": 60,
        "agent": {"harness": "shell"}, "priority": priority,
    }))
    .unwrap()
}

fn node(id: &str, max: u32) -> NodeRegistration {
    NodeRegistration {
        version: 1,
        node_id: id.into(),
        address: format!("http://{id}.test"),
        instance: "i1".into(),
        capacity: NodeCapacity {
            max_sessions: max,
            stages: Default::default(),
        },
        labels: Default::default(),
        backends: Default::default(),
    }
}

fn result(node: &str, attempt: u32, status: SampleStatus) -> SessionResult {
    SessionResult {
        node_id: node.into(),
        attempt,
        status,
        reward: Some(1.0),
        trajectory_uri: None,
        tokens: TokenUsage::default(),
        error: None,
        stats: None,
        retry: false,
        infra_fault: false,
        node_unfit: false,
    }
}

/// (session, node) of each push since the last call.
fn pushes(s: &mut Scheduler) -> Vec<(String, String)> {
    s.take_changes()
        .pushes
        .into_iter()
        .map(|p| (p.assignment.session_id, p.node_id))
        .collect()
}

#[test]
fn higher_priority_first_then_submission_order() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.submit(task_p("low", 2, 0), t0, 0).unwrap();
    s.submit(task_p("high", 2, 5), t0, 0).unwrap();
    s.submit(task_p("low2", 1, 0), t0, 0).unwrap();
    s.register(node("n1", 100), t0, 0);
    s.take_changes();
    assert_eq!(s.assign(0, 100), 5);
    let order: Vec<String> = pushes(&mut s).into_iter().map(|p| p.0).collect();
    assert_eq!(order, ["high-s0", "high-s1", "low-s0", "low-s1", "low2-s0"]);
}

#[test]
fn least_loaded_node_with_stable_ties_and_capacity() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 2), t0, 0);
    s.register(node("b", 4), t0, 0);
    s.submit(task("t", 8), t0, 0).unwrap();
    s.take_changes();
    assert_eq!(s.assign(0, 100), 6, "capacity 2 + 4");
    let nodes: Vec<String> = pushes(&mut s).into_iter().map(|p| p.1).collect();
    // a 0/2 vs b 0/4: tie -> a; then b (0/4 < 1/2); b (1/4 < 1/2); a/b tie
    // at 1/2 vs 2/4 -> a; then b, b.
    assert_eq!(nodes, ["a", "b", "b", "a", "b", "b"]);
    assert_eq!(s.queued(), 2);
}

#[test]
fn a_lost_node_has_its_sessions_dispatched_again_then_failed() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 10), t0, 0);
    s.submit(task("t", 2), t0, 0).unwrap();
    s.assign(0, 10);
    s.take_changes();
    // No heartbeat: lost, sessions back in the queue (retry 1 of 1).
    let t1 = t0 + Duration::from_secs(2);
    s.tick(t1, 2000);
    assert_eq!(s.queued(), 2);
    s.register(node("b", 10), t1, 2000);
    s.assign(2000, 10);
    let p = pushes(&mut s);
    assert!(p.iter().all(|(_, n)| n == "b"), "{p:?}");
    // b is lost too: retry limit reached, sessions fail, task fails.
    s.tick(t1 + Duration::from_secs(2), 4000);
    let v = s.task_view("t", true).unwrap();
    assert_eq!(v.status, TaskStatus::Failed);
    assert_eq!(v.counts.failed, 2);
    assert!(
        matches!(&v.samples[0].state, SessionState::Failed { error } if error.contains("retry limit"))
    );
}

#[test]
fn an_attempt_the_infrastructure_ended_is_run_again_then_kept() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 10), t0, 0);
    s.submit(task("t", 1), t0, 0).unwrap();
    s.assign(0, 10);
    s.take_changes();
    let infra = |attempt| SessionResult {
        reward: Some(0.0),
        trajectory_uri: Some(format!("file:///x/t-s0-{attempt}.parquet")),
        error: Some("the inference backend ended the session".into()),
        retry: true,
        infra_fault: true,
        ..result("a", attempt, SampleStatus::Error)
    };
    // Attempt 1: the backend ended it: run again (retry 1 of 1).
    s.result("t-s0", &infra(1), t0, 0).unwrap();
    assert_eq!(s.queued(), 1);
    assert_eq!(s.counters().infra_reruns, 1);
    assert_eq!(s.counters().redispatches, 1);
    s.assign(0, 10);
    assert_eq!(pushes(&mut s), [("t-s0".to_owned(), "a".to_owned())]);
    let v = s.task_view("t", true).unwrap();
    assert_eq!((v.samples[0].attempts, v.samples[0].retries), (2, 1));
    // Attempt 2 too, at the limit: its result is kept, not failed.
    s.result("t-s0", &infra(2), t0, 0).unwrap();
    assert_eq!(s.counters().infra_reruns, 1);
    let v = s.task_view("t", true).unwrap();
    assert_eq!(v.counts.done, 1);
    assert!(matches!(
        &v.samples[0].state,
        SessionState::Done { result, attempt: 2, .. }
            if result.status == SampleStatus::Error
                && result.trajectory_uri.as_deref() == Some("file:///x/t-s0-2.parquet")
                && result.reward.is_none()
    ));
    // The node reported reward 0 for it: no reward, no mean, no usable
    // sample, so the task failed (not completed) and says why.
    assert_eq!(v.status, TaskStatus::Failed);
    assert_eq!((v.counts.usable, v.requested), (0, 1));
    assert_eq!(v.mean_reward, None);
    assert_eq!(v.failures.len(), 1);
    assert_eq!(
        (
            v.failures[0].status.as_str(),
            v.failures[0].error.as_str(),
            v.failures[0].count
        ),
        ("error", "the inference backend ended the session", 1)
    );
}

#[test]
fn a_task_with_fewer_usable_samples_than_requested_is_partial() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 10), t0, 0);
    s.submit(task("t", 3), t0, 0).unwrap();
    s.assign(0, 10);
    s.take_changes();
    let scored = |r| SessionResult {
        reward: Some(r),
        ..result("a", 1, SampleStatus::Completed)
    };
    s.result("t-s0", &scored(1.0), t0, 0).unwrap();
    s.result("t-s1", &scored(0.0), t0, 0).unwrap();
    let timed_out = SessionResult {
        reward: Some(0.0),
        error: Some("the session's time ran out".into()),
        ..result("a", 1, SampleStatus::Timeout)
    };
    s.result("t-s2", &timed_out, t0, 0).unwrap();
    let v = s.task_view("t", true).unwrap();
    assert_eq!(v.status, TaskStatus::Partial);
    assert!(v.status.is_finished());
    assert_eq!((v.counts.done, v.counts.usable, v.requested), (3, 2, 3));
    assert_eq!(v.mean_reward, Some(0.5), "the timeout is out of the mean");
    assert_eq!(v.reward_std, Some(0.5), "rewards 1 and 0");
    assert_eq!(v.failures[0].samples, [2]);
    let report = crate::report::results_table(&v);
    assert!(
        report.contains("2 of 3 requested samples usable, mean reward 0.5000 over the usable ones"),
        "{report}"
    );
    assert!(
        report.contains("1 sample timeout: the session's time ran out (sample 2)"),
        "{report}"
    );
    assert!(
        report.contains("prompt_tok_all_calls  response_tok_all_calls")
            && report.contains("(token counts are summed over each session's model calls"),
        "{report}"
    );
}

#[test]
fn a_node_fault_at_the_retry_limit_fails_the_session() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 10), t0, 0);
    s.submit(task("t", 1), t0, 0).unwrap();
    s.assign(0, 10);
    s.take_changes();
    let node_fault = |attempt| SessionResult {
        retry: true,
        ..result("a", attempt, SampleStatus::Error)
    };
    s.result("t-s0", &node_fault(1), t0, 0).unwrap();
    s.assign(0, 10);
    s.take_changes();
    s.result("t-s0", &node_fault(2), t0, 0).unwrap();
    assert_eq!(s.counters().infra_reruns, 0);
    let v = s.task_view("t", true).unwrap();
    assert!(
        matches!(&v.samples[0].state, SessionState::Failed { error } if error.contains("retry limit"))
    );
}

#[test]
fn stale_and_unknown_reports_are_refused() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 10), t0, 0);
    s.submit(task("t", 1), t0, 0).unwrap();
    s.assign(0, 10);
    assert!(matches!(
        s.result("t-s0", &result("a", 2, SampleStatus::Completed), t0, 0),
        Err(ReportError::Stale { .. })
    ));
    assert!(matches!(
        s.result("zz", &result("a", 1, SampleStatus::Completed), t0, 0),
        Err(ReportError::UnknownSession(_))
    ));
    s.result("t-s0", &result("a", 1, SampleStatus::Completed), t0, 0)
        .unwrap();
    assert!(
        s.result("t-s0", &result("a", 1, SampleStatus::Completed), t0, 0)
            .is_err()
    );
    let v = s.task_view("t", false).unwrap();
    assert_eq!(v.status, TaskStatus::Completed);
    assert!(s.assigned_to("a").is_empty());
}

#[test]
fn early_stop_cancels_the_rest_and_tells_the_gateway() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 2), t0, 0);
    let mut req = task("t", 5);
    req.early_stop_after = Some(2);
    s.submit(req, t0, 0).unwrap();
    s.assign(0, 10);
    s.take_changes();
    s.result("t-s0", &result("a", 1, SampleStatus::Completed), t0, 0)
        .unwrap();
    s.assign(0, 10);
    s.take_changes();
    s.result("t-s1", &result("a", 1, SampleStatus::Completed), t0, 0)
        .unwrap();
    let c = s.take_changes();
    assert_eq!(c.cancels.len(), 1, "t-s2 was running on a");
    assert_eq!(c.cancels[0].session_id, "t-s2");
    let v = s.task_view("t", false).unwrap();
    assert_eq!(v.status, TaskStatus::Completed);
    assert_eq!((v.counts.done, v.counts.cancelled), (2, 3));
    assert_eq!(s.queued(), 0);
}

#[test]
fn overdue_sessions_fail_and_refusing_nodes_wait_for_a_heartbeat() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 10), t0, 0);
    s.submit(task("t", 2), t0, 0).unwrap();
    s.assign(0, 10);
    s.take_changes();
    s.push_failed("t-s1", "a", 1, "refused", t0);
    assert_eq!(s.queued(), 1);
    assert_eq!(s.assign(0, 10), 0, "a refuses until its next heartbeat");
    s.take_changes();
    s.heartbeat("a", Heartbeat::default(), t0).unwrap();
    assert!(s.take_changes().wake, "the heartbeat wakes the dispatcher");
    assert_eq!(s.assign(0, 10), 1);
    // 60 s budget + 1 s grace, heartbeats keep coming.
    let late = t0 + Duration::from_millis(500);
    s.heartbeat("a", Heartbeat::default(), late).unwrap();
    s.take_changes();
    s.tick(late, 61_001 + 10);
    let c = s.take_changes();
    assert_eq!(c.cancels.len(), 2);
    assert_eq!(s.task_view("t", false).unwrap().status, TaskStatus::Failed);
}

#[test]
fn a_push_whose_answer_was_lost_after_the_node_reported_it_running_stands() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 10), t0, 0);
    s.submit(task("t", 2), t0, 0).unwrap();
    assert_eq!(s.assign(0, 10), 2);
    s.take_changes();
    let running = SessionProgress {
        node_id: "a".into(),
        attempt: 1,
        stage: "running".into(),
        calls: Vec::new(),
    };
    s.progress("t-s0", &running).unwrap();
    // The node died while answering both pushes.
    s.push_failed("t-s0", "a", 1, "connection reset", t0);
    s.push_failed("t-s1", "a", 1, "connection reset", t0);
    assert_eq!(s.queued(), 1, "only the session never reported goes back");
    let v = s.task_view("t", true).unwrap();
    assert!(
        matches!(&v.samples[0].state, SessionState::Running { node, attempt: 1, .. } if node == "a"),
        "{:?}",
        v.samples[0].state
    );
    assert_eq!(v.samples[1].state, SessionState::Pending);
    assert_eq!(s.assigned_to("a").len(), 1);
}

#[test]
fn heartbeats_reconcile_and_a_new_instance_loses_sessions() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 10), t0, 0);
    s.submit(task("t", 1), t0, 0).unwrap();
    s.assign(0, 10);
    let hb = Heartbeat {
        sessions: Some(vec!["t-s0".into(), "gone".into()]),
        ..Heartbeat::default()
    };
    let reply = s.heartbeat("a", hb, t0).unwrap();
    assert_eq!(reply.cancel.len(), 1);
    assert_eq!(reply.cancel[0].session_id, "gone");
    let mut again = node("a", 10);
    again.instance = "i2".into();
    let r = s.register(again, t0, 0);
    assert_eq!(r.requeued, 1);
    assert!(matches!(
        s.heartbeat(
            "a",
            Heartbeat {
                instance: Some("i1".into()),
                ..Heartbeat::default()
            },
            t0
        ),
        Err(HeartbeatError::WrongInstance { .. })
    ));
    assert!(matches!(
        s.heartbeat("zz", Heartbeat::default(), t0),
        Err(HeartbeatError::UnknownNode(_))
    ));
}

#[test]
fn no_healthy_node_for_too_long_fails_pending_sessions() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.submit(task("t", 3), t0, 0).unwrap();
    s.tick(t0 + Duration::from_secs(5), 5000);
    assert_eq!(s.queued(), 3);
    s.tick(t0 + Duration::from_secs(11), 11_000);
    assert_eq!(s.queued(), 0);
    assert_eq!(s.task_view("t", false).unwrap().status, TaskStatus::Failed);
}

#[test]
fn a_draining_node_gets_nothing() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 10), t0, 0);
    s.register(node("b", 10), t0, 0);
    assert!(s.drain("a", true, t0));
    s.submit(task("t", 4), t0, 0).unwrap();
    s.take_changes();
    s.assign(0, 10);
    assert!(pushes(&mut s).iter().all(|(_, n)| n == "b"));
}

fn backends(
    healthy: u32,
) -> std::collections::BTreeMap<String, polar_rollout_types::BackendHealth> {
    [(
        "policy".to_owned(),
        polar_rollout_types::BackendHealth {
            replicas: 1,
            healthy,
        },
    )]
    .into_iter()
    .collect()
}

#[test]
fn a_node_whose_backend_is_down_gets_nothing_until_it_is_back() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    // Down from its registration on: listed as such, sent nothing.
    let mut reg = node("a", 10);
    reg.backends = backends(0);
    s.register(reg, t0, 0);
    s.submit(task("t", 2), t0, 0).unwrap();
    s.take_changes();
    assert_eq!(s.assign(0, 10), 0);
    let view = s.node_views(t0);
    assert_eq!(view[0].health, NodeHealth::BackendDown);
    assert_eq!(view[0].backends["policy"].healthy, 0);
    // Its heartbeat says a replica answers again: woken, dispatched.
    let up = Heartbeat {
        backends: backends(1),
        ..Heartbeat::default()
    };
    s.heartbeat("a", up, t0).unwrap();
    assert!(s.take_changes().wake);
    assert_eq!(s.node_views(t0)[0].health, NodeHealth::Healthy);
    assert_eq!(s.assign(0, 10), 2);
    // Down again: the sessions it holds go on, new ones wait.
    let down = Heartbeat {
        backends: backends(0),
        ..Heartbeat::default()
    };
    s.heartbeat("a", down, t0).unwrap();
    s.take_changes();
    s.submit(task("u", 1), t0, 0).unwrap();
    assert_eq!(s.assign(0, 10), 0);
    assert_eq!(s.queued(), 1);
}

#[test]
fn sessions_no_node_can_take_fail_naming_the_backend_that_is_down() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    let mut reg = node("a", 10);
    reg.backends = backends(0);
    s.register(reg, t0, 0);
    s.submit(task("t", 1), t0, 0).unwrap();
    // Heartbeats keep coming; no_node_timeout (10 s) passes.
    let later = t0 + Duration::from_secs(11);
    s.heartbeat(
        "a",
        Heartbeat {
            backends: backends(0),
            ..Heartbeat::default()
        },
        later,
    )
    .unwrap();
    s.tick(later, 11_000);
    let v = s.task_view("t", true).unwrap();
    assert_eq!(v.status, TaskStatus::Failed);
    assert!(
        matches!(&v.samples[0].state, SessionState::Failed { error }
            if error == "no healthy node for 10000 ms; inference backend down: node a: backend policy has no healthy replica (0 of 1)"),
        "{:?}",
        v.samples[0].state
    );
}

fn unfit(node: &str, attempt: u32, error: &str) -> SessionResult {
    SessionResult {
        retry: true,
        node_unfit: true,
        error: Some(error.into()),
        reward: None,
        ..result(node, attempt, SampleStatus::Error)
    }
}

#[test]
fn a_node_that_cannot_run_a_session_fails_it_at_once_when_it_is_the_only_one() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 4), t0, 0);
    s.submit(task("t", 1), t0, 0).unwrap();
    s.assign(0, 10);
    s.take_changes();
    s.result("t-s0", &unfit("a", 1, "harness x is not installed"), t0, 0)
        .unwrap();
    let v = s.task_view("t", true).unwrap();
    assert_eq!(v.status, TaskStatus::Failed);
    assert_eq!((v.samples[0].attempts, v.samples[0].retries), (1, 0));
    assert!(
        matches!(&v.samples[0].state, SessionState::Failed { error }
            if error == "node a cannot run it: harness x is not installed (no other node to try)"),
        "{:?}",
        v.samples[0].state
    );
    assert!(s.assigned_to("a").is_empty());
    assert_eq!(s.queued(), 0);
}

#[test]
fn a_node_that_cannot_run_a_session_never_gets_it_again() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 4), t0, 0);
    s.register(node("b", 1), t0, 0);
    s.submit(task("t", 2), t0, 0).unwrap();
    s.take_changes();
    s.assign(0, 10);
    let p = pushes(&mut s);
    assert_eq!(p.len(), 2, "{p:?}");
    let on_a = p
        .iter()
        .find(|(_, n)| n == "a")
        .map(|(sid, _)| sid.clone())
        .unwrap();
    let on_b = p
        .iter()
        .find(|(_, n)| n == "b")
        .map(|(sid, _)| sid.clone())
        .unwrap();
    s.result(&on_a, &unfit("a", 1, "runtime docker unavailable"), t0, 0)
        .unwrap();
    // b is full: the session waits rather than go back to a, which has room.
    assert_eq!(s.assign(0, 10), 0);
    assert_eq!(s.queued(), 1);
    s.result(&on_b, &result("b", 1, SampleStatus::Completed), t0, 0)
        .unwrap();
    s.assign(0, 10);
    assert_eq!(pushes(&mut s), [(on_a.clone(), "b".to_owned())]);
    // b cannot either: no node left, it fails naming both.
    s.result(&on_a, &unfit("b", 2, "runtime docker unavailable"), t0, 0)
        .unwrap();
    let v = s.task_view("t", true).unwrap();
    assert_eq!(v.status, TaskStatus::Partial);
    let failed = v.samples.iter().find(|x| x.session_id == on_a).unwrap();
    assert!(
        matches!(&failed.state, SessionState::Failed { error }
            if error == "node a cannot run it: runtime docker unavailable; node b cannot run it: runtime docker unavailable (no other node to try)"),
        "{:?}",
        failed.state
    );
}

#[test]
fn a_retry_goes_to_another_node_and_the_ended_attempt_says_why() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 4), t0, 0);
    s.register(node("b", 4), t0, 0);
    s.submit(task("t", 1), t0, 0).unwrap();
    s.take_changes();
    s.assign(0, 10);
    assert_eq!(pushes(&mut s), [("t-s0".to_owned(), "a".to_owned())]);
    // a fails it in a retryable way: b (less loaded or not) gets attempt 2.
    let mut r = result("a", 1, SampleStatus::Error);
    r.retry = true;
    r.error = Some("sandbox broke".into());
    s.result("t-s0", &r, t0, 0).unwrap();
    // a is now the less loaded by id order too; the retry still avoids it.
    s.assign(0, 10);
    assert_eq!(pushes(&mut s), [("t-s0".to_owned(), "b".to_owned())]);
    let v = s.task_view("t", true).unwrap();
    let ended = &v.samples[0].ended_attempts;
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!((ended[0].attempt, ended[0].node.as_str()), (1, "a"));
    assert!(ended[0].reason.contains("sandbox broke"), "{ended:?}");
}

#[test]
fn a_retry_goes_back_to_the_same_node_when_it_is_the_only_one() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(limits(), t0);
    s.register(node("a", 4), t0, 0);
    s.submit(task("t", 1), t0, 0).unwrap();
    s.assign(0, 10);
    s.take_changes();
    let mut r = result("a", 1, SampleStatus::Error);
    r.retry = true;
    s.result("t-s0", &r, t0, 0).unwrap();
    s.assign(0, 10);
    assert_eq!(pushes(&mut s), [("t-s0".to_owned(), "a".to_owned())]);
}

#[test]
fn finished_tasks_are_deleted_and_expire_after_the_retention() {
    let t0 = Instant::now();
    let mut l = limits();
    l.retention = Some(Duration::from_secs(60));
    let mut s = Scheduler::new(l, t0);
    s.submit(task("old", 2), t0, 0).unwrap();
    s.submit(task("live", 1), t0, 0).unwrap();
    assert!(matches!(
        s.delete("live"),
        Err(DeleteError::NotFinished { .. })
    ));
    s.cancel("old", "x", t0, 1_000);
    s.take_changes();
    // Not yet past the retention, then past it: only the finished task goes.
    assert_eq!(s.expire(60_000), 0);
    assert_eq!(s.expire(61_001), 1);
    assert!(s.task_view("old", true).is_none());
    assert!(s.task_view("live", true).is_some());
    let ops = s.take_changes().ops;
    assert!(
        matches!(&ops[..], [Op::DeleteTask { task_id }] if task_id == "old"),
        "{ops:?}"
    );
    assert_eq!(s.delete("old"), Err(DeleteError::Unknown("old".into())));
}
