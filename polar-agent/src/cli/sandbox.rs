//! `polar sandbox run`: one command in a sandbox session, its traffic
//! captured by the interception proxy (or, with `--inspect`, only logged).
//!
//! The command runs in the native runtime ([`polar_sandbox::runtime::oneshot`]):
//! the same hardened bubblewrap sandbox as a harness session, with the
//! caller's stdio. Only `--unconfined`, a debugging flag that warns loudly,
//! runs it the old way: as root on the host's root file system, with every
//! capability, confined by nothing but its network namespace and cgroup.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;

use super::{CliError, ConfigArgs, exit_code};
use polar_capture::SessionInfo;
use polar_ids::SessionId;
use polar_node::agent::AgentParts;
use polar_node::harness::run::release_dirs;
use polar_redirect::dns::{FakeIps, InterceptAll, Resolver};
use polar_redirect::listener::LogHandler;
use polar_redirect::preflight;
use polar_sandbox::runtime::oneshot;
use polar_sandbox::runtime::steps::SandboxDirs;
use polar_sandbox::session::Exec;
use polar_sandbox::{End, NetworkMode, RunSpec, SandboxError};
use polar_tls::TrustFiles;

/// Arguments of `polar sandbox run`.
#[derive(Debug, clap::Args)]
pub struct SandboxRunArgs {
    /// Network mode: `isolated` (own network namespace, fails closed) or
    /// `host` (shares the host's namespace).
    #[arg(long, value_enum, default_value_t = NetworkArg::Isolated)]
    pub network: NetworkArg,
    /// Session id (random by default).
    #[arg(long)]
    pub session: Option<SessionId>,
    /// The task the session runs (stamped on its captured calls).
    #[arg(long)]
    pub task: Option<String>,
    /// The policy version the session's calls run under (stamped on its
    /// records and exported as `policy_version`).
    #[arg(long)]
    pub policy_version: Option<String>,
    /// The configuration (routing rules, CA, limits).
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Only log each connection (session, original destination, first
    /// bytes) and close it, without proxying: for finding out what a
    /// program connects to.
    #[arg(long)]
    pub inspect: bool,
    /// DEBUGGING ONLY — NOT A SANDBOX: run the command as root with every
    /// capability on the host's root file system, read-write (it can
    /// write /etc and read the CA key), confined only by its network
    /// namespace and cgroup. Warns on stderr. Without it the command runs
    /// in the native runtime, as the sandbox user, on a read-only root.
    #[arg(long, conflicts_with_all = ["harness", "runtime"])]
    pub unconfined: bool,
    /// With `--inspect`: how long to wait for a connection's bytes, in ms.
    #[arg(long, default_value_t = 1500)]
    pub read_timeout_ms: u64,
    /// Run this harness preset (codex, claude_code, gemini_cli, qwen_code,
    /// opencode, pi, mini_swe_agent, aider, openhands, copilot, hermes,
    /// shell) on a runtime, end to end.
    #[command(flatten)]
    pub harness: super::harness::HarnessArgs,
    /// The command and its arguments, after `--` (with `--harness shell`
    /// or `--runtime`: the command run in the runtime).
    #[arg(last = true, required_unless_present_any = ["harness", "runtime"])]
    pub command: Vec<OsString>,
}

impl SandboxRunArgs {
    /// What `--task` and `--policy-version` say of the session.
    pub fn session_info(&self) -> SessionInfo {
        SessionInfo {
            task_id: self.task.clone(),
            ..SessionInfo::default()
        }
        .with_policy_version(self.policy_version.clone())
    }
}

/// `--network` values.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum NetworkArg {
    /// Own network namespace.
    Isolated,
    /// The host's network namespace.
    Host,
}

impl From<NetworkArg> for NetworkMode {
    fn from(a: NetworkArg) -> Self {
        match a {
            NetworkArg::Isolated => NetworkMode::Isolated,
            NetworkArg::Host => NetworkMode::Host,
        }
    }
}

/// The warning `--unconfined` prints.
const UNCONFINED_WARNING: &str = "WARNING: --unconfined: the command runs as root with every \
capability on the host's root file system, read-write; it is NOT sandboxed (only its network \
namespace and cgroup are its own). Use it to debug, never for untrusted code.";

/// The command as the agent execs it: in the native runtime, with the
/// session's directories under `state_dir` (`trust` bound when given);
/// with `--unconfined`, as it is, with `env` and the trust bundle's
/// `binds`. The session's directories come back too, to be released
/// ([`release_dirs`]) once the command ended.
fn exec_for(
    args: &SandboxRunArgs,
    session: &SessionId,
    config: &polar_config::Config,
    trust: Option<&TrustFiles>,
) -> Result<(Exec, Option<(SandboxDirs, oneshot::RunGuard)>), CliError> {
    if args.unconfined {
        {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "{UNCONFINED_WARNING}");
        }
        tracing::warn!(session = %session, "running the command unconfined: not a sandbox");
        let mut exec = Exec::new(args.command.clone());
        if let Some(t) = trust {
            exec.env = t.env();
            exec.binds = t.bind_mounts();
        }
        exec.env.push(("POLAR_SESSION".into(), session.to_string()));
        return Ok((exec, None));
    }
    // Directories and the quota's mount: blocking, before the session.
    let node = polar_sandbox::runtime::Node::of(config);
    let state_dir = &config.agent.state_dir;
    let disk_bytes = config.sandbox.disk_bytes;
    let shot = tokio::task::block_in_place(|| {
        oneshot::native(state_dir, disk_bytes, &node, trust, session, &args.command)
    })
    .map_err(polar_harness::HarnessError::from)?;
    tracing::info!(
        session = %session,
        workspace = %shot.dirs.workspace.display(),
        "native sandbox"
    );
    Ok((shot.exec, Some((shot.dirs, shot.guard))))
}

/// The run of `exec` with the node's default limits (`[sandbox]`).
fn spec(
    args: &SandboxRunArgs,
    session: SessionId,
    exec: Exec,
    config: &polar_config::Config,
) -> RunSpec {
    let sandbox = &config.sandbox;
    RunSpec {
        limits: sandbox.default_limits(),
        exec,
        network: args.network.into(),
        session: Some(session),
        reaper_exe: std::env::current_exe().ok(),
        sandboxes: Some(polar_sandbox::runtime::steps::sandboxes_dir(
            &config.agent.state_dir,
        )),
        drain_grace: Duration::from_secs(5),
    }
}

async fn inspect(args: SandboxRunArgs) -> Result<ExitCode, CliError> {
    let session = args.session.clone().unwrap_or_else(SessionId::random);
    let handler = Arc::new(LogHandler::new(Duration::from_millis(args.read_timeout_ms)));
    let resolver = Arc::new(Resolver::new(
        Arc::new(FakeIps::default()),
        Arc::new(InterceptAll),
        5,
    ));
    // Validate everything before anything is created.
    let config = args.config.load()?;
    preflight::check().map_err(|e| CliError::Sandbox(SandboxError::Redirect(e.into())))?;
    let (exec, dirs) = exec_for(&args, &session, &config, None)?;
    let mut spec = spec(&args, session.clone(), exec, &config);
    spec.drain_grace = handler.read_timeout + Duration::from_secs(2);
    let out = polar_sandbox::run(spec, Arc::clone(&handler), resolver).await;
    // Inspecting keeps nothing: the session's directories go, their disk
    // quota discarded rather than copied to disk.
    if let Some((dirs, _guard)) = dirs {
        tokio::task::spawn_blocking(move || dirs.remove())
            .await
            .map_err(|e| CliError::Io("removing the session".into(), std::io::Error::other(e)))?
            .map_err(polar_harness::HarnessError::from)?;
    }
    let out = out?;
    tracing::info!(session = %out.session, captured = handler.captured(), "sandbox finished");
    Ok(finish(out.end))
}

async fn proxied(args: SandboxRunArgs) -> Result<ExitCode, CliError> {
    // Validate everything before anything is created.
    let config = args.config.load()?;
    preflight::check().map_err(|e| CliError::Sandbox(SandboxError::Redirect(e.into())))?;
    let parts = AgentParts::build(config)?;
    let session = args.session.clone().unwrap_or_else(SessionId::random);
    parts.sessions.register(&session, None);
    parts.registry.register(&session, args.session_info());
    if let Some(c) = &parts.capture {
        c.spawn_health_checks();
    }
    let tasks = parts.tasks.clone();
    parts
        .serve_base_url()
        .await
        .map_err(|e| CliError::Io("base-URL mode".into(), e))?;
    let exec = exec_for(&args, &session, &parts.config, Some(&parts.trust));
    let (exec, dirs) = match exec {
        Ok(e) => e,
        Err(e) => {
            parts.sessions.unregister(&session);
            parts.registry.unregister(&session);
            return Err(e);
        }
    };
    let spec = spec(&args, session.clone(), exec, &parts.config);
    let result =
        polar_sandbox::run(spec, Arc::clone(&parts.proxy), Arc::clone(&parts.resolver)).await;
    if let Some((dirs, _guard)) = dirs {
        release_dirs(dirs).await;
    }
    parts.sessions.unregister(&session);
    tasks.drain(Duration::from_secs(2)).await;
    if let Some(c) = &parts.capture {
        c.end_session(&session);
        tracing::info!(session = %session, log = %c.store().session_dir(&session).display(), "capture log");
    }
    parts.registry.unregister(&session);
    let out = result?;
    let s = &parts.proxy.stats;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    tracing::info!(
        session = %out.session,
        connections = n(&s.connections),
        model = n(&s.model),
        passed = n(&s.passed),
        denied = n(&s.denied),
        tls_ok = n(&s.tls_ok),
        tls_failed = n(&s.tls_failed),
        "sandbox finished"
    );
    Ok(finish(out.end))
}

fn finish(end: End) -> ExitCode {
    ExitCode::from(match end {
        End::Exited(s) => exit_code(s),
        End::Interrupted(sig) => u8::try_from(128 + sig).unwrap_or(255),
    })
}

/// Runs `polar sandbox run`.
pub async fn run(args: SandboxRunArgs) -> Result<ExitCode, CliError> {
    if args.harness.harness.is_some() || args.harness.runtime.is_some() {
        super::harness::run(args).await
    } else if args.inspect {
        inspect(args).await
    } else {
        proxied(args).await
    }
}
