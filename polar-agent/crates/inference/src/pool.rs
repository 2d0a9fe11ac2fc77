//! The replicas of one backend: session affinity by rendezvous hashing (a
//! session stays on its replica while that replica is healthy, and only the
//! sessions of a failed replica move), health checks (`GET /health`, in a
//! background task and after connect failures), pause/resume of new
//! generations, and counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use polar_io::http::ClientOptions;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{Notify, watch};

use super::{BackendConfig, InferenceError};
use polar_io::tasks::Tasks;

/// How many times a call asks a replica its context length before it
/// fails as the replica's fault.
const CONTEXT_ASKS: u32 = 3;
/// The wait before the second ask (twice that before the third).
const CONTEXT_RETRY: Duration = Duration::from_millis(250);

/// How much longer than the connect timeout a replica has to answer
/// `GET /health`.
pub const HEALTH_GRACE: Duration = Duration::from_secs(2);

/// The HTTP client every call of a pool goes through.
pub(crate) type Http = polar_io::http::HttpClient;

/// Checks a replica base URL (`http://host:port[/prefix]`); returns it
/// without a trailing slash.
pub fn parse_base(url: &str) -> Result<String, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{url:?}: only http:// replicas are supported"));
    }
    if uri.authority().is_none_or(|a| a.host().is_empty()) {
        return Err(format!("{url:?}: no host"));
    }
    if uri.query().is_some() {
        return Err(format!("{url:?}: a query is not allowed"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

#[derive(Debug)]
struct Replica {
    url: String,
    score_seed: u64,
    healthy: AtomicBool,
    requests: AtomicU64,
    connect_failures: AtomicU64,
    failures: AtomicU64,
    in_flight: AtomicUsize,
    /// The served model's context length (`GET /v1/models`), 0 until known.
    model_len: AtomicU64,
}

/// Counters of one replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplicaStats {
    /// Base URL.
    pub url: String,
    /// Whether it is considered healthy.
    pub healthy: bool,
    /// Requests sent (attempts included).
    pub requests: u64,
    /// Attempts that never reached it.
    pub connect_failures: u64,
    /// Calls that failed after reaching it.
    pub failures: u64,
    /// Calls running on it.
    pub in_flight: usize,
}

/// Counters of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    /// Backend name.
    pub backend: String,
    /// Whether new generations are held.
    pub paused: bool,
    /// Calls admitted and not finished.
    pub in_flight: usize,
    /// Calls waiting for `resume`.
    pub waiting: usize,
    /// Per replica.
    pub replicas: Vec<ReplicaStats>,
}

#[derive(Debug)]
struct Inner {
    backend: String,
    replicas: Vec<Replica>,
    paused: watch::Sender<bool>,
    in_flight: AtomicUsize,
    waiting: AtomicUsize,
    idle: Notify,
    http: Http,
    health_timeout: Duration,
    health_interval: Duration,
}

/// The replicas of one backend. Cloning shares them.
#[derive(Clone, Debug)]
pub struct Pool {
    inner: Arc<Inner>,
}

/// A call admitted by the pool: counted in flight until dropped.
#[derive(Debug)]
pub struct Admission {
    inner: Arc<Inner>,
    replica: Option<usize>,
}

impl Admission {
    /// Binds the call to the replica that took it.
    pub(crate) fn bind(&mut self, replica: usize) {
        if let Some(old) = self.replica.replace(replica) {
            self.inner.replicas[old]
                .in_flight
                .fetch_sub(1, Ordering::Relaxed);
        }
        self.inner.replicas[replica]
            .in_flight
            .fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(r) = self.replica {
            self.inner.replicas[r]
                .in_flight
                .fetch_sub(1, Ordering::Relaxed);
        }
        if self.inner.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

impl Pool {
    /// A pool for `cfg` (validated first); every replica starts healthy.
    pub fn new(cfg: &BackendConfig) -> Result<Self, InferenceError> {
        cfg.validate().map_err(|e| InferenceError::Config {
            backend: cfg.name.clone(),
            key: e.key.to_string(),
            reason: e.reason,
        })?;
        let http = polar_io::http::client(
            &ClientOptions::new()
                .connect_timeout(cfg.connect_timeout())
                .pool_idle_timeout(Duration::from_secs(60)),
        );
        let replicas = cfg
            .replicas
            .iter()
            .map(|u| {
                let url = parse_base(u).unwrap_or_else(|_| u.clone());
                Replica {
                    score_seed: hash(url.as_bytes()),
                    url,
                    healthy: AtomicBool::new(true),
                    requests: AtomicU64::new(0),
                    connect_failures: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                    in_flight: AtomicUsize::new(0),
                    model_len: AtomicU64::new(0),
                }
            })
            .collect();
        Ok(Self {
            inner: Arc::new(Inner {
                backend: cfg.name.clone(),
                replicas,
                paused: watch::channel(false).0,
                in_flight: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                idle: Notify::new(),
                http,
                health_timeout: cfg.connect_timeout() + HEALTH_GRACE,
                health_interval: cfg.health_check_interval(),
            }),
        })
    }

    /// Backend name.
    pub fn backend(&self) -> &str {
        &self.inner.backend
    }

    /// Replica base URLs, in configuration order.
    pub fn replica_urls(&self) -> Vec<String> {
        self.inner.replicas.iter().map(|r| r.url.clone()).collect()
    }

    pub(crate) fn url(&self, replica: usize) -> &str {
        &self.inner.replicas[replica].url
    }

    /// How many ids `replica`'s context holds: the served model's
    /// `max_model_len` in `GET /v1/models` (vLLM's and SGLang's model
    /// cards), asked until one answer says; `Ok(None)` when the replica
    /// answers without it, `Err` when it could not be asked (after
    /// [`CONTEXT_ASKS`] tries, [`CONTEXT_RETRY`] apart: a busy replica is
    /// not a misconfigured one).
    pub(crate) async fn context_len(
        &self,
        replica: usize,
        served: &str,
        timeout: Duration,
    ) -> Result<Option<u64>, String> {
        let r = &self.inner.replicas[replica];
        let known = r.model_len.load(Ordering::Relaxed);
        if known > 0 {
            return Ok(Some(known));
        }
        let mut last = String::new();
        for ask in 0..CONTEXT_ASKS {
            if ask > 0 {
                tokio::time::sleep(CONTEXT_RETRY * ask).await;
            }
            match self.models(&r.url, timeout).await {
                Ok(models) => {
                    let n = served_model_len(&models, served);
                    if let Some(n) = n {
                        r.model_len.store(n, Ordering::Relaxed);
                    }
                    return Ok(n);
                }
                Err(why) => last = why,
            }
        }
        Err(format!("{}/v1/models: {last}", r.url))
    }

    /// One `GET {url}/v1/models`, its JSON answer.
    async fn models(&self, url: &str, timeout: Duration) -> Result<Value, String> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(format!("{url}/v1/models"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(timeout, self.inner.http.request(req))
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        let read = tokio::time::timeout(timeout, Limited::new(resp.into_body(), 1 << 20).collect())
            .await
            .map_err(|_| format!("no whole answer within {timeout:?}"))?
            .map_err(|e| e.to_string())?
            .to_bytes();
        serde_json::from_slice(&read).map_err(|e| format!("not JSON: {e}"))
    }

    pub(crate) fn http(&self) -> &Http {
        &self.inner.http
    }

    /// The replicas to try for `session`, best first: healthy ones by
    /// rendezvous score, then unhealthy ones (a last resort).
    pub fn order(&self, session: &str) -> Vec<usize> {
        let key = hash(session.as_bytes());
        let mut scored: Vec<(bool, u64, usize)> = self
            .inner
            .replicas
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    r.healthy.load(Ordering::Relaxed),
                    mix(key ^ r.score_seed),
                    i,
                )
            })
            .collect();
        scored.sort_by(|a, b| b.cmp(a));
        scored.into_iter().map(|(_, _, i)| i).collect()
    }

    /// The replica `session` goes to now.
    pub fn pick(&self, session: &str) -> Option<String> {
        self.order(session).first().map(|&i| self.url(i).to_owned())
    }

    /// Holds new calls until [`Pool::resume`]; calls already running go on.
    pub fn pause(&self) {
        self.inner.paused.send_replace(true);
        tracing::info!(backend = %self.inner.backend, "inference paused");
    }

    /// Lets held and new calls run.
    pub fn resume(&self) {
        self.inner.paused.send_replace(false);
        tracing::info!(backend = %self.inner.backend, "inference resumed");
    }

    /// Whether new calls are held.
    pub fn is_paused(&self) -> bool {
        *self.inner.paused.borrow()
    }

    /// Waits until no admitted call runs (after [`Pool::pause`]: the drain).
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.inner.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Admits a call: waits while paused, then counts it in flight.
    pub async fn admit(&self) -> Admission {
        let mut paused = self.inner.paused.subscribe();
        loop {
            if *paused.borrow_and_update() {
                self.inner.waiting.fetch_add(1, Ordering::Relaxed);
                let _ = paused.wait_for(|p| !*p).await;
                self.inner.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            self.inner.in_flight.fetch_add(1, Ordering::AcqRel);
            let admission = Admission {
                inner: Arc::clone(&self.inner),
                replica: None,
            };
            if !*paused.borrow() {
                return admission;
            }
            drop(admission);
        }
    }

    /// Counts an attempt on `replica`.
    pub(crate) fn note_attempt(&self, replica: usize) {
        self.inner.replicas[replica]
            .requests
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Records that `replica` could not be reached: it is unhealthy until a
    /// health check passes.
    pub(crate) fn note_unreachable(&self, replica: usize) {
        let r = &self.inner.replicas[replica];
        r.connect_failures.fetch_add(1, Ordering::Relaxed);
        if r.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(backend = %self.inner.backend, replica = %r.url, "replica unreachable, marked unhealthy");
        }
    }

    /// Records a call that failed after reaching `replica`.
    pub(crate) fn note_failure(&self, replica: usize) {
        self.inner.replicas[replica]
            .failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Marks a replica healthy or not.
    pub fn set_healthy(&self, replica_url: &str, healthy: bool) {
        for r in self.inner.replicas.iter().filter(|r| r.url == replica_url) {
            r.healthy.store(healthy, Ordering::Relaxed);
        }
    }

    /// Checks every replica once (`GET /health`, 2xx within the connect
    /// timeout plus 2 s is healthy).
    pub async fn check_health(&self) {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..self.inner.replicas.len() {
            let inner = Arc::clone(&self.inner);
            set.spawn(async move {
                let r = &inner.replicas[i];
                let ok = probe(&inner.http, &r.url, inner.health_timeout).await;
                if r.healthy.swap(ok, Ordering::Relaxed) != ok {
                    tracing::info!(backend = %inner.backend, replica = %r.url, healthy = ok, "replica health changed");
                }
            });
        }
        while set.join_next().await.is_some() {}
    }

    /// Runs [`Pool::check_health`] every health-check interval until shutdown.
    pub fn spawn_health_checks(&self, tasks: &Tasks) {
        let pool = self.clone();
        let shutdown = tasks.shutdown_token();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(pool.inner.health_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => pool.check_health().await,
                }
            }
        });
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        let i = &self.inner;
        PoolStats {
            backend: i.backend.clone(),
            paused: *i.paused.borrow(),
            in_flight: i.in_flight.load(Ordering::Relaxed),
            waiting: i.waiting.load(Ordering::Relaxed),
            replicas: i
                .replicas
                .iter()
                .map(|r| ReplicaStats {
                    url: r.url.clone(),
                    healthy: r.healthy.load(Ordering::Relaxed),
                    requests: r.requests.load(Ordering::Relaxed),
                    connect_failures: r.connect_failures.load(Ordering::Relaxed),
                    failures: r.failures.load(Ordering::Relaxed),
                    in_flight: r.in_flight.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }
}

async fn probe(http: &Http, base: &str, timeout: Duration) -> bool {
    let Ok(req) = Request::builder()
        .method(Method::GET)
        .uri(format!("{base}/health"))
        .body(Full::new(Bytes::new()))
    else {
        return false;
    };
    let call = async {
        let resp = http.request(req).await.ok()?;
        let ok = resp.status().is_success();
        resp.into_body().collect().await.ok()?;
        Some(ok)
    };
    matches!(tokio::time::timeout(timeout, call).await, Ok(Some(true)))
}

fn hash(bytes: &[u8]) -> u64 {
    mix(bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }))
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The `max_model_len` of `served` in a `GET /v1/models` answer (the
/// first model's when none has that id).
fn served_model_len(models: &Value, served: &str) -> Option<u64> {
    let data = models.get("data")?.as_array()?;
    data.iter()
        .find(|m| m.get("id").and_then(Value::as_str) == Some(served))
        .or_else(|| data.first())?
        .get("max_model_len")?
        .as_u64()
        .filter(|&n| n > 0)
}

#[cfg(test)]
mod model_card_tests {
    use serde_json::json;

    use super::served_model_len;

    #[test]
    fn the_served_models_context_is_read_from_its_model_card() {
        let models = json!({"object": "list", "data": [
            {"id": "other", "max_model_len": 1024},
            {"id": "served", "max_model_len": 32768},
        ]});
        assert_eq!(served_model_len(&models, "served"), Some(32768));
        assert_eq!(served_model_len(&models, "unknown"), Some(1024));
        assert_eq!(served_model_len(&json!({"data": []}), "served"), None);
        assert_eq!(
            served_model_len(&json!({"data": [{"id": "served"}]}), "served"),
            None
        );
    }
}
