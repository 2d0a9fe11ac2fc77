//! The handle that owns one of a store's threads (the syncing thread of
//! [`super::sync`], the writing thread of [`super::writer`]): it starts the
//! thread over the state it shares with it, and when the last handle goes
//! (the store closed) tells the thread to close and waits for it, so the
//! thread's last work (lines written, syncs, the journal removed) is done
//! when the store's drop returns. A store opened again on the same state
//! directory (an agent restarted in the same process) never races the old
//! one's close. Also the [`Bell`] such a thread sleeps on.

use std::sync::{Arc, Condvar, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// A thread's state, under its mutex, with the flag saying it sleeps.
pub(crate) trait Sleeper {
    /// Whether the thread waits on the [`Bell`] for work.
    fn asleep(&mut self) -> &mut bool;
}

/// What a store thread sleeps on while it has no work: rung only while it
/// sleeps (a `notify_one` is a `futex` call even when no one waits), since
/// a thread at work finds what was added on its next look under the lock.
#[derive(Default)]
pub(crate) struct Bell(Condvar);

impl Bell {
    /// After work was added to `state`: wakes the thread if it sleeps.
    pub(crate) fn ring<T: Sleeper>(&self, mut state: MutexGuard<'_, T>) {
        if std::mem::take(state.asleep()) {
            drop(state);
            self.0.notify_one();
        }
    }

    /// On the thread, with nothing to do: sleeps until rung (or woken
    /// spuriously: look again, then sleep again).
    pub(crate) fn sleep<'a, T: Sleeper>(&self, mut state: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        *state.asleep() = true;
        let mut state = self.0.wait(state).unwrap_or_else(PoisonError::into_inner);
        *state.asleep() = false;
        state
    }

    /// The condition variable itself (the tests' simulated power loss
    /// waits on it for the thread to stop).
    #[cfg(test)]
    pub(crate) fn condvar(&self) -> &Condvar {
        &self.0
    }
}

/// State shared with a store thread.
pub(crate) trait Worker: Send + Sync + 'static {
    /// Tells the thread to finish what it has and end.
    fn close(&self);
}

/// Owns the thread running over `shared`; wrap it in an `Arc` for clones.
pub(crate) struct Owned<S: Worker> {
    pub(crate) shared: Arc<S>,
    thread: Option<JoinHandle<()>>,
    /// What the thread is, for the log: "syncing", "writing".
    what: &'static str,
}

impl<S: Worker> Owned<S> {
    /// Starts `run(&shared)` on a thread named `polar-capture-<what>`.
    pub(crate) fn start(shared: S, what: &'static str, run: fn(&S)) -> std::io::Result<Self> {
        let shared = Arc::new(shared);
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("polar-capture-{what}"))
            .spawn(move || run(&theirs))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            what,
        })
    }
}

impl<S: Worker> Drop for Owned<S> {
    fn drop(&mut self) {
        self.shared.close();
        let Some(thread) = self.thread.take() else {
            return;
        };
        // Not from the thread itself, where a job or an answer let go of
        // the last handle: it ends on its own once its work is done.
        if thread.thread().id() == std::thread::current().id() {
            return;
        }
        if thread.join().is_err() {
            tracing::error!("the capture log's {} thread panicked", self.what);
        }
    }
}
