//! Commit first, then apply: a change whose commit fails is nowhere (not
//! in answers, not in memory, not at the next start), the same request
//! succeeds once the database takes writes again. Failures are injected
//! with SQLite triggers that abort the server's writes, made through a
//! second connection to its database file.

use std::time::Duration;

use super::*;
use polar_rollout_types::SessionState;

/// Makes every write matching `when` (e.g. `INSERT ON tasks`) fail.
fn inject(db: &std::path::Path, name: &str, when: &str) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(&format!(
        "CREATE TRIGGER {name} BEFORE {when} BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
    ))
    .unwrap();
}

fn heal(db: &std::path::Path, name: &str) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(&format!("DROP TRIGGER {name};"))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_leaves_no_trace_and_the_retry_succeeds() {
    let e = env();
    let db = e.cfg.database.clone();
    let server = start(&e.cfg).await;
    let c = client(&server);

    inject(&db, "no_tasks", "INSERT ON tasks");
    let err = c.submit(&task("t1", 3)).await.unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::SERVICE_UNAVAILABLE), "{err}");
    let err = c.task("t1").await.unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::NOT_FOUND), "{err}");
    assert!(c.tasks(None).await.unwrap().tasks.is_empty());
    assert_eq!(c.status().await.unwrap().tasks.values().sum::<u64>(), 0);

    heal(&db, "no_tasks");
    // Not 409: the failed submission left nothing behind.
    c.submit(&task("t1", 3)).await.unwrap();
    assert_eq!(c.task("t1").await.unwrap().status, TaskStatus::Queued);

    // A later change (cancel) fails: the task stays as committed.
    inject(&db, "no_task_updates", "UPDATE ON tasks");
    let err = c.cancel("t1").await.unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::SERVICE_UNAVAILABLE), "{err}");
    let v = c.task("t1").await.unwrap();
    assert_eq!(v.status, TaskStatus::Queued, "{v:?}");
    assert_eq!(v.counts.pending, 3, "{:?}", v.counts);
    assert!(
        v.samples.iter().all(|s| s.state == SessionState::Pending),
        "{v:?}"
    );
    heal(&db, "no_task_updates");

    // The next start holds what was answered.
    server.shutdown().await;
    let server = start(&e.cfg).await;
    let c = client(&server);
    let v = c.task("t1").await.unwrap();
    assert_eq!(v.status, TaskStatus::Queued, "{v:?}");
    assert_eq!(v.counts.pending, 3, "{:?}", v.counts);
    c.cancel("t1").await.unwrap();
    assert_eq!(c.task("t1").await.unwrap().status, TaskStatus::Cancelled);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_whose_commit_fails_is_not_seen_until_a_retry_commits_it() {
    let e = env();
    let db = e.cfg.database.clone();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let mut g = gw_config(&server, "node-a");
    g.max_sessions = 2;
    g.session_time = Duration::from_millis(20);
    let g = gateway(g).await;

    inject(
        &db,
        "no_done",
        "UPDATE ON sessions WHEN NEW.state_kind = 'done'",
    );
    c.submit(&task("r1", 2)).await.unwrap();
    until("both sessions ran", Duration::from_secs(5), || {
        g.received().len() == 2
    })
    .await;
    // The gateway reports and is refused (503) while the trigger is there;
    // give it a few tries, then look: nothing is done, in memory or in the
    // database.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let v = c.task("r1").await.unwrap();
    assert_eq!(v.counts.done, 0, "{:?}", v.counts);
    assert!(!v.status.is_finished(), "{v:?}");
    assert!(
        v.samples
            .iter()
            .all(|s| !matches!(s.state, SessionState::Done { .. })),
        "{v:?}"
    );
    heal(&db, "no_done");
    // The gateway's retries now commit.
    let v = finished(&c, "r1", Duration::from_secs(20)).await;
    assert_completed(&v, 2);
    g.stop().await;
    server.shutdown().await;
}
