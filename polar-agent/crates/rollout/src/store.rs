//! Persistence: an embedded SQLite database (WAL mode) holding every task,
//! session and node, exclusive to one server (an exclusive `flock` on
//! `{database}.lock`). One writer thread owns the connection; callers hand
//! it batches of rows ([`Op`]) and wait for the commit before acknowledging
//! anything, and the thread publishes each batch's events only after its
//! commit, so events come in database order. Batches queued together share
//! one transaction (group commit). Checkpoints (which fsync) run on their
//! own thread and connection, passive, so they never hold a commit up;
//! under a steady stream of commits a passive checkpoint never catches the
//! log's end, so the log would only grow: past [`WAL_LIMIT`] a checkpoint
//! waits for the commit in progress, copies the rest and truncates the log
//! (`TRUNCATE`), which bounds the WAL file (BENCHMARKS.md, "Bounded state").
//!
//! Schema versions are listed in `schema_migrations`; [`MIGRATIONS`] are
//! applied in order on open.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use tokio::sync::oneshot;

use super::config::Synchronous;
use super::events::{Event, EventHub};
use super::scheduler::Op;
use super::scheduler::views::{StoredSession, StoredTask};
use polar_rollout_api::{CallbackView, NodeRegistration, SessionState, TaskRequest, TaskStatus};

/// Batches committed in one transaction at most.
const MAX_GROUP: usize = 256;
/// How often the checkpointer copies the WAL into the database.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);
/// The WAL file's size past which the checkpointer truncates it.
pub const WAL_LIMIT: u64 = 64 << 20;

/// The schema, one step per version.
pub const MIGRATIONS: &[(u32, &str)] = &[
    (
        1,
        "CREATE TABLE tasks (
        task_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        request TEXT NOT NULL,
        status TEXT NOT NULL,
        submitted_unix_ms INTEGER NOT NULL,
        finished_unix_ms INTEGER,
        reason TEXT,
        callback TEXT NOT NULL
    );
    CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL REFERENCES tasks(task_id),
        sample_index INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        retries INTEGER NOT NULL,
        state_kind TEXT NOT NULL,
        state TEXT NOT NULL,
        UNIQUE (task_id, sample_index)
    );
    CREATE INDEX sessions_by_kind ON sessions(state_kind);
    CREATE TABLE nodes (
        node_id TEXT PRIMARY KEY,
        registration TEXT NOT NULL,
        drain_requested INTEGER NOT NULL
    );",
    ),
    (
        2,
        "ALTER TABLE sessions ADD COLUMN ended TEXT NOT NULL DEFAULT '[]';",
    ),
    (
        3,
        "ALTER TABLE sessions ADD COLUMN unfit TEXT NOT NULL DEFAULT '{}';",
    ),
];

/// A database failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or migrated.
    #[error("opening the rollout database {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rusqlite::Error,
    },
    /// A statement failed.
    #[error("rollout database: {0}")]
    Sql(#[from] rusqlite::Error),
    /// A stored JSON value does not parse.
    #[error("rollout database: bad {what}: {source}")]
    Json {
        /// Which value.
        what: &'static str,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A batch could not be committed.
    #[error("rollout database: write failed: {0}")]
    Write(String),
    /// The writer thread is gone.
    #[error("rollout database: the writer stopped")]
    Closed,
    /// Another server holds the database.
    #[error("the rollout database {0} is in use by another server")]
    Locked(PathBuf),
    /// The writer thread could not be started.
    #[error("rollout database: starting the writer: {0}")]
    Thread(#[source] std::io::Error),
}

/// What the database held on open.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Tasks.
    pub tasks: Vec<StoredTask>,
    /// Sessions.
    pub sessions: Vec<StoredSession>,
    /// Nodes with their drain flag.
    pub nodes: Vec<(NodeRegistration, bool)>,
}

struct Batch {
    ops: Vec<Op>,
    events: Vec<Event>,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

/// What the writer thread is asked to do, in order.
enum Msg {
    /// Commit a batch.
    Batch(Batch),
    /// Read the database back (after every batch queued before).
    Load(oneshot::Sender<Result<Snapshot, StoreError>>),
}

/// The handle to the writer thread.
#[derive(Debug)]
pub struct Store {
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    checkpointer: Mutex<Option<(mpsc::Sender<()>, JoinHandle<()>)>>,
    lock: Mutex<Option<nix::fcntl::Flock<std::fs::File>>>,
}

/// Takes the database's lock file.
fn take_lock(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, StoreError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&name)
        .map_err(StoreError::Thread)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|_| StoreError::Locked(path.to_owned()))
}

fn connect(path: &Path, synchronous: Synchronous) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let sync = match synchronous {
        Synchronous::Normal => "NORMAL",
        Synchronous::Full => "FULL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

/// Checkpoints (passive: never blocking the writer) until told to stop;
/// truncates the log `wal` once it is past [`WAL_LIMIT`].
fn checkpointer(conn: Connection, wal: PathBuf, stop: mpsc::Receiver<()>) {
    loop {
        match stop.recv_timeout(CHECKPOINT_EVERY) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!(error = %e, "rollout database checkpoint");
        }
        if std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_LIMIT)
            && let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        {
            tracing::warn!(error = %e, "truncating the rollout database's log");
        }
    }
}

impl Store {
    /// Opens (creating and migrating) the database, reads it, and starts
    /// the writer, which publishes committed events to `hub`.
    pub fn open(
        path: &Path,
        synchronous: Synchronous,
        hub: Arc<EventHub>,
    ) -> Result<(Self, Snapshot), StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        let lock = take_lock(path)?;
        let mut conn = connect(path, synchronous).map_err(open_err)?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(open_err)?;
        // When the writer starts the log over, a longer file is cut back.
        conn.pragma_update(None, "journal_size_limit", WAL_LIMIT.to_string())
            .map_err(open_err)?;
        migrate(&mut conn).map_err(open_err)?;
        let snapshot = load(&conn)?;
        let ck_conn = connect(path, synchronous).map_err(open_err)?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let (ck_tx, ck_rx) = mpsc::channel();
        let ck = std::thread::Builder::new()
            .name("rollout-ckpt".into())
            .spawn(move || checkpointer(ck_conn, wal, ck_rx))
            .map_err(StoreError::Thread)?;
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("rollout-db".into())
            .spawn(move || writer(conn, rx, &hub))
            .map_err(StoreError::Thread)?;
        Ok((
            Self {
                tx: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
                checkpointer: Mutex::new(Some((ck_tx, ck))),
                lock: Mutex::new(Some(lock)),
            },
            snapshot,
        ))
    }

    /// Queues a batch; the returned receiver resolves once it is committed.
    /// Call with the scheduler locked, so batches keep its order.
    pub fn send(&self, ops: Vec<Op>, events: Vec<Event>) -> oneshot::Receiver<Result<(), String>> {
        let (done, rx) = oneshot::channel();
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = guard.as_ref() {
            let _ = tx.send(Msg::Batch(Batch {
                ops,
                events,
                done: Some(done),
            }));
        }
        rx
    }

    /// Reads what is committed, after every batch sent before (the writer
    /// thread does it, so no async worker blocks on the database).
    pub async fn load(&self) -> Result<Snapshot, StoreError> {
        let (done, rx) = oneshot::channel();
        {
            let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            let tx = guard.as_ref().ok_or(StoreError::Closed)?;
            tx.send(Msg::Load(done)).map_err(|_| StoreError::Closed)?;
        }
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Waits for a batch sent with [`Store::send`].
    pub async fn wait(rx: oneshot::Receiver<Result<(), String>>) -> Result<(), StoreError> {
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Write(e)),
            Err(_) => Err(StoreError::Closed),
        }
    }

    /// Commits what is queued, stops the writer and closes the database.
    pub fn close(&self) {
        let ck = self
            .checkpointer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((stop, t)) = ck {
            drop(stop);
            let _ = t.join();
        }
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

fn migrate(conn: &mut Connection) -> Result<(), rusqlite::Error> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version INTEGER PRIMARY KEY,
            applied_unix_ms INTEGER NOT NULL
        )",
    )?;
    for (version, sql) in MIGRATIONS {
        let done: Option<u32> = conn
            .query_row(
                "SELECT version FROM schema_migrations WHERE version = ?1",
                [version],
                |r| r.get(0),
            )
            .optional()?;
        if done.is_some() {
            continue;
        }
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_unix_ms) VALUES (?1, ?2)",
            params![version, sql_int(polar_rollout_api::now_ms())],
        )?;
        tx.commit()?;
        tracing::info!(version, "rollout database migrated");
    }
    Ok(())
}

fn json<T: serde::de::DeserializeOwned>(what: &'static str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|source| StoreError::Json { what, source })
}

fn load(conn: &Connection) -> Result<Snapshot, StoreError> {
    let mut snap = Snapshot::default();
    let mut stmt =
        conn.prepare("SELECT registration, drain_requested FROM nodes ORDER BY node_id")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?)))?;
    for row in rows {
        let (reg, drain) = row?;
        snap.nodes.push((json("node registration", &reg)?, drain));
    }
    let mut stmt = conn.prepare(
        "SELECT request, seq, status, submitted_unix_ms, finished_unix_ms, reason, callback
         FROM tasks ORDER BY seq",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, Option<i64>>(4)?,
            r.get::<_, Option<String>>(5)?,
            r.get::<_, String>(6)?,
        ))
    })?;
    for row in rows {
        let (request, seq, status, submitted, finished, reason, callback) = row?;
        let request: TaskRequest = json("task request", &request)?;
        let status: TaskStatus = json("task status", &format!("\"{status}\""))?;
        let callback: CallbackView = json("callback", &callback)?;
        snap.tasks.push(StoredTask {
            request,
            seq: seq.unsigned_abs(),
            status,
            submitted_unix_ms: submitted.unsigned_abs(),
            finished_unix_ms: finished.map(i64::unsigned_abs),
            reason,
            callback,
        });
    }
    let mut stmt = conn.prepare(
        "SELECT session_id, task_id, sample_index, attempts, retries, state, ended, unfit \
         FROM sessions",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, u32>(2)?,
            r.get::<_, u32>(3)?,
            r.get::<_, u32>(4)?,
            r.get::<_, String>(5)?,
            r.get::<_, String>(6)?,
            r.get::<_, String>(7)?,
        ))
    })?;
    for row in rows {
        let (session_id, task_id, sample_index, attempts, retries, state, ended, unfit) = row?;
        let state: SessionState = json("session state", &state)?;
        let ended = json("ended attempts", &ended)?;
        let unfit = json("unfit nodes", &unfit)?;
        snap.sessions.push(StoredSession {
            session_id,
            task_id,
            sample_index,
            attempts,
            retries,
            state,
            ended,
            unfit,
        });
    }
    Ok(snap)
}

/// The writer thread: commits batches (several at once when they queue
/// up), then acknowledges them and publishes their events.
fn writer(mut conn: Connection, rx: mpsc::Receiver<Msg>, hub: &EventHub) {
    let mut next = None;
    loop {
        let first = match next.take() {
            Some(m) => m,
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => break,
            },
        };
        let first = match first {
            Msg::Batch(b) => b,
            Msg::Load(done) => {
                let _ = done.send(load(&conn));
                continue;
            }
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(Msg::Batch(b)) => group.push(b),
                Ok(load) => {
                    // Answered after this group's commit, in order.
                    next = Some(load);
                    break;
                }
                Err(_) => break,
            }
        }
        let result = conn.transaction().map_err(StoreError::from).and_then(|tx| {
            for b in &group {
                for op in &b.ops {
                    apply(&tx, op)?;
                }
            }
            tx.commit().map_err(StoreError::from)
        });
        let result = result.map_err(|e| {
            tracing::error!(error = %e, "rollout database write failed");
            e.to_string()
        });
        for mut b in group {
            if result.is_ok() {
                hub.publish(std::mem::take(&mut b.events));
            }
            if let Some(done) = b.done.take() {
                let _ = done.send(result.clone());
            }
        }
    }
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, "final checkpoint of the rollout database");
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the rollout database");
    }
}

/// SQLite integers are signed.
fn sql_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|source| StoreError::Json {
        what: "value to store",
        source,
    })
}

fn apply(tx: &Transaction<'_>, op: &Op) -> Result<(), StoreError> {
    match op {
        Op::InsertTask {
            request,
            seq,
            submitted_unix_ms,
        } => {
            let callback = CallbackView {
                state: if request.callback_url.is_some() {
                    polar_rollout_api::CallbackState::Waiting
                } else {
                    polar_rollout_api::CallbackState::None
                },
                ..CallbackView::default()
            };
            tx.prepare_cached(
                "INSERT INTO tasks (task_id, seq, request, status, submitted_unix_ms, callback)
                 VALUES (?1, ?2, ?3, 'queued', ?4, ?5)",
            )?
            .execute(params![
                request.task_id,
                sql_int(*seq),
                to_json(request.as_ref())?,
                sql_int(*submitted_unix_ms),
                to_json(&callback)?,
            ])?;
            let pending = to_json(&SessionState::Pending)?;
            let mut stmt = tx.prepare_cached(
                "INSERT INTO sessions (session_id, task_id, sample_index, attempts, retries, state_kind, state)
                 VALUES (?1, ?2, ?3, 0, 0, 'pending', ?4)",
            )?;
            for i in 0..request.num_samples {
                stmt.execute(params![
                    polar_rollout_api::session_id(&request.task_id, i),
                    request.task_id,
                    i,
                    pending,
                ])?;
            }
        }
        Op::Task {
            task_id,
            status,
            finished_unix_ms,
            reason,
            callback,
        } => {
            tx.prepare_cached(
                "UPDATE tasks SET status = ?2, finished_unix_ms = ?3, reason = ?4, callback = ?5
                 WHERE task_id = ?1",
            )?
            .execute(params![
                task_id,
                status.as_str(),
                finished_unix_ms.map(sql_int),
                reason,
                to_json(callback)?,
            ])?;
        }
        Op::Session {
            session_id,
            task_id,
            sample_index,
            attempts,
            retries,
            state,
            ended,
            unfit,
        } => {
            tx.prepare_cached(
                "INSERT INTO sessions (session_id, task_id, sample_index, attempts, retries, state_kind, state, ended, unfit)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (session_id) DO UPDATE SET attempts = excluded.attempts,
                    retries = excluded.retries, state_kind = excluded.state_kind,
                    state = excluded.state, ended = excluded.ended, unfit = excluded.unfit",
            )?
            .execute(params![
                session_id,
                task_id,
                sample_index,
                attempts,
                retries,
                state.kind().as_str(),
                to_json(state)?,
                to_json(ended)?,
                to_json(unfit)?,
            ])?;
        }
        Op::DeleteTask { task_id } => {
            tx.prepare_cached("DELETE FROM sessions WHERE task_id = ?1")?
                .execute(params![task_id])?;
            tx.prepare_cached("DELETE FROM tasks WHERE task_id = ?1")?
                .execute(params![task_id])?;
        }
        Op::Node {
            registration,
            drain_requested,
        } => {
            tx.prepare_cached(
                "INSERT INTO nodes (node_id, registration, drain_requested) VALUES (?1, ?2, ?3)
                 ON CONFLICT (node_id) DO UPDATE SET registration = excluded.registration,
                    drain_requested = excluded.drain_requested",
            )?
            .execute(params![
                registration.node_id,
                to_json(registration)?,
                drain_requested,
            ])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_apply_once_and_a_second_server_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sqlite");
        let hub = Arc::new(EventHub::new());
        let (store, snap) = Store::open(&path, Synchronous::Normal, Arc::clone(&hub)).unwrap();
        assert!(snap.tasks.is_empty());
        store.close();
        let (store, _) = Store::open(&path, Synchronous::Normal, Arc::clone(&hub)).unwrap();
        let second = Store::open(&path, Synchronous::Normal, Arc::clone(&hub));
        assert!(matches!(second, Err(StoreError::Locked(_))), "{second:?}");
        store.close();
        let conn = Connection::open(&path).unwrap();
        let n: u32 = conn
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, MIGRATIONS.len() as u32);
        drop(conn);
        assert!(Store::open(&path, Synchronous::Normal, hub).is_ok());
    }
}
