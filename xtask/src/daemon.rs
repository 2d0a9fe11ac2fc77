//! A program running in the background for the length of one xtask
//! command (the demo's mock backend, rollout server and gateway; the
//! tests' Docker engine): started, waited for until it is ready, and
//! stopped by its pid (SIGTERM, then SIGKILL after a grace period), also
//! when the command fails half-way (on drop). Also the loopback plumbing a
//! stack of them shares: free ports, a listening check, the start wait.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cmd::Cmd;

/// A background program, stopped by its pid when dropped.
pub struct Daemon {
    what: &'static str,
    child: Child,
}

impl Daemon {
    /// Starts `cmd` (its standard error to `log`) and waits up to `wait`
    /// for `ready` to say it is ready; fails, with the log's tail, if it
    /// exits first or never gets ready.
    pub fn start(
        what: &'static str,
        cmd: Cmd,
        log: &Path,
        wait: Duration,
        ready: impl Fn() -> bool,
    ) -> Result<Self> {
        let child = cmd
            .spawn(log)
            .with_context(|| format!("starting the {what}"))?;
        let mut daemon = Self { what, child };
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if ready() {
                return Ok(daemon);
            }
            if let Some(status) = daemon.child.try_wait()? {
                bail!("the {what} exited early ({status}):\n{}", tail(log, 20));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        daemon.stop(Duration::from_secs(10));
        bail!(
            "the {what} was not ready after {wait:?}:\n{}",
            tail(log, 20)
        )
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        terminate(self.child.id());
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "xtask: the {} did not stop within {grace:?}; killing it",
            self.what
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends SIGTERM to `pid` (best effort: the caller checks what follows).
pub fn terminate(pid: u32) {
    let _ = Cmd::new("kill").map(|kill| kill.args(["-TERM", &pid.to_string()]).probe());
}

/// The last `lines` lines of the file at `path`.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// How long each of a stack's daemons has to start listening.
pub const LISTEN_WAIT: Duration = Duration::from_secs(60);

/// Three free loopback ports, held together while chosen so that they
/// differ (a stack's mock backend, rollout server and gateway).
pub fn free_ports() -> Result<[u16; 3]> {
    let l: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()?;
    let p = |i: usize| -> Result<u16> { Ok(l[i].local_addr()?.port()) };
    Ok([p(0)?, p(1)?, p(2)?])
}

/// Ready once something accepts connections on loopback `port`.
pub fn listening(port: u16) -> impl Fn() -> bool {
    move || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}
