//! `polar agent --config FILE`: the gateway daemon of a training node. It
//! checks the configuration (the agent's tables and `[gateway]`) and the
//! node (capabilities, kernel, cgroup v2) before anything is created,
//! assembles the agent (CA, proxy, capture, DNS), attaches the redirect,
//! registers with the rollout server and runs its sessions until SIGTERM or
//! SIGINT, then drains: running sessions finish (for up to
//! `gateway.drain_timeout_secs`) or are handed back to the server, captures
//! are flushed, the redirect is detached. SIGHUP reloads the routing rules
//! and the gateway's tokens (the file's, and the token files again:
//! rotation) from the file; `GET /metrics` on the node is the agent's page.
//! The gateway serves HTTPS with `[gateway.tls]` (its files read at start).

use std::process::ExitCode;
use std::sync::Arc;

use super::{CliError, ConfigArgs};
use polar_export::{Destination, ExportOptions, Exporter};
use polar_node::agent::AgentParts;
use polar_node::gateway::retention::Retention;
use polar_node::gateway::work::HarnessWork;
use polar_node::gateway::{GatewayConfig, GatewayConfigError, Node, NodeOptions, Stages};
use polar_redirect::{Redirect, RedirectOptions, preflight};
use polar_sandbox::SandboxError;
use polar_spec::{KeyError, KeyPath};

/// Arguments of `polar agent`.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The configuration (the agent's tables and `[gateway]`).
    #[command(flatten)]
    pub config: ConfigArgs,
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> CliError + '_ {
    move |e| CliError::Io(what.to_owned(), e)
}

/// Runs the gateway daemon until a terminating signal.
pub async fn run(args: AgentArgs) -> Result<ExitCode, CliError> {
    let mut signals = polar_sandbox::signals::Terminated::install();
    // Everything checked before anything is created.
    let path = args.config.config.clone().ok_or_else(|| {
        CliError::Usage("polar agent needs --config FILE with a [gateway] table".into())
    })?;
    let Checked {
        config,
        gw,
        tls,
        export,
        dest,
    } = check(&args.config, &path)?;
    let exporter = Exporter::new(
        dest,
        ExportOptions {
            formats: gw.formats.clone(),
            ..ExportOptions::default()
        },
    )?;
    preflight::check().map_err(|e| CliError::Sandbox(SandboxError::Redirect(e.into())))?;
    let parts = Arc::new(AgentParts::build(config)?);
    if let Some(c) = &parts.capture {
        // Checked before registering, so the server knows at once whether
        // this node can reach its backends; then every interval.
        for b in c.backends() {
            let pool = b.pool();
            pool.check_health().await;
            let stats = pool.stats();
            let down: Vec<&str> = stats
                .replicas
                .iter()
                .filter(|r| !r.healthy)
                .map(|r| r.url.as_str())
                .collect();
            if !stats.replicas.is_empty() && down.len() == stats.replicas.len() {
                tracing::warn!(
                    backend = %stats.backend,
                    replicas = %down.join(", "),
                    "no replica of the backend answered GET /health: the rollout server sends this node no session until one does"
                );
            } else if !down.is_empty() {
                tracing::warn!(backend = %stats.backend, unhealthy = %down.join(", "), "some replicas of the backend did not answer GET /health");
            }
        }
        c.spawn_health_checks();
    }
    parts.serve_base_url().await.map_err(io("base-URL mode"))?;
    let redirect = Arc::new(
        Redirect::start(&RedirectOptions {
            reaper_exe: std::env::current_exe().ok(),
            sandboxes: Some(polar_sandbox::runtime::steps::sandboxes_dir(
                &parts.config.agent.state_dir,
            )),
        })
        .map_err(|e| CliError::Sandbox(SandboxError::Redirect(e)))?,
    );
    let mut labels = serde_json::Map::new();
    labels.insert("polar_version".into(), env!("CARGO_PKG_VERSION").into());
    let opts = NodeOptions {
        node_id: gw.node_id.clone(),
        server_url: gw.server.clone(),
        token: gw.token.clone(),
        accept_tokens: gw.accept_tokens.clone(),
        advertise: gw.advertise.clone(),
        max_sessions: gw.max_sessions,
        heartbeat_interval: gw.heartbeat_interval,
        progress: polar_node::gateway::Progress::All,
        labels,
        limits: gw.serve_limits,
        tls: Some(tls),
    };
    // Failed sessions' directories are kept for a while, under a ceiling;
    // what an earlier run left is swept at once.
    let retention = Retention::new(&parts.config.agent.state_dir, gw.keep);
    parts
        .tasks
        .spawn(retention.clone().run(parts.tasks.shutdown_token()));
    let work = HarnessWork::new(
        Arc::clone(&parts),
        Arc::clone(&redirect),
        exporter,
        gw.agent_timeout,
        gw.node_id.clone(),
        gw.policy.clone(),
        retention.clone(),
    )
    .with_calls_export(gw.export_calls);
    let started = Node::start(opts, gw.listen, Stages::new(gw.limits), work).await;
    let node = match started {
        Ok(n) => n,
        Err(e) => {
            shutdown(&parts, redirect).await;
            return Err(start_error(e, &gw.node_id));
        }
    };
    {
        let (parts, redirect) = (Arc::clone(&parts), Arc::clone(&redirect));
        let export = node.work().exporter().counters();
        node.set_metrics(Arc::new(move |by_stage, queued| {
            crate::metrics::render(&crate::metrics::AgentMetrics {
                capture: parts.capture.as_ref().map(|c| &**c.store().stats()),
                proxy: Some(&parts.proxy.stats),
                redirect: Some(redirect.stats()),
                export: Some(&export),
                sessions_by_stage: by_stage,
                queue_depths: queued,
            })
        }));
    }
    {
        let (path, node_id) = (path.clone(), gw.node_id.clone());
        node.set_token_source(Arc::new(move || {
            read_tokens(&path, &node_id).map_err(|e| polar_io::chain(&e).to_string())
        }));
    }
    tracing::info!(node = %node.node_id(), listen = %node.local_addr(), export = %export, "gateway ready");
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(io("installing the SIGHUP handler"))?;
    let sig = loop {
        tokio::select! {
            sig = signals.recv() => break sig,
            _ = hup.recv() => {
                reload(&parts, &args.config);
                reload_tokens(&node, &path);
            }
        }
    };
    tracing::info!(signal = sig, grace = ?gw.drain_timeout, "stopping: draining the sessions");
    tokio::select! {
        () = node.drain(gw.drain_timeout) => {}
        s = signals.recv() => tracing::warn!(signal = s, "second signal: stopping at once"),
    }
    shutdown(&parts, redirect).await;
    Ok(ExitCode::SUCCESS)
}

/// What `polar agent` reads and checks of its configuration before it
/// creates anything.
pub(crate) struct Checked {
    /// The agent's tables.
    pub config: polar_config::Config,
    /// `[gateway]`, its token files read.
    pub gw: GatewayConfig,
    /// The gateway's TLS, its files loaded.
    pub tls: polar_rollout_api::tls::TlsConfigs,
    /// Where trajectories go, as written.
    pub export: String,
    /// Where trajectories go.
    pub dest: Destination,
}

/// Every check of the file `polar agent` makes before it creates anything
/// (`polar config check` runs this too): the agent's tables, `[gateway]`
/// and its token and TLS files, the policy's roots against the node's
/// secrets, the export destination, a uid for each session the node may
/// hold at once.
pub(crate) fn check(args: &ConfigArgs, path: &std::path::Path) -> Result<Checked, CliError> {
    let config = args.load()?;
    let mut gw = GatewayConfig::load(path)?.ok_or_else(|| {
        CliError::Usage(format!(
            "{}: no [gateway] table (the rollout server's URL, the node token...)",
            path.display()
        ))
    })?;
    gw.finish_tokens()?;
    let tls = gw.tls.configs().map_err(GatewayConfigError::from)?;
    // No policy root may hold or be inside the node's secrets.
    gw.policy
        .check_protected(
            &polar_node::gateway::config::policy_key(),
            &[
                ("state directory", config.agent.state_dir.as_path()),
                ("config file", path),
            ],
        )
        .map_err(GatewayConfigError::from)?;
    let export = gw.export.clone().unwrap_or_else(|| {
        config
            .agent
            .state_dir
            .join("trajectories")
            .display()
            .to_string()
    });
    let dest = Destination::parse(&export, &gw.s3)?;
    // A uid for each session the node holds at once.
    polar_sandbox::uids::RangeCheck::check_node(&config.sandbox.uids, gw.max_sessions)
        .map_err(polar_node::agent::AgentError::from)?;
    Ok(Checked {
        config,
        gw,
        tls,
        export,
        dest,
    })
}

/// SIGHUP: the routing rules of the file, now; a file that does not
/// check or a refused reload keeps the rules in force.
fn reload(parts: &AgentParts, config: &ConfigArgs) {
    match config.load() {
        Ok(new) => match parts.reload(new) {
            Ok(summary) => tracing::info!(%summary, "routing rules reloaded"),
            Err(e) => {
                tracing::error!(error = %polar_io::chain(&e), "reload refused; the rules in force stay")
            }
        },
        Err(e) => {
            tracing::error!(error = %polar_io::chain(&e), "reload: the configuration does not check; the rules in force stay")
        }
    }
}

/// SIGHUP: the gateway's tokens, read again from the file and the token
/// files (rotation); tokens that do not check keep the ones in force.
/// Other `[gateway]` changes apply at restart.
fn reload_tokens<W: polar_node::gateway::Work>(node: &Node<W>, path: &std::path::Path) {
    match read_tokens(path, node.node_id()) {
        Ok((token, accept)) => node.set_tokens(&token, accept),
        Err(e) => {
            tracing::error!(error = %polar_io::chain(&e), "gateway tokens not reloaded; the ones in force stay")
        }
    }
}

/// The node's tokens as the file at `path` and its token files say them
/// now, checked as at start (`(node token, accepted tokens)`): what SIGHUP
/// puts in force, and what the node reads by itself when the server
/// refuses its token or presents one it does not take. Blocks.
fn read_tokens(
    path: &std::path::Path,
    node_id: &str,
) -> Result<(String, Vec<String>), GatewayConfigError> {
    let gateway = KeyPath::root().key("gateway");
    let mut gw = GatewayConfig::load(path)?
        .ok_or_else(|| KeyError::new(gateway.clone(), "the [gateway] table is gone"))?;
    if gw.node_id != node_id {
        return Err(KeyError::new(
            gateway.key("node_id"),
            format!(
                "changed from {node_id:?} to {:?}: a node id changes at restart only",
                gw.node_id
            ),
        )
        .into());
    }
    gw.finish_tokens()?;
    Ok((gw.token, gw.accept_tokens))
}

async fn shutdown(parts: &AgentParts, redirect: Arc<Redirect>) {
    parts.tasks.drain(std::time::Duration::from_secs(2)).await;
    match Arc::try_unwrap(redirect) {
        Ok(r) => {
            if let Err(e) = r.shutdown() {
                tracing::warn!(error = %e, "detaching the redirect");
            }
        }
        Err(_) => tracing::warn!("sessions still hold the redirect; the reaper detaches it"),
    }
}

/// A start that failed: the server refusing the node's token (401) is an
/// authentication error (exit 4) naming the node and where its token
/// comes from; the rest as they are.
fn start_error(e: polar_node::gateway::NodeError, node_id: &str) -> CliError {
    use polar_rollout_api::ClientError;
    match e {
        polar_node::gateway::NodeError::Register {
            url,
            source:
                ClientError::Status {
                    status: http::StatusCode::UNAUTHORIZED,
                    message,
                    ..
                },
        } => CliError::Auth(format!(
            "the rollout server {url} refused this node's token for node `{node_id}`: {message}. \
             The token comes from gateway.token, token_file, token_dir or POLAR_GATEWAY_TOKEN; \
             the server takes the one in its rollout.node_tokens.{node_id}."
        )),
        other => other.into(),
    }
}
