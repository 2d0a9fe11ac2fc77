//! Starting a sandboxed process: it joins the session's network namespace
//! (isolated mode) and moves itself into the session's cgroup (and the v1
//! limit groups, on hybrid hosts) after the fork and before it execs, so the
//! redirect and the limits apply from its first instruction; then it drops
//! to the sandbox user, if one is given, sets `no_new_privs` when asked, and
//! execs (bubblewrap, for the native runtime).

use std::ffi::CString;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
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
    /// Read-only bind mounts `(source, target)` in a private mount namespace
    /// (the trust bundle over the distribution bundles).
    pub binds: &'a [(PathBuf, PathBuf)],
    /// Where its stdout goes.
    pub stdout: Stdio,
    /// Where its stderr goes.
    pub stderr: Stdio,
}

/// More of what the child does before exec (the runtimes' needs); the
/// default changes nothing.
#[derive(Debug, Default)]
pub struct Isolation {
    /// More `cgroup.procs` to join (cgroup v1 limit groups).
    pub extra_procs: Vec<File>,
    /// Drop to this `(uid, gid)` after joining, with no supplementary
    /// groups.
    pub user: Option<(u32, u32)>,
    /// Start from an empty environment (only `env`).
    pub clear_env: bool,
    /// Working directory of the exec'd program (on the host's side).
    pub cwd: Option<PathBuf>,
    /// Its stdin (inherited when `None`).
    pub stdin: Option<Stdio>,
    /// Descriptors the exec'd program inherits (their close-on-exec flag is
    /// cleared in the child).
    pub keep_fds: Vec<i32>,
    /// Set `no_new_privs` before exec: neither the program nor anything it
    /// starts gains privileges through setuid/setgid bits or file
    /// capabilities.
    pub no_new_privs: bool,
}

/// Errors of starting a sandboxed process.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The command line is empty.
    #[error("no command to run")]
    NoCommand,
    /// A bind-mount path cannot be passed to the kernel.
    #[error("bind-mount path {0:?} contains a NUL byte")]
    BadPath(PathBuf),
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

/// In a new mount namespace (mounts private, so nothing propagates to the
/// host), bind-mounts each source read-only over its target.
///
/// # Safety
/// Only for the child between fork and exec: raw syscalls, no allocation.
unsafe fn private_binds(binds: &[(CString, CString)]) -> io::Result<()> {
    let fail = || Err(io::Error::last_os_error());
    // SAFETY: plain syscalls with valid NUL-terminated strings.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return fail();
        }
        let root = c"/";
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return fail();
        }
        for (src, dst) in binds {
            if libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return fail();
            }
            let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
            if libc::mount(
                std::ptr::null(),
                dst.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            ) != 0
            {
                return fail();
            }
        }
    }
    Ok(())
}

/// Forks, joins netns and cgroup, execs. The child is killed if the handle
/// is dropped.
pub fn spawn(launch: Launch<'_>) -> Result<Child, SpawnError> {
    spawn_with(launch, Isolation::default())
}

/// [`spawn`], with the runtimes' extras: more cgroups to join, a user to
/// drop to, a clean environment, inherited descriptors.
pub fn spawn_with(launch: Launch<'_>, iso: Isolation) -> Result<Child, SpawnError> {
    let (program, args) = launch.argv.split_first().ok_or(SpawnError::NoCommand)?;
    let mut cmd = Command::new(program);
    if iso.clear_env {
        cmd.env_clear();
    }
    if let Some(dir) = &iso.cwd {
        cmd.current_dir(dir);
    }
    cmd.args(args)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(iso.stdin.unwrap_or_else(Stdio::inherit))
        .stdout(launch.stdout)
        .stderr(launch.stderr)
        .kill_on_drop(true);
    let procs_fd = launch.cgroup_procs.as_raw_fd();
    let extra_fds: Vec<i32> = iso.extra_procs.iter().map(AsRawFd::as_raw_fd).collect();
    let user = iso.user;
    let no_new_privs = iso.no_new_privs;
    let keep_fds = iso.keep_fds.clone();
    let netns_fd = launch.netns.map(AsRawFd::as_raw_fd);
    let cstr = |p: &PathBuf| {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| SpawnError::BadPath(p.clone()))
    };
    let binds = launch
        .binds
        .iter()
        .map(|(src, dst)| Ok((cstr(src)?, cstr(dst)?)))
        .collect::<Result<Vec<_>, SpawnError>>()?;
    // SAFETY: the hook runs between fork and exec and only makes raw
    // syscalls (setns, unshare, mount, write, prctl) with descriptors and C strings
    // prepared before the fork, which stay alive until `spawn` returns; it
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = netns_fd
                && libc::setns(fd, libc::CLONE_NEWNET) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if !binds.is_empty() {
                private_binds(&binds)?;
            }
            // "0" moves the writing process itself.
            for fd in std::iter::once(procs_fd).chain(extra_fds.iter().copied()) {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            for fd in keep_fds.iter().copied() {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some((uid, gid)) = user
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(gid, gid, gid) != 0
                    || libc::setresuid(uid, uid, uid) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            if no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
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
    drop(iso.extra_procs);
    Ok(child)
}
