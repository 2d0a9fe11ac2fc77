//! `polar rollout serve`: the rollout server. Settings come from the
//! `[rollout]` table of `--config`, then the flags and the environment
//! (`POLAR_ROLLOUT_TOKEN`, `POLAR_ROLLOUT_NODE_TOKEN` as `NODE_ID=TOKEN`).
//! SIGHUP reads the token files again and puts the tokens in force
//! (rotation without a restart); tokens that break the rules are logged
//! and the old ones stay. `polar rollout ca` makes the cluster CA and the
//! server's and nodes' certificates (`[rollout.tls]`, `[gateway.tls]`).

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
    /// The cluster CA of the control plane: its certificates for the
    /// rollout server and the nodes.
    #[command(subcommand)]
    Ca(ClusterCaCommand),
}

/// `polar rollout ca ...`
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCaCommand {
    /// Create the CA in a directory (`ca.key` mode 0600, `ca.crt`); refuses
    /// to overwrite one.
    Init {
        /// The CA's directory (created 0700).
        #[arg(long)]
        dir: PathBuf,
        /// How long the CA is valid, in days.
        #[arg(long, default_value_t = 3650)]
        days: u64,
    },
    /// Issue a certificate for the rollout server or a node (valid for TLS
    /// servers and clients): `<out>/<name>.crt` (leaf, then the CA) and
    /// `<name>.key` (mode 0600). A node's name is its node id: the server
    /// binds mutual TLS to it.
    Issue {
        /// The CA's directory.
        #[arg(long)]
        dir: PathBuf,
        /// The node id (or the server's name): the file stem and first DNS
        /// name.
        #[arg(long)]
        name: String,
        /// Another DNS name clients dial (repeatable).
        #[arg(long)]
        dns: Vec<String>,
        /// An IP address clients dial (repeatable).
        #[arg(long)]
        ip: Vec<std::net::IpAddr>,
        /// How long the certificate is valid, in days.
        #[arg(long, default_value_t = 365)]
        days: u64,
        /// Where the files go (default: the CA's directory).
        #[arg(long)]
        out: Option<PathBuf>,
    },
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
    /// Serve HTTPS with this certificate (PEM chain; also presented to the
    /// server as the client certificate).
    #[arg(long, requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The certificate's key (mode 0600).
    #[arg(long, requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// The CA bundle an `https://` server is verified against.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
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
            let stop = polar_sandbox::signals::terminated();
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
        RolloutCommand::Ca(cmd) => ca(cmd),
        RolloutCommand::SimGateway(a) => {
            let raw = polar_rollout_api::tls::RawTls {
                cert_file: a.cert_file.clone(),
                key_file: a.key_file.clone(),
                ca_file: a.ca_file.clone(),
                ..Default::default()
            };
            let tls = polar_rollout_api::tls::TlsSettings::from_raw(&raw, "sim-gateway", None)
                .and_then(|t| t.configs())
                .map_err(|e| CliError::Usage(e.to_string()))?;
            polar_rollout_api::tls::check_target(
                &a.server,
                false,
                "the simulated gateway has no opt-in",
            )
            .map_err(CliError::Usage)?;
            let mut cfg = SimGatewayConfig::new(&a.node_id, &a.server, &a.token);
            cfg.tls = Some(tls);
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
            polar_sandbox::signals::terminated().await;
            gw.stop().await;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Runs a `polar rollout ca` command; prints what it wrote.
fn ca(cmd: ClusterCaCommand) -> Result<ExitCode, CliError> {
    use polar_io::tls::ca::{ClusterCa, IssueRequest};
    let days = |d: u64| Duration::from_secs(d.saturating_mul(86_400));
    let text = match cmd {
        ClusterCaCommand::Init { dir, days: d } => {
            let ca = ClusterCa::init(&dir, days(d))?;
            format!(
                "cluster CA created: {} (key {}, mode 0600)\n",
                ca.cert_path().display(),
                dir.join(polar_io::tls::ca::KEY_FILE).display()
            )
        }
        ClusterCaCommand::Issue {
            dir,
            name,
            dns,
            ip,
            days: d,
            out,
        } => {
            let ca = ClusterCa::load(&dir)?;
            let req = IssueRequest {
                name,
                dns,
                ips: ip,
                validity: days(d),
            };
            let issued = ca.issue(&req, out.as_deref().unwrap_or(&dir))?;
            format!(
                "issued {} (key {}, mode 0600), signed by {}\n",
                issued.cert.display(),
                issued.key.display(),
                ca.cert_path().display()
            )
        }
    };
    std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}
