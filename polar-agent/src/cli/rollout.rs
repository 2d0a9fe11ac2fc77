//! `polar rollout serve`: the rollout server. Settings come from the
//! `[rollout]` table of `--config`, then the flags and the environment
//! (`POLAR_ROLLOUT_TOKEN`, `POLAR_ROLLOUT_NODE_TOKEN` as `NODE_ID=TOKEN`).
//! SIGHUP reads the token files again and puts the tokens in force
//! (rotation without a restart); tokens that break the rules are logged
//! and the old ones stay.

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
    /// This node's token, presented to the server.
    #[arg(long, env = "POLAR_GATEWAY_TOKEN", hide_env_values = true)]
    pub token: String,
    /// The token the server must present (its `gateway_token`).
    #[arg(long, env = "POLAR_GATEWAY_ACCEPT_TOKEN", hide_env_values = true)]
    pub accept_token: String,
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
    /// A node's token to accept, as `NODE_ID=TOKEN` (added to
    /// `rollout.node_tokens`).
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
            let mut cfg = args.load()?;
            let mut hangup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let server = RolloutServer::start(cfg.clone()).await?;
            let stop = crate::signals::terminated();
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    _ = &mut stop => break,
                    Some(()) = async { hangup.as_mut()?.recv().await } => {
                        match cfg.reload_tokens() {
                            Ok(()) => {
                                if let Err(e) = server.set_tokens(&cfg) {
                                    tracing::error!(error = %e, "tokens not reloaded");
                                }
                            }
                            Err(e) => tracing::error!(error = %e, "tokens not reloaded; the old ones stay"),
                        }
                    }
                }
            }
            server.run_until(async {}).await;
            Ok(ExitCode::SUCCESS)
        }
        RolloutCommand::SimGateway(a) => {
            let mut cfg = SimGatewayConfig::new(&a.node_id, &a.server, &a.token);
            cfg.accept_token = a.accept_token;
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
