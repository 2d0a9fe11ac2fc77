//! `polar proxy`: the agent in base-URL mode only — no sandbox, no redirect,
//! no root. Harnesses (or tests) given the listener as their base URL are
//! served by the capture stage for the sessions named with `--session`.
//! Prints `listening on ADDR` on stdout once it accepts connections; runs
//! until SIGINT or SIGTERM, then lets streamed replies finish.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use super::{CliError, ConfigArgs};
use polar_capture::SessionInfo;
use polar_ids::SessionId;
use polar_node::agent::AgentParts;

/// Arguments of `polar proxy`.
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// The configuration (backends, routes, limits, state directory).
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Where to listen (default: `proxy.base_url_listen`); port 0 picks a
    /// free port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// A session to accept (repeatable). Requests prove it with its id as
    /// their API key (or in `x-polar-key`); `x-polar-session` alone is not
    /// enough. `polar proxy` runs no sandbox: every client is the
    /// operator's own, so the id is the key.
    #[arg(long = "session", required = true)]
    pub sessions: Vec<SessionId>,
    /// The task the sessions belong to (stamped on their records).
    #[arg(long)]
    pub task: Option<String>,
    /// How long streamed replies may take to finish after a stop signal, in
    /// ms.
    #[arg(long, default_value_t = 10_000)]
    pub drain_ms: u64,
}

/// Runs `polar proxy`.
pub async fn run(args: ProxyArgs) -> Result<ExitCode, CliError> {
    let config = args.config.load()?;
    let Some(addr) = args.listen.or(config.proxy.base_url_listen) else {
        return Err(CliError::Usage(
            "no address to listen on: give --listen or set proxy.base_url_listen".into(),
        ));
    };
    let mut terminated = polar_sandbox::signals::Terminated::install();
    let parts = AgentParts::build(config)?;
    for s in &args.sessions {
        parts.sessions.register(s, Some(s.as_str()));
        let info = SessionInfo {
            task_id: args.task.clone(),
            ..SessionInfo::default()
        };
        parts.registry.register(s, info);
    }
    if let Some(c) = &parts.capture {
        c.spawn_health_checks();
    }
    let local = parts
        .serve_base_url_on(addr)
        .await
        .map_err(|e| CliError::Io(format!("binding {addr}"), e))?;
    let tasks = parts.tasks.clone();
    tracing::info!(%local, sessions = args.sessions.len(), "base-URL proxy listening");
    std::io::Write::write_all(
        &mut std::io::stdout(),
        format!("listening on {local}\n").as_bytes(),
    )?;
    let signal = terminated.recv().await;
    tracing::info!(signal, "stopping; letting replies finish");
    let drained = tasks.drain(Duration::from_millis(args.drain_ms)).await;
    if !drained {
        tracing::warn!("some replies were still running at the end of the drain");
    }
    Ok(ExitCode::SUCCESS)
}
