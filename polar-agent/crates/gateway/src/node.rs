//! The gateway side of the rollout protocol (docs/ROLLOUT-API.md), generic
//! over the [`Work`] its sessions do: register with the server (again after
//! a server restart), heartbeat with the load of each stage and the
//! sessions held (the server answers with cancellations), accept pushed
//! assignments up to `max_sessions`, take cancellations, report each
//! session's stage (with the calls that ended meanwhile, for a live
//! timeline) and its result (retried with backoff until the server
//! takes it or refuses it for good), drain. Its HTTP routes and views are
//! in `http.rs`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Response, StatusCode};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::stages::{Job, Report, Stage, Stages, Work};
use polar_io::tasks::{Tasks, caught};
use polar_rollout_api::client::{ClientError, RolloutClient};
use polar_rollout_api::http::{Body, error, json};
use polar_rollout_api::serve::ServeLimits;
use polar_rollout_api::tls::TlsConfigs;
use polar_rollout_api::{
    API_VERSION, Heartbeat, MAX_LIVE_CALLS, NodeCapacity, NodeRegistration, SessionAssignment,
    SessionProgress, SessionResult,
};

/// How often a running session's new calls are reported.
const LIVE_CALLS_EVERY: Duration = Duration::from_secs(1);

/// How long a starting node keeps trying to reach its server.
const REGISTER_PATIENCE: Duration = Duration::from_secs(60);

/// How a node talks to its server.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// The node id.
    pub node_id: String,
    /// The rollout server's base URL.
    pub server_url: String,
    /// The token presented to the server.
    pub token: String,
    /// Tokens the server may present.
    pub accept_tokens: Vec<String>,
    /// The URL the server pushes to (`None`: `http://{bound address}`).
    pub advertise: Option<String>,
    /// Sessions held at once.
    pub max_sessions: u32,
    /// Heartbeat interval until the server says otherwise.
    pub heartbeat_interval: Duration,
    /// Which stages are reported to the server as sessions enter them.
    pub progress: Progress,
    /// Labels sent with the registration.
    pub labels: serde_json::Map<String, serde_json::Value>,
    /// The accept loop's header-read timeout and connection cap.
    pub limits: ServeLimits,
    /// HTTPS and the client side's CA and certificate (`None`: plain HTTP,
    /// the system's roots for an `https://` server).
    pub tls: Option<TlsConfigs>,
}

/// The tokens in force (replaced whole when they rotate).
#[derive(Debug)]
pub(super) struct Tokens {
    /// Tokens the server may present.
    pub(super) accept: Vec<String>,
    /// The client presenting the node token.
    pub(super) client: RolloutClient,
}

/// Which stage changes a node reports (`POST /v1/sessions/{id}/state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// None: the server sees the session dispatched, then done.
    None,
    /// Only the start of RUNNING.
    Running,
    /// Every stage: `init`, `ready`, `running`, `postrun`.
    All,
}

impl Progress {
    fn reports(self, stage: Stage) -> bool {
        match self {
            Self::None => false,
            Self::Running => stage == Stage::Running,
            Self::All => stage != Stage::Queued,
        }
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The route table does not build (a bug).
    #[error(transparent)]
    Routes(#[from] polar_rollout_api::route::RouteError),
    /// Its listener could not be bound.
    #[error("binding the gateway's listener {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server refused the registration.
    #[error("registering with the rollout server {url}: {source}")]
    Register {
        /// The server.
        url: String,
        /// Why.
        #[source]
        source: ClientError,
    },
}

/// An assignment as the node received it (kept for tests only).
#[cfg(any(test, feature = "test-hooks"))]
#[derive(Clone, Debug)]
pub struct Received {
    /// The assignment.
    pub assignment: SessionAssignment,
    /// When it arrived.
    pub at: Instant,
}

/// The agent's metrics page for `GET /metrics`, given the node's sessions
/// by stage and queue depth per stage (see [`crate::metrics::render`]); the
/// node appends its own counters.
pub type MetricsFn = Arc<dyn Fn(&[(&str, u64)], &[(&str, u64)]) -> String + Send + Sync>;

pub(super) struct Inner<W: Work> {
    pub(super) opts: NodeOptions,
    pub(super) work: W,
    pub(super) stages: Stages,
    pub(super) tokens: std::sync::RwLock<Arc<Tokens>>,
    /// Where the tokens are read again when they may have rotated
    /// (`tokens.rs`), and when they last were.
    pub(super) token_source: Mutex<Option<crate::tokens::TokenSource>>,
    pub(super) tokens_read_at: Mutex<Option<Instant>>,
    pub(super) instance: String,
    pub(super) address: String,
    pub(super) held: Mutex<HashMap<String, Arc<Job>>>,
    /// Every assignment taken, in arrival order (tests only).
    #[cfg(any(test, feature = "test-hooks"))]
    received: Mutex<Vec<Received>>,
    /// Every session cancelled here (tests only).
    #[cfg(any(test, feature = "test-hooks"))]
    cancelled: Mutex<Vec<String>>,
    pub(super) reported: AtomicU64,
    pub(super) finished: AtomicU64,
    /// Sessions whose task has not ended (held, or reporting its result).
    pub(super) live: AtomicU64,
    pub(super) draining: AtomicBool,
    /// The server asks it to drain (its heartbeat replies say so until the
    /// server lifts it: then the node takes sessions again, unless it is
    /// stopping itself, `draining`).
    pub(super) server_drain: AtomicBool,
    /// The policy version the last resume named (sent in heartbeats).
    pub(super) policy_version: Mutex<Option<String>>,
    /// Sessions' lifetimes (stopped at once by [`Node::kill`]).
    pub(super) tasks: Tasks,
    pub(super) extra_metrics: Mutex<Option<MetricsFn>>,
    /// The HTTP routes, built once.
    pub(super) routes: super::http::Routes,
}

/// A running gateway node.
pub struct Node<W: Work> {
    inner: Arc<Inner<W>>,
    addr: SocketAddr,
}

impl<W: Work> std::fmt::Debug for Node<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node_id", &self.inner.opts.node_id)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<W: Work> Node<W> {
    pub(super) fn inner(&self) -> &Inner<W> {
        &self.inner
    }

    /// Binds `listen` (port 0 picks one), registers with the server and
    /// starts heartbeating.
    pub async fn start(
        opts: NodeOptions,
        listen: SocketAddr,
        stages: Stages,
        work: W,
    ) -> Result<Self, NodeError> {
        let routes = super::http::routes()?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| NodeError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| NodeError::Bind {
            addr: listen,
            source,
        })?;
        let mut client = RolloutClient::new(opts.server_url.clone(), Some(opts.token.clone()))
            .with_timeout(Duration::from_secs(10));
        if let Some(tls) = &opts.tls {
            client = client.with_tls(tls.client.clone());
        }
        let server_tls = opts.tls.as_ref().and_then(|t| t.server.clone());
        let scheme = if server_tls.is_some() {
            "https"
        } else {
            "http"
        };
        let inner = Arc::new(Inner {
            tokens: std::sync::RwLock::new(Arc::new(Tokens {
                accept: opts.accept_tokens.clone(),
                client,
            })),
            token_source: Mutex::new(None),
            tokens_read_at: Mutex::new(None),
            instance: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()),
            address: opts
                .advertise
                .clone()
                .unwrap_or_else(|| format!("{scheme}://{addr}")),
            opts,
            work,
            stages,
            held: Mutex::new(HashMap::new()),
            #[cfg(any(test, feature = "test-hooks"))]
            received: Mutex::new(Vec::new()),
            #[cfg(any(test, feature = "test-hooks"))]
            cancelled: Mutex::new(Vec::new()),
            reported: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            live: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            server_drain: AtomicBool::new(false),
            policy_version: Mutex::new(None),
            tasks: Tasks::new(),
            extra_metrics: Mutex::new(None),
            routes,
        });
        let i = Arc::clone(&inner);
        inner.spawn(async move { super::http::accept(i, listener, server_tls).await });
        if let Err(source) = inner.register_at_start().await {
            inner.tasks.shutdown_token().cancel();
            let _ = inner.tasks.drain(Duration::from_secs(2)).await;
            return Err(NodeError::Register {
                url: inner.opts.server_url.clone(),
                source,
            });
        }
        tracing::info!(node = %inner.opts.node_id, address = %inner.address, server = %inner.opts.server_url, "gateway registered");
        let i = Arc::clone(&inner);
        inner.spawn(async move { i.heartbeats().await });
        Ok(Self { inner, addr })
    }

    /// The node id.
    pub fn node_id(&self) -> &str {
        &self.inner.opts.node_id
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL the server pushes to.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// The pipeline.
    pub fn stages(&self) -> &Stages {
        &self.inner.stages
    }

    /// The work.
    pub fn work(&self) -> &W {
        &self.inner.work
    }

    /// Renders `GET /metrics` with the agent's counters.
    pub fn set_metrics(&self, f: MetricsFn) {
        *lock(&self.inner.extra_metrics) = Some(f);
    }

    /// Every assignment taken, in arrival order; a session taken again
    /// counts again (tests only).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn received(&self) -> Vec<Received> {
        lock(&self.inner.received).clone()
    }

    /// Sessions it was told to cancel (tests only).
    #[cfg(any(test, feature = "test-hooks"))]
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

    /// Sessions the node still keeps anything of (assignment, instruction,
    /// stop token): held, or reporting their result. A session is
    /// forgotten once the server acknowledged (or refused for good) its
    /// result, so this is 0 when every result was taken.
    pub fn remembered(&self) -> u64 {
        self.inner.live.load(Ordering::Relaxed)
    }

    /// Vanishes at once, as a crash would: no more heartbeats or results,
    /// the port closes, held sessions are dropped unreported.
    pub fn kill(&self) {
        self.inner.tasks.shutdown_token().cancel();
    }

    /// Drains: takes no new session, lets the held ones finish for up to
    /// `grace`, then stops the rest and hands them back to the server
    /// (reported as errors to dispatch again), and stops.
    pub async fn drain(self, grace: Duration) {
        let inner = &self.inner;
        inner.draining.store(true, Ordering::Relaxed);
        inner.heartbeat_once().await;
        let until = Instant::now() + grace;
        while inner.live.load(Ordering::Relaxed) > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let left: Vec<Arc<Job>> = lock(&inner.held).values().cloned().collect();
        if !left.is_empty() {
            tracing::warn!(
                sessions = left.len(),
                "drain grace over; handing the remaining sessions back"
            );
        }
        for job in &left {
            let report = Report {
                error: Some("the gateway stopped (drain grace over)".into()),
                retry: true,
                ..Report::new(polar_rollout_api::SampleStatus::Error)
            };
            inner.deliver(job, &report).await;
            job.stop.cancel();
        }
        // Sessions stopped above still tear down in POSTRUN.
        let until = Instant::now() + Duration::from_secs(30);
        while inner.live.load(Ordering::Relaxed) > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill();
        let _ = inner.tasks.drain(Duration::from_secs(5)).await;
    }

    /// Kills it and waits for its tasks to end.
    pub async fn stop(self) {
        self.kill();
        let _ = self.inner.tasks.drain(Duration::from_secs(2)).await;
    }
}

impl<W: Work> Inner<W> {
    /// The tokens in force.
    pub(super) fn tokens(&self) -> Arc<Tokens> {
        Arc::clone(&self.tokens.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The client of the server, with the node token in force.
    pub(super) fn client(&self) -> RolloutClient {
        self.tokens().client.clone()
    }

    pub(super) fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        let stop = self.tasks.shutdown_token();
        self.tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = fut => {}
            }
        });
    }

    fn registration(&self) -> NodeRegistration {
        let o = &self.opts;
        let l = self.stages.limits();
        let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        NodeRegistration {
            version: API_VERSION,
            node_id: o.node_id.clone(),
            address: self.address.clone(),
            instance: self.instance.clone(),
            capacity: NodeCapacity {
                max_sessions: o.max_sessions,
                stages: [
                    ("init", n(l.init)),
                    ("ready", n(l.ready_buffer)),
                    ("running", n(l.running)),
                    ("postrun", n(l.postrun)),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            },
            labels: o.labels.clone(),
            backends: self.work.backends(),
        }
    }

    /// Registers; while the server cannot be reached (it may be starting
    /// too), tries again for up to a minute. A refusal is final.
    async fn register_at_start(&self) -> Result<(), ClientError> {
        let until = Instant::now() + REGISTER_PATIENCE;
        let mut wait = Duration::from_millis(100);
        loop {
            match self.client().register(&self.registration()).await {
                Ok(_) => return Ok(()),
                Err(e) if e.status().is_none() && Instant::now() + wait < until => {
                    tracing::warn!(error = %e, "the rollout server cannot be reached yet; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether it takes no new session: it stops, or the server drains it.
    pub(super) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed) || self.server_drain.load(Ordering::Relaxed)
    }

    fn heartbeat_body(&self) -> Heartbeat {
        let sessions: Vec<String> = lock(&self.held).keys().cloned().collect();
        Heartbeat {
            instance: Some(self.instance.clone()),
            active: u32::try_from(sessions.len()).unwrap_or(u32::MAX),
            stages: self.stages.loads(),
            draining: self.is_draining(),
            sessions: Some(sessions),
            paused: self.stages.paused(),
            policy_version: lock(&self.policy_version).clone(),
            backends: self.work.backends(),
        }
    }

    async fn heartbeat_once(&self) {
        let mut sent = self
            .client()
            .heartbeat(&self.opts.node_id, &self.heartbeat_body())
            .await;
        if matches!(&sent, Err(e) if e.status() == Some(StatusCode::UNAUTHORIZED))
            && self
                .reread_tokens("the server refused the node token")
                .await
        {
            sent = self
                .client()
                .heartbeat(&self.opts.node_id, &self.heartbeat_body())
                .await;
        }
        match sent {
            Ok(reply) => {
                for c in reply.cancel {
                    tracing::info!(session = %c.session_id, reason = %c.reason, "server cancelled a session");
                    self.cancel_local(&c.session_id, None);
                }
                if reply.drain != self.server_drain.swap(reply.drain, Ordering::Relaxed) {
                    if reply.drain {
                        tracing::info!("the server drains this node");
                    } else {
                        tracing::info!("the server no longer drains this node");
                    }
                }
            }
            Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => {
                // The server lost us (a restart with a fresh database).
                if let Err(e) = self.client().register(&self.registration()).await {
                    tracing::warn!(error = %e, "registering again failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
    }

    async fn heartbeats(self: Arc<Self>) {
        let mut every = tokio::time::interval(self.opts.heartbeat_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.heartbeat_once().await;
        }
    }

    /// Stops a held session; `attempt` must match when given.
    pub(super) fn cancel_local(&self, sid: &str, attempt: Option<u32>) -> bool {
        let held = lock(&self.held);
        match held.get(sid) {
            Some(j) if attempt.is_none_or(|a| a == j.assignment.attempt) => {
                j.stop.cancel();
                #[cfg(any(test, feature = "test-hooks"))]
                lock(&self.cancelled).push(sid.to_owned());
                true
            }
            _ => false,
        }
    }

    pub(super) fn accept_assignment(self: &Arc<Self>, a: SessionAssignment) -> Response<Body> {
        if self.is_draining() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "draining",
                None,
                "the node is draining",
            );
        }
        if let Err(e) = a.session_id.parse::<polar_ids::SessionId>() {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                Some("session_id"),
                &e.to_string(),
            );
        }
        let (job, superseded) = {
            let mut held = lock(&self.held);
            let mut superseded = None;
            if let Some(j) = held.get(&a.session_id) {
                if j.assignment.attempt == a.attempt {
                    return json(StatusCode::OK, &json!({"duplicate": true}));
                }
                if j.assignment.attempt > a.attempt {
                    return error(
                        StatusCode::CONFLICT,
                        "stale_attempt",
                        Some("attempt"),
                        &format!(
                            "attempt {} of this session is held already",
                            j.assignment.attempt
                        ),
                    );
                }
                // A newer dispatch of a session this node still holds: the
                // old attempt is stopped, and the new one starts once the
                // old one is torn down.
                j.stop.cancel();
                superseded = Some(Arc::clone(j));
            } else if held.len() >= self.opts.max_sessions as usize {
                return error(StatusCode::SERVICE_UNAVAILABLE, "full", None, "at capacity");
            }
            #[cfg(any(test, feature = "test-hooks"))]
            lock(&self.received).push(Received {
                assignment: a.clone(),
                at: Instant::now(),
            });
            let sid = a.session_id.clone();
            let job = Arc::new(Job::new(a));
            held.insert(sid, Arc::clone(&job));
            (job, superseded)
        };
        let me = Arc::clone(self);
        self.live.fetch_add(1, Ordering::Relaxed);
        self.spawn(async move {
            if let Some(old) = superseded {
                tracing::info!(
                    session = %old.assignment.session_id,
                    old = old.assignment.attempt,
                    new = job.assignment.attempt,
                    "a newer attempt waits for the old one's tear-down"
                );
                old.ended.cancelled().await;
            }
            Arc::clone(&me).run(job).await;
            me.live.fetch_sub(1, Ordering::Relaxed);
        });
        json(StatusCode::ACCEPTED, &json!({"accepted": true}))
    }

    async fn run(self: Arc<Self>, job: Arc<Job>) {
        let sid = job.assignment.session_id.clone();
        // Stages are reported in order, by one task per session, and the
        // result after them; while the session runs, the calls that ended
        // since the last report are reported every LIVE_CALLS_EVERY (the
        // dashboard's live timeline), up to MAX_LIVE_CALLS.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Stage>();
        let reporter = {
            let (me, j) = (Arc::clone(&self), Arc::clone(&job));
            let killed = self.tasks.shutdown_token();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(LIVE_CALLS_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let (mut running, mut sent) = (false, 0usize);
                loop {
                    let (stage, calls) = tokio::select! {
                        s = rx.recv() => match s {
                            Some(stage) => (stage, Vec::new()),
                            None => return,
                        },
                        _ = tick.tick(), if running && sent < MAX_LIVE_CALLS => {
                            let mut calls = me.work.calls_since(&j, sent);
                            calls.truncate(MAX_LIVE_CALLS - sent);
                            if calls.is_empty() {
                                continue;
                            }
                            sent += calls.len();
                            (Stage::Running, calls)
                        }
                    };
                    if calls.is_empty() {
                        running = stage == Stage::Running;
                    }
                    tokio::select! {
                        () = killed.cancelled() => return,
                        () = me.progress(&j, stage, calls) => {}
                    }
                }
            })
        };
        let progress = self.opts.progress;
        let stages = self.stages.run(&self.work, &job, move |stage| {
            if progress.reports(stage) {
                let _ = tx.send(stage);
            }
        });
        // A panic in the session's work (a bug) ends this session only: its
        // slot is freed below as after any end, and the server is told the
        // node failed it, to run it again within its retry limit.
        let report = caught(stages).await.unwrap_or_else(|why| {
            tracing::error!(session = %sid, panic = %why, "the session's work panicked");
            Some(Report {
                error: Some(format!(
                    "the gateway's work for this session panicked (a bug): {why}"
                )),
                retry: true,
                infra_fault: true,
                ..Report::new(polar_rollout_api::SampleStatus::Error)
            })
        });
        job.ended.cancel();
        // The work is done: the slot is free while the result is reported.
        {
            let mut held = lock(&self.held);
            if held.get(&sid).is_some_and(|j| Arc::ptr_eq(j, &job)) {
                held.remove(&sid);
            }
        }
        self.finished.fetch_add(1, Ordering::Relaxed);
        let _ = reporter.await;
        if let Some(report) = report {
            self.deliver(&job, &report).await;
        }
    }

    async fn progress(&self, job: &Job, stage: Stage, calls: Vec<serde_json::Value>) {
        let p = SessionProgress {
            node_id: self.opts.node_id.clone(),
            attempt: job.assignment.attempt,
            stage: stage.as_str().into(),
            calls,
        };
        if let Err(e) = self.client().progress(&job.assignment.session_id, &p).await {
            tracing::debug!(session = %job.assignment.session_id, error = %e, "progress not delivered");
        }
    }

    /// Reports until the server takes the result or refuses it for good
    /// (it may be restarting meanwhile).
    async fn deliver(&self, job: &Job, r: &Report) {
        let sid = &job.assignment.session_id;
        let result = SessionResult {
            node_id: self.opts.node_id.clone(),
            attempt: job.assignment.attempt,
            status: r.status,
            reward: r.reward,
            trajectory_uri: r.trajectory_uri.clone(),
            tokens: r.tokens,
            error: r.error.clone(),
            stats: Some(serde_json::Value::Object(r.stats.clone())),
            retry: r.retry,
            infra_fault: r.infra_fault,
            node_unfit: r.node_unfit,
        };
        let mut wait = Duration::from_millis(20);
        let give_up = Instant::now() + Duration::from_secs(600);
        loop {
            match self.client().result(sid, &result).await {
                Ok(_) => {
                    self.reported.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(session = %sid, status = r.status.as_str(), reward = ?r.reward, "result reported");
                    return;
                }
                Err(e)
                    if matches!(
                        e.status(),
                        Some(
                            StatusCode::CONFLICT | StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST
                        )
                    ) =>
                {
                    tracing::info!(session = %sid, error = %e, "result refused by the server");
                    return;
                }
                Err(e) if Instant::now() > give_up => {
                    tracing::error!(session = %sid, error = %e, "result not delivered; giving up (the trajectory stays exported)");
                    return;
                }
                Err(e) => {
                    tracing::debug!(session = %sid, error = %e, "result not delivered, retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}
