//! Running commands in a sandbox session: a fresh session cgroup with the
//! redirect active, its own network namespace (isolated mode, the default) or
//! the host's (host mode), the agent's listener and DNS responder serving it.
//! [`session`] keeps a session open across several commands (what the
//! runtimes use); [`run`] runs one command and ends.
//!
//! Around the session: the network namespaces isolated sessions live in
//! ([`netns`]), the sandboxes' limits, seccomp filters and uids, the
//! runtimes that run a task's steps in a session (bwrap, Docker, Apptainer:
//! [`runtime`], which builds on the session and which the session's one-shot
//! commands use), and the signals that end a run ([`signals`]).
//!
//! It knows the redirect, the DNS responder and the accept loop
//! (`polar-redirect`) and the trust files of the CA (`polar-tls`); it knows
//! nothing of the proxy, the harness presets or trajectories: a session's
//! connections go to whatever [`listener::Handler`] the caller gives it.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod limits;
pub mod netns;
pub mod process;
pub mod runtime;
pub(crate) mod seccomp;
pub mod session;
pub mod signals;
pub mod uids;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use crate::netns::{IsolatedNet, NetnsError, Sockets};
use polar_ids::SessionId;
use polar_io::tasks::Tasks;
use polar_redirect::dns::{self, Resolver};
use polar_redirect::listener::{self, Handler};
use polar_redirect::{Redirect, RedirectError, RedirectOptions, SessionTarget};

/// The network of a sandbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NetworkMode {
    /// Its own network namespace with only loopback: without the redirect it
    /// has no network at all (fails closed).
    #[default]
    Isolated,
    /// The host's network namespace; the agent listens on the host loopback.
    Host,
}

/// Errors of a sandbox run.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The redirect could not be set up.
    #[error(transparent)]
    Redirect(#[from] RedirectError),
    /// The network could not be set up.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The command could not be started.
    #[error(transparent)]
    Spawn(#[from] process::SpawnError),
    /// The limits could not be applied.
    #[error(transparent)]
    Limits(#[from] crate::limits::LimitError),
    /// An I/O error on the agent's side.
    #[error("{0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
}

/// What to run and how.
#[derive(Debug)]
pub struct RunSpec {
    /// The command as the agent execs it (for the native runtime, the
    /// whole `bwrap ... -- CMD` line with its user, environment and
    /// descriptors; see [`crate::runtime::oneshot`]).
    pub exec: session::Exec,
    /// Network mode.
    pub network: NetworkMode,
    /// Session id (random when absent).
    pub session: Option<SessionId>,
    /// The `polar` executable for the cleanup guardian.
    pub reaper_exe: Option<PathBuf>,
    /// The state's `sandboxes/` directory, for the guardian
    /// ([`RedirectOptions::sandboxes`]).
    pub sandboxes: Option<PathBuf>,
    /// How long connections may take to finish after the command ended.
    pub drain_grace: Duration,
    /// Its limits (memory, processes, CPU) through the session's cgroups.
    pub limits: polar_spec::runtime::Limits,
}

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// The session.
    pub session: SessionId,
    /// How the command ended.
    pub end: End,
}

/// How a sandboxed command ended.
#[derive(Debug, Clone, Copy)]
pub enum End {
    /// It exited (or was killed) on its own.
    Exited(ExitStatus),
    /// The agent got this signal and stopped the sandbox.
    Interrupted(i32),
}

/// The network side of one session: where it lives and its sockets.
pub(crate) struct SessionNet {
    pub(crate) isolated: Option<IsolatedNet>,
    host: Option<Sockets>,
}

impl SessionNet {
    fn bind(mode: NetworkMode) -> Result<Self, NetnsError> {
        Ok(match mode {
            NetworkMode::Isolated => Self {
                isolated: Some(IsolatedNet::create()?),
                host: None,
            },
            NetworkMode::Host => Self {
                isolated: None,
                host: Some(Sockets::bind_loopback()?),
            },
        })
    }

    fn sockets(&self) -> Option<&Sockets> {
        self.isolated
            .as_ref()
            .map(|n| &n.sockets)
            .or(self.host.as_ref())
    }

    fn target(&self) -> SessionTarget {
        let (tcp_port, dns_port) = self
            .sockets()
            .map_or((0, 0), |s| (s.tcp_port(), s.dns_port()));
        SessionTarget {
            listen_v4: Ipv4Addr::LOCALHOST,
            listen_v6: Ipv6Addr::LOCALHOST,
            tcp_port,
            dns_port,
            local_bypass: self.isolated.is_some(),
        }
    }
}

/// The agent's side of one session: the listeners and DNS sockets (on
/// `acceptors`) and the connections they accepted (on `handlers`).
pub(crate) struct Serving {
    pub(crate) acceptors: Tasks,
    pub(crate) handlers: Tasks,
}

fn serve<H: Handler>(
    net: &SessionNet,
    session: &SessionId,
    redirect: &Redirect,
    resolver: &Arc<Resolver>,
    handler: &Arc<H>,
) -> Result<Serving, SandboxError> {
    let serving = Serving {
        acceptors: Tasks::new(),
        handlers: Tasks::new(),
    };
    let Some(s) = net.sockets() else {
        return Ok(serving);
    };
    let ctx = Arc::new(listener::AcceptContext {
        redirect: Some(redirect.clone()),
        fake: Arc::clone(resolver.fake_ips()),
        session: Some(session.clone()),
        handler: Arc::clone(handler),
        handlers: serving.handlers.clone(),
    });
    for l in std::iter::once(&s.tcp_v4).chain(s.tcp_v6.as_ref()) {
        let l = l.try_clone().map_err(|e| SandboxError::Io("listener", e))?;
        l.set_nonblocking(true)
            .map_err(|e| SandboxError::Io("listener", e))?;
        let l =
            tokio::net::TcpListener::from_std(l).map_err(|e| SandboxError::Io("listener", e))?;
        serving.acceptors.spawn(listener::accept_loop(
            l,
            Arc::clone(&ctx),
            serving.acceptors.shutdown_token(),
        ));
    }
    for u in std::iter::once(&s.dns_v4).chain(s.dns_v6.as_ref()) {
        let u = u
            .try_clone()
            .map_err(|e| SandboxError::Io("dns socket", e))?;
        u.set_nonblocking(true)
            .map_err(|e| SandboxError::Io("dns socket", e))?;
        let u =
            tokio::net::UdpSocket::from_std(u).map_err(|e| SandboxError::Io("dns socket", e))?;
        serving.acceptors.spawn(dns::serve(
            u,
            Arc::clone(resolver),
            serving.acceptors.shutdown_token(),
        ));
    }
    Ok(serving)
}

/// Runs one command in a sandbox session whose connections go to `handler`
/// and whose DNS questions go to `resolver`, and cleans everything up.
pub async fn run<H: Handler>(
    spec: RunSpec,
    handler: Arc<H>,
    resolver: Arc<Resolver>,
) -> Result<RunOutcome, SandboxError> {
    // From here on SIGINT/SIGTERM stop the sandbox and clean up.
    let mut signals = crate::signals::Terminated::install();
    let redirect = Redirect::start(&RedirectOptions {
        reaper_exe: spec.reaper_exe.clone(),
        sandboxes: spec.sandboxes.clone(),
    })?;
    let id = spec.session.clone().unwrap_or_else(SessionId::random);
    let opts = session::SessionOptions {
        id: id.clone(),
        network: spec.network,
        limits: spec.limits,
        drain_grace: spec.drain_grace,
    };
    let sandbox = session::SandboxSession::open(&redirect, &opts, &handler, &resolver)?;
    let cmd = spec.exec;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut interrupted = None;
    let ended = {
        let exec = sandbox.exec(cmd, &stop);
        tokio::pin!(exec);
        loop {
            tokio::select! {
                r = &mut exec => break r,
                sig = signals.recv(), if interrupted.is_none() => {
                    tracing::warn!(signal = sig, "interrupted; stopping the sandbox");
                    interrupted = Some(sig);
                    stop.cancel();
                }
            }
        }
    };
    let closed = sandbox.close().await;
    tracing::info!(stats = ?redirect.stats(), "redirect counters");
    let ended = ended?;
    closed?;
    redirect.shutdown()?;
    let end = match (interrupted, ended) {
        (Some(sig), _) => End::Interrupted(sig),
        (None, session::ExecEnd::Exited(s)) => End::Exited(s),
        (None, session::ExecEnd::TimedOut | session::ExecEnd::Stopped) => {
            End::Interrupted(libc::SIGKILL)
        }
    };
    Ok(RunOutcome { session: id, end })
}
