//! Failover inside a call: when the replica fails in the middle of a
//! reply (a cut, a reset, an error inside the stream, a stall, an `abort`
//! finish), the [`ChatStream`] goes on on the same or another replica and
//! its consumer never sees the fault:
//!
//! - nothing but the reply's `Start` was yielded yet, and no token came
//!   (or they cannot be resumed from): the chat request is sent again,
//!   whole, to the next replica (its `Start` is not yielded twice);
//! - output was yielded, or tokens came, and the backend names its output
//!   format
//!   ([`BackendConfig::output_parser`]): the generation is resumed from its
//!   tokens through the token-in endpoint (vLLM `/v1/completions` with the
//!   prompt ids and the generated ids as the prompt, SGLang `/generate`
//!   with them as `input_ids`), with the same sampling and an explicit
//!   length: what is left of `max_tokens`, within what is left of the
//!   replica's context (its `max_model_len`, `GET /v1/models`); never the
//!   endpoints' own defaults (16 and 128 tokens); `skip_special_tokens =
//!   false` for a format whose markup is special tokens, so the
//!   continuation's text keeps it. The raw text of the ids so far (`/detokenize`) and of the
//!   continuation is parsed here ([`polar_chat::output`]) and only what goes
//!   beyond what was yielded is yielded ([`Resync`]); output that does not
//!   continue it ends the stream with the fault instead. A whole reply
//!   (SGLang) that ends with an `abort` yields none of its output
//!   ([`Failover::hold_aborted`]): it goes on as one that produced none.
//!
//! Replicas are tried in the session's order with the failing one last;
//! a call fails over at most `max(2, replicas)` times. Requests sent again
//! carry `x-polar-attempt` (2, 3, ...; backends ignore it, the mock
//! backend leaves its scripted faults out). The parts are recorded as
//! [`Resumption`]. Structured output and forced tool choices are not resumed
//! token-in, served token-faithfully or not: the continuation would be a
//! new request whose grammar starts at its first generated token, in the
//! middle of the JSON the first part began, so it could not finish that
//! JSON as the schema says; such a reply is sent again whole while none of
//! it went out (also token-in, with its constraint), and fails with the
//! fault after. Nor is a reply resumed whose ids are not all known.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use serde_json::{Map, Value, json};

use polar_chat::output::resync::Resync;
use polar_chat::output::{OutputFormat, OutputOptions, OutputParser};

use super::super::guided::Reader;
use polar_chat::{ChatRequest, FinishReason, StreamEvent, ToolChoice, Usage};
use polar_sse::SseParser;

use super::super::client::{SESSION_HEADER, chat_request, error_body, error_chain, weight_version};
use super::super::decode::{ChunkDecoder, DecodeError};
use super::super::request::chat_body;
use super::super::{BackendConfig, Dialect, InferenceError, SamplingMode};
use super::continuation::{Piece, sglang_whole, vllm_chunk};
use super::{ChatStream, Source};

/// The header numbering a call's attempts after the first.
pub const ATTEMPT_HEADER: &str = "x-polar-attempt";

/// Longest fault text kept per part.
const MAX_FAULT: usize = 500;

/// What a token-in resumption sends besides the ids: the served model and
/// the sampling as the chat request had it (with the policy applied).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ResumeBase {
    format: OutputFormat,
    /// What the parser needs of the request (its tools' schemas).
    options: OutputOptions,
    model: Value,
    sampling: Map<String, Value>,
    max_tokens: Option<u64>,
}

impl ResumeBase {
    /// The base for `req` in `mode`; `None` when the backend names no
    /// output format or the request constrains the output.
    pub(crate) fn new(cfg: &BackendConfig, req: &ChatRequest, mode: SamplingMode) -> Option<Self> {
        let constrained = req.response_format.is_some()
            || matches!(
                req.tool_choice,
                Some(ToolChoice::Required | ToolChoice::Tool { .. })
            );
        if constrained {
            return None;
        }
        Self::token_in(cfg, req, mode)
    }

    /// The base of a token-in call of `req` in `mode`, constrained or not
    /// (its constraint is added to the body by the caller,
    /// [`crate::guided::Guided::apply`]); `None` when the backend names no
    /// output format.
    pub(crate) fn token_in(
        cfg: &BackendConfig,
        req: &ChatRequest,
        mode: SamplingMode,
    ) -> Option<Self> {
        let format = cfg.output_parser?;
        // The chat body's own sampling fields (one place applies the policy).
        let bare = ChatRequest {
            model: req.model.clone(),
            messages: Vec::new(),
            tools: Vec::new(),
            tool_choice: None,
            response_format: None,
            sampling: req.sampling.clone(),
            stream: false,
            extra: Map::new(),
        };
        let body = chat_body(cfg, &bare, mode);
        let mut sampling = Map::new();
        for key in ["temperature", "top_p", "top_k", "stop", "seed"] {
            if let Some(v) = body.get(key) {
                sampling.insert(key.to_owned(), v.clone());
            }
        }
        Some(Self {
            format,
            options: OutputOptions::with_tools(&req.tools),
            model: body.get("model").cloned().unwrap_or(Value::Null),
            sampling,
            max_tokens: body.get("max_tokens").and_then(Value::as_u64),
        })
    }

    /// What is left of `max_tokens` after `generated` ids; `Some(0)` when
    /// nothing is.
    fn left(&self, generated: usize) -> Option<u64> {
        self.max_tokens.map(|m| m.saturating_sub(generated as u64))
    }

    /// The `max_tokens` of a resumption after `generated` of the ids in an
    /// `input` of `input_len` ids, on a replica whose context holds
    /// `model_len` ids (`None`: it did not say): what is left of the
    /// harness's `max_tokens`, within what is left of the context. Always
    /// explicit: a token-in request without one stops at 16 tokens (vLLM's
    /// `/v1/completions`) or 128 (SGLang's `/generate`).
    pub(crate) fn max_tokens(
        &self,
        generated: usize,
        input_len: usize,
        model_len: Option<u64>,
    ) -> Result<u64, String> {
        let context_left = model_len.map(|m| m.saturating_sub(input_len as u64));
        let left = match (self.left(generated), context_left) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => {
                return Err("the request sets no max_tokens and the replica reports no \
                            max_model_len (GET /v1/models), so the resumption's length \
                            cannot be set"
                    .into());
            }
        };
        if left == 0 {
            return Err("max_tokens or the model's context was reached".into());
        }
        Ok(left)
    }

    /// The vLLM `/v1/completions` body resuming with the ids in `input`
    /// (the prompt ids, then the generated ids), generating at most
    /// `max_tokens`.
    pub(crate) fn vllm_body(&self, input: &[u32], max_tokens: u64) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), self.model.clone());
        body.insert("prompt".into(), json!(input));
        body.extend(self.sampling.clone());
        body.insert("max_tokens".into(), json!(max_tokens));
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
        body.insert("return_token_ids".into(), json!(true));
        body.insert("logprobs".into(), json!(0));
        if self.format.markup_is_special() {
            body.insert("skip_special_tokens".into(), json!(false));
        }
        Value::Object(body)
    }

    /// The body of a token-in call of `dialect` on the ids in `input`.
    pub(crate) fn body(&self, dialect: Dialect, input: &[u32], max_tokens: u64) -> Value {
        match dialect {
            Dialect::Vllm => self.vllm_body(input, max_tokens),
            Dialect::Sglang => self.sglang_body(input, max_tokens),
        }
    }

    /// A parser of the raw output, with the request's tool schemas.
    pub(crate) fn parser(&self) -> OutputParser {
        OutputParser::with_options(self.format, &self.options)
    }

    /// The same, for a prompt that ends inside a reasoning block (its
    /// generation prompt opened `<think>`): the output starts as reasoning.
    pub(crate) fn reasoning_open(mut self, open: bool) -> Self {
        self.options.reasoning_open = open;
        self
    }

    /// The SGLang `/generate` body resuming with the ids in `input`,
    /// generating at most `max_tokens`.
    pub(crate) fn sglang_body(&self, input: &[u32], max_tokens: u64) -> Value {
        let mut sampling = self.sampling.clone();
        sampling.insert("max_new_tokens".into(), json!(max_tokens));
        if self.format.markup_is_special() {
            sampling.insert("skip_special_tokens".into(), json!(false));
        }
        json!({
            "input_ids": input,
            "sampling_params": sampling,
            "return_logprob": true,
            "stream": false,
        })
    }
}

/// What a call that failed before any output is sent again as.
#[derive(Debug)]
pub(crate) enum Resend {
    /// Its chat body, to the chat endpoint.
    Chat {
        /// The body.
        body: Bytes,
        /// Whether it streams.
        streaming: bool,
    },
    /// Its token-in body (token-faithful serving).
    TokenIn {
        /// The body.
        body: Bytes,
        /// Its prompt's length.
        prompt_len: u32,
        /// What reads its output (a fresh one).
        reader: Box<Reader>,
    },
}

/// A call's failover state, kept by its [`ChatStream`].
#[derive(Debug)]
pub(crate) struct Failover {
    session: String,
    resend: Resend,
    resume: Option<ResumeBase>,
    resync: Resync,
    output_sent: bool,
    left: usize,
    attempt: usize,
    pub(super) skip_start: bool,
    pub(super) resumed: Option<Resumption>,
}

impl Failover {
    /// The state of a call sent again as `resend`, resumed token-in from
    /// `resume` (`None`: it cannot be, [`ResumeBase::new`]).
    pub(crate) fn new(
        cfg: &BackendConfig,
        session: &str,
        resend: Resend,
        resume: Option<ResumeBase>,
    ) -> Self {
        Self {
            resume,
            session: session.to_owned(),
            resend,
            resync: Resync::new(),
            output_sent: false,
            left: cfg.replicas.len().max(2),
            attempt: 1,
            skip_start: false,
            resumed: None,
        }
    }

    /// A whole reply that ends with an `abort` finish keeps only its
    /// `Start` and that finish: its output is not yielded, so the call goes
    /// on as if it had produced none (resumed from its tokens, whose text
    /// this side parses, or sent again). A server's parse of output cut in
    /// the middle of a tool call holds the call's raw text as answer text,
    /// which nothing could continue.
    pub(super) fn hold_aborted(&self, events: &mut Vec<StreamEvent>) {
        let aborted = matches!(
            events.last(),
            Some(StreamEvent::Finish {
                finish_reason: FinishReason::Abort,
                ..
            })
        );
        if aborted && self.left > 0 {
            events.retain(|e| matches!(e, StreamEvent::Start { .. } | StreamEvent::Finish { .. }));
        }
    }

    /// Notes the replicas that took the request and failed before their
    /// reply began (each with its fault), the request having then been
    /// sent again, whole, to `replica`: parts that kept no ids.
    pub(crate) fn note_sent_again(&mut self, failed: &[(String, String)], replica: &str) {
        if failed.is_empty() {
            return;
        }
        let parts = failed.len() + 1;
        self.resumed = Some(Resumption {
            replicas: failed
                .iter()
                .map(|(r, _)| r.clone())
                .chain([replica.to_owned()])
                .collect(),
            part_tokens: vec![0; parts],
            weight_versions: vec![String::new(); parts],
            faults: failed
                .iter()
                .map(|(_, f)| f.chars().take(MAX_FAULT).collect())
                .collect(),
        });
    }

    /// Notes an event the consumer got.
    pub(super) fn observe(&mut self, event: &StreamEvent) {
        if !matches!(event, StreamEvent::Start { .. }) {
            self.output_sent = true;
        }
        // A token-in reply's events are made from what was sent
        // (`Resync::step`), resumed or not.
        if self.resume.is_some() || matches!(self.resend, Resend::TokenIn { .. }) {
            self.resync.observe(event);
        }
    }

    /// Notes a new part on `replica` after `fault` ended the one before
    /// (on `ended.0`, weight version `ended.1`), the parts so far having
    /// generated `generated` ids in all.
    fn note_part(
        &mut self,
        ended: (&str, Option<&str>),
        replica: &str,
        fault: &InferenceError,
        generated: usize,
    ) {
        let r = self.resumed.get_or_insert_with(|| Resumption {
            replicas: vec![ended.0.to_owned()],
            part_tokens: vec![0],
            weight_versions: vec![String::new()],
            faults: Vec::new(),
        });
        set_last_part(r, generated, ended.1);
        r.faults
            .push(fault.to_string().chars().take(MAX_FAULT).collect());
        r.replicas.push(replica.to_owned());
        r.part_tokens.push(0);
        r.weight_versions.push(String::new());
    }
}

/// The parts of a reply that went on after faults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Resumption {
    /// The replica of each part, in order (the first is the one that
    /// failed first; the last one finished the reply).
    pub replicas: Vec<String>,
    /// The number of response token ids each part generated (0 for a
    /// part whose request was sent again whole: none of its ids is kept).
    pub part_tokens: Vec<u32>,
    /// The weight version each part's replica reported (empty when none).
    pub weight_versions: Vec<String>,
    /// Why each part but the last ended.
    pub faults: Vec<String>,
}

/// Sets the last part's token count (`total`: every part's) and weight
/// version.
pub(super) fn set_last_part(r: &mut Resumption, total: usize, version: Option<&str>) {
    let before: u32 = r.part_tokens.iter().sum();
    if let Some(last) = r.part_tokens.last_mut() {
        *last = (total as u32).saturating_sub(before - *last);
    }
    if let (Some(last), Some(v)) = (r.weight_versions.last_mut(), version) {
        v.clone_into(last);
    }
}

/// Whether a failure may be failed over: one in the middle of a reply.
fn resumable(e: &InferenceError) -> bool {
    match e {
        InferenceError::StreamCut { .. } | InferenceError::Aborted { .. } => true,
        InferenceError::Timeout { waiting_for, .. } => *waiting_for == "reply body",
        _ => false,
    }
}

/// The `POST` of a token-in `body` of `dialect` to `base` (vLLM
/// `/v1/completions`, streamed; SGLang `/generate`, whole).
pub(crate) fn token_in_request(
    dialect: Dialect,
    base: &str,
    session: &str,
    body: &Bytes,
) -> Result<Request<Full<Bytes>>, String> {
    let (path, accept) = match dialect {
        Dialect::Vllm => ("/v1/completions", "text/event-stream"),
        Dialect::Sglang => ("/generate", "application/json"),
    };
    Request::builder()
        .method(Method::POST)
        .uri(format!("{base}{path}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, accept)
        .header(
            SESSION_HEADER,
            HeaderValue::from_str(session).unwrap_or(HeaderValue::from_static("invalid")),
        )
        .body(Full::new(body.clone()))
        .map_err(|e| format!("{base}: cannot build a request: {e}"))
}

/// A token-in generation being read (resumed, or sent token-in from the
/// start).
pub(super) struct Continuing {
    body: hyper::body::Incoming,
    sse: Option<SseParser>,
    parser: Reader,
    prompt_len: u32,
    finished: bool,
}

impl Continuing {
    /// The reply `body` of a token-in call of `dialect` whose prompt has
    /// `prompt_len` ids, its text parsed by `parser`.
    pub(super) fn new(
        body: hyper::body::Incoming,
        dialect: Dialect,
        parser: Reader,
        prompt_len: u32,
    ) -> Self {
        Self {
            body,
            sse: (dialect == Dialect::Vllm).then(SseParser::default),
            parser,
            prompt_len,
            finished: false,
        }
    }
}

impl ChatStream {
    /// The replicas to fail over to: the session's order, the failing one
    /// last.
    fn failover_order(&self, session: &str) -> Vec<usize> {
        let mut order = self.pool.order(session);
        order.retain(|&r| r != self.replica);
        order.push(self.replica);
        order
    }

    /// After `e` ended the current part: goes on elsewhere when it can
    /// (the stream then yields the rest), else gives `e` back.
    pub(super) async fn fail(&mut self, e: InferenceError) -> Result<(), InferenceError> {
        self.source = Source::Finished;
        self.pending.clear();
        let Some(f) = self.failover.as_mut() else {
            return Err(e);
        };
        if f.left == 0 || !resumable(&e) {
            return Err(e);
        }
        f.left -= 1;
        f.attempt += 1;
        let (output_sent, resumable) = (f.output_sent, f.resume.is_some());
        let generated = self.token_acc().response_len() > 0;
        // Tokens are kept when they can be (resumed from them), else the
        // request is sent again if nothing of it went out.
        let result = if resumable && (output_sent || generated) {
            self.resume_tokens(&e).await
        } else if !output_sent {
            self.send_again(&e).await
        } else {
            Err("the backend names no output_parser (or the output is constrained)".into())
        };
        match result {
            Ok(()) => Ok(()),
            Err(why) => {
                tracing::warn!(backend = %self.info.backend, replica = %self.info.replica, error = %e, why = %why, "the reply could not go on after a fault");
                Err(e)
            }
        }
    }

    /// Sends the chat request again, whole (nothing but `Start` was
    /// yielded).
    async fn send_again(&mut self, fault: &InferenceError) -> Result<(), String> {
        let Some(f) = self.failover.as_deref() else {
            return Err("no failover".into());
        };
        let session = f.session.clone();
        let attempt = f.attempt;
        let backend = self.info.backend.clone();
        let dialect = self.info.dialect;
        let mut last = String::from("no replica");
        for replica in self.failover_order(&session) {
            let base = self.pool.url(replica).to_owned();
            let Some(f) = self.failover.as_deref() else {
                return Err("no failover".into());
            };
            let mut req = match &f.resend {
                Resend::Chat { body, streaming } => {
                    chat_request(&base, &session, body, *streaming, &backend)
                        .map_err(|e| e.to_string())?
                }
                Resend::TokenIn { body, .. } => token_in_request(dialect, &base, &session, body)?,
            };
            mark_attempt(req.headers_mut(), attempt);
            match self.send(replica, req).await {
                Ok(resp) => {
                    let ended = (self.info.replica.clone(), self.info.weight_version.clone());
                    self.switch_to(replica, &base, &resp);
                    let resp = resp.into_body();
                    let Some(f) = self.failover.as_deref() else {
                        return Err("no failover".into());
                    };
                    match &f.resend {
                        Resend::Chat { streaming, .. } => {
                            self.source = if *streaming {
                                Source::Sse(resp, SseParser::default())
                            } else {
                                Source::Whole(resp)
                            };
                            self.decoder = ChunkDecoder::new(&self.model);
                        }
                        Resend::TokenIn {
                            prompt_len, reader, ..
                        } => {
                            self.source = Source::Resumed(Box::new(Continuing::new(
                                resp,
                                dialect,
                                (**reader).clone(),
                                *prompt_len,
                            )));
                        }
                    }
                    self.whole_tokens = None;
                    if let Some(f) = self.failover.as_deref_mut() {
                        f.skip_start = self.yielded > 0;
                        // The first part's tokens are not kept: none is in
                        // the record.
                        f.note_part((&ended.0, ended.1.as_deref()), &base, fault, 0);
                    }
                    return Ok(());
                }
                Err(why) => last = why,
            }
        }
        Err(format!("sending the request again failed: {last}"))
    }

    /// Resumes the generation from its tokens (output was yielded).
    async fn resume_tokens(&mut self, fault: &InferenceError) -> Result<(), String> {
        let Some(f) = self.failover.as_deref() else {
            return Err("no failover".into());
        };
        let Some(base) = f.resume.clone() else {
            return Err("the backend names no output_parser (or the output is constrained)".into());
        };
        let (session, attempt) = (f.session.clone(), f.attempt);
        let tokens = self.tokens();
        let (Some(prompt), Some(generated)) = (tokens.prompt_token_ids, tokens.response_token_ids)
        else {
            return Err("the reply's token ids are not all known".into());
        };
        if base.left(generated.len()) == Some(0) {
            return Err("max_tokens was reached".into());
        }
        let mut input = prompt.clone();
        input.extend_from_slice(&generated);
        let mut last = String::from("no replica");
        for replica in self.failover_order(&session) {
            let url = self.pool.url(replica).to_owned();
            let model_len = match self
                .pool
                .context_len(replica, &self.info.served_model, self.timeout)
                .await
            {
                Ok(n) => n,
                Err(why) => {
                    last = why;
                    continue;
                }
            };
            let max_tokens = match base.max_tokens(generated.len(), input.len(), model_len) {
                Ok(n) => n,
                Err(why) => {
                    last = format!("{url}: {why}");
                    continue;
                }
            };
            let body = Bytes::from(base.body(self.info.dialect, &input, max_tokens).to_string());
            let text = match self.detokenize(replica, &generated).await {
                Ok(t) => t,
                Err(why) => {
                    last = why;
                    continue;
                }
            };
            if text.ends_with('\u{FFFD}') {
                return Err("the generated ids end inside a character".into());
            }
            let mut parser = Reader::new(base.parser(), None);
            parser
                .push(&text)
                .map_err(|e| format!("the output so far does not parse: {e}"))?;
            let events = match self.failover.as_deref() {
                Some(f) => f.resync.step(parser.parsed(), false),
                None => return Err("no failover".into()),
            }
            .map_err(|e| e.to_string())?;
            let mut req = token_in_request(self.info.dialect, &url, &session, &body)?;
            mark_attempt(req.headers_mut(), attempt);
            match self.send(replica, req).await {
                Ok(resp) => {
                    let ended = (self.info.replica.clone(), self.info.weight_version.clone());
                    self.switch_to(replica, &url, &resp);
                    self.pending.extend(events);
                    self.source = Source::Resumed(Box::new(Continuing::new(
                        resp.into_body(),
                        self.info.dialect,
                        parser,
                        prompt.len() as u32,
                    )));
                    if let Some(f) = self.failover.as_deref_mut() {
                        let ended = (ended.0.as_str(), ended.1.as_deref());
                        f.note_part(ended, &url, fault, generated.len());
                    }
                    return Ok(());
                }
                Err(why) => last = why,
            }
        }
        Err(format!("resuming failed: {last}"))
    }

    /// The stream now reads `resp` from `replica` (`url`).
    fn switch_to(
        &mut self,
        replica: usize,
        url: &str,
        resp: &http::Response<hyper::body::Incoming>,
    ) {
        self.replica = replica;
        self.admission.bind(replica);
        url.clone_into(&mut self.info.replica);
        self.info.attempts += 1;
        self.info.weight_version = weight_version(resp.headers());
    }

    /// Sends `req` to `replica`: the reply once its head says 2xx.
    async fn send(
        &self,
        replica: usize,
        req: Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, String> {
        let base = self.pool.url(replica).to_owned();
        self.pool.note_attempt(replica);
        match tokio::time::timeout(self.timeout, self.pool.http().request(req)).await {
            Err(_) => {
                self.pool.note_failure(replica);
                Err(format!("{base}: no reply head within {:?}", self.timeout))
            }
            Ok(Err(e)) => {
                if e.is_connect() {
                    self.pool.note_unreachable(replica);
                } else {
                    self.pool.note_failure(replica);
                }
                Err(format!("{base}: {}", error_chain(&e)))
            }
            Ok(Ok(resp)) if resp.status().is_success() => Ok(resp),
            Ok(Ok(resp)) => {
                self.pool.note_failure(replica);
                let status = resp.status().as_u16();
                let body = error_body(resp.into_body(), self.timeout).await;
                Err(format!("{base}: HTTP {status}: {body}"))
            }
        }
    }

    /// The text of `ids` as `replica`'s tokenizer writes it (`/detokenize`).
    async fn detokenize(&self, replica: usize, ids: &[u32]) -> Result<String, String> {
        let base = self.pool.url(replica).to_owned();
        let body = match self.info.dialect {
            Dialect::Vllm => json!({"model": self.info.served_model, "tokens": ids}),
            Dialect::Sglang => json!({"tokens": ids, "skip_special_tokens": false}),
        };
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("{base}/detokenize"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| format!("{base}: cannot build a request: {e}"))?;
        let resp = self.send(replica, req).await?;
        let read = tokio::time::timeout(self.timeout, resp.into_body().collect())
            .await
            .map_err(|_| format!("{base}: /detokenize timed out"))?
            .map_err(|e| format!("{base}: /detokenize: {e}"))?
            .to_bytes();
        let v: Value = serde_json::from_slice(&read)
            .map_err(|e| format!("{base}: /detokenize is not JSON: {e}"))?;
        ["prompt", "text"]
            .iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str))
            .map(str::to_owned)
            .ok_or_else(|| format!("{base}: /detokenize gave no text"))
    }

    /// Reads the next part of a resumed generation into events.
    pub(super) async fn pull_resumed(
        &mut self,
        mut r: Box<Continuing>,
    ) -> Result<(), InferenceError> {
        let piece = if r.sse.is_some() {
            let frame = match self.frame(&mut r.body).await {
                Ok(f) => f,
                // What follows the finish (usage, `[DONE]`) may be lost.
                Err(_) if r.finished => return Ok(()),
                Err(e) => return Err(e),
            };
            let Some(bytes) = frame else {
                if r.finished {
                    return Ok(());
                }
                return Err(self.decode_error(DecodeError::Cut(
                    "the resumed stream ended without a finish reason".into(),
                )));
            };
            let events = r
                .sse
                .as_mut()
                .map(|p| p.push(&bytes))
                .transpose()
                .map_err(|e| self.decode_error(DecodeError::Malformed(e.to_string())))?
                .unwrap_or_default();
            let mut piece = Piece::default();
            for event in events {
                if event.data.trim() == "[DONE]" || r.finished {
                    continue;
                }
                let p = vllm_chunk(&event.data).map_err(|e| self.decode_error(e))?;
                piece.text.push_str(&p.text);
                piece.ids.extend(p.ids);
                piece.logprobs.extend(p.logprobs);
                if p.finish.is_some() {
                    piece.finish = p.finish;
                }
            }
            piece
        } else {
            let mut bytes = Vec::new();
            while let Some(chunk) = self.frame(&mut r.body).await? {
                bytes.extend_from_slice(&chunk);
            }
            sglang_whole(&bytes).map_err(|e| self.decode_error(e))?
        };
        self.apply(&mut r, piece)?;
        if !r.finished || r.sse.is_some() {
            self.source = Source::Resumed(r);
        }
        Ok(())
    }

    /// Adds a piece's tokens and the events its text brings.
    fn apply(&mut self, r: &mut Continuing, piece: Piece) -> Result<(), InferenceError> {
        let Piece {
            text,
            ids,
            logprobs,
            finish,
            weight_version,
        } = piece;
        self.token_acc_mut().extend_response(&ids, &logprobs);
        if weight_version.is_some() {
            self.info.weight_version = weight_version;
        }
        let diverged = |e: polar_chat::output::OutputError| InferenceError::Malformed {
            backend: self.info.backend.clone(),
            replica: self.info.replica.clone(),
            reason: e.to_string(),
        };
        r.parser.push(&text).map_err(diverged)?;
        if finish.is_some() {
            r.parser.finish().map_err(diverged)?;
        }
        let Some(f) = self.failover.as_deref() else {
            return Ok(());
        };
        let events = f
            .resync
            .step(r.parser.parsed(), r.parser.is_finished())
            .map_err(diverged)?;
        self.pending.extend(events);
        if let Some(reason) = finish {
            r.finished = true;
            let total = self.token_acc().response_len();
            self.timings.finished = Some(self.started.elapsed());
            self.pending.push_back(StreamEvent::Finish {
                finish_reason: match reason {
                    FinishReason::Abort => FinishReason::Abort,
                    other => r.parser.parsed().finish_reason(other),
                },
                usage: Usage {
                    prompt_tokens: r.prompt_len,
                    completion_tokens: total as u32,
                    cached_tokens: None,
                },
            });
        }
        Ok(())
    }
}

fn mark_attempt(headers: &mut http::HeaderMap, attempt: usize) {
    if attempt > 1
        && let Ok(v) = HeaderValue::from_str(&attempt.to_string())
    {
        headers.insert(ATTEMPT_HEADER, v);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::SamplingOverrides;
    use polar_chat::{Message, ResponseFormat, Role, Sampling};

    fn request() -> ChatRequest {
        ChatRequest {
            model: "gpt-5".into(),
            messages: vec![Message::text(Role::User, "hi")],
            tools: Vec::new(),
            tool_choice: None,
            response_format: None,
            sampling: Sampling {
                max_tokens: Some(100),
                temperature: Some(0.3),
                top_p: None,
                top_k: None,
                stop: vec!["END".into()],
                seed: None,
            },
            stream: true,
            extra: Map::new(),
        }
    }

    fn cfg(dialect: Dialect) -> BackendConfig {
        let mut cfg = BackendConfig::new("b", dialect, vec!["http://127.0.0.1:1".into()], "served");
        cfg.output_parser = Some(OutputFormat::Qwen3);
        cfg.sampling.train = SamplingOverrides {
            temperature: Some(1.0),
            top_p: None,
            top_k: Some(-1),
        };
        cfg
    }

    #[test]
    fn vllm_resumes_through_completions_with_the_same_sampling() {
        let base = ResumeBase::new(&cfg(Dialect::Vllm), &request(), SamplingMode::Train).unwrap();
        let max_tokens = base.max_tokens(2, 5, None).unwrap();
        let body = base.vllm_body(&[1, 2, 3, 40, 41], max_tokens);
        assert_eq!(
            body,
            json!({
                "model": "served", "prompt": [1, 2, 3, 40, 41],
                "temperature": 1.0, "top_k": -1, "stop": ["END"], "max_tokens": 98,
                "stream": true, "stream_options": {"include_usage": true},
                "return_token_ids": true, "logprobs": 0,
            })
        );
    }

    #[test]
    fn sglang_resumes_through_generate_with_input_ids() {
        let base = ResumeBase::new(&cfg(Dialect::Sglang), &request(), SamplingMode::Train).unwrap();
        let max_tokens = base.max_tokens(1, 4, Some(1000)).unwrap();
        let body = base.sglang_body(&[1, 2, 3, 40], max_tokens);
        assert_eq!(
            body,
            json!({
                "input_ids": [1, 2, 3, 40],
                "sampling_params": {"temperature": 1.0, "top_k": -1, "stop": ["END"], "max_new_tokens": 99},
                "return_logprob": true, "stream": false,
            })
        );
        assert_eq!(base.left(100), Some(0));
    }

    #[test]
    fn a_resumption_always_sets_its_length() {
        let mut req = request();
        req.sampling.max_tokens = None;
        let base = ResumeBase::new(&cfg(Dialect::Vllm), &req, SamplingMode::Train).unwrap();
        // Without the harness's max_tokens: what is left of the context.
        assert_eq!(base.max_tokens(10, 500, Some(4096)), Ok(3596));
        assert_eq!(base.vllm_body(&[1], 3596)["max_tokens"], json!(3596));
        // Neither known: refused, never the endpoint's 16-token default.
        let err = base.max_tokens(10, 500, None).unwrap_err();
        assert!(err.contains("max_model_len"), "{err}");
        assert!(base.max_tokens(0, 4096, Some(4096)).is_err());
        // The harness's, within the context.
        let base = ResumeBase::new(&cfg(Dialect::Vllm), &request(), SamplingMode::Train).unwrap();
        assert_eq!(base.max_tokens(2, 10, Some(50)), Ok(40));
        assert_eq!(base.max_tokens(2, 10, Some(4096)), Ok(98));
    }

    #[test]
    fn formats_made_of_special_tokens_keep_them_in_the_text() {
        for (dialect, format) in [
            (Dialect::Vllm, OutputFormat::GptOss),
            (Dialect::Sglang, OutputFormat::Llama3Json),
        ] {
            let mut cfg = cfg(dialect);
            cfg.output_parser = Some(format);
            let base = ResumeBase::new(&cfg, &request(), SamplingMode::Train).unwrap();
            let body = match dialect {
                Dialect::Vllm => base.vllm_body(&[1, 2], 1),
                Dialect::Sglang => base.sglang_body(&[1, 2], 1)["sampling_params"].clone(),
            };
            assert_eq!(body["skip_special_tokens"], json!(false), "{format:?}");
        }
    }

    #[test]
    fn constrained_or_unparsed_output_is_not_resumed_token_in() {
        let mut plain = cfg(Dialect::Vllm);
        plain.output_parser = None;
        assert!(ResumeBase::new(&plain, &request(), SamplingMode::Train).is_none());
        let mut req = request();
        req.response_format = Some(ResponseFormat::JsonObject);
        assert!(ResumeBase::new(&cfg(Dialect::Vllm), &req, SamplingMode::Train).is_none());
        let mut req = request();
        req.tool_choice = Some(ToolChoice::Required);
        assert!(ResumeBase::new(&cfg(Dialect::Vllm), &req, SamplingMode::Train).is_none());
        req.tool_choice = Some(ToolChoice::Auto);
        assert!(ResumeBase::new(&cfg(Dialect::Vllm), &req, SamplingMode::Train).is_some());
    }

    #[test]
    fn only_faults_in_the_middle_of_a_reply_fail_over() {
        let cut = InferenceError::StreamCut {
            backend: "b".into(),
            replica: "r".into(),
            events: 3,
            reason: "reset".into(),
        };
        assert!(resumable(&cut));
        assert!(resumable(&InferenceError::Aborted {
            backend: "b".into(),
            replica: "r".into(),
            events: 0,
        }));
        assert!(!resumable(&InferenceError::Malformed {
            backend: "b".into(),
            replica: "r".into(),
            reason: "x".into(),
        }));
        assert!(!resumable(&InferenceError::Timeout {
            backend: "b".into(),
            replica: "r".into(),
            timeout: std::time::Duration::from_secs(1),
            waiting_for: "reply head",
            events: 0,
        }));
    }

    #[test]
    fn parts_count_their_own_tokens() {
        let c = cfg(Dialect::Vllm);
        let resend = Resend::Chat {
            body: Bytes::new(),
            streaming: true,
        };
        let resume = ResumeBase::new(&c, &request(), SamplingMode::Train);
        let mut f = Failover::new(&c, "s", resend, resume);
        let fault = InferenceError::Aborted {
            backend: "b".into(),
            replica: "a".into(),
            events: 2,
        };
        f.note_part(("a", Some("1")), "b", &fault, 4);
        f.note_part(("b", None), "a", &fault, 10);
        let mut r = f.resumed.unwrap();
        set_last_part(&mut r, 13, Some("2"));
        assert_eq!(r.replicas, vec!["a", "b", "a"]);
        assert_eq!(r.part_tokens, vec![4, 6, 3]);
        assert_eq!(r.weight_versions, vec!["1", "", "2"]);
        assert_eq!(r.faults.len(), 2);
    }
}
