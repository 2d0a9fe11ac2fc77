//! The `polar` command line: argument parsing and dispatch, and the mapping
//! of errors to exit codes. Exit codes follow the container runners'
//! convention: the command's own code when it ran, 125 when Polar itself
//! failed, 126/127 when the command could not be started or found, 128+N
//! after signal N.

mod agent;
mod ca;
mod check;
mod harness;
mod install;
mod probe;
mod proxy;
mod rollout;
mod sandbox;
mod slurm;
mod submit;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use polar_io::chain;
use tokio_util::sync::CancellationToken;

use crate::telemetry::{self, LogFormat};
use polar_config::{Config, ConfigError};
use polar_node::agent::AgentError;
use polar_sandbox::SandboxError;

pub use self::ca::CaCommand;
pub use self::install::{InstallArgs, UninstallArgs};
pub use self::proxy::ProxyArgs;
pub use self::rollout::{RolloutCommand, ServeArgs};
pub use self::sandbox::{NetworkArg, SandboxRunArgs};
pub use self::slurm::SlurmCommand;
pub use self::submit::{ServerArgs, StatusArgs, SubmitArgs};

/// Polar: run coding-agent CLIs in sandboxes and capture their model traffic.
#[derive(Debug, Parser)]
#[command(name = "polar", version, about, long_about = None)]
pub struct Cli {
    /// Log format on stderr (default: the configuration's
    /// `agent.log_format` for the commands that read one, else text).
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
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
    /// The gateway daemon of a training node: runs the rollout server's
    /// sessions in sandboxes, captures their model calls, evaluates, exports
    /// the trajectories.
    Agent(agent::AgentArgs),
    /// Sandboxes.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// Polar's certificate authority.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// A mock inference server (vLLM or SGLang token-id dialect) for tests,
    /// benchmarks and the demo.
    MockBackend(polar_mock::MockArgs),
    /// Rebuild trajectories from captured session logs and write them as
    /// JSONL/Parquet to a directory or s3://bucket/prefix.
    Export(polar_export::ExportArgs),
    /// Serve base-URL mode only (no sandbox, no root): model calls of the
    /// given sessions are translated, sent to the backends and captured.
    Proxy(ProxyArgs),
    /// The rollout control plane.
    #[command(subcommand)]
    Rollout(RolloutCommand),
    /// Submit a task (TOML or JSON TaskRequest) to a rollout server and
    /// follow it to the end.
    Submit(SubmitArgs),
    /// A rollout server's health, nodes and tasks.
    Status(StatusArgs),
    /// The control plane inside a Slurm job: the rollout server and one
    /// gateway per allocated node, for the life of the job.
    #[command(subcommand)]
    Slurm(SlurmCommand),
    /// Install the agent on this node (or below --root): binary, config,
    /// state directory with the CA, systemd units; idempotent.
    Install(InstallArgs),
    /// Remove what `polar install` installed, stop the service, and report
    /// any Polar cgroup or BPF program still present.
    Uninstall(UninstallArgs),
    /// Internal: print the long help of every command (the manual).
    #[command(name = "__manual", hide = true)]
    Manual,
    /// Internal: print a systemd unit `polar install` writes.
    #[command(name = "__unit", hide = true)]
    Unit {
        /// `polar-agent.service` or `polar-rollout.service`.
        name: String,
    },
    /// Internal: the cleanup guardian started by the agent.
    #[command(name = "__reap", hide = true)]
    Reap {
        /// The agent's cgroup directory.
        dir: PathBuf,
        /// The state's `sandboxes/` directory, whose mounts of the agent's
        /// sessions are released after it.
        #[arg(long)]
        sandboxes: Option<PathBuf>,
    },
}

/// `polar sandbox ...`
#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Run a command in a fresh sandbox session: every connection it makes
    /// is redirected into the agent and handled per the routing rules.
    Run(SandboxRunArgs),
}

/// `polar config ...`
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check a configuration file exactly as every command that reads it
    /// checks it at start (the node's tables; `[gateway]` as `polar agent`;
    /// `[rollout]` as `polar rollout serve`, with the tokens of the
    /// environment) and summarize it.
    Check {
        /// The file.
        file: PathBuf,
        /// Also ask every backend replica `GET /health` and say which
        /// answered (exit 1 when a backend has no replica that did).
        #[arg(long)]
        probe: bool,
    },
}

/// Where the configuration comes from.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArgs {
    /// Configuration file (TOML); the embedded defaults without one.
    #[arg(long, env = "POLAR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Override `agent.state_dir` (where the CA lives).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

impl ConfigArgs {
    /// The validated configuration.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if let Some(dir) = &self.state_dir {
            config.agent.state_dir.clone_from(dir);
        }
        Ok(config)
    }
}

/// Errors of the command line, each with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The agent could not be assembled.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The CA operation failed.
    #[error(transparent)]
    Ca(#[from] polar_tls::CaError),
    /// The cluster CA operation failed.
    #[error(transparent)]
    ClusterCa(#[from] polar_io::tls::ca::CaError),
    /// The sandbox failed.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The mock backend failed.
    #[error(transparent)]
    Mock(#[from] polar_mock::MockError),
    /// The export failed.
    #[error(transparent)]
    Export(#[from] polar_export::ExportError),
    /// The rollout server could not start.
    #[error(transparent)]
    Rollout(#[from] polar_rollout::RolloutError),
    /// The rollout settings are invalid.
    #[error(transparent)]
    RolloutConfig(#[from] polar_rollout::RolloutConfigError),
    /// A call to the rollout server failed.
    #[error(transparent)]
    RolloutClient(#[from] polar_rollout_api::ClientError),
    /// The rollout server could not be reached (exit 5).
    #[error("{0}")]
    Unreachable(String),
    /// The rollout server refused the token (exit 4).
    #[error("{0}")]
    Auth(String),
    /// The task file does not parse.
    #[error("task file {0}")]
    TaskFile(String),
    /// The simulated gateway could not start.
    #[error(transparent)]
    Sim(#[from] polar_node::gateway::NodeError),
    /// The harness session failed.
    #[error(transparent)]
    Harness(Box<polar_harness::HarnessError>),
    /// The runtime spec is invalid.
    #[error(transparent)]
    Spec(#[from] polar_spec::runtime::SpecError),
    /// Install or uninstall failed.
    #[error(transparent)]
    Install(#[from] crate::install::InstallError),
    /// An I/O error.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// The arguments do not say enough.
    #[error("{0}")]
    Usage(String),
    /// The `[gateway]` table is invalid.
    #[error(transparent)]
    Gateway(#[from] polar_node::gateway::GatewayConfigError),
    /// `polar config check`: the file does not pass the checks `command`
    /// makes at start.
    #[error("{file}: not valid for {command}: {error}")]
    NotValidFor {
        /// The file checked.
        file: String,
        /// The command (or commands) whose checks refused it.
        command: &'static str,
        /// Why.
        error: Box<CliError>,
    },
    /// Running in a Slurm job failed.
    #[error(transparent)]
    Slurm(#[from] crate::slurm::SlurmError),
}

impl From<polar_harness::HarnessError> for CliError {
    fn from(e: polar_harness::HarnessError) -> Self {
        Self::Harness(Box::new(e))
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        Self::Io("writing output".into(), e)
    }
}

impl CliError {
    fn exit_code(&self) -> u8 {
        match self {
            Self::Sandbox(SandboxError::Spawn(polar_sandbox::process::SpawnError::Spawn {
                source,
                ..
            })) if source.kind() == std::io::ErrorKind::NotFound => 127,
            Self::Sandbox(SandboxError::Spawn(_)) => 126,
            Self::Auth(_) => 4,
            Self::Unreachable(_) => 5,
            _ => 125,
        }
    }
}

/// `agent.log_format` of the configuration a command reads, when it reads
/// one and the file checks (a file that does not is reported by the
/// command itself, once logging is up).
fn configured_log_format(command: &Command) -> Option<LogFormat> {
    let args = match command {
        Command::Agent(a) => &a.config,
        Command::Sandbox(SandboxCommand::Run(a)) => &a.config,
        Command::Proxy(a) => &a.config,
        _ => return None,
    };
    args.config.as_ref()?;
    let config = args.load().ok()?;
    Some(match config.agent.log_format {
        polar_config::LogFormat::Text => LogFormat::Text,
        polar_config::LogFormat::Json => LogFormat::Json,
    })
}

/// Parses the command line, runs, and returns the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let format = cli
        .log_format
        .or_else(|| configured_log_format(&cli.command))
        .unwrap_or_default();
    telemetry::init(format, cli.verbose);
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            // The command's failure is one plain line for the person or
            // the script that ran it (`ERROR` and the causes, no time, no
            // module); JSON logs keep it as an event like the others.
            match format {
                LogFormat::Text => {
                    let line = format!("ERROR {}\n", chain(&e));
                    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                }
                LogFormat::Json => tracing::error!("{}", chain(&e)),
            }
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(command: Command) -> Result<ExitCode, CliError> {
    match command {
        Command::Reap { dir, sandboxes } => {
            use polar_redirect::reaper::{self, Release};
            let agent = std::os::unix::process::parent_id();
            let (release, reaped) = reaper::run(&dir);
            let reaped = reaped.map_err(|e| CliError::Sandbox(SandboxError::Redirect(e.into())));
            // After the kill: nothing of the agent holds the mounts now.
            // Its pipe closes while it exits, before it is gone: the mounts
            // are its until then. An agent shutting down in order waits
            // for this process: its mounts stay its own.
            if let Some(s) = sandboxes {
                let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while release == Release::Gone
                    && polar_sandbox::runtime::quota::runs(agent)
                    && std::time::Instant::now() < until
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                polar_sandbox::runtime::quota::reclaim_stale(&s);
            }
            reaped?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Ca(cmd) => ca::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::Install(args) => install::install(args),
        Command::Uninstall(args) => install::uninstall(args),
        Command::Unit { name } => {
            let text = match name.as_str() {
                crate::install::units::AGENT_UNIT => crate::install::units::agent_unit(),
                crate::install::units::ROLLOUT_UNIT => crate::install::units::rollout_unit(),
                other => return Err(CliError::Usage(format!("no unit named {other:?}"))),
            };
            std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Manual => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            cmd.build();
            let text = install::manual(&mut cmd);
            std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(ConfigCommand::Check { file, probe }) => {
            let report = check::check(&file)?;
            std::io::Write::write_all(&mut std::io::stdout(), report.as_bytes())?;
            if !probe {
                return Ok(ExitCode::SUCCESS);
            }
            let config = polar_config::Config::load(&file)?;
            let probes = runtime()?
                .block_on(probe::probe(&config.backends))
                .map_err(CliError::Usage)?;
            std::io::Write::write_all(&mut std::io::stdout(), probe::report(&probes).as_bytes())?;
            Ok(if probes.iter().all(probe::BackendProbe::is_up) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Sandbox(SandboxCommand::Run(args)) => runtime()?.block_on(sandbox::run(args)),
        Command::Proxy(args) => runtime()?.block_on(proxy::run(args)),
        Command::Agent(args) => runtime()?.block_on(agent::run(args)),
        Command::Rollout(cmd) => runtime()?.block_on(rollout::run(cmd)),
        Command::Submit(args) => runtime()?.block_on(submit::submit(args)),
        Command::Status(args) => runtime()?.block_on(submit::status(args)),
        Command::Slurm(cmd) => runtime()?.block_on(slurm::run(cmd)),
        Command::MockBackend(args) if args.write_tokenizer.is_some() => {
            if let Some(path) = &args.write_tokenizer {
                polar_mock::hf_tokenizer::write(path)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::MockBackend(args) => runtime()?.block_on(async {
            let token = CancellationToken::new();
            let stop = token.clone();
            tokio::spawn(async move {
                polar_sandbox::signals::terminated().await;
                stop.cancel();
            });
            polar_mock::run(&args, token).await?;
            Ok(ExitCode::SUCCESS)
        }),
        Command::Export(mut args) => {
            if args.sessions.is_empty() && args.state_dir.is_none() && args.from.is_none() {
                let config = match &args.config {
                    Some(file) => polar_config::Config::load(file).map_err(|e| {
                        CliError::Export(polar_export::ExportError::Usage(format!(
                            "configuration: {e}"
                        )))
                    })?,
                    None => polar_config::Config::default(),
                };
                args.state_dir = Some(config.agent.state_dir);
            }
            // This process only exports: keep freed memory for reuse.
            polar_export::memory::retain_freed_memory();
            let json = args.json;
            let summary = runtime()?.block_on(polar_export::run(args))?;
            let text = if json {
                serde_json::to_string_pretty(&summary).map_err(|e| CliError::Export(e.into()))?
                    + "\n"
            } else {
                summary.to_string()
            };
            std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())?;
            Ok(if summary.sessions_failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Io("starting the runtime".into(), e))
}

/// The exit code for a finished command.
pub fn exit_code(s: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        _ => 1,
    }
}
