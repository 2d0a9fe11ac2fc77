//! `polar rollout serve`: the rollout server. Settings come from the
//! `[rollout]` table of `--config`, then the flags and the environment
//! (`POLAR_ROLLOUT_TOKEN`, `POLAR_ROLLOUT_NODE_TOKEN`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::CliError;
use polar_gateway::{SimGateway, SimGatewayConfig};
use polar_rollout::config::{NODE_TOKEN_ENV, TOKEN_ENV};
use polar_rollout::{RolloutConfig, RolloutServer};

/// `polar rollout ...`
#[derive(Debug, clap::Subcommand)]
pub enum RolloutCommand {
    /// Run the rollout server: task API, node registry, dispatch to
    /// gateways, results and callbacks, state in SQLite.
    Serve(ServeArgs),
    /// A simulated gateway node (sessions sleep, then report a reward), for
    /// trying the server and for benchmarks.
    SimGateway(SimArgs),
}

/// Arguments of `polar rollout sim-gateway`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// The rollout server's base URL.
    #[arg(
        long,
        env = "POLAR_ROLLOUT_URL",
        default_value = "http://127.0.0.1:7070"
    )]
    pub server: String,
    /// The node id.
    #[arg(long, default_value = "sim-1")]
    pub node_id: String,
    /// The gateway token presented to the server; also the token the
    /// server must present unless `--accept-token` is given.
    #[arg(long, env = NODE_TOKEN_ENV, hide_env_values = true)]
    pub token: String,
    /// The token the server must present.
    #[arg(long)]
    pub accept_token: Option<String>,
    /// Sessions held at once.
    #[arg(long, default_value_t = 8)]
    pub max_sessions: u32,
    /// How long each session "runs", in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub session_ms: u64,
}

/// Arguments of `polar rollout serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TOML file with a `[rollout]` table (defaults without one).
    #[arg(long, env = "POLAR_ROLLOUT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen address (overrides `rollout.listen`).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// SQLite database file (overrides `rollout.database`).
    #[arg(long)]
    pub database: Option<PathBuf>,
    /// A trainer token to accept (added to `rollout.tokens`).
    #[arg(long, env = TOKEN_ENV, hide_env_values = true)]
    pub token: Option<String>,
    /// A gateway token to accept (added to `rollout.node_tokens`).
    #[arg(long, env = NODE_TOKEN_ENV, hide_env_values = true)]
    pub node_token: Option<String>,
}

impl ServeArgs {
    /// The validated settings.
    pub fn load(&self) -> Result<RolloutConfig, CliError> {
        let mut cfg = match &self.config {
            Some(path) => RolloutConfig::load(path)?,
            None => RolloutConfig::from_toml("", None)?,
        };
        if let Some(l) = self.listen {
            cfg.listen = l;
        }
        if let Some(d) = &self.database {
            cfg.database.clone_from(d);
        }
        cfg.finish_tokens(self.token.clone(), self.node_token.clone())?;
        Ok(cfg)
    }
}

/// Runs a `polar rollout` command.
pub async fn run(cmd: RolloutCommand) -> Result<ExitCode, CliError> {
    match cmd {
        RolloutCommand::Serve(args) => {
            let cfg = args.load()?;
            let server = RolloutServer::start(cfg).await?;
            server
                .run_until(async {
                    crate::signals::terminated().await;
                })
                .await;
            Ok(ExitCode::SUCCESS)
        }
        RolloutCommand::SimGateway(a) => {
            let mut cfg = SimGatewayConfig::new(&a.node_id, &a.server, &a.token);
            if let Some(t) = a.accept_token {
                cfg.accept_token = t;
            }
            cfg.max_sessions = a.max_sessions;
            cfg.session_time = Duration::from_millis(a.session_ms);
            cfg.heartbeat_interval = Duration::from_secs(1);
            let gw = SimGateway::start(cfg).await?;
            tracing::info!(
                node = gw.node_id(),
                address = gw.address(),
                "simulated gateway running"
            );
            crate::signals::terminated().await;
            gw.stop().await;
            Ok(ExitCode::SUCCESS)
        }
    }
}
