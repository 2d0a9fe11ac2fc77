//! The cleanup guardian: a small process (`polar __reap DIR`) started with the
//! agent that waits for the agent to go away (its stdin, a pipe from the
//! agent, reaches end-of-file however the agent ends, SIGKILL included), then
//! kills whatever is left in the agent's cgroup subtree and removes it,
//! with the cgroup v1 groups runc made at the same paths for the docker
//! runtime's containers (which the kill ended: they were in the subtree).
//! `polar __reap` then releases the disk quotas of the agent's sessions
//! (`runtime::quota::reclaim_stale`), which nothing holds once the subtree
//! is gone, so a crashed agent's tmpfs mounts do not wait for its next start.
//! An agent that shuts down in order writes [`ORDERLY`] before closing the
//! pipe and then waits for the guardian: the guardian does not wait for it
//! to be gone (it would wait for its own end), its mounts are its own.

use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use super::cgroup;

/// The running guardian, owned by the agent.
pub struct Guardian {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Guardian {
    /// Starts `exe __reap DIR [--sandboxes PATH]` in its own process group
    /// (so a terminal's Ctrl-C reaches the agent, which cleans up, and not
    /// the guardian).
    pub fn spawn(exe: &Path, dir: &Path, sandboxes: Option<&Path>) -> io::Result<Self> {
        let mut cmd = Command::new(exe);
        cmd.arg("__reap").arg(dir);
        if let Some(s) = sandboxes {
            cmd.arg("--sandboxes").arg(s);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(Self { child, stdin })
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        // Closing the pipe tells the guardian to clean up and exit; the
        // byte before tells it this agent waits for it.
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(&[ORDERLY]);
        }
        let _ = self.child.wait();
    }
}

/// The byte an agent shutting down in order writes to the guardian before
/// it closes the pipe and waits for it.
pub const ORDERLY: u8 = b'.';

/// How the agent let the guardian go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// It shut down in order and waits for the guardian to finish.
    Orderly,
    /// It went away (an exit without shutdown, a crash, SIGKILL).
    Gone,
}

/// The guardian's body: block until stdin closes, then clean up `dir`;
/// returns how the agent let go and what the cleanup did.
pub fn run(dir: &Path) -> (Release, Result<(), cgroup::CgroupError>) {
    use nix::sys::signal::{SigHandler, Signal, signal};
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: installing SIG_IGN runs no code in a signal context.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    let mut buf = [0u8; 64];
    let mut stdin = io::stdin();
    let mut release = Release::Gone;
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if buf[..n].contains(&ORDERLY) {
                    release = Release::Orderly;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let result = cgroup::kill_and_remove(dir);
    super::remove_parent_if_empty(dir);
    if let Ok(mount) = cgroup::Cgroup2Mount::find()
        && let Ok(rel) = dir.strip_prefix(&mount.mount_point)
    {
        cgroup::remove_v1_mirrors(rel, std::time::Duration::from_secs(10));
    }
    (release, result)
}
