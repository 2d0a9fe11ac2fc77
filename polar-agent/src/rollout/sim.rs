//! A simulated gateway node for tests and benchmarks: it speaks the
//! gateway side of the protocol for real (HTTP on loopback: register,
//! heartbeat, accept pushed assignments, take cancellations, report
//! progress and results), but "runs" each session by sleeping for a
//! configurable time and reports a reward and token counts chosen by a
//! function of the assignment. [`SimGateway::kill`] makes it vanish at once
//! (no more heartbeats, no results, its port closed), to test
//! re-dispatch.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::client::{ClientError, RolloutClient};
use super::http::{Body, bearer, error, json, read_body, token_ok};
use super::types::{
    API_VERSION, CancelSession, Heartbeat, NodeCapacity, NodeRegistration, SampleStatus,
    SessionAssignment, SessionProgress, SessionResult, StageLoad, TokenUsage,
};
use super::validate;
use crate::tasks::Tasks;

/// What a simulated session ends with.
#[derive(Clone, Debug, PartialEq)]
pub struct SimOutcome {
    /// Reported status.
    pub status: SampleStatus,
    /// Reported reward.
    pub reward: Option<f64>,
    /// Reported token counts.
    pub tokens: TokenUsage,
    /// How long the session "runs" (the gateway's default when `None`).
    pub run_for: Option<Duration>,
    /// Ask the server to dispatch the session again.
    pub retry: bool,
}

/// Chooses a session's outcome.
pub type OutcomeFn = Arc<dyn Fn(&SessionAssignment) -> SimOutcome + Send + Sync>;

/// The default outcome: completed, reward `1 / (1 + sample_index)`, token
/// counts that depend on the index.
pub fn default_outcome(a: &SessionAssignment) -> SimOutcome {
    SimOutcome {
        status: SampleStatus::Completed,
        reward: Some(1.0 / f64::from(1 + a.sample_index)),
        tokens: TokenUsage {
            prompt: 100 + u64::from(a.sample_index),
            response: 50 + u64::from(a.sample_index),
            calls: 3,
        },
        run_for: None,
        retry: false,
    }
}

/// Settings of a simulated gateway.
#[derive(Clone)]
pub struct SimGatewayConfig {
    /// The node id.
    pub node_id: String,
    /// The rollout server's base URL.
    pub server_url: String,
    /// The token presented to the server (a node token).
    pub token: String,
    /// The token the server must present (its gateway token).
    pub accept_token: String,
    /// Sessions held at once.
    pub max_sessions: u32,
    /// How long a session "runs".
    pub session_time: Duration,
    /// Spread of the run time: each session runs `session_time` times a
    /// random factor in `[1 - jitter, 1 + jitter]` (0 for exactly).
    pub jitter: f64,
    /// Heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Report the `running` stage before the result.
    pub report_progress: bool,
    /// The outcome of each session.
    pub outcome: OutcomeFn,
}

impl std::fmt::Debug for SimGatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGatewayConfig")
            .field("node_id", &self.node_id)
            .field("server_url", &self.server_url)
            .field("max_sessions", &self.max_sessions)
            .field("session_time", &self.session_time)
            .finish_non_exhaustive()
    }
}

impl SimGatewayConfig {
    /// Defaults: 16 sessions of 50 ms, heartbeat every 50 ms, the same
    /// token both ways, [`default_outcome`].
    pub fn new(node_id: &str, server_url: &str, token: &str) -> Self {
        Self {
            node_id: node_id.to_owned(),
            server_url: server_url.to_owned(),
            token: token.to_owned(),
            accept_token: token.to_owned(),
            max_sessions: 16,
            session_time: Duration::from_millis(50),
            jitter: 0.0,
            heartbeat_interval: Duration::from_millis(50),
            report_progress: true,
            outcome: Arc::new(default_outcome),
        }
    }
}

/// Why the simulated gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Its listener could not be bound.
    #[error("binding the simulated gateway: {0}")]
    Bind(#[source] std::io::Error),
    /// The server refused its registration.
    #[error("registering the simulated gateway: {0}")]
    Register(#[source] ClientError),
}

/// An assignment as the simulated gateway received it.
#[derive(Clone, Debug)]
pub struct Received {
    /// The assignment.
    pub assignment: SessionAssignment,
    /// When it arrived.
    pub at: Instant,
}

struct Held {
    attempt: u32,
    stop: CancellationToken,
}

struct Inner {
    cfg: SimGatewayConfig,
    client: RolloutClient,
    instance: String,
    address: String,
    held: Mutex<HashMap<String, Held>>,
    received: Mutex<Vec<Received>>,
    cancelled: Mutex<Vec<String>>,
    reported: AtomicU64,
    tasks: Tasks,
}

/// A running simulated gateway.
pub struct SimGateway {
    inner: Arc<Inner>,
    addr: SocketAddr,
}

impl std::fmt::Debug for SimGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGateway")
            .field("node_id", &self.inner.cfg.node_id)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl SimGateway {
    /// Binds 127.0.0.1 on a free port, registers with the server and starts
    /// heartbeating.
    pub async fn start(cfg: SimGatewayConfig) -> Result<Self, SimError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(SimError::Bind)?;
        let addr = listener.local_addr().map_err(SimError::Bind)?;
        let client = RolloutClient::new(cfg.server_url.clone(), Some(cfg.token.clone()))
            .with_timeout(Duration::from_secs(5));
        let inner = Arc::new(Inner {
            client,
            instance: format!("sim-{:016x}", rand::random::<u64>()),
            address: format!("http://{addr}"),
            cfg,
            held: Mutex::new(HashMap::new()),
            received: Mutex::new(Vec::new()),
            cancelled: Mutex::new(Vec::new()),
            reported: AtomicU64::new(0),
            tasks: Tasks::new(),
        });
        let i = Arc::clone(&inner);
        inner.spawn(async move { accept(i, listener).await });
        inner.register().await.map_err(SimError::Register)?;
        let i = Arc::clone(&inner);
        inner.spawn(async move { i.heartbeats().await });
        Ok(Self { inner, addr })
    }

    /// The node id.
    pub fn node_id(&self) -> &str {
        &self.inner.cfg.node_id
    }

    /// Its base URL.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// Every assignment received (repeats included), in arrival order.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.inner.received).clone()
    }

    /// Sessions it was told to cancel.
    pub fn cancelled(&self) -> Vec<String> {
        lock(&self.inner.cancelled).clone()
    }

    /// Results the server accepted from it.
    pub fn reported(&self) -> u64 {
        self.inner.reported.load(Ordering::Relaxed)
    }

    /// Sessions held now.
    pub fn holding(&self) -> usize {
        lock(&self.inner.held).len()
    }

    /// Vanishes at once: no more heartbeats or results, the port closes,
    /// held sessions are dropped unreported.
    pub fn kill(&self) {
        self.inner.tasks.shutdown_token().cancel();
    }

    /// Kills it and waits for its tasks to end.
    pub async fn stop(self) {
        self.kill();
        let _ = self.inner.tasks.drain(Duration::from_secs(2)).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        let stop = self.tasks.shutdown_token();
        self.tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = fut => {}
            }
        });
    }

    fn registration(&self) -> NodeRegistration {
        let c = &self.cfg;
        NodeRegistration {
            version: API_VERSION,
            node_id: c.node_id.clone(),
            address: self.address.clone(),
            instance: self.instance.clone(),
            capacity: NodeCapacity {
                max_sessions: c.max_sessions,
                stages: [("running".to_owned(), c.max_sessions)]
                    .into_iter()
                    .collect(),
            },
            labels: serde_json::Map::from_iter([("simulated".to_owned(), json!(true))]),
        }
    }

    async fn register(&self) -> Result<(), ClientError> {
        self.client.register(&self.registration()).await.map(|_| ())
    }

    async fn heartbeats(self: Arc<Self>) {
        let mut every = tokio::time::interval(self.cfg.heartbeat_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let sessions: Vec<String> = lock(&self.held).keys().cloned().collect();
            let active = u32::try_from(sessions.len()).unwrap_or(u32::MAX);
            let hb = Heartbeat {
                instance: Some(self.instance.clone()),
                active,
                stages: [("running".to_owned(), StageLoad { queued: 0, active })]
                    .into_iter()
                    .collect(),
                draining: false,
                sessions: Some(sessions),
            };
            match self.client.heartbeat(&self.cfg.node_id, &hb).await {
                Ok(reply) => {
                    for c in reply.cancel {
                        self.cancel_local(&c.session_id, None);
                    }
                }
                Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => {
                    if let Err(e) = self.register().await {
                        tracing::debug!(error = %e, "simulated gateway: register again failed");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "simulated gateway: heartbeat failed"),
            }
        }
    }

    /// Stops a held session; `attempt` must match when given.
    fn cancel_local(&self, sid: &str, attempt: Option<u32>) -> bool {
        let mut held = lock(&self.held);
        match held.get(sid) {
            Some(h) if attempt.is_none_or(|a| a == h.attempt) => {
                h.stop.cancel();
                held.remove(sid);
                lock(&self.cancelled).push(sid.to_owned());
                true
            }
            _ => false,
        }
    }

    fn accept_assignment(self: &Arc<Self>, a: SessionAssignment) -> Response<Body> {
        let stop = CancellationToken::new();
        {
            let mut held = lock(&self.held);
            if let Some(h) = held.get(&a.session_id) {
                if h.attempt == a.attempt {
                    return json(StatusCode::OK, &json!({"duplicate": true}));
                }
                h.stop.cancel();
            } else if held.len() >= self.cfg.max_sessions as usize {
                return error(StatusCode::SERVICE_UNAVAILABLE, "full", None, "at capacity");
            }
            held.insert(
                a.session_id.clone(),
                Held {
                    attempt: a.attempt,
                    stop: stop.clone(),
                },
            );
        }
        lock(&self.received).push(Received {
            assignment: a.clone(),
            at: Instant::now(),
        });
        let me = Arc::clone(self);
        self.spawn(async move { me.run(a, stop).await });
        json(StatusCode::ACCEPTED, &json!({"accepted": true}))
    }

    async fn run(self: Arc<Self>, a: SessionAssignment, stop: CancellationToken) {
        let outcome = (self.cfg.outcome)(&a);
        if self.cfg.report_progress {
            let p = SessionProgress {
                node_id: self.cfg.node_id.clone(),
                attempt: a.attempt,
                stage: "running".into(),
            };
            let _ = self.client.progress(&a.session_id, &p).await;
        }
        let run_for = outcome.run_for.unwrap_or_else(|| {
            let j = self.cfg.jitter.clamp(0.0, 1.0);
            self.cfg
                .session_time
                .mul_f64(1.0 - j + 2.0 * j * rand::random::<f64>())
        });
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(run_for) => {}
        }
        let result = SessionResult {
            node_id: self.cfg.node_id.clone(),
            attempt: a.attempt,
            status: outcome.status,
            reward: outcome.reward,
            trajectory_uri: Some(format!("sim://{}/{}.json", self.cfg.node_id, a.session_id)),
            tokens: outcome.tokens,
            error: (outcome.status != SampleStatus::Completed)
                .then(|| format!("simulated {}", outcome.status.as_str())),
            stats: Some(json!({"simulated_ms": run_for.as_millis() as u64})),
            retry: outcome.retry,
        };
        // The slot is free once the work is done; then report until the
        // server takes the result or refuses it for good (it may be
        // restarting).
        {
            let mut held = lock(&self.held);
            if held
                .get(&a.session_id)
                .is_some_and(|h| h.attempt == a.attempt)
            {
                held.remove(&a.session_id);
            }
        }
        let mut wait = Duration::from_millis(20);
        loop {
            if stop.is_cancelled() {
                return;
            }
            match self.client.result(&a.session_id, &result).await {
                Ok(_) => {
                    self.reported.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(e)
                    if matches!(
                        e.status(),
                        Some(
                            StatusCode::CONFLICT | StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST
                        )
                    ) =>
                {
                    tracing::debug!(session = %a.session_id, error = %e, "simulated gateway: result refused");
                    break;
                }
                Err(e) => {
                    tracing::debug!(session = %a.session_id, error = %e, "simulated gateway: result not delivered, retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(500));
                }
            }
        }
    }
}

async fn accept(inner: Arc<Inner>, listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let i = Arc::clone(&inner);
        inner.spawn(async move {
            let service = service_fn(move |req| {
                let i = Arc::clone(&i);
                async move { Ok::<_, Infallible>(handle(i, req).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(inner: Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    if !token_ok(
        bearer(req.headers()),
        std::slice::from_ref(&inner.cfg.accept_token),
    ) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            None,
            "missing or wrong bearer token",
        );
    }
    let path = req.uri().path().to_owned();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    let Some(bytes) = read_body(req.into_body(), 8 << 20).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            None,
            "body too large",
        );
    };
    match (method, segs.as_slice()) {
        (Method::POST, ["v1", "sessions"]) => match validate::parse::<SessionAssignment>(&bytes) {
            Ok(a) => inner.accept_assignment(a),
            Err(e) => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                Some(&e.field),
                &e.to_string(),
            ),
        },
        (Method::POST, ["v1", "sessions", sid, "cancel"]) => {
            match validate::parse::<CancelSession>(&bytes) {
                Ok(c) if inner.cancel_local(sid, Some(c.attempt)) => {
                    json(StatusCode::OK, &json!({"cancelled": true}))
                }
                Ok(_) => error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    None,
                    "no such session here",
                ),
                Err(e) => error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    Some(&e.field),
                    &e.to_string(),
                ),
            }
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", None, "no route"),
    }
}
