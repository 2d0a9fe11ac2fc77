//! Starting a sandboxed process: it joins the session's network namespace
//! (isolated mode) and moves itself into the session's cgroup after the fork
//! and before it execs, so the redirect applies from its first instruction.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;

use tokio::process::{Child, Command};

/// What to run.
#[derive(Debug)]
pub struct Launch<'a> {
    /// Program and arguments.
    pub argv: &'a [OsString],
    /// `cgroup.procs` of the session cgroup, opened by the agent.
    pub cgroup_procs: File,
    /// The session's network namespace (isolated mode).
    pub netns: Option<&'a OwnedFd>,
    /// Extra environment.
    pub env: &'a [(String, String)],
    /// Where its stdout goes.
    pub stdout: Stdio,
    /// Where its stderr goes.
    pub stderr: Stdio,
}

/// Errors of starting a sandboxed process.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The command line is empty.
    #[error("no command to run")]
    NoCommand,
    /// fork/exec failed (a missing program, a refused setns or cgroup move).
    #[error("starting {program:?}: {source}")]
    Spawn {
        /// The program.
        program: OsString,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Forks, joins netns and cgroup, execs. The child is killed if the handle
/// is dropped.
pub fn spawn(launch: Launch<'_>) -> Result<Child, SpawnError> {
    let (program, args) = launch.argv.split_first().ok_or(SpawnError::NoCommand)?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::inherit())
        .stdout(launch.stdout)
        .stderr(launch.stderr)
        .kill_on_drop(true);
    let procs_fd = launch.cgroup_procs.as_raw_fd();
    let netns_fd = launch.netns.map(AsRawFd::as_raw_fd);
    // SAFETY: the hook runs between fork and exec and only makes raw
    // syscalls (setns, write) on descriptors that stay open until `spawn`
    // returns; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = netns_fd
                && libc::setns(fd, libc::CLONE_NEWNET) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // "0" moves the writing process itself.
            if libc::write(procs_fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| SpawnError::Spawn {
        program: program.clone(),
        source,
    })?;
    drop(launch.cgroup_procs);
    Ok(child)
}
