//! The `polar` command line: argument parsing and dispatch. Exit codes follow
//! the container runners' convention: the command's own code when it ran,
//! 125 when Polar itself failed, 126/127 when the command could not be
//! started or found, 128+N after signal N.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::ids::SessionId;
use crate::sandbox::{self, NetworkMode, RunSpec, SandboxError};
use crate::telemetry::{self, LogFormat};

/// Polar: run coding-agent CLIs in sandboxes and capture their model traffic.
#[derive(Debug, Parser)]
#[command(name = "polar", version, about, long_about = None)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// More logging (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sandboxes.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// Internal: the cleanup guardian started by the agent.
    #[command(name = "__reap", hide = true)]
    Reap {
        /// The agent's cgroup directory.
        dir: PathBuf,
    },
}

/// `polar sandbox ...`
#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Run a command in a fresh sandbox session whose every connection is
    /// redirected into the agent, which logs each one (session, original
    /// destination, bytes seen) and closes it.
    Run(SandboxRunArgs),
}

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
    /// How long the listener waits for a connection's bytes, in ms.
    #[arg(long, default_value_t = 1500)]
    pub read_timeout_ms: u64,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
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

/// Parses the command line, runs, and returns the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format, cli.verbose);
    match cli.command {
        Command::Reap { dir } => match crate::redirect::reaper::run(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        },
        Command::Sandbox(SandboxCommand::Run(args)) => sandbox_run(args),
    }
}

fn fail(e: &dyn std::error::Error) -> ExitCode {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    tracing::error!("{msg}");
    ExitCode::from(125)
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn sandbox_run(args: SandboxRunArgs) -> ExitCode {
    let spec = RunSpec {
        argv: args.command,
        network: args.network.into(),
        session: args.session,
        reaper_exe: std::env::current_exe().ok(),
        read_timeout: Duration::from_millis(args.read_timeout_ms),
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    match rt.block_on(sandbox::run(spec)) {
        Ok(out) => {
            let code = match out.end {
                sandbox::End::Exited(s) => exit_code(s),
                sandbox::End::Interrupted(sig) => u8::try_from(128 + sig).unwrap_or(255),
            };
            tracing::info!(
                session = %out.session,
                captured = out.captured,
                exit_code = code,
                "sandbox finished"
            );
            ExitCode::from(code)
        }
        Err(SandboxError::Spawn(e)) => {
            let code = match &e {
                sandbox::process::SpawnError::Spawn { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    127
                }
                _ => 126,
            };
            tracing::error!("{e}");
            ExitCode::from(code)
        }
        Err(e) => fail(&e),
    }
}

fn exit_code(s: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        _ => 1,
    }
}
