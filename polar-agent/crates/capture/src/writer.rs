//! The writing thread of a store ([`LogWriter`]): every session's calls
//! hand it the line that ends their record (serialize, append, journal),
//! and it runs them one after another in the order they came.
//!
//! A call's end used to take a thread of the blocking pool, one wake-up
//! and two thread switches per call. Here a call queues its job and wakes
//! the thread only when it sleeps; the thread takes every queued job at
//! once and runs them in a row, so the calls that end together share one
//! wake-up (the syncing thread, [`super::sync`], does the same for syncs).
//! The work stays off the async workers: a `write` can sleep under
//! dirty-page throttling, which a sandbox filling the disk can cause.
//!
//! The jobs are small (the big request fields were serialized and written
//! while the backend generated, [`super::part`]), so one thread keeps up
//! with many sessions; a job that panics is logged and its caller told
//! (its answer channel dropped), the thread goes on. Dropping the last
//! handle runs what is queued and joins the thread ([`super::worker`]).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::worker::{Bell, Owned, Sleeper, Worker};
use polar_capture_log::LogError;

type Job = Box<dyn FnOnce() + Send>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// The thread sleeps on its [`Bell`].
    asleep: bool,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Bell,
    /// Times the thread was woken for jobs.
    wakeups: AtomicU64,
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

/// A handle on a store's writing thread; clones share it. When the last
/// goes, the thread runs what is queued and is joined.
#[derive(Clone)]
pub(crate) struct LogWriter(Arc<Owned<Shared>>);

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter")
            .field("wakeups", &self.wakeups())
            .finish()
    }
}

impl LogWriter {
    /// Starts the thread.
    pub(crate) fn start() -> Result<Self, LogError> {
        let owned = Owned::start(Shared::default(), "write", run).map_err(|e| {
            LogError::Task(format!("starting the capture log's writing thread: {e}"))
        })?;
        Ok(Self(Arc::new(owned)))
    }

    /// Queues `job`, run on the thread after the jobs queued before it.
    /// The job must not hold a [`LogWriter`] handle (the last one's drop
    /// joins the thread) and must not wait for other jobs.
    pub(crate) fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let shared = &self.0.shared;
        let mut state = lock(&shared.state);
        state.jobs.push_back(Box::new(job));
        shared.wake.ring(state);
    }

    /// Times the thread was woken for jobs (a burst of jobs takes one).
    pub(crate) fn wakeups(&self) -> u64 {
        self.0.shared.wakeups.load(Ordering::Relaxed)
    }
}

/// The thread: every queued job, in order, until closed with none left.
fn run(shared: &Shared) {
    let mut batch = VecDeque::new();
    loop {
        {
            let mut state = lock(&shared.state);
            let mut waited = false;
            while state.jobs.is_empty() && !state.closed {
                waited = true;
                state = shared.wake.sleep(state);
            }
            if state.jobs.is_empty() {
                return;
            }
            if waited {
                shared.wakeups.fetch_add(1, Ordering::Relaxed);
            }
            std::mem::swap(&mut batch, &mut state.jobs);
        }
        for job in batch.drain(..) {
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                tracing::error!("a capture log write panicked; its call ends with an error");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn jobs_run_in_order_and_a_burst_takes_one_wakeup() {
        let writer = LogWriter::start().unwrap();
        let (tx, rx) = mpsc::channel();
        // Hold the thread in a first job while 100 more are queued.
        let (release, held) = mpsc::channel::<()>();
        let (started, running) = mpsc::channel::<()>();
        let first = tx.clone();
        writer.submit(move || {
            started.send(()).unwrap();
            held.recv().unwrap();
            first.send(0).unwrap();
        });
        running.recv_timeout(Duration::from_secs(10)).unwrap();
        let woken = writer.wakeups();
        for i in 1..=100 {
            let tx = tx.clone();
            writer.submit(move || tx.send(i).unwrap());
        }
        release.send(()).unwrap();
        let got: Vec<i32> = (0..=100)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, (0..=100).collect::<Vec<_>>());
        // The 100 jobs queued while the thread worked woke it no more.
        assert_eq!(writer.wakeups(), woken);
    }

    #[test]
    fn a_panicking_job_drops_its_answer_and_the_thread_goes_on() {
        let writer = LogWriter::start().unwrap();
        let (tx, rx) = mpsc::channel::<u8>();
        writer.submit(move || {
            let _keep = tx;
            panic!("a bug in a job");
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_err(),
            "the panicking job's channel is dropped"
        );
        let (tx, rx) = mpsc::channel();
        writer.submit(move || tx.send(7u8).unwrap());
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 7);
    }

    #[test]
    fn dropping_the_last_handle_runs_the_queued_jobs_first() {
        let writer = LogWriter::start().unwrap();
        let ran = Arc::new(AtomicU64::new(0));
        let (release, held) = mpsc::channel::<()>();
        writer.submit(move || held.recv().unwrap());
        for _ in 0..50 {
            let ran = Arc::clone(&ran);
            writer.submit(move || {
                ran.fetch_add(1, Ordering::Relaxed);
            });
        }
        let clone = writer.clone();
        drop(writer);
        release.send(()).unwrap();
        drop(clone);
        assert_eq!(ran.load(Ordering::Relaxed), 50);
    }
}
