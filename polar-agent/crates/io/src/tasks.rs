//! The one place where the agent spawns background tasks: every task is
//! tracked, sees the shutdown signal, and a drain waits for all of them.
//! Also [`caught`]: a future's panic as an error, for work that must go
//! on after a bug (tear a sandbox down, report a result).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Awaits `fut`; a panic in it (a bug) comes back as its message instead
/// of unwinding into the caller. For callers that still have to clean up
/// and report when the work they called failed in a way it never should:
/// the state `fut` left behind is not to be trusted, only dropped.
pub async fn caught<T>(fut: impl Future<Output = T>) -> Result<T, String> {
    AssertUnwindSafe(fut).catch_unwind().await.map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned())
    })
}

/// Tracked tasks sharing one shutdown signal. Cloning shares them.
#[derive(Clone, Default)]
pub struct Tasks {
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl Tasks {
    /// A new, empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Spawns a tracked task.
    pub fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(fut);
    }

    /// The shutdown signal, for tasks to watch.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Whether shutdown was requested.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Signals shutdown and waits up to `grace` for every task to finish.
    /// Returns whether all finished in time.
    pub async fn drain(&self, grace: Duration) -> bool {
        self.shutdown.cancel();
        self.tracker.close();
        tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
    }

    /// Number of running tasks.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether no task runs.
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }
}
