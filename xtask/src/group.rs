//! Programs xtask runs in a process group of their own (a fuzz target under
//! `cargo fuzz`, the background set-up with its pip, npm and debootstrap),
//! so that each can be stopped with everything it started: by its group's
//! id, never by name.
//!
//! A terminal's Ctrl-C reaches only the terminal's process group, and a
//! SIGTERM or SIGHUP only xtask itself; [`forward_interrupts`] passes each
//! on to the groups still running, then ends xtask, so that an interrupted
//! `cargo xtask fuzz` or `cargo xtask test` leaves nothing behind. The
//! groups are registered while their leader is unreaped, under one lock
//! with the reaping, so a group id signalled is never one the system has
//! reused.

use std::path::Path;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::cmd::Cmd;

/// The groups started and not yet reaped, by their leader's pid.
static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn live() -> MutexGuard<'static, Vec<u32>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends `signal` (`TERM`, `KILL`) to process group `group`.
fn signal(signal: &str, group: u32) {
    let _ = Cmd::new("kill").map(|kill| {
        kill.args([format!("-{signal}"), "--".into(), format!("-{group}")])
            .probe()
    });
}

/// A program in a process group of its own, stopped with its group when
/// dropped.
pub struct Group {
    child: Child,
    grace: Duration,
}

impl Group {
    /// Starts `cmd` as [`Cmd::spawn`] does, in a new process group; once
    /// stopped (or dropped), the group has `grace` to exit after SIGTERM.
    pub fn spawn(cmd: Cmd, log: &Path, grace: Duration) -> Result<Self> {
        let mut live = live();
        let child = cmd.own_process_group().spawn(log)?;
        live.push(child.id());
        Ok(Self { child, grace })
    }

    /// The group's id (its leader's pid).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its leader's exit status, once it has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        let mut live = live();
        let status = self.child.try_wait().context("checking a process group")?;
        if status.is_some() {
            live.retain(|&g| g != self.child.id());
        }
        Ok(status)
    }

    /// Waits for its leader to exit.
    pub fn wait(&mut self) -> Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops it with everything in its group: SIGTERM to the group, then
    /// SIGKILL if the leader is still there after the grace period (only
    /// while it is unreaped is the group's id surely still this group's).
    pub fn stop(&mut self) {
        if !matches!(self.try_wait(), Ok(None)) {
            return;
        }
        signal("TERM", self.id());
        let until = Instant::now() + self.grace;
        while Instant::now() < until {
            if !matches!(self.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        {
            let _live = live();
            if matches!(self.child.try_wait(), Ok(None)) {
                signal("KILL", self.id());
            }
        }
        let _ = self.wait();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.stop();
    }
}

/// While a task serves until it is told to stop ([`serve_until_interrupted`]):
/// an interrupt is its signal to stop, not the end of xtask.
static SERVING: AtomicBool = AtomicBool::new(false);
/// An interrupt came while [`SERVING`].
static STOP: AtomicBool = AtomicBool::new(false);

/// Blocks until SIGINT, SIGTERM or SIGHUP (or, when stdin is a terminal,
/// Enter), then returns, so that the caller stops what it runs and ends
/// normally. A closed or redirected stdin does not end the wait.
pub fn serve_until_interrupted() {
    STOP.store(false, Ordering::SeqCst);
    SERVING.store(true, Ordering::SeqCst);
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        std::thread::spawn(|| {
            let mut line = String::new();
            if std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
                STOP.store(true, Ordering::SeqCst);
            }
        });
    }
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    SERVING.store(false, Ordering::SeqCst);
}

/// From now on, a SIGINT (a terminal's Ctrl-C), SIGTERM or SIGHUP to xtask
/// sends SIGTERM to every [`Group`] still running, then ends xtask with
/// status 130 (except while [`serve_until_interrupted`] waits: then it
/// returns). The programs in xtask's own process group get a terminal's
/// Ctrl-C themselves.
pub fn forward_interrupts() -> Result<()> {
    ctrlc::set_handler(|| {
        if SERVING.load(Ordering::SeqCst) {
            STOP.store(true, Ordering::SeqCst);
            return;
        }
        // Held to the end: nothing is reaped or started meanwhile.
        let live = live();
        for &group in live.iter() {
            signal("TERM", group);
        }
        eprintln!(
            "xtask: interrupted; sent SIGTERM to {} process group(s) it started",
            live.len()
        );
        std::process::exit(130);
    })
    .context("could not install the interrupt handler")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SIGTERM while serving ends the wait, not the process; stdin (not
    /// a terminal under the test runner) is not read.
    #[test]
    fn a_sigterm_while_serving_ends_the_wait_not_xtask() {
        forward_interrupts().unwrap();
        let pid = std::process::id().to_string();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            Cmd::new("kill")
                .unwrap()
                .args(["-TERM", &pid])
                .run()
                .unwrap();
        });
        let started = Instant::now();
        serve_until_interrupted();
        sender.join().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(!SERVING.load(Ordering::SeqCst));
    }
}
