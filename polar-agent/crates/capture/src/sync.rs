//! Group commit: the syncing thread that makes the capture logs' lines
//! durable ([`GroupCommit`]), shared by every session of a store.
//!
//! A call's line is written by its own task (one `write`, see
//! [`super::log::LogFile`]); the task then registers with the syncing
//! thread and waits, without holding a thread, until a `fdatasync` of its
//! file that began after its write has returned. The thread takes every
//! registration pending at once, syncs each file they name once, answers
//! them, and starts over: the calls that end while a round runs share the
//! next round's syncs, whatever their session. A sync covers every line
//! written to its file before it began (each file counts its writes; a
//! registration whose line an earlier sync already covered is answered
//! without another). The files of one round are synced side by side, by
//! up to 16 threads: the file system commits their journal entries
//! together and the device flushes once for them (synced one after the
//! other, each file paid a flush of its own: slower at 64 sessions than a
//! sync per call on threads of their own).
//!
//! Threads, not io_uring: not measured (no io_uring crate is in the
//! dependency tree); BENCHMARKS.md ("Capture log durability") has the
//! figures of this design. The thread ends when the store and every
//! log that shares it are gone.
//!
//! A failed sync fails the registrations of its round for that file (their
//! calls end with the API's error: their records may or may not be on
//! disk); later lines are covered by later syncs only.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::log::{LogError, LogFile};

/// What a syncing round tells a waiting line.
pub(crate) type SyncResult = Result<(), Arc<io::Error>>;

/// The sync operation: `File::sync_data` (tests put a recording one in).
type SyncFn = fn(&File) -> io::Result<()>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The writes made to one file and how far they are durable.
#[derive(Debug, Default)]
pub(crate) struct WriteCount {
    /// Lines written so far (each numbered, from 1, when written).
    written: AtomicU64,
    /// Every line numbered up to this was written before a sync that
    /// returned successfully.
    durable: AtomicU64,
}

impl WriteCount {
    /// Numbers a line just written (call under the file's write lock, so
    /// numbers follow the file's order).
    pub(crate) fn wrote(&self) -> u64 {
        self.written.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Whether line `n` is known durable.
    pub(crate) fn is_durable(&self, n: u64) -> bool {
        self.durable.load(Ordering::Acquire) >= n
    }
}

struct Waiter {
    target: Arc<LogFile>,
    line: u64,
    answer: oneshot::Sender<SyncResult>,
}

#[derive(Default)]
struct State {
    pending: Vec<Waiter>,
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    syncs: AtomicU64,
    sync: SyncFn,
}

/// Ends the thread when the last [`GroupCommit`] handle goes.
struct Handle(Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        lock(&self.0.state).closed = true;
        self.0.wake.notify_one();
    }
}

/// A handle on the syncing thread; clones share it.
#[derive(Clone)]
pub struct GroupCommit(Arc<Handle>);

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("syncs", &self.syncs())
            .finish()
    }
}

impl GroupCommit {
    /// Starts the syncing thread.
    pub fn start() -> Result<Self, LogError> {
        Self::start_with(File::sync_data)
    }

    /// Starts the syncing thread with `sync` as its sync operation.
    pub(crate) fn start_with(sync: SyncFn) -> Result<Self, LogError> {
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            wake: Condvar::new(),
            syncs: AtomicU64::new(0),
            sync,
        });
        let thread = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("polar-capture-sync".into())
            .spawn(move || run(&thread))
            .map_err(|e| {
                LogError::io(
                    "starting the capture log's syncing thread for",
                    std::path::Path::new("the state directory"),
                    e,
                )
            })?;
        Ok(Self(Arc::new(Handle(shared))))
    }

    /// The syncs made so far (one per file per round).
    pub fn syncs(&self) -> u64 {
        self.0.0.syncs.load(Ordering::Relaxed)
    }

    /// Registers line `line` of `target` (already written); the answer
    /// comes once a sync covering it has returned. `None` when it is
    /// already durable.
    pub(crate) fn register(
        &self,
        target: Arc<LogFile>,
        line: u64,
    ) -> Option<oneshot::Receiver<SyncResult>> {
        if target.count.is_durable(line) {
            return None;
        }
        let (answer, rx) = oneshot::channel();
        let shared = &self.0.0;
        lock(&shared.state).pending.push(Waiter {
            target,
            line,
            answer,
        });
        shared.wake.notify_one();
        Some(rx)
    }
}

/// The thread: one round after another until closed with nothing pending.
fn run(shared: &Shared) {
    let mut round = Vec::new();
    loop {
        {
            let mut state = lock(&shared.state);
            while state.pending.is_empty() && !state.closed {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if state.pending.is_empty() {
                return;
            }
            std::mem::swap(&mut round, &mut state.pending);
        }
        sync_round(shared, &mut round);
    }
}

/// Most threads syncing one round's files at once.
const SYNC_THREADS: usize = 16;

/// Syncs each file of `round` once and answers its waiters: the files of
/// a round are synced side by side (up to [`SYNC_THREADS`] at once), so the
/// file system commits their journal entries together and the device
/// flushes once for them, not once per file.
fn sync_round(shared: &Shared, round: &mut Vec<Waiter>) {
    round.sort_by_key(|w| Arc::as_ptr(&w.target) as usize);
    let mut groups: Vec<Vec<Waiter>> = Vec::new();
    for w in round.drain(..) {
        match groups.last_mut() {
            Some(g) if Arc::ptr_eq(&g[0].target, &w.target) => g.push(w),
            _ => groups.push(vec![w]),
        }
    }
    if groups.len() == 1 {
        groups.into_iter().for_each(|g| sync_group(shared, g));
        return;
    }
    let per_thread = groups.len().div_ceil(SYNC_THREADS);
    let mut chunks = Vec::new();
    while !groups.is_empty() {
        let rest = groups.split_off(groups.len().saturating_sub(per_thread));
        chunks.push(rest);
    }
    std::thread::scope(|scope| {
        for chunk in chunks {
            let work = move || chunk.into_iter().for_each(|g| sync_group(shared, g));
            // Without a thread its waiters are dropped unanswered: their
            // calls fail (the syncing thread's error), none is released.
            let spawned = std::thread::Builder::new()
                .name("polar-capture-sync".into())
                .spawn_scoped(scope, work);
            if let Err(e) = spawned {
                tracing::error!(error = %e, "no thread to sync capture logs; their calls fail");
            }
        }
    });
}

/// Syncs one file for its waiters (unless an earlier sync covered them all)
/// and answers them.
fn sync_group(shared: &Shared, group: Vec<Waiter>) {
    let Some(first) = group.first() else {
        return;
    };
    let target = Arc::clone(&first.target);
    let count = &target.count;
    let result = if group.iter().all(|w| count.is_durable(w.line)) {
        Ok(())
    } else {
        // Every line numbered up to `upto` is written: the sync that
        // begins now covers them.
        let upto = count.written.load(Ordering::Acquire);
        shared.syncs.fetch_add(1, Ordering::Relaxed);
        match (shared.sync)(&target.file) {
            Ok(()) => {
                count.durable.fetch_max(upto, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => Err(Arc::new(e)),
        }
    };
    for w in group {
        // A waiter that went away (its call cancelled) needs no answer.
        let _ = w.answer.send(result.clone());
    }
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
