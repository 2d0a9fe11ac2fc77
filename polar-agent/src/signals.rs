//! Waiting for the signals that end the agent (SIGINT, SIGTERM).

use tokio::signal::unix::{SignalKind, signal};

/// Resolves with the signal number when SIGINT or SIGTERM arrives.
pub async fn terminated() -> i32 {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without signal handlers the default action (exit) applies anyway.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => libc::SIGINT,
        _ = term.recv() => libc::SIGTERM,
    }
}
