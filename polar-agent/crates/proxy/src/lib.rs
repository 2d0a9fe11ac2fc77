//! The interception proxy: every redirected connection arrives here. Its
//! first bytes say what it is (TLS ClientHello with SNI, plain HTTP, other);
//! the routing rules say what to do with its host and port:
//!
//! - `model`: TLS is terminated with a leaf from Polar's CA and HTTP/1.1 or
//!   HTTP/2 is served; each request goes to the model pipeline;
//! - `pass`: the raw bytes are relayed to the original destination, when
//!   that is an address the route's name resolves to on the node or one
//!   the route lists ([`bind`]); any other is refused and logged;
//! - `deny`: the connection is closed and logged with its session.
//!
//! Every connection first takes its place under the fair shares
//! ([`shares`]: node-wide and per-session connection caps, then per-request
//! stream and body caps), base-URL connections included.
//!
//! The proxy knows nothing of trajectories: what a model request becomes is
//! the pipeline's business ([`pipeline::ModelPipeline`]); its capture stage
//! ([`capture`]) hands records to `polar-capture`. It knows nothing of
//! sandboxes or harnesses either: connections come from the accept loop of
//! `polar-redirect` with their session, and base-URL sessions are found
//! through [`base_url::SessionDirectory`].
#![forbid(unsafe_code)]

pub mod base_url;
pub(crate) mod bind;
pub(crate) mod body;
pub mod capture;
pub mod error;
pub mod forward;
pub mod http;
pub mod pipeline;
pub(crate) mod relay;
pub(crate) mod rewind;
pub mod shares;
pub mod sniff;
pub(crate) mod upstream_conn;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_rustls::TlsAcceptor;

use polar_config::{Config, Decision, Ipv4Cidr, LiveRules, RouteAction, Rules};
use polar_ids::SessionId;
use polar_redirect::dns::Answers;
use polar_redirect::listener::{Accepted, Handler};
use polar_tls::ServerConfigFactory;

use self::http::HttpLimits;
use self::pipeline::{ModelPipeline, RequestContext};
use self::rewind::Rewind;
use self::shares::{ConnPermit, ShareLimits, Shares};
use self::sniff::Sniffed;

/// A base-URL connection (host listener or a sandbox's base URL): counted
/// as handled and as a model connection, as a transparent one is.
pub fn count_base_url(stats: &ProxyStats) {
    stats.connections.fetch_add(1, Ordering::Relaxed);
    stats.model.fetch_add(1, Ordering::Relaxed);
}

/// Counters of the proxy.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Connections handled.
    pub connections: AtomicU64,
    /// Connections served as model APIs.
    pub model: AtomicU64,
    /// Connections relayed.
    pub passed: AtomicU64,
    /// Connections refused.
    pub denied: AtomicU64,
    /// TLS handshakes completed.
    pub tls_ok: AtomicU64,
    /// TLS handshakes failed.
    pub tls_failed: AtomicU64,
    /// Connections refused for a connection cap (node or session).
    pub over_limit: AtomicU64,
    /// Refusals by fair-share cap ([`shares::Cap`]).
    pub refused: shares::Refusals,
    /// Requests refused for naming, in `x-polar-session`, a session other
    /// than their connection's.
    pub session_mismatch_header: AtomicU64,
    /// Requests refused for carrying another session's key.
    pub session_mismatch_key: AtomicU64,
}

impl ProxyStats {
    /// Counts a request refused with `e` where it has a counter of its own
    /// (a session mismatch).
    pub fn count_error(&self, e: &error::ProxyError) {
        if let error::ProxyError::SessionMismatch { via, .. } = e {
            let c = match via {
                error::NamedBy::Header => &self.session_mismatch_header,
                error::NamedBy::Key => &self.session_mismatch_key,
            };
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The proxy's settings and shared state.
pub struct Proxy {
    rules: LiveRules,
    tls: ServerConfigFactory,
    pipeline: Arc<dyn ModelPipeline>,
    limits: HttpLimits,
    fake_range: Ipv4Cidr,
    shares: Arc<Shares>,
    answers: Arc<Answers>,
    /// Counters.
    pub stats: Arc<ProxyStats>,
}

/// What the proxy does with one connection, decided from its first bytes.
#[derive(Debug)]
struct Plan {
    host: Option<String>,
    tls: bool,
    decision: Decision,
    /// Where a pass may go.
    allowed: bind::Allowed,
}

impl Proxy {
    /// A proxy over validated config, a TLS factory and a pipeline.
    pub fn new(
        config: &Config,
        tls: ServerConfigFactory,
        pipeline: Arc<dyn ModelPipeline>,
    ) -> Self {
        Self::with_rules(config, LiveRules::new(config.rules.clone()), tls, pipeline)
    }

    /// A proxy following `rules` (replaced on a reload) instead of the
    /// configuration's.
    pub fn with_rules(
        config: &Config,
        rules: LiveRules,
        tls: ServerConfigFactory,
        pipeline: Arc<dyn ModelPipeline>,
    ) -> Self {
        let p = &config.proxy;
        let stats = Arc::new(ProxyStats::default());
        Self {
            rules,
            tls,
            pipeline,
            limits: HttpLimits {
                header_timeout: p.header_timeout,
                max_body_bytes: p.max_body_bytes,
                idle_timeout: p.idle_timeout,
            },
            fake_range: config.dns.fake_range,
            shares: Arc::new(Shares::new(ShareLimits::of(p), Arc::clone(&stats))),
            answers: Arc::new(Answers::new(config.dns.ttl_secs)),
            stats,
        }
    }

    /// What the node's resolver answered for passed names: the DNS
    /// responder records into it ([`polar_redirect::dns::Resolver::recording`]).
    pub fn answers(&self) -> &Arc<Answers> {
        &self.answers
    }

    /// The fair shares every connection and request goes through.
    pub fn shares(&self) -> &Arc<Shares> {
        &self.shares
    }

    /// A place for a connection of `session` under the connection caps,
    /// or `None` (logged and counted) when it must be closed.
    pub async fn admit(&self, session: Option<&SessionId>, peer: SocketAddr) -> Option<ConnPermit> {
        match self.shares.connection(session).await {
            Ok(p) => Some(p),
            Err(e) => {
                self.stats.over_limit.fetch_add(1, Ordering::Relaxed);
                // Counted on the metrics page; a flood must not flood the log too.
                tracing::debug!(session = ?session, %peer, error = %e, "connection refused; closing");
                None
            }
        }
    }

    /// The HTTP limits in force.
    pub fn limits(&self) -> HttpLimits {
        self.limits
    }

    /// The pipeline.
    pub fn pipeline(&self) -> Arc<dyn ModelPipeline> {
        Arc::clone(&self.pipeline)
    }

    /// The routing rules in force (a snapshot).
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.current()
    }

    /// The routing rules, as replaced on a reload.
    pub fn live_rules(&self) -> &LiveRules {
        &self.rules
    }

    fn is_fake(&self, ip: IpAddr) -> bool {
        let v4 = match ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(v6) => v6.to_ipv4_mapped(),
        };
        v4.is_some_and(|v4| self.fake_range.contains(v4))
    }

    fn plan(&self, conn: &Accepted, sniffed: &Sniffed) -> Plan {
        let (tls, seen_host) = match sniffed {
            Sniffed::Tls { sni } => (true, sni.clone()),
            Sniffed::Http { host } => (false, host.clone()),
            Sniffed::Other | Sniffed::Silent => (false, None),
        };
        // The name the harness used: SNI or Host header, else the name
        // behind the fake address it dialled.
        let host = seen_host.or_else(|| conn.host.clone());
        let orig = conn.orig.map(|o| o.0);
        let ip = orig.map(|o| o.ip()).filter(|ip| !self.is_fake(*ip));
        let port = orig.map_or(if tls { 443 } else { 80 }, |o| o.port());
        // One snapshot per connection: a reload does not change its decision.
        let rules = self.rules.current();
        let decision = rules.route(host.as_deref(), ip, port);
        let allowed = bind::allowed(&rules, &decision, host.as_deref());
        Plan {
            host,
            tls,
            decision,
            allowed,
        }
    }

    async fn serve_model(&self, conn: Accepted, prefix: bytes::Bytes, plan: Plan) {
        let RouteAction::Model {
            provider,
            backend,
            upstream,
        } = plan.decision.action.clone()
        else {
            return;
        };
        let fallback_ip = conn.orig.map(|o| o.0.ip());
        let ctx = Arc::new(RequestContext {
            session: conn.session.clone(),
            orig: conn.orig,
            host: plan.host.clone().unwrap_or_default(),
            peer: conn.peer,
            backend,
            upstream,
            provider,
            tls: plan.tls,
            upstream_conn: Some(Arc::new(upstream_conn::UpstreamConn::default())),
        });
        let io = Rewind::new(prefix, conn.stream);
        if plan.tls {
            let acceptor = TlsAcceptor::from(self.tls.for_connection(fallback_ip));
            let handshake =
                tokio::time::timeout(self.limits.header_timeout, acceptor.accept(io)).await;
            match handshake {
                Ok(Ok(tls)) => {
                    self.stats.tls_ok.fetch_add(1, Ordering::Relaxed);
                    http::serve(
                        tls,
                        ctx,
                        self.pipeline(),
                        self.limits,
                        Arc::clone(&self.shares),
                    )
                    .await;
                }
                Ok(Err(e)) => {
                    self.stats.tls_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(session = ?conn.session, host = ?plan.host, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    self.stats.tls_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(session = ?conn.session, host = ?plan.host, "TLS handshake timed out");
                }
            }
        } else {
            http::serve(
                io,
                ctx,
                self.pipeline(),
                self.limits,
                Arc::clone(&self.shares),
            )
            .await;
        }
    }

    async fn pass(&self, conn: Accepted, prefix: bytes::Bytes, dst: SocketAddr) {
        let session = conn.session.clone();
        match relay::relay(
            Rewind::new(prefix, conn.stream),
            dst,
            Duration::from_secs(10),
            self.limits.idle_timeout,
        )
        .await
        {
            Ok(r) => {
                tracing::debug!(session = ?session, %dst, up = r.up, down = r.down, idle_cut = r.idle_cut, "relay done")
            }
            Err(e) => tracing::warn!(session = ?session, %dst, error = %e, "relay failed"),
        }
    }

    /// Where a passed connection goes, or why it may not: its original
    /// destination when the route allows it ([`bind`]); for a fake address
    /// (a name the agent answers for), an address of the name, resolved on
    /// the node.
    async fn pass_destination(
        &self,
        conn: &Accepted,
        plan: &Plan,
    ) -> Result<SocketAddr, &'static str> {
        let orig = conn.orig.ok_or("no original destination")?.0;
        if self.is_fake(orig.ip()) {
            let host = plan
                .host
                .as_deref()
                .ok_or("a fake address without a name")?;
            let ip = self
                .answers
                .lookup(host)
                .await
                .ok()
                .and_then(|ips| ips.into_iter().next())
                .ok_or("the name does not resolve on the node")?;
            return Ok(SocketAddr::new(ip, orig.port()));
        }
        if plan.allowed.listed(orig.ip()) {
            return Ok(orig);
        }
        let Some(name) = plan.allowed.name() else {
            return Err("the dialled address is not the route's");
        };
        if self.answers.resolves_to(name, orig.ip()).await {
            Ok(orig)
        } else {
            Err("the dialled address is not one the route's name resolves to")
        }
    }
}

/// What a plain-HTTP client gets for a pass it may not make.
const REFUSED_HTTP: &[u8] = b"HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\n\
    content-length: 55\r\nconnection: close\r\n\r\n\
    polar: this address is not one the route's name allows\n";

impl Handler for Proxy {
    async fn handle(&self, mut conn: Accepted) {
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        let need_host = conn.host.is_none();
        let (prefix, sniffed) =
            sniff::sniff(&mut conn.stream, self.limits.header_timeout, need_host).await;
        if sniffed == Sniffed::Silent {
            tracing::debug!(session = ?conn.session, peer = %conn.peer, bytes = prefix.len(), "connection closed or silent before it said what it is");
            return;
        }
        // Connections that said what they are count against the caps; the
        // silent ones are bounded by the header timeout alone, so a flood of
        // half-open connections cannot lock others out.
        let Some(_slot) = self.admit(conn.session.as_ref(), conn.peer).await else {
            return;
        };
        let plan = self.plan(&conn, &sniffed);
        let orig = conn
            .orig
            .map(|o| o.to_string())
            .unwrap_or_else(|| "direct".into());
        let session = conn
            .session
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_else(|| "-".into());
        let rule = plan.decision.matched.to_string();
        match (&plan.decision.action, &sniffed) {
            (RouteAction::Model { .. }, Sniffed::Tls { .. } | Sniffed::Http { .. }) => {
                self.stats.model.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%session, orig_dst = %orig, host = ?plan.host, %rule, action = "model", "connection");
                self.serve_model(conn, prefix, plan).await;
            }
            (RouteAction::Pass, _) => match self.pass_destination(&conn, &plan).await {
                Ok(dst) => {
                    self.stats.passed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%session, orig_dst = %orig, host = ?plan.host, %rule, action = "pass", "connection");
                    self.pass(conn, prefix, dst).await;
                }
                Err(why) => {
                    self.stats.denied.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%session, orig_dst = %orig, host = ?plan.host, %rule, action = "deny", reason = why, "connection refused");
                    if matches!(sniffed, Sniffed::Http { .. }) {
                        let mut stream = conn.stream;
                        let _ =
                            tokio::io::AsyncWriteExt::write_all(&mut stream, REFUSED_HTTP).await;
                    }
                }
            },
            (action, _) => {
                self.stats.denied.fetch_add(1, Ordering::Relaxed);
                let why = if matches!(action, RouteAction::Model { .. }) {
                    "not TLS or HTTP"
                } else {
                    "denied by the routing rules"
                };
                tracing::warn!(%session, orig_dst = %orig, host = ?plan.host, %rule, action = "deny", reason = why, "connection refused");
            }
        }
    }
}
