//! The mock's HTTP server: accept loop with graceful shutdown, routing,
//! admin endpoints (health, models, metrics, pause, weight version) and what
//! every generation endpoint shares (admission while paused, error
//! injection, context checks, session keys, the simulated prefix cache, the
//! list of served generations behind `--record-served`).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::body::{RespBody, error_response, full, json_response};
use super::codec::Codec;
use super::constrain::Constraint;
use super::generate::{Generation, generate_with, hash_bytes, mix};
use super::openai::SESSION_HEADER;
use super::script::{Plan, Policy};
use super::template::PromptFacts;
use super::{Dialect, MockConfig, MockError, resume, sglang, vllm};

const MAX_BODY: usize = 64 << 20;
const MAX_REMEMBERED_SESSIONS: usize = 100_000;
/// The most generations `GET /served` keeps (later ones are counted only).
const MAX_SERVED: usize = 100_000;

/// The generations served, for `GET /served` (`--record-served`).
#[derive(Debug, Default)]
struct Served {
    list: Vec<Value>,
    dropped: u64,
}

/// Request counters, exported on `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<String, u64>>,
    errors: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    running: AtomicI64,
}

/// State shared by every request.
#[derive(Debug)]
pub struct State {
    /// Settings.
    pub cfg: MockConfig,
    policy: Policy,
    paused: watch::Sender<bool>,
    weight_version: Mutex<String>,
    counter: AtomicU64,
    calls: AtomicU64,
    cache: Mutex<HashMap<String, Vec<u32>>>,
    served: Mutex<Served>,
    /// Set once a scripted fault hit with `down_after_fault`.
    down: AtomicBool,
    /// What generations are written and tokenized with.
    codec: Codec,
    /// This server's mark in the ids it makes up (replies, tool calls), so
    /// that replicas never hand out the same ones (real servers' are
    /// random): a harness whose conversation went through two replicas
    /// would take a second `call_1` for the first one again.
    tag: u32,
    /// Counters.
    pub metrics: Metrics,
    /// Tasks feeding streamed bodies.
    pub tasks: TaskTracker,
}

/// A generation admitted to run: it holds a "running" slot until dropped.
#[derive(Debug)]
pub struct Admitted {
    /// What to send.
    pub generation: Generation,
    /// Wait before the first token.
    pub first_delay: Duration,
    /// Request number (for ids).
    pub number: u64,
    /// Prompt tokens found in the simulated prefix cache.
    pub cached_tokens: usize,
    /// The prompt tokens the usage reports (the prompt's length unless the
    /// script reports a full context).
    pub usage_prompt_tokens: usize,
    state: Arc<State>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.state.metrics.running.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Admitted {
    /// Settings.
    pub fn cfg(&self) -> &MockConfig {
        &self.state.cfg
    }

    /// A fresh tool call id, `call_<tag><n>`, unique across servers.
    pub fn call_id(&self) -> String {
        let n = self.state.calls.fetch_add(1, Ordering::Relaxed);
        format!("call_{:08x}{n}", self.state.tag)
    }

    /// The reply's id: `hex_len` hex digits (at least 8), this server's tag
    /// and the request number.
    pub fn reply_id(&self, hex_len: usize) -> String {
        let width = hex_len.saturating_sub(8);
        format!("{:08x}{:0width$x}", self.state.tag, self.number)
    }

    /// The current weight version.
    pub fn weight_version(&self) -> String {
        self.state.weight_version()
    }

    /// Records generated tokens sent.
    pub fn count_generated(&self, n: usize) {
        self.state
            .metrics
            .generation_tokens
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The tracker of tasks feeding streamed bodies.
    pub fn tasks(&self) -> TaskTracker {
        self.state.tasks.clone()
    }
}

/// The inputs of a generation, common to every endpoint.
#[derive(Debug)]
pub struct GenRequest<'a> {
    /// Request headers.
    pub headers: &'a HeaderMap,
    /// The `user` field.
    pub user: Option<&'a str>,
    /// What the policy needs.
    pub facts: PromptFacts,
    /// Prompt ids.
    pub prompt_ids: Vec<u32>,
    /// Requested token limit.
    pub max_tokens: Option<usize>,
    /// Structured output and tool choice (the token-in endpoints' have
    /// their structured output only: [`crate::guided`]).
    pub constraint: Constraint,
}

impl State {
    fn new(mut cfg: MockConfig) -> Self {
        // A real model's tool parser already sends arguments as
        // `json.dumps` writes them.
        cfg.json_dumps_arguments &= cfg.model.is_none();
        let policy = match &cfg.script {
            Some(s) => Policy::scripted(s.clone()),
            None => Policy::builtin(),
        };
        let codec = match &cfg.model {
            Some(m) => Codec::Real(Arc::clone(m)),
            None => Codec::Mock {
                glue: cfg.template.generation_glue.clone(),
            },
        };
        Self {
            weight_version: Mutex::new(cfg.weight_version.clone()),
            codec,
            cfg,
            policy,
            paused: watch::channel(false).0,
            counter: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            cache: Mutex::default(),
            served: Mutex::default(),
            down: AtomicBool::new(false),
            tag: instance_tag(),
            metrics: Metrics::default(),
            tasks: TaskTracker::new(),
        }
    }

    /// What generations are written and tokenized with.
    pub fn codec(&self) -> &Codec {
        &self.codec
    }

    fn weight_version(&self) -> String {
        self.weight_version
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Runs the shared admission steps; an `Err` is the response to send.
    pub async fn admit(
        self: &Arc<Self>,
        req: GenRequest<'_>,
    ) -> Result<Admitted, Response<RespBody>> {
        let prompt_len = req.prompt_ids.len();
        let max_len = self.cfg.max_model_len;
        if prompt_len >= max_len {
            let e = MockError::ContextOverflow {
                max: max_len,
                prompt: prompt_len,
            };
            return Err(error_response(StatusCode::BAD_REQUEST, &e.to_string()));
        }
        let max_tokens = req
            .max_tokens
            .unwrap_or(usize::MAX)
            .min(max_len - prompt_len);
        let number = self.counter.fetch_add(1, Ordering::Relaxed);
        if self.cfg.fail_rate > 0.0 {
            let draw = (mix(number ^ mix(self.cfg.fail_seed)) >> 11) as f64 / (1u64 << 53) as f64;
            if draw < self.cfg.fail_rate {
                return Err(error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "injected failure (--fail-rate)",
                ));
            }
        }
        let session = session_key(req.headers, req.user, &req.facts, &req.prompt_ids);
        let (plan, done) = match self.plan(&session, &req, max_tokens) {
            Ok(p) => p,
            Err(e) => return Err(error_response(StatusCode::BAD_REQUEST, &e.to_string())),
        };
        if let Some(prompt) = plan.usage_prompt_tokens.filter(|&p| p >= max_len) {
            // A context the script filled past the model's: refused as
            // vLLM refuses a prompt that long.
            let e = MockError::ContextOverflow {
                max: max_len,
                prompt,
            };
            return Err(error_response(StatusCode::BAD_REQUEST, &e.to_string()));
        }
        if self.cfg.down_after_fault
            && (plan.disconnect_after.is_some() || plan.abort_after.is_some())
        {
            self.down.store(true, Ordering::Relaxed);
        }
        if let Some((status, message)) = &plan.error {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Err(error_response(status, message));
        }
        let mut paused = self.paused.subscribe();
        let _ = paused.wait_for(|p| !*p).await;
        self.metrics.running.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .prompt_tokens
            .fetch_add(prompt_len as u64, Ordering::Relaxed);
        let generation = if done > 0 {
            resume::generate_from(&self.codec, req.prompt_ids, &plan, max_tokens, done)
        } else {
            generate_with(&self.codec, req.prompt_ids, &plan, max_tokens)
        };
        let cached_tokens = self.remember(&session, &generation);
        if self.cfg.record_served {
            self.record_served(number, &session, &generation);
        }
        tracing::debug!(%session, number, prompt = prompt_len, generated = generation.ids.len(), "mock generation");
        Ok(Admitted {
            generation,
            first_delay: self.cfg.ttft + plan.delay.unwrap_or_default(),
            number,
            cached_tokens,
            usage_prompt_tokens: plan.usage_prompt_tokens.unwrap_or(prompt_len),
            state: Arc::clone(self),
        })
    }

    /// The plan of a request and the ids of its turn already generated (see
    /// [`resume::plan_of_request`]): the JSON its `response_format` asks
    /// for, else the policy's plan filtered by its tool choice (see
    /// [`super::constrain`]).
    fn plan(
        &self,
        session: &str,
        req: &GenRequest<'_>,
        max_tokens: usize,
    ) -> Result<(Plan, usize), MockError> {
        if let Some(plan) = req.constraint.structured_plan()? {
            return Ok((plan, 0));
        }
        // A judge request of Polar's `llm_judge` is answered from what it
        // shows, without taking a scripted turn.
        if let Some(plan) = super::judge::plan(&req.facts) {
            return Ok((plan, 0));
        }
        let (mut plan, done) = resume::plan_of_request(
            &self.codec,
            &self.policy,
            session,
            &req.facts,
            &req.prompt_ids,
            max_tokens,
            resume::is_retry(req.headers),
        );
        if plan.error.is_none() {
            req.constraint
                .apply_tools(&mut plan, &req.facts.tools, self.cfg.dialect)?;
        }
        Ok((plan, done))
    }

    /// Adds a generation to what `GET /served` lists.
    fn record_served(&self, number: u64, session: &str, g: &Generation) {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        if served.list.len() >= MAX_SERVED {
            served.dropped += 1;
            return;
        }
        served.list.push(json!({
            "number": number,
            "session": session,
            "prompt_token_ids": g.prompt_ids,
            "token_ids": g.ids,
            "logprobs": g.logprobs,
            "finish_reason": g.finish.as_str(),
            "disconnect_after": g.disconnect_after,
        }));
    }

    /// Stores the session's sequence; returns the prompt prefix it shared
    /// with the previous one.
    fn remember(&self, session: &str, g: &Generation) -> usize {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let cached = cache.get(session).map_or(0, |prev| {
            prev.iter()
                .zip(&g.prompt_ids)
                .take_while(|(a, b)| a == b)
                .count()
        });
        if cache.len() >= MAX_REMEMBERED_SESSIONS {
            cache.clear();
        }
        let mut seq = g.prompt_ids.clone();
        seq.extend(&g.ids);
        cache.insert(session.to_owned(), seq);
        cached
    }
}

/// The session of a request: the `x-polar-session` header, else `user`, else
/// `h-` and a hash of the first user message (or of the prompt ids).
pub fn session_key(
    headers: &HeaderMap,
    user: Option<&str>,
    facts: &PromptFacts,
    prompt_ids: &[u32],
) -> String {
    if let Some(s) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
        return s.to_owned();
    }
    if let Some(u) = user.filter(|u| !u.is_empty()) {
        return u.to_owned();
    }
    let h = match &facts.first_user {
        Some(text) => hash_bytes(text.as_bytes()),
        None => hash_bytes(
            &prompt_ids
                .iter()
                .flat_map(|i| i.to_le_bytes())
                .collect::<Vec<_>>(),
        ),
    };
    format!("h-{h:016x}")
}

/// A tag telling this server from others (time, process, a counter).
fn instance_tag() -> u32 {
    static STARTED: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seed =
        nanos ^ (u64::from(std::process::id()) << 32) ^ STARTED.fetch_add(1, Ordering::Relaxed);
    mix(seed) as u32
}

/// Seconds since the epoch, for `created`.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Serves the mock on `listener` until `shutdown`, then lets open
/// connections finish their current request and returns.
pub async fn serve(listener: TcpListener, cfg: MockConfig, shutdown: CancellationToken) {
    let state = Arc::new(State::new(cfg));
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "mock backend accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let state = Arc::clone(&state);
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| handle(Arc::clone(&state), req));
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "mock connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    state.tasks.close();
    state.tasks.wait().await;
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, Infallible> {
    let path = req.uri().path().to_owned();
    {
        let mut requests = state
            .metrics
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *requests.entry(path.clone()).or_insert(0) += 1;
    }
    let mut resp = route(&state, req).await;
    if resp.status().as_u16() >= 400 {
        state.metrics.errors.fetch_add(1, Ordering::Relaxed);
    }
    if let Ok(v) = HeaderValue::from_str(&state.weight_version()) {
        resp.headers_mut().insert("x-weight-version", v);
    }
    Ok(resp)
}

async fn route(state: &Arc<State>, req: Request<Incoming>) -> Response<RespBody> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error_response(StatusCode::BAD_REQUEST, &format!("cannot read body: {e}"));
        }
    };
    let dialect = state.cfg.dialect;
    if state.down.load(Ordering::Relaxed) {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "replica down (--down-after-fault)",
        );
    }
    let result = match (&parts.method, parts.uri.path(), dialect) {
        (&Method::GET, "/health", _) => Ok(Response::new(full(Bytes::new()))),
        (&Method::GET, "/v1/models", _) => Ok(models(state)),
        (&Method::GET, "/metrics", _) => Ok(metrics(state)),
        (&Method::GET, "/served", _) => served(state),
        (&Method::POST, "/pause_generation" | "/pause", _) => Ok(set_paused(state, true)),
        (&Method::POST, "/continue_generation" | "/resume", _) => Ok(set_paused(state, false)),
        (&Method::GET, "/is_paused", _) => Ok(json_response(
            StatusCode::OK,
            &json!({"is_paused": *state.paused.borrow()}),
        )),
        (&Method::GET, "/get_weight_version", _) => Ok(json_response(
            StatusCode::OK,
            &json!({"weight_version": state.weight_version()}),
        )),
        (&Method::POST, "/update_weight_version", _) => update_weight_version(state, &body),
        (&Method::POST, "/v1/chat/completions", Dialect::Vllm) => {
            vllm::chat(state, &parts.headers, &body).await
        }
        (&Method::POST, "/v1/chat/completions", Dialect::Sglang) => {
            sglang::chat(state, &parts.headers, &body).await
        }
        (&Method::POST, "/v1/completions", Dialect::Vllm) => {
            vllm::completions(state, &parts.headers, &body).await
        }
        (&Method::POST, "/tokenize", Dialect::Vllm) => vllm::tokenize(state, &parts.headers, &body),
        (&Method::POST, "/detokenize", Dialect::Vllm) => vllm::detokenize(state, &body, "prompt"),
        (&Method::POST, "/v1/tokenize" | "/tokenize", Dialect::Sglang) => {
            sglang::tokenize(state, &parts.headers, &body)
        }
        (&Method::POST, "/detokenize", Dialect::Sglang) => vllm::detokenize(state, &body, "text"),
        (&Method::POST, "/generate", Dialect::Sglang) => {
            sglang::generate(state, &parts.headers, &body).await
        }
        (_, path, _) => Ok(error_response(
            StatusCode::NOT_FOUND,
            &format!("no route for {} {path}", parts.method),
        )),
    };
    result.unwrap_or_else(|e| error_response(StatusCode::BAD_REQUEST, &e.to_string()))
}

fn models(state: &State) -> Response<RespBody> {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [{
            "id": state.cfg.served_model, "object": "model", "created": 0,
            "owned_by": "polar-mock", "root": state.cfg.served_model,
            "max_model_len": state.cfg.max_model_len,
        }]}),
    )
}

/// `GET /served`: every generation served, in order, with its session,
/// prompt ids, generated ids and logprobs (a 404 unless `--record-served`).
fn served(state: &State) -> Result<Response<RespBody>, MockError> {
    if !state.cfg.record_served {
        return Ok(error_response(
            StatusCode::NOT_FOUND,
            "generations are not recorded: start the mock with --record-served",
        ));
    }
    let served = state.served.lock().unwrap_or_else(|e| e.into_inner());
    Ok(json_response(
        StatusCode::OK,
        &json!({"served": served.list, "dropped": served.dropped}),
    ))
}

fn set_paused(state: &State, paused: bool) -> Response<RespBody> {
    state.paused.send_replace(paused);
    tracing::info!(paused, "mock generation pause switched");
    json_response(StatusCode::OK, &json!({"is_paused": paused}))
}

fn update_weight_version(state: &State, body: &[u8]) -> Result<Response<RespBody>, MockError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| MockError::BadRequest(format!("invalid JSON body: {e}")))?;
    let version = v
        .get("new_version")
        .and_then(Value::as_str)
        .ok_or_else(|| MockError::BadRequest("`new_version` must be a string".into()))?;
    *state
        .weight_version
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = version.to_owned();
    Ok(json_response(
        StatusCode::OK,
        &json!({"success": true, "message": "weight version updated"}),
    ))
}

fn metrics(state: &State) -> Response<RespBody> {
    let m = &state.metrics;
    let mut out = String::new();
    out.push_str("# TYPE polar_mock_requests_total counter\n");
    for (path, n) in m.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        out.push_str(&format!(
            "polar_mock_requests_total{{path=\"{path}\"}} {n}\n"
        ));
    }
    for (name, kind, value) in [
        (
            "polar_mock_errors_total",
            "counter",
            m.errors.load(Ordering::Relaxed) as i64,
        ),
        (
            "polar_mock_prompt_tokens_total",
            "counter",
            m.prompt_tokens.load(Ordering::Relaxed) as i64,
        ),
        (
            "polar_mock_generation_tokens_total",
            "counter",
            m.generation_tokens.load(Ordering::Relaxed) as i64,
        ),
        (
            "polar_mock_requests_running",
            "gauge",
            m.running.load(Ordering::Relaxed),
        ),
        (
            "polar_mock_paused",
            "gauge",
            i64::from(*state.paused.borrow()),
        ),
    ] {
        out.push_str(&format!("# TYPE {name} {kind}\n{name} {value}\n"));
    }
    let mut resp = Response::new(full(out));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}
