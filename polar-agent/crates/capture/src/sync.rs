//! Group commit: the syncing thread that makes the capture logs' lines
//! durable ([`GroupCommit`]), shared by every session of a store, over the
//! agent's journal ([`super::journal`]).
//!
//! A call's line is written by its own task to its session's log and its
//! frame buffered for the journal (see [`super::log::LogFile`]); the task
//! then registers the journal position after its frame and waits, without
//! holding a thread, until the thread has written and synced it. The
//! thread takes every registration pending at once, writes the buffered
//! frames with one `write`, syncs the journal once, answers them, and
//! starts over: the calls that end
//! while a round runs share the next round's sync, whatever their session
//! (one `fdatasync` per round, not one per session's file).
//!
//! Off the calls' path the same thread syncs session logs: those of the
//! sessions that ended ([`GroupCommit::retire`]), those of a segment it
//! rotates ([`super::journal::Journal::rotate`]), and all of them when the
//! last handle goes (the store closed: the journal, its directory with it,
//! is then removed). Logs are synced side by side, by up to 16 threads:
//! the file system commits their journal entries together and the device
//! flushes once for them.
//!
//! A failed sync of the journal fails the registrations of its round
//! (their calls end with the API's error: their records may or may not be
//! on disk); later lines are covered by later syncs only.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::journal::{JOURNAL_DIR, Journal, Retired, SyncFn, Touched};
use super::owners::{OwnJournal, RootLock};
use super::worker::{Bell, Owned, Sleeper, Worker};
use polar_capture_log::LogError;

/// What a syncing round tells a waiting line.
pub(crate) type SyncResult = Result<(), Arc<io::Error>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a waiting line is told, on the syncing thread: it must be quick.
pub(crate) type Answer = Box<dyn FnOnce(SyncResult) + Send>;

struct Waiter {
    pos: u64,
    answer: Answer,
}

#[derive(Default)]
struct State {
    pending: Vec<Waiter>,
    /// Logs of ended sessions, to sync.
    retire: Vec<u64>,
    /// The journal's buffer is past `FLUSH_BYTES`: write it.
    flush: bool,
    closed: bool,
    /// The thread sleeps on its [`Bell`].
    asleep: bool,
    /// Tests: stop at once, as the agent's process would on a power loss.
    #[cfg(test)]
    crash: bool,
    #[cfg(test)]
    stopped: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Bell,
    syncs: AtomicU64,
    sync: SyncFn,
    journal: Journal,
}

impl Sleeper for State {
    fn asleep(&mut self) -> &mut bool {
        &mut self.asleep
    }
}

impl Worker for Shared {
    fn close(&self) {
        let mut state = lock(&self.state);
        state.closed = true;
        self.wake.ring(state);
    }
}

/// A handle on the syncing thread and its journal; clones share them.
/// When the last goes, the thread's close is waited for: the last round
/// synced, the logs synced and the journal removed (a few syncs, once,
/// when the store closes).
#[derive(Clone)]
pub struct GroupCommit(Arc<Owned<Shared>>);

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("syncs", &self.syncs())
            .finish()
    }
}

impl GroupCommit {
    /// Opens a journal of its own under `state_dir` (segments rotated at
    /// `limit` bytes) and starts the syncing thread. What other journals
    /// there hold is not replayed: [`super::CaptureStore::open`] does
    /// that. Blocking.
    pub fn start(state_dir: &Path, limit: u64) -> Result<Self, LogError> {
        let own = RootLock::take(&state_dir.join(JOURNAL_DIR))?.make_own()?;
        Self::start_with(own, limit, File::sync_data)
    }

    /// Opens a journal in the store's own directory `own` (segments
    /// rotated at `limit` bytes) and starts the syncing thread, with
    /// `sync` as the sync operation. Blocking.
    pub(crate) fn start_with(own: OwnJournal, limit: u64, sync: SyncFn) -> Result<Self, LogError> {
        let journal = Journal::open(own, limit)?;
        let dir = journal.dir().to_owned();
        let shared = Shared {
            state: Mutex::default(),
            wake: Bell::default(),
            syncs: AtomicU64::new(0),
            sync,
            journal,
        };
        let owned = Owned::start(shared, "sync", run)
            .map_err(|e| LogError::io("starting the capture log's syncing thread for", &dir, e))?;
        Ok(Self(Arc::new(owned)))
    }

    /// The directory of the journal's segments.
    pub fn journal_dir(&self) -> &Path {
        self.0.shared.journal.dir()
    }

    /// The syncs of the journal made so far by rounds (one per round).
    pub fn syncs(&self) -> u64 {
        self.0.shared.syncs.load(Ordering::Relaxed)
    }

    /// Appends the frame of a line just written to the log `log_id` (its
    /// file `log`): `prefix` then `line`. Returns the position to wait
    /// for. Blocking.
    pub(crate) fn append(
        &self,
        log_id: u64,
        log: &Arc<File>,
        prefix: &[u8],
        line: &[u8],
    ) -> io::Result<u64> {
        let shared = &self.0.shared;
        let (pos, full) = shared.journal.append(log_id, log, prefix, line)?;
        if full {
            let mut state = lock(&shared.state);
            state.flush = true;
            shared.wake.ring(state);
        }
        Ok(pos)
    }

    /// Registers journal position `pos` (already written); the answer
    /// comes once a sync covering it has returned. `None` when it is
    /// already durable.
    #[cfg(any(test, feature = "bench"))]
    pub(crate) fn register(&self, pos: u64) -> Option<tokio::sync::oneshot::Receiver<SyncResult>> {
        if self.0.shared.journal.is_durable(pos) {
            return None;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.on_durable(
            pos,
            Box::new(move |result| {
                // The waiter may have gone (its call cancelled).
                let _ = tx.send(result);
            }),
        );
        Some(rx)
    }

    /// Calls `answer` once journal position `pos` (already written) is
    /// durable: at once when it is, else on the syncing thread after the
    /// sync covering it returned. `answer` must be quick and must not hold
    /// a [`GroupCommit`] handle (the last one's drop joins the thread).
    pub(crate) fn on_durable(&self, pos: u64, answer: Answer) {
        let shared = &self.0.shared;
        if shared.journal.is_durable(pos) {
            return answer(Ok(()));
        }
        let mut state = lock(&shared.state);
        state.pending.push(Waiter { pos, answer });
        shared.wake.ring(state);
    }

    /// Asks the thread to sync the log `log_id` (its session ended), off
    /// the calls' path.
    pub(crate) fn retire(&self, log_id: u64) {
        let shared = &self.0.shared;
        let mut state = lock(&shared.state);
        state.retire.push(log_id);
        shared.wake.ring(state);
    }
}

#[cfg(test)]
impl GroupCommit {
    /// Stops the thread where it is, as a power loss would: nothing more
    /// is synced or removed, and the journal's lock is let go, as the
    /// process's end would.
    pub(crate) fn crash(&self) {
        let shared = &self.0.shared;
        let mut state = lock(&shared.state);
        state.crash = true;
        shared.wake.condvar().notify_all();
        while !state.stopped {
            state = shared
                .wake
                .condvar()
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        shared.journal.abandon();
    }
}

/// The thread: one round after another until closed with nothing pending,
/// then every log synced and the journal removed.
fn run(shared: &Shared) {
    let mut round = Vec::new();
    let mut retire = Vec::new();
    let mut kept: Vec<Retired> = Vec::new();
    loop {
        let closed = {
            let mut state = lock(&shared.state);
            while state.pending.is_empty()
                && state.retire.is_empty()
                && !state.flush
                && !state.closed
            {
                #[cfg(test)]
                if state.crash {
                    break;
                }
                state = shared.wake.sleep(state);
            }
            #[cfg(test)]
            if state.crash {
                state.stopped = true;
                shared.wake.condvar().notify_all();
                return;
            }
            std::mem::swap(&mut round, &mut state.pending);
            std::mem::swap(&mut retire, &mut state.retire);
            let flush = std::mem::take(&mut state.flush);
            (state.closed && round.is_empty(), flush)
        };
        let (closed, flush) = closed;
        if !round.is_empty() || flush {
            sync_round(shared, &mut round);
        }
        if !retire.is_empty() {
            let touched = shared.journal.take_touched(&retire);
            retire.clear();
            let failed = sync_logs(shared.sync, touched);
            shared.journal.put_back(failed);
        }
        if closed {
            kept.push(shared.journal.close());
            finish_retired(shared, &mut kept);
            // A segment kept (its logs failed to sync) stays, locked until
            // the process ends, then replayed by the next agent.
            if kept.is_empty()
                && let Err(e) = shared.journal.remove_dir()
            {
                tracing::warn!(error = %e, "removing the capture journal's directory");
            }
            return;
        }
        if shared.journal.wants_rotation() {
            match shared.journal.rotate(shared.sync) {
                Ok(old) => kept.push(old),
                Err(e) => tracing::error!(error = %e, "rotating the capture journal failed"),
            }
            finish_retired(shared, &mut kept);
        }
    }
}

/// Syncs the journal once and answers the round's waiters.
fn sync_round(shared: &Shared, round: &mut Vec<Waiter>) {
    let result = match shared.journal.sync(shared.sync) {
        Ok(synced) => {
            shared.syncs.fetch_add(u64::from(synced), Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(Arc::new(e)),
    };
    for w in round.drain(..) {
        let answer = match &result {
            Ok(()) if shared.journal.is_durable(w.pos) => Ok(()),
            Ok(()) => Err(Arc::new(io::Error::other(
                "the capture journal's sync did not cover the line",
            ))),
            Err(e) => Err(Arc::clone(e)),
        };
        (w.answer)(answer);
    }
}

/// Syncs the logs of retired segments and removes each segment whose logs
/// are all synced; the others are kept for the next try.
fn finish_retired(shared: &Shared, kept: &mut Vec<Retired>) {
    for mut old in std::mem::take(kept) {
        old.touched = sync_logs(shared.sync, std::mem::take(&mut old.touched));
        if !old.touched.is_empty() {
            tracing::error!(segment = %old.path.display(), logs = old.touched.len(), "capture logs failed to sync; their journal segment is kept");
            kept.push(old);
            continue;
        }
        if let Err(e) = shared.journal.remove(&old.path) {
            tracing::warn!(error = %e, "removing a replayed-out capture journal segment");
        }
    }
}

/// Most threads syncing logs at once.
const SYNC_THREADS: usize = 16;

/// Syncs `logs` side by side (up to [`SYNC_THREADS`] at once); returns
/// those whose sync failed.
fn sync_logs(sync: SyncFn, logs: Touched) -> Touched {
    let mut logs: Vec<(u64, Arc<File>)> = logs.into_iter().collect();
    let per_thread = logs.len().div_ceil(SYNC_THREADS).max(1);
    let mut chunks = Vec::new();
    while !logs.is_empty() {
        chunks.push(logs.split_off(logs.len().saturating_sub(per_thread)));
    }
    let failed = Mutex::new(Touched::new());
    std::thread::scope(|scope| {
        for chunk in chunks {
            let failed = &failed;
            let ours: Vec<_> = chunk.iter().map(|(id, f)| (*id, Arc::clone(f))).collect();
            let work = move || {
                for (id, file) in chunk {
                    if let Err(e) = sync(&file) {
                        tracing::error!(error = %e, "syncing a capture log failed");
                        lock(failed).insert(id, file);
                    }
                }
            };
            if let Err(e) = std::thread::Builder::new()
                .name("polar-capture-sync".into())
                .spawn_scoped(scope, work)
            {
                tracing::error!(error = %e, "no thread to sync capture logs; tried later");
                lock(failed).extend(ours);
            }
        }
    });
    failed.into_inner().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
