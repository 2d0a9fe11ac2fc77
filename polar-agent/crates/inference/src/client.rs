//! [`Client`]: one call = admission by the pool (held while paused), the
//! request built for the dialect, sent to the session's replica, and the
//! reply handed back as a [`ChatStream`]; token counts from the backend's
//! tokenizer ([`Client::count_tokens`]). The request goes to the next
//! replica when one could not be reached, and also when one took it but
//! failed before its reply began (a reset, HTTP 429 or 5xx): no output of
//! it reached anyone, so sending it again is safe (each replica is tried
//! once; the later attempts carry `x-polar-attempt`; the call's record
//! tells them as parts with no ids, [`crate::stream::failover::Resumption`]).
//! A replica that is
//! too slow to answer is not tried again (the harness's own clock runs),
//! nor a request a replica refused (4xx but 429). Failures after the reply
//! began are the stream's ([`crate::stream::failover`]). A request that
//! needs constrained decoding from a backend configured without it
//! (`constrained_decoding = false`) is refused before anything is sent.
//! With `model_dir`, calls go token-in ([`crate::token_in`]), constrained
//! ones too ([`crate::guided`]) but for the few the chat endpoint keeps,
//! whose record says why.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use tracing::Instrument;

use super::faithful::Faithful;
use super::guided::Guided;
use super::pool::Pool;
use super::request::{chat_body, streams_upstream};
use super::stream::failover::{ATTEMPT_HEADER, Failover, Resend, ResumeBase};
use super::stream::{BackendInfo, ChatStream, StreamParts, Timings};
use super::tokenize::{parse_count, tokenize_body, tokenize_path};
use super::wire::chat_body_bytes;
use super::{BackendConfig, InferenceError, SamplingMode};
use polar_chat::output::OutputFormat;
use polar_chat::{ChatRequest, ToolChoice};
use polar_faithful::Serving;

/// The header naming the session, sent to the backend (the mock keys its
/// script on it; vLLM and SGLang ignore it).
pub const SESSION_HEADER: &str = "x-polar-session";

const MAX_ERROR_BODY: usize = 64 << 10;
/// The largest tokenize answer read (its `tokens` list: a few bytes per
/// token of the longest context).
const MAX_TOKENIZE_BODY: usize = 64 << 20;

/// Calls one backend.
#[derive(Clone, Debug)]
pub struct Client {
    cfg: Arc<BackendConfig>,
    pool: Pool,
    faithful: Option<Arc<Faithful>>,
}

impl Client {
    /// A client for `cfg` (validated). Health checks start with
    /// [`Pool::spawn_health_checks`].
    /// With `model_dir` set, the model's files are loaded and checked here
    /// (file I/O: call it at start, not on an async worker's hot path).
    pub fn new(cfg: BackendConfig) -> Result<Self, InferenceError> {
        let pool = Pool::new(&cfg)?;
        let faithful = Faithful::load(&cfg)?.map(Arc::new);
        Ok(Self {
            cfg: Arc::new(cfg),
            pool,
            faithful,
        })
    }

    /// Forgets what the client keeps of `session` (its chains).
    pub fn end_session(&self, session: &str) {
        if let Some(f) = &self.faithful {
            f.end_session(session);
        }
    }

    /// The backend's settings.
    pub fn config(&self) -> &BackendConfig {
        &self.cfg
    }

    /// The replica pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Calls the backend for `session` with the configured sampling mode.
    pub async fn chat(
        &self,
        session: &str,
        req: &ChatRequest,
    ) -> Result<ChatStream, InferenceError> {
        self.chat_in_mode(session, req, self.cfg.sampling.mode)
            .await
    }

    /// Calls the backend with the sampling overrides of `mode`.
    pub async fn chat_in_mode(
        &self,
        session: &str,
        req: &ChatRequest,
        mode: SamplingMode,
    ) -> Result<ChatStream, InferenceError> {
        if !self.cfg.constrained_decoding
            && let Some(feature) = needs_constrained_decoding(req)
        {
            return Err(InferenceError::Unsupported {
                backend: self.cfg.name.clone(),
                feature,
            });
        }
        let mut chat_endpoint_reason = None;
        if let Some(f) = &self.faithful {
            let chat = chat_body(&self.cfg, req, mode);
            let format = self.cfg.output_parser.unwrap_or(OutputFormat::Qwen3);
            match Guided::of(self.cfg.dialect, format, &chat) {
                Ok(guided) => {
                    return self
                        .chat_token_in(session, req, mode, (f.clone(), &chat), guided)
                        .await;
                }
                Err(why) => chat_endpoint_reason = Some(why),
            }
        }
        let started_at = SystemTime::now();
        let waiting = Instant::now();
        let mut admission = self.pool.admit().await;
        let paused = waiting.elapsed();
        let started = Instant::now();
        let body = Bytes::from(chat_body_bytes(&self.cfg, req, mode));
        let streaming = streams_upstream(self.cfg.dialect);
        let timeout = self.cfg.request_timeout();
        let backend = self.cfg.name.clone();
        let Reached {
            replica,
            base,
            resp,
            attempts,
            failed,
        } = self
            .reach(session, |base| {
                chat_request(base, session, &body, streaming, &backend)
            })
            .await?;
        let head = started.elapsed();
        let weight_version = weight_version(resp.headers());
        admission.bind(replica);
        let info = BackendInfo {
            backend: backend.clone(),
            dialect: self.cfg.dialect,
            replica: base,
            served_model: self.cfg.map_model(&req.model).to_owned(),
            weight_version,
            attempts,
            serving: Some(Serving::ChatEndpoint {
                reason: chat_endpoint_reason,
            }),
        };
        let resend = Resend::Chat { body, streaming };
        let resume = ResumeBase::new(&self.cfg, req, mode);
        let mut failover = Failover::new(&self.cfg, session, resend, resume);
        failover.note_sent_again(&failed, &info.replica);
        Ok(ChatStream::new(StreamParts {
            info,
            body: resp.into_body(),
            streaming,
            model: req.model.clone(),
            timeout,
            started,
            timings: Timings {
                started_at,
                paused,
                head: Some(head),
                first_token: None,
                finished: None,
            },
            pool: self.pool.clone(),
            replica,
            admission,
            failover: Some(Box::new(failover)),
        }))
    }
}

impl Client {
    /// The prompt tokens of `req` as the backend's tokenizer and served
    /// chat template count them (see [`crate::tokenize`]), from the
    /// session's replica (the next one as a chat request would go there,
    /// [`Client::reach`]).
    /// Not a generation: it is not held while the pool is paused.
    pub async fn count_tokens(
        &self,
        session: &str,
        req: &ChatRequest,
    ) -> Result<u64, InferenceError> {
        let body = Bytes::from(tokenize_body(&self.cfg, req).to_string());
        let path = tokenize_path(self.cfg.dialect);
        let timeout = self.cfg.request_timeout();
        let backend = self.cfg.name.clone();
        let Reached { base, resp, .. } = self
            .reach(session, |base| {
                post_json(base, path, session, &body, &backend)
            })
            .await?;
        let read = tokio::time::timeout(
            timeout,
            Limited::new(resp.into_body(), MAX_TOKENIZE_BODY).collect(),
        )
        .await;
        let bytes = match read {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) => {
                return Err(InferenceError::StreamCut {
                    backend,
                    replica: base,
                    events: 0,
                    reason: format!("tokenize answer: {e}"),
                });
            }
            Err(_) => {
                return Err(InferenceError::Timeout {
                    backend,
                    replica: base,
                    timeout,
                    waiting_for: "reply body",
                    events: 0,
                });
            }
        };
        parse_count(&bytes).map_err(|reason| InferenceError::Malformed {
            backend,
            replica: base,
            reason,
        })
    }

    /// The reply head of the first of `session`'s replicas (best first)
    /// that answers the request `make` builds for its base URL with a
    /// success: the next replica is tried when one cannot be reached, or
    /// took the request and failed before its reply began (a reset, HTTP
    /// 429 or 5xx); a replica too slow to answer, or one refusing the
    /// request (4xx but 429), ends the call. Each try is counted in the
    /// pool's health figures; tries after one a replica took carry
    /// `x-polar-attempt`.
    pub(crate) async fn reach(
        &self,
        session: &str,
        make: impl Fn(&str) -> Result<Request<Full<Bytes>>, InferenceError>,
    ) -> Result<Reached, InferenceError> {
        let timeout = self.cfg.request_timeout();
        let backend = &self.cfg.name;
        let mut attempts = 0;
        let mut last = String::from("no replica");
        // The last failure of a replica that took the request.
        let mut reached: Option<InferenceError> = None;
        let mut failed: Vec<(String, String)> = Vec::new();
        for replica in self.pool.order(session) {
            attempts += 1;
            let base = self.pool.url(replica).to_owned();
            let mut request = make(&base)?;
            if reached.is_some()
                && let Ok(v) = HeaderValue::from_str(&attempts.to_string())
            {
                request.headers_mut().insert(ATTEMPT_HEADER, v);
            }
            self.pool.note_attempt(replica);
            let span =
                tracing::debug_span!("inference", backend = %backend, replica = %base, session);
            let result = tokio::time::timeout(timeout, self.pool.http().request(request))
                .instrument(span)
                .await;
            let resp = match result {
                Err(_) => {
                    self.pool.note_failure(replica);
                    return Err(InferenceError::Timeout {
                        backend: backend.clone(),
                        replica: base,
                        timeout,
                        waiting_for: "reply head",
                        events: 0,
                    });
                }
                Ok(Err(e)) if e.is_connect() => {
                    tracing::warn!(backend = %backend, replica = %base, error = %e, "replica unreachable, trying the next one");
                    self.pool.note_unreachable(replica);
                    last = format!("{base}: {}", error_chain(&e));
                    continue;
                }
                Ok(Err(e)) => {
                    self.pool.note_failure(replica);
                    tracing::warn!(backend = %backend, replica = %base, error = %e, "replica failed before its reply began, trying the next one");
                    let err = InferenceError::Disconnected {
                        backend: backend.clone(),
                        replica: base.clone(),
                        reason: error_chain(&e),
                    };
                    failed.push((base, err.to_string()));
                    reached = Some(err);
                    continue;
                }
                Ok(Ok(resp)) => resp,
            };
            let status = resp.status();
            if !status.is_success() {
                self.pool.note_failure(replica);
                let err = InferenceError::Status {
                    backend: backend.clone(),
                    replica: base.clone(),
                    status: status.as_u16(),
                    body: error_body(resp.into_body(), timeout).await,
                };
                if status.as_u16() == 429 || status.is_server_error() {
                    tracing::warn!(backend = %backend, error = %err, "replica failed before its reply began, trying the next one");
                    failed.push((base, err.to_string()));
                    reached = Some(err);
                    continue;
                }
                return Err(err);
            }
            return Ok(Reached {
                replica,
                base,
                resp,
                attempts,
                failed,
            });
        }
        Err(reached.unwrap_or(InferenceError::Unreachable {
            backend: backend.clone(),
            attempts,
            last,
        }))
    }
}

/// A replica that answered with a success ([`Client::reach`]).
pub(crate) struct Reached {
    /// Its index in the pool.
    pub(crate) replica: usize,
    /// Its base URL.
    pub(crate) base: String,
    /// Its reply head (and body to come).
    pub(crate) resp: http::Response<hyper::body::Incoming>,
    /// How many replicas were tried, this one included.
    pub(crate) attempts: usize,
    /// Each replica that took the request and failed before its reply
    /// began, with its fault.
    pub(crate) failed: Vec<(String, String)>,
}

/// The weight version a reply's head names (`x-weight-version`), if any.
pub(crate) fn weight_version(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get("x-weight-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// What in `req` needs constrained decoding (structured output, a
/// required or named tool choice: what vLLM and SGLang compile into a
/// grammar), if anything.
pub fn needs_constrained_decoding(req: &ChatRequest) -> Option<&'static str> {
    if req.response_format.is_some() {
        return Some("structured output (a JSON schema or JSON mode)");
    }
    match req.tool_choice {
        Some(ToolChoice::Required) => Some("a required tool choice"),
        Some(ToolChoice::Tool { .. }) => Some("a named tool choice"),
        _ => None,
    }
}

/// A `POST {base}{path}` of the JSON `body` for `session`.
fn post_json(
    base: &str,
    path: &str,
    session: &str,
    body: &Bytes,
    backend: &str,
) -> Result<Request<Full<Bytes>>, InferenceError> {
    Request::builder()
        .method(Method::POST)
        .uri(format!("{base}{path}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            SESSION_HEADER,
            HeaderValue::from_str(session).unwrap_or(HeaderValue::from_static("invalid")),
        )
        .body(Full::new(body.clone()))
        .map_err(|e| InferenceError::Config {
            backend: backend.to_owned(),
            key: "replicas".into(),
            reason: format!("{base}: cannot build a request: {e}"),
        })
}

/// The `POST {base}/v1/chat/completions` of `body` for `session`
/// (`backend` names the backend in the error).
pub(crate) fn chat_request(
    base: &str,
    session: &str,
    body: &Bytes,
    streaming: bool,
    backend: &str,
) -> Result<Request<Full<Bytes>>, InferenceError> {
    let mut request = post_json(base, "/v1/chat/completions", session, body, backend)?;
    request.headers_mut().insert(
        header::ACCEPT,
        HeaderValue::from_static(if streaming {
            "text/event-stream"
        } else {
            "application/json"
        }),
    );
    Ok(request)
}

/// The start of an error reply's body (at most 64 KiB, what arrives within
/// `timeout`).
pub(crate) async fn error_body(mut body: hyper::body::Incoming, timeout: Duration) -> String {
    let mut bytes = Vec::new();
    let read = async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                bytes.extend_from_slice(&data);
                if bytes.len() >= MAX_ERROR_BODY {
                    bytes.truncate(MAX_ERROR_BODY);
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(timeout, read).await;
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
