//! The signals that end the agent (SIGINT, SIGTERM), installed early so a
//! signal that arrives during start-up is not lost to the default action.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Installed handlers for SIGINT and SIGTERM.
pub struct Terminated {
    int: Option<Signal>,
    term: Option<Signal>,
}

impl Terminated {
    /// Installs the handlers (inside a tokio runtime). From here on the
    /// signals no longer kill the process; [`Terminated::recv`] reports them.
    pub fn install() -> Self {
        Self {
            int: signal(SignalKind::interrupt()).ok(),
            term: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Resolves with the signal number when SIGINT or SIGTERM arrives.
    pub async fn recv(&mut self) -> i32 {
        async fn next(s: &mut Option<Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(&mut self.int) => libc::SIGINT,
            () = next(&mut self.term) => libc::SIGTERM,
        }
    }
}

/// Resolves with the signal number when SIGINT or SIGTERM arrives, with
/// handlers installed now.
pub async fn terminated() -> i32 {
    Terminated::install().recv().await
}
