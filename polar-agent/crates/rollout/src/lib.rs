//! The rollout control plane's server side (`polar rollout serve`): a
//! trainer submits a [`TaskRequest`]; the server creates one session per
//! sample, keeps everything in SQLite, pushes each session to the least
//! loaded healthy gateway node, collects results, and delivers them to the
//! task's callback URL. docs/ROLLOUT-API.md is the protocol.
//!
//! - the wire types, the checks naming the field, the client and the event
//!   stream reader are `polar-rollout-api`'s;
//! - `scheduler` (pure; `nodes`, `reports`, `views` inside): tasks,
//!   sessions, nodes, queue, dispatch choice,
//!   retries, early stop, deadlines;
//! - `store`: SQLite (WAL, migrations, group commit, events after commit);
//! - `core`: the scheduler + store + background work (dispatcher, ticker,
//!   pushes, cancellations); `callback`: result delivery with backoff;
//! - `server`: HTTP endpoints and error mapping (its route table is
//!   `polar-rollout-api`'s `route`, shared with the gateway); `events`: the
//!   event stream; `metrics`: `/metrics`; `report`: text for the CLI;
//! - `config`: the `[rollout]` settings;
//! - `ui`: the dashboard (`/ui`): its embedded files, the sample and
//!   exported-trajectory endpoints it reads, `[rollout.dashboard]`.
//!
//! Layering: above `polar-rollout-api`, `polar-spec`, `polar-metrics` and
//! `polar-io`; the only crate with `rusqlite`. Tests: `tests/` (API,
//! dispatch, failures, routes) and `scheduler/tests.rs`, against
//! `polar-gateway`'s simulated gateway; benchmark: `benches/rollout.rs`.
#![forbid(unsafe_code)]

mod callback;
pub mod config;
pub mod core;
mod events;
mod metrics;
pub mod report;
mod scheduler;
mod server;

mod store;
pub mod ui;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use polar_spec::{KeyError, KeyPath};

pub use config::{RolloutConfig, RolloutConfigError};
pub use store::StoreError;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// The settings are invalid (the TLS settings included, or their files
    /// do not load).
    #[error(transparent)]
    Config(#[from] RolloutConfigError),
    /// The route table does not build (a bug).
    #[error(transparent)]
    Routes(#[from] polar_rollout_api::route::RouteError),
    /// The database could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The listen address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A running rollout server. Dropping it stops it ([`RolloutServer::abort`]).
#[derive(Debug)]
pub struct RolloutServer {
    core: Arc<core::Core>,
    addr: SocketAddr,
    https: bool,
}

impl Drop for RolloutServer {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Everything [`RolloutServer::start`] refuses before it binds anything
/// (`polar config check` runs this too): bad identities, plain HTTP on an
/// address that is not loopback without `rollout.tls.allow_plain_http`,
/// TLS files that do not load, a `[rollout.dashboard] tokenizer` that does
/// not load (loaded into `cfg`). Blocking: it reads files.
pub fn preflight(
    cfg: &mut RolloutConfig,
) -> Result<polar_rollout_api::tls::TlsConfigs, RolloutError> {
    cfg.check_identities()?;
    cfg.tls
        .check_listen("rollout.listen", cfg.listen)
        .map_err(RolloutConfigError::from)?;
    let tls = cfg.tls.configs().map_err(RolloutConfigError::from)?;
    cfg.dashboard
        .load_tokenizer()
        .map_err(|e| RolloutConfigError::from(e.under(&KeyPath::dotted("rollout.dashboard"))))?;
    Ok(tls)
}

impl RolloutServer {
    /// Opens the database (restoring its state), binds `cfg.listen` (port 0
    /// picks one) and starts serving (HTTPS with `rollout.tls.cert_file`).
    /// Refused before anything is bound: bad identities, TLS files that do
    /// not load, plain HTTP on an address that is not loopback without
    /// `rollout.tls.allow_plain_http`, a `[rollout.dashboard] tokenizer`
    /// that does not load.
    pub async fn start(cfg: RolloutConfig) -> Result<Self, RolloutError> {
        let checked = tokio::task::spawn_blocking(move || {
            let mut cfg = cfg;
            preflight(&mut cfg).map(|tls| (cfg, tls))
        })
        .await;
        let (cfg, tls) = match checked {
            Ok(checked) => checked?,
            Err(e) => {
                return Err(RolloutConfigError::from(KeyError::new(
                    KeyPath::dotted("rollout"),
                    format!("the start-up checks did not finish: {e}"),
                ))
                .into());
            }
        };
        let routes = server::routes()?;
        let listen = cfg.listen;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| RolloutError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| RolloutError::Bind {
            addr: listen,
            source,
        })?;
        let (core, restored) = core::Core::open(cfg, tls.client)?;
        core.start_loops();
        core.follow_up(restored);
        let api = Arc::new(server::Api::new(Arc::clone(&core), routes));
        let https = tls.server.is_some();
        core.tasks.spawn(server::serve(api, listener, tls.server));
        tracing::info!(%addr, https, database = %core.cfg.database.display(), "rollout server listening");
        Ok(Self { core, addr, https })
    }

    /// Puts new tokens in force (rotation): `cfg` is the server's
    /// settings after [`RolloutConfig::reload_tokens`]; only its tokens
    /// are taken. Requests in flight finish with the old ones.
    pub fn set_tokens(&self, cfg: &RolloutConfig) -> Result<(), RolloutError> {
        cfg.check_identities()?;
        self.core.set_tokens(cfg);
        tracing::info!(
            trainers = cfg.tokens.len(),
            nodes = cfg.node_tokens.len(),
            "rollout tokens reloaded"
        );
        Ok(())
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{addr}`, or `https://{addr}` when serving TLS.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Stops: no new connections, background work cancelled (assignments
    /// not yet pushed are pushed again by the next start; callbacks resume),
    /// database closed. Nothing acknowledged is lost.
    pub async fn shutdown(self) {
        self.core.shutdown(Duration::from_secs(3)).await;
    }

    /// Stops at once, as a crash would, but closing the database cleanly:
    /// background work is cancelled where it stands. Dropping the server
    /// does the same.
    pub fn abort(&self) {
        self.core.tasks.shutdown_token().cancel();
        self.core.close_store();
    }

    /// Runs until `stop` fires, then shuts down.
    pub async fn run_until(self, stop: impl std::future::Future<Output = ()>) {
        stop.await;
        tracing::info!("rollout server stopping");
        self.shutdown().await;
    }
}
