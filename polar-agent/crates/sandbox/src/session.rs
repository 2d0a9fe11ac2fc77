//! One sandbox session that runs several commands in turn (prepare steps,
//! the harness, post-run steps): the network (its own namespace with the
//! agent's listener and DNS inside, or the host's), the session cgroup the
//! redirect knows, the limit groups, and a child cgroup per command so that
//! a command that overruns its deadline is killed with everything it
//! started, without ending the session.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::process::{self, Isolation, Launch};
use super::{NetworkMode, SandboxError, Serving, SessionNet, serve};
use crate::limits::{Enforced, LimitGroups};
use polar_ids::SessionId;
use polar_redirect::dns::Resolver;
use polar_redirect::listener::Handler;
use polar_redirect::{CgroupDir, Redirect, RedirectError, SessionCgroup};
use polar_spec::runtime::Limits;

/// How a session is opened.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Its id.
    pub id: SessionId,
    /// Its network.
    pub network: NetworkMode,
    /// Its limits.
    pub limits: Limits,
    /// How long connections may take to finish after the last command.
    pub drain_grace: Duration,
}

/// One command of a session.
#[derive(Debug)]
pub struct Exec {
    /// Program and arguments (as the agent execs them: for the native
    /// runtime, `bwrap ... -- CMD`).
    pub argv: Vec<std::ffi::OsString>,
    /// Its whole environment when `clear_env`, else added to the agent's.
    pub env: Vec<(String, String)>,
    /// Start from an empty environment.
    pub clear_env: bool,
    /// Read-only bind mounts made in a private mount namespace before exec
    /// (the trust bundle, for commands not run through bubblewrap).
    pub binds: Vec<(PathBuf, PathBuf)>,
    /// Drop to this `(uid, gid)` before exec.
    pub user: Option<(u32, u32)>,
    /// Host-side working directory.
    pub cwd: Option<PathBuf>,
    /// Killed, with everything it started, at this instant.
    pub deadline: Option<Instant>,
    /// Its stdin.
    pub stdin: Stdio,
    /// Its stdout.
    pub stdout: Stdio,
    /// Its stderr.
    pub stderr: Stdio,
    /// Descriptors it inherits (bind sources for bwrap), open until spawned.
    pub keep_fds: Vec<std::os::fd::OwnedFd>,
    /// Run in the session's long-lived cgroup: what it leaves running (a
    /// container instance) survives it until the session ends.
    pub keep_running: bool,
    /// Set `no_new_privs` before exec.
    pub no_new_privs: bool,
}

impl Exec {
    /// A command with the agent's environment, stdio inherited, no deadline.
    pub fn new(argv: Vec<std::ffi::OsString>) -> Self {
        Self {
            argv,
            env: Vec::new(),
            clear_env: false,
            binds: Vec::new(),
            user: None,
            cwd: None,
            deadline: None,
            stdin: Stdio::inherit(),
            stdout: Stdio::inherit(),
            stderr: Stdio::inherit(),
            keep_fds: Vec::new(),
            keep_running: false,
            no_new_privs: false,
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecEnd {
    /// It exited (or was killed by something else).
    Exited(ExitStatus),
    /// Its deadline passed: it and everything it started were killed.
    TimedOut,
    /// The session was stopped (`stop` fired): it was killed.
    Stopped,
}

/// An open session. Close it with [`SandboxSession::close`]; dropping it
/// kills what runs in it and removes its cgroups too, without draining.
pub struct SandboxSession {
    id: SessionId,
    redirect: Redirect,
    net: SessionNet,
    serving: Serving,
    // Field order is drop order: the session cgroup (killed) before the
    // limit groups (removed once empty).
    cgroup: SessionCgroup,
    limits: LimitGroups,
    steps: AtomicU32,
    drain_grace: Duration,
    network: NetworkMode,
}

impl SandboxSession {
    /// Opens a session on a started redirect: network, listener and DNS
    /// serving, session cgroup, limits.
    pub fn open<H: Handler>(
        redirect: &Redirect,
        opts: &SessionOptions,
        handler: &Arc<H>,
        resolver: &Arc<Resolver>,
    ) -> Result<Self, SandboxError> {
        let net = SessionNet::bind(opts.network)?;
        let serving = serve(&net, &opts.id, redirect, resolver, handler)?;
        let cgroup = redirect.create_session(&opts.id, net.target())?;
        let dir = cgroup.dir().ok_or_else(|| {
            SandboxError::Io("session cgroup", std::io::ErrorKind::NotFound.into())
        })?;
        let limits = LimitGroups::apply(
            &opts.limits,
            &redirect.mount().mount_point,
            dir.path(),
            opts.id.as_str(),
        )?;
        tracing::debug!(session = %opts.id, enforced = ?limits.enforced, "session opened");
        Ok(Self {
            id: opts.id.clone(),
            redirect: redirect.clone(),
            net,
            serving,
            cgroup,
            limits,
            steps: AtomicU32::new(0),
            drain_grace: opts.drain_grace,
            network: opts.network,
        })
    }

    /// The session id.
    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// What limits are enforced where.
    pub fn enforced(&self) -> Enforced {
        self.limits.enforced
    }

    /// The session's cgroup v2 directory.
    pub fn cgroup_dir(&self) -> Option<PathBuf> {
        self.cgroup.dir().map(|d| d.path().to_owned())
    }

    /// The redirect this session runs under.
    pub fn redirect(&self) -> &Redirect {
        &self.redirect
    }

    /// Moves the session into another network namespace (a container's,
    /// `/proc/<pid>/ns/net`): binds the listener and DNS socket in it,
    /// serves them with `handler` and `resolver`, and points the redirect
    /// at them; the session's own namespace is then drained and dropped.
    pub async fn adopt_netns<H: Handler>(
        &mut self,
        ns_path: &std::path::Path,
        handler: &Arc<H>,
        resolver: &Arc<Resolver>,
    ) -> Result<(), SandboxError> {
        let net = SessionNet {
            isolated: Some(crate::netns::IsolatedNet::join(ns_path)?),
            host: None,
        };
        let serving = serve(&net, &self.id, &self.redirect, resolver, handler)?;
        self.redirect.retarget(&self.cgroup, net.target())?;
        let old_net = std::mem::replace(&mut self.net, net);
        let old = std::mem::replace(&mut self.serving, serving);
        old.acceptors.drain(Duration::from_millis(200)).await;
        old.handlers.drain(Duration::from_millis(200)).await;
        drop(old_net);
        Ok(())
    }

    /// Runs one command to its end, its deadline, or `stop`. Everything it
    /// leaves behind is killed when it ends.
    pub async fn exec(&self, cmd: Exec, stop: &CancellationToken) -> Result<ExecEnd, SandboxError> {
        if cmd.deadline.is_some_and(|d| d <= Instant::now()) {
            return Ok(ExecEnd::TimedOut);
        }
        let n = self.steps.fetch_add(1, Ordering::Relaxed);
        let parent = self.cgroup.dir().ok_or_else(|| {
            SandboxError::Io("session cgroup", std::io::ErrorKind::NotFound.into())
        })?;
        let name = if cmd.keep_running {
            "services".to_owned()
        } else {
            format!("step-{n}")
        };
        let step =
            CgroupDir::create_or_open(parent.path().join(name)).map_err(RedirectError::from)?;
        let iso = Isolation {
            extra_procs: self.limits.procs_files()?,
            user: cmd.user,
            clear_env: cmd.clear_env,
            cwd: cmd.cwd.clone(),
            stdin: Some(cmd.stdin),
            keep_fds: cmd
                .keep_fds
                .iter()
                .map(std::os::fd::AsRawFd::as_raw_fd)
                .collect(),
            no_new_privs: cmd.no_new_privs,
        };
        let launch = Launch {
            argv: &cmd.argv,
            cgroup_procs: step.procs_file().map_err(RedirectError::from)?,
            netns: self.net.isolated.as_ref().map(|n| &n.ns),
            env: &cmd.env,
            binds: &cmd.binds,
            stdout: cmd.stdout,
            stderr: cmd.stderr,
        };
        let spawned = process::spawn_with(launch, iso);
        drop(cmd.keep_fds);
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                if !cmd.keep_running {
                    let _ = step.kill_and_remove();
                }
                return Err(e.into());
            }
        };
        let pid = child.id().unwrap_or(0);
        if n == 0 {
            tracing::info!(
                session = %self.id,
                pid,
                network = ?self.network,
                cgroup = %parent.path().display(),
                "sandbox started"
            );
        } else {
            tracing::debug!(session = %self.id, step = n, pid, "command started");
        }
        let deadline = async {
            match cmd.deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let end = tokio::select! {
            s = child.wait() => ExecEnd::Exited(s.map_err(|e| SandboxError::Io("waiting for the command", e))?),
            () = deadline => ExecEnd::TimedOut,
            () = stop.cancelled() => ExecEnd::Stopped,
        };
        if cmd.keep_running && end != ExecEnd::TimedOut && end != ExecEnd::Stopped {
            let _ = child.wait().await;
            return Ok(end);
        }
        // Kill whatever the command left (or the command itself, on a
        // timeout) through its cgroup, then reap it.
        let killed = tokio::task::spawn_blocking(move || step.kill_and_remove())
            .await
            .map_err(|e| SandboxError::Io("cleaning up a command", std::io::Error::other(e)))?;
        let _ = child.wait().await;
        killed.map_err(RedirectError::from)?;
        Ok(end)
    }

    /// Takes in what was already dialled, kills what is left, lets the
    /// connections finish (bounded), removes the cgroups.
    pub async fn close(self) -> Result<(), SandboxError> {
        let Self {
            id,
            redirect: _,
            net,
            serving,
            cgroup,
            limits,
            steps: _,
            drain_grace,
            network: _,
        } = self;
        serving.acceptors.drain(Duration::from_secs(2)).await;
        let ended = cgroup.end();
        drop(limits);
        if !serving.handlers.drain(drain_grace).await {
            tracing::warn!(
                session = %id,
                connections = serving.handlers.len(),
                "some connections were still open at exit"
            );
        }
        drop(net);
        ended?;
        Ok(())
    }
}
