//! [`Core`]: the scheduler behind a lock, the database, and the background
//! work that follows state changes. Every change goes through
//! [`Core::apply`]: with the scheduler locked for writing, mutate it, queue
//! its rows to the database and wait for the commit; only then release the
//! lock (readers see nothing uncommitted) and acknowledge, push
//! assignments, send cancellations or start callbacks. A commit that fails
//! leaves the scheduler as the database has it: it is rebuilt from the
//! committed rows, as at start-up (the same restore), before anything else
//! reads or changes it. Each change also assigns what it made dispatchable
//! (a result frees a slot, a submission brings sessions, a node registers)
//! within the same commit. Background loops: the dispatcher (continues
//! large assignments when woken) and the ticker (lost nodes, deadlines).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;
use rustls::pki_types::ServerName;
use tokio::sync::{Notify, RwLock};

use super::callback;
use super::config::{GatewayName, RolloutConfig};
use super::events::EventHub;
use super::metrics::Metrics;
use super::scheduler::{CancelOrder, Changes, Limits, Push, Scheduler};
use super::store::{Snapshot, Store, StoreError};
use polar_io::tasks::Tasks;
use polar_rollout_api::http::{HttpClient, bearer_value, join};
use polar_rollout_api::now_ms;
use polar_rollout_api::{API_VERSION, CancelSession};

/// Assignments made per scheduler lock.
const ASSIGN_BATCH: usize = 256;

/// The tokens in force (replaced whole when they rotate).
#[derive(Debug)]
pub struct Auth {
    /// Trainer tokens.
    pub tokens: Vec<String>,
    /// Read-only tokens.
    pub viewer_tokens: Vec<String>,
    /// Node tokens by node id.
    pub node_tokens: std::collections::BTreeMap<String, String>,
    /// Presented to gateways.
    pub gateway_token: String,
}

impl Auth {
    fn of(cfg: &RolloutConfig) -> Self {
        Self {
            tokens: cfg.tokens.clone(),
            viewer_tokens: cfg.viewer_tokens.clone(),
            node_tokens: cfg.node_tokens.clone(),
            gateway_token: cfg.gateway_token.clone(),
        }
    }

    /// The node a token belongs to.
    pub fn node_of(&self, token: &str) -> Option<&str> {
        polar_io::auth::token_owner(
            token,
            self.node_tokens
                .iter()
                .map(|(n, t)| (n.as_str(), t.as_str())),
        )
    }
}

/// Shared state of a running server.
pub struct Core {
    /// Settings (the tokens as at start: [`Core::auth`] has those in
    /// force).
    pub cfg: RolloutConfig,
    auth: std::sync::RwLock<Arc<Auth>>,
    state: RwLock<State>,
    store: Store,
    /// Events for `/v1/events`.
    pub hub: Arc<EventHub>,
    /// Outgoing HTTP (gateways, callbacks).
    pub http: HttpClient,
    /// Registered node addresses (URI authority) to node id: the TLS name
    /// of a push with `verify_gateway_as = "node_id"`.
    gateway_names: Arc<std::sync::RwLock<HashMap<String, String>>>,
    /// Background work.
    pub tasks: Tasks,
    wake: Notify,
    /// Latency histogram and counters.
    pub metrics: Metrics,
    /// When the server started.
    pub started: Instant,
}

/// The scheduler and whether it may hold what the database does not.
#[derive(Debug)]
struct State {
    sched: Scheduler,
    /// A change was not (or not known to be) committed: rebuild from the
    /// database before the next read or change.
    stale: bool,
}

/// The authority (`host:port`) of a URL.
fn authority(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    Some(uri.authority()?.as_str().to_owned())
}

/// The scheduler's limits from the settings.
fn limits(cfg: &RolloutConfig) -> Limits {
    Limits {
        heartbeat_timeout: cfg.heartbeat_timeout,
        max_retries: cfg.max_retries,
        result_grace: cfg.result_grace,
        no_node_timeout: cfg.no_node_timeout,
        retention: cfg.retention,
    }
}

/// A scheduler holding what the database held (start-up, and after a
/// failed commit).
fn restored(limits: Limits, snap: Snapshot, now: Instant) -> Scheduler {
    let mut sched = Scheduler::new(limits, now);
    let (tasks, sessions) = (snap.tasks.len(), snap.sessions.len());
    for (reg, drain) in snap.nodes {
        sched.restore_node(reg, drain, now);
    }
    sched.restore(snap.tasks, snap.sessions, now, now_ms());
    if tasks > 0 {
        tracing::info!(tasks, sessions, "rollout state restored");
    }
    sched
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("listen", &self.cfg.listen)
            .field("database", &self.cfg.database)
            .finish_non_exhaustive()
    }
}

impl Core {
    /// Opens the database and restores its state; `tls` is the client
    /// side of the calls to gateways and callbacks. Nothing runs yet.
    pub fn open(
        cfg: RolloutConfig,
        tls: rustls::ClientConfig,
    ) -> Result<(Arc<Self>, Changes), StoreError> {
        let hub = Arc::new(EventHub::new());
        let (store, snap) = Store::open(&cfg.database, cfg.synchronous, Arc::clone(&hub))?;
        let gateway_names = Arc::new(std::sync::RwLock::new(
            snap.nodes
                .iter()
                .filter_map(|(reg, _)| Some((authority(&reg.address)?, reg.node_id.clone())))
                .collect::<HashMap<_, _>>(),
        ));
        let http = match cfg.verify_gateway_as {
            GatewayName::Address => polar_rollout_api::http::client(tls),
            GatewayName::NodeId => {
                let names = Arc::clone(&gateway_names);
                polar_rollout_api::http::client_named(tls, move |uri| {
                    let node = uri.authority().and_then(|a| {
                        names
                            .read()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(a.as_str())
                            .cloned()
                    });
                    let host = uri.host().unwrap_or_default();
                    let name = node.unwrap_or_else(|| {
                        host.trim_start_matches('[')
                            .trim_end_matches(']')
                            .to_owned()
                    });
                    ServerName::try_from(name).map_err(|e| e.to_string())
                })
            }
        };
        let now = Instant::now();
        let mut sched = restored(limits(&cfg), snap, now);
        let changes = sched.take_changes();
        let core = Arc::new(Self {
            auth: std::sync::RwLock::new(Arc::new(Auth::of(&cfg))),
            cfg,
            state: RwLock::new(State {
                sched,
                stale: false,
            }),
            store,
            hub,
            http,
            gateway_names,
            tasks: Tasks::new(),
            wake: Notify::new(),
            metrics: Metrics::default(),
            started: now,
        });
        Ok((core, changes))
    }

    /// Notes a node's registered address: with `verify_gateway_as =
    /// "node_id"`, its certificate must name `node_id`.
    pub fn note_address(&self, node_id: &str, address: &str) {
        if let Some(a) = authority(address) {
            self.gateway_names
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(a, node_id.to_owned());
        }
    }

    /// The tokens in force.
    pub fn auth(&self) -> Arc<Auth> {
        Arc::clone(&self.auth.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts the tokens of `cfg` (checked) in force.
    pub fn set_tokens(&self, cfg: &RolloutConfig) {
        *self.auth.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Auth::of(cfg));
    }

    /// Reads the scheduler (as committed).
    pub async fn read<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&Scheduler) -> R,
    ) -> Result<R, StoreError> {
        {
            let st = self.state.read().await;
            if !st.stale {
                return Ok(f(&st.sched));
            }
        }
        let mut st = self.state.write().await;
        if st.stale {
            self.reload(&mut st).await?;
        }
        Ok(f(&st.sched))
    }

    /// Changes the scheduler and commits, holding the write lock until the
    /// commit is done; then starts what must follow. When the commit fails
    /// the scheduler is rebuilt from the database and the error returned:
    /// the change is nowhere.
    pub async fn apply<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Scheduler, Instant, u64) -> R,
    ) -> Result<R, StoreError> {
        let mut st = self.state.write().await;
        if st.stale {
            self.reload(&mut st).await?;
        }
        let wall = now_ms();
        let r = f(&mut st.sched, Instant::now(), wall);
        // Whatever the change freed (a slot, a node) is used in the
        // same commit: no extra round trip through the dispatcher.
        st.sched.assign(wall, ASSIGN_BATCH);
        let changes = st.sched.take_changes();
        if changes.is_empty() {
            return Ok(r);
        }
        if let Err(e) = self.commit(&mut st, changes.ops, changes.events).await {
            tracing::error!(error = %e, "state change not committed: restoring the committed state");
            if let Err(e) = self.reload(&mut st).await {
                tracing::error!(error = %e, "the committed state could not be read back (retried on the next request)");
            }
            return Err(e);
        }
        drop(st);
        self.follow_up(Changes {
            ops: Vec::new(),
            events: Vec::new(),
            ..changes
        });
        Ok(r)
    }

    /// Commits rows and events with the state locked. Until the commit is
    /// known the state is marked stale, so a caller that goes away while
    /// waiting leaves it to be read back from the database.
    async fn commit(
        &self,
        st: &mut State,
        ops: Vec<super::scheduler::Op>,
        events: Vec<super::events::Event>,
    ) -> Result<(), StoreError> {
        if ops.is_empty() && events.is_empty() {
            return Ok(());
        }
        st.stale = true;
        Store::wait(self.store.send(ops, events)).await?;
        st.stale = false;
        Ok(())
    }

    /// Rebuilds the scheduler from what the database holds (after every
    /// batch queued before), keeping the counters; what the restore itself
    /// changes is committed and followed up like any change.
    async fn reload(self: &Arc<Self>, st: &mut State) -> Result<(), StoreError> {
        st.stale = true;
        let snap = self.store.load().await?;
        let counters = st.sched.counters();
        st.sched = restored(limits(&self.cfg), snap, Instant::now());
        st.sched.set_counters(counters);
        let mut changes = st.sched.take_changes();
        let (ops, events) = (
            std::mem::take(&mut changes.ops),
            std::mem::take(&mut changes.events),
        );
        if ops.is_empty() && events.is_empty() {
            st.stale = false;
        } else {
            self.commit(st, ops, events).await?;
        }
        tracing::warn!("rollout state rebuilt from the database");
        self.follow_up(changes);
        Ok(())
    }

    /// Starts the pushes, cancellations and callbacks a change calls for.
    pub fn follow_up(self: &Arc<Self>, changes: Changes) {
        for push in changes.pushes {
            let core = Arc::clone(self);
            self.spawn(async move { core.push(push).await });
        }
        for order in changes.cancels {
            let core = Arc::clone(self);
            self.spawn(async move { core.send_cancel(order).await });
        }
        for task_id in changes.callbacks {
            let core = Arc::clone(self);
            self.spawn(async move { callback::deliver(core, task_id).await });
        }
        self.wake.notify_one();
    }

    /// Spawns tracked work that stops at shutdown.
    pub fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        let stop = self.tasks.shutdown_token();
        self.tasks.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = fut => {}
            }
        });
    }

    /// Starts the dispatcher and the ticker.
    pub fn start_loops(self: &Arc<Self>) {
        let core = Arc::clone(self);
        self.spawn(async move { core.dispatcher().await });
        let core = Arc::clone(self);
        self.spawn(async move { core.ticker().await });
    }

    async fn dispatcher(self: Arc<Self>) {
        loop {
            self.wake.notified().await;
            loop {
                match self.apply(|s, _, wall| s.assign(wall, ASSIGN_BATCH)).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "dispatch not committed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        break;
                    }
                }
            }
        }
    }

    async fn ticker(self: Arc<Self>) {
        let every = (self.cfg.heartbeat_timeout / 4)
            .clamp(Duration::from_millis(20), Duration::from_secs(1));
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            if let Err(e) = self.apply(|s, now, wall| s.tick(now, wall)).await {
                tracing::error!(error = %e, "periodic checks not committed");
            }
            // A safety net: whatever was missed is dispatched within a tick.
            self.wake.notify_one();
        }
    }

    /// Sends an assignment; a refusal or no answer puts the session back.
    async fn push(self: Arc<Self>, push: Push) {
        let sid = push.assignment.session_id.clone();
        let attempt = push.assignment.attempt;
        let url = join(&push.address, "/v1/sessions");
        let body = match serde_json::to_vec(&push.assignment) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode an assignment");
                return;
            }
        };
        let outcome = self.post(&url, body, self.cfg.push_timeout).await;
        match outcome {
            Ok(status) if status.is_success() => {
                let latency = push.dispatchable_at.elapsed();
                self.metrics.observe(latency);
                tracing::debug!(
                    session = %sid,
                    node = %push.node_id,
                    latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
                    "assignment accepted"
                );
            }
            other => {
                let reason = match other {
                    Ok(status) => format!("gateway answered {status}"),
                    Err(e) => e,
                };
                let node = push.node_id.clone();
                let r = self
                    .apply(move |s, now, _| s.push_failed(&sid, &node, attempt, &reason, now))
                    .await;
                if let Err(e) = r {
                    tracing::error!(error = %e, "push failure not committed");
                }
            }
        }
    }

    async fn send_cancel(self: Arc<Self>, order: CancelOrder) {
        let url = join(
            &order.address,
            &format!("/v1/sessions/{}/cancel", order.session_id),
        );
        let body = CancelSession {
            version: API_VERSION,
            attempt: order.attempt,
            reason: order.reason,
        };
        let body = serde_json::to_vec(&body).unwrap_or_default();
        match self.post(&url, body, self.cfg.push_timeout).await {
            Ok(s) if s.is_success() || s == http::StatusCode::NOT_FOUND => {}
            Ok(s) => tracing::debug!(session = %order.session_id, status = %s, "cancel refused"),
            Err(e) => {
                tracing::debug!(session = %order.session_id, error = %e, "cancel not delivered (the heartbeat reconciles)")
            }
        }
    }

    /// POSTs JSON with the gateway token; the status, or why none came.
    pub(crate) async fn post(
        &self,
        url: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<http::StatusCode, String> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(
                header::AUTHORIZATION,
                bearer_value(&self.auth().gateway_token),
            )
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(timeout, self.http.request(req)).await {
            Ok(Ok(resp)) => Ok(resp.status()),
            Ok(Err(e)) => Err(polar_io::chain(&e)),
            Err(_) => Err(format!("no answer within {timeout:?}")),
        }
    }

    /// Closes the database (what is queued is committed first).
    pub fn close_store(&self) {
        self.store.close();
    }

    /// Stops the background work (waiting up to `grace`) and closes the
    /// database; what was committed stays.
    pub async fn shutdown(&self, grace: Duration) {
        if !self.tasks.drain(grace).await {
            tracing::warn!("rollout background work still running at shutdown");
        }
        self.store.close();
    }
}
