//! The provider layer: pure, I/O-free translation between the harness APIs
//! (Anthropic Messages, OpenAI Chat Completions, OpenAI Responses, Gemini) and
//! the normalized chat model of [`polar_chat`].
//!
//! What this module owns:
//! - [`detect`]: which API a request speaks, or which side call it is
//!   (token counting, model listing, Codex's WebSocket attempt, other
//!   traffic), with [`canned`] answers for the side calls a harness needs.
//! - Per API (one file each, laid out as types, request conversion, response
//!   conversion, stream encoder, errors, tests): request -> [`ChatRequest`],
//!   [`ChatResponse`] -> native JSON, a [`StreamEncoder`] turning
//!   [`StreamEvent`]s into the API's exact SSE sequence, and the API's error
//!   body.
//! - [`assemble`] / [`events_of`]: the fold between a stream of events and a
//!   complete reply, and [`with_history`] for `previous_response_id`.
//! - [`sse`]: SSE events with JSON data (the framing is [`polar_sse`]).
//!
//! Names are passed through untouched: tool names longer than 64 characters
//! (a limit some APIs enforce) are kept as they are, and the backend sees
//! them as-is; call ids round-trip exactly (Gemini's are synthesized, see
//! [`gemini`]).
//!
//! Nothing here touches a socket or a clock: times (`created`) come in
//! through [`ReplyOptions`], ids are derived from the ids the caller gives.

pub mod anthropic;
pub mod canned;
pub mod gemini;
pub mod openai_chat;
pub mod openai_responses;
mod read;
pub mod sse;
pub mod structured;

#[cfg(test)]
mod fixtures;

use std::fmt;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::Api;
use crate::{ChatRequest, ChatResponse, FinishReason, Message, Part, StreamEvent};
use polar_json::{Doc, Json};

// ---------------------------------------------------------------- errors

/// Which side of the proxy an error comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The harness sent something wrong.
    Harness,
    /// The inference backend failed.
    Backend,
    /// The agent itself failed (a bug).
    Agent,
}

/// What went wrong; decides the status and the error type in each API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ErrorKind {
    /// The request is malformed or misses required fields (400).
    #[error("invalid request")]
    InvalidRequest,
    /// The request is larger than allowed (413).
    #[error("request too large")]
    TooLarge,
    /// The backend refused the request because it does not fit the
    /// model's context (400): answered in the words each API's servers use,
    /// the ones its harnesses compact (or shrink `max_tokens`) on.
    #[error("context overflow")]
    ContextOverflow {
        /// The prompt's tokens.
        prompt: u32,
        /// The completion tokens asked for, when the backend said.
        completion: Option<u32>,
        /// The model's context length.
        max: u32,
    },
    /// The request asks for something the proxy cannot do (400).
    #[error("unsupported")]
    Unsupported,
    /// The model or path does not exist (404).
    #[error("not found")]
    NotFound,
    /// No backend replica could be reached (502).
    #[error("backend unavailable")]
    BackendUnavailable,
    /// The backend did not answer in time (504).
    #[error("backend timeout")]
    BackendTimeout,
    /// The backend answered with an error or garbage (502).
    #[error("backend error")]
    BackendError,
    /// The backend is overloaded, paused, or stopped the generation (503;
    /// 529 for Anthropic): what each API's own servers answer when
    /// overloaded, retried by every harness of that API.
    #[error("overloaded")]
    Overloaded,
    /// The agent failed (500).
    #[error("internal error")]
    Internal,
}

impl ErrorKind {
    /// The HTTP status for this kind in `api`'s conventions, chosen so that
    /// every harness's own retry logic applies to the backend's transient
    /// failures (docs/ROLLOUT-API.md, "Faults"): an overload is what the
    /// API's servers send for one (Anthropic `529 overloaded_error`, OpenAI
    /// `503`, Gemini `503 UNAVAILABLE`), never 429, which Codex CLI does not
    /// retry; a backend that failed or could not be reached is 502, and one
    /// too slow 504 (5xx: retried by all six CLIs).
    pub fn status(self, api: Api) -> u16 {
        match self {
            Self::InvalidRequest | Self::Unsupported | Self::ContextOverflow { .. } => 400,
            Self::TooLarge => 413,
            Self::NotFound => 404,
            Self::BackendUnavailable | Self::BackendError => 502,
            Self::BackendTimeout => 504,
            Self::Overloaded => match api {
                Api::AnthropicMessages => 529,
                Api::OpenaiChat | Api::OpenaiResponses | Api::Gemini => 503,
            },
            Self::Internal => 500,
        }
    }
}

/// An error to report to the harness, in its API's shape.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} ({side} side): {message}")]
pub struct ProviderError {
    /// Whose fault it is.
    pub side: Side,
    /// What went wrong.
    pub kind: ErrorKind,
    /// A message for the harness's user (never secrets or bodies).
    pub message: String,
}

impl ProviderError {
    /// An error of `kind` on `side`.
    pub fn new(side: Side, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            side,
            kind,
            message: message.into(),
        }
    }

    /// The harness sent an invalid request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Side::Harness, ErrorKind::InvalidRequest, message)
    }
}

/// The status and JSON body that report `err` to a harness speaking `api`.
pub fn error_response(api: Api, err: &ProviderError) -> (u16, Value) {
    match api {
        Api::AnthropicMessages => anthropic::error_body(err),
        Api::OpenaiChat => openai_chat::error_body(err),
        Api::OpenaiResponses => openai_responses::error_body(err),
        Api::Gemini => gemini::error_body(err),
    }
}

// ---------------------------------------------------------------- detection

/// Read access to request headers, by case-insensitive name.
pub trait Headers {
    /// The first value of header `name`.
    fn header(&self, name: &str) -> Option<&str>;
}

impl Headers for http::HeaderMap {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Headers for [(K, V)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> Headers for [(K, V); N] {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Headers for Vec<(K, V)> {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

/// How a reply must be framed on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Framing {
    /// One JSON body.
    Json,
    /// Server-sent events.
    Sse,
    /// A JSON array of chunks (Gemini `streamGenerateContent` without
    /// `alt=sse`).
    JsonArray,
}

impl Framing {
    /// The `Content-Type` of a reply in this framing.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Sse => "text/event-stream",
            Self::Json | Self::JsonArray => "application/json",
        }
    }
}

/// A model call: which API, and how to frame the reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelCall {
    /// The API the harness speaks.
    pub api: Api,
    /// How the reply is framed: from the path (Gemini) or `stream` (others).
    pub framing: Framing,
    /// The model named in the path (Gemini), percent-decoding not applied.
    pub path_model: Option<String>,
}

/// Traffic besides model calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SideCall {
    /// Token counting (Anthropic `/v1/messages/count_tokens`, Gemini
    /// `:countTokens`): counted by the backend ([`canned::count_request`]
    /// says what), answered with [`canned::count_tokens`].
    CountTokens {
        /// The API it belongs to.
        api: Api,
    },
    /// Model listing (`GET .../models`): answer with [`canned::list_models`].
    ListModels {
        /// The API whose list shape to answer in.
        api: Api,
    },
    /// Codex's WebSocket upgrade on `GET /v1/responses`: answer with
    /// [`canned::websocket_refusal`] (426) so it falls back to SSE.
    ResponsesWebsocket,
    /// Anything else (telemetry, feature flags, update checks): answered or
    /// passed through per the routing rules.
    Other,
}

/// What a request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detected {
    /// A model call to translate.
    Model(ModelCall),
    /// A side call.
    Side(SideCall),
}

/// What detection reads of a body: which top-level members it has, and
/// its `stream` flag.
pub trait BodyShape {
    /// Whether the body is an object with member `key`.
    fn has(&self, key: &str) -> bool;
    /// Whether the body's `stream` is `true`.
    fn streams(&self) -> bool;
}

impl BodyShape for Value {
    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn streams(&self) -> bool {
        self.get("stream").and_then(Value::as_bool) == Some(true)
    }
}

impl BodyShape for Json<'_> {
    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn streams(&self) -> bool {
        self.get("stream").and_then(|s| s.as_bool()) == Some(true)
    }
}

/// Classify a request by path first, then by headers (`anthropic-version`,
/// `x-goog-api-key`) and body shape. `path` may carry a query.
pub fn detect(
    method: &str,
    path: &str,
    headers: &(impl Headers + ?Sized),
    body: &impl BodyShape,
) -> Detected {
    let (path_only, query) = path.split_once('?').unwrap_or((path, ""));
    let trimmed = path_only.trim_end_matches('/');
    let is = |m: &str| method.eq_ignore_ascii_case(m);

    if is("GET") {
        return detect_get(trimmed, headers);
    }
    if !is("POST") {
        return Detected::Side(SideCall::Other);
    }
    if let Some(detected) = detect_gemini_path(trimmed, query) {
        return detected;
    }
    if trimmed.ends_with("/messages/count_tokens") {
        return Detected::Side(SideCall::CountTokens {
            api: Api::AnthropicMessages,
        });
    }
    if trimmed.ends_with("/v1/messages") || trimmed == "/messages" {
        return model_by_body(Api::AnthropicMessages, body);
    }
    if trimmed.ends_with("/chat/completions") {
        return model_by_body(Api::OpenaiChat, body);
    }
    if trimmed.ends_with("/v1/responses") || trimmed == "/responses" {
        return model_by_body(Api::OpenaiResponses, body);
    }
    detect_by_shape(query, headers, body)
}

/// A model call of `api` with no model in the path, streamed when the body
/// says `"stream": true`.
fn model_by_body(api: Api, body: &impl BodyShape) -> Detected {
    Detected::Model(ModelCall {
        api,
        framing: if body.streams() {
            Framing::Sse
        } else {
            Framing::Json
        },
        path_model: None,
    })
}

/// A `GET` (query removed, no trailing `/`): the Responses websocket, a
/// model list, or another side call.
fn detect_get(trimmed: &str, headers: &(impl Headers + ?Sized)) -> Detected {
    if trimmed.ends_with("/responses") {
        return Detected::Side(SideCall::ResponsesWebsocket);
    }
    if trimmed.ends_with("/models") {
        let api = if trimmed.contains("/v1beta/") || headers.header("x-goog-api-key").is_some() {
            Api::Gemini
        } else if headers.header("anthropic-version").is_some() {
            Api::AnthropicMessages
        } else {
            Api::OpenaiChat
        };
        return Detected::Side(SideCall::ListModels { api });
    }
    Detected::Side(SideCall::Other)
}

/// A `POST` to a Gemini path, `.../models/{model}:{method}`.
fn detect_gemini_path(trimmed: &str, query: &str) -> Option<Detected> {
    let (before, method_name) = trimmed.rsplit_once(':')?;
    let model_name = before.rsplit('/').next()?;
    if !before.contains("/models/") {
        return None;
    }
    let path_model = Some(model_name.to_owned());
    let sse = query
        .split('&')
        .any(|kv| kv.eq_ignore_ascii_case("alt=sse"));
    Some(match method_name {
        "generateContent" => Detected::Model(ModelCall {
            api: Api::Gemini,
            framing: Framing::Json,
            path_model,
        }),
        "streamGenerateContent" => Detected::Model(ModelCall {
            api: Api::Gemini,
            framing: if sse {
                Framing::Sse
            } else {
                Framing::JsonArray
            },
            path_model,
        }),
        "countTokens" => Detected::Side(SideCall::CountTokens { api: Api::Gemini }),
        _ => Detected::Side(SideCall::Other),
    })
}

/// The fallback for a `POST` to an unknown path: headers and body shape,
/// only for bodies that name a model and carry a conversation.
fn detect_by_shape(
    query: &str,
    headers: &(impl Headers + ?Sized),
    body: &impl BodyShape,
) -> Detected {
    let has = |k: &str| body.has(k);
    if headers.header("x-goog-api-key").is_some() || (has("contents") && !has("messages")) {
        if has("contents") {
            return Detected::Model(ModelCall {
                api: Api::Gemini,
                framing: if query.contains("alt=sse") {
                    Framing::Sse
                } else {
                    Framing::Json
                },
                path_model: None,
            });
        }
        return Detected::Side(SideCall::Other);
    }
    if !has("model") {
        return Detected::Side(SideCall::Other);
    }
    if has("messages")
        && (headers.header("anthropic-version").is_some() || has("max_tokens") && has("system"))
    {
        return model_by_body(Api::AnthropicMessages, body);
    }
    if has("messages") {
        return model_by_body(Api::OpenaiChat, body);
    }
    if has("input") {
        return model_by_body(Api::OpenaiResponses, body);
    }
    Detected::Side(SideCall::Other)
}

// ---------------------------------------------------------------- the shared trait

/// A request parsed into the normalized model, with what the reply needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedRequest {
    /// The normalized request.
    pub request: ChatRequest,
    /// OpenAI Responses `previous_response_id`: the proxy prepends the
    /// stored conversation with [`with_history`].
    pub previous_response_id: Option<String>,
    /// OpenAI Chat `stream_options.include_usage`.
    pub include_usage: bool,
    /// OpenAI Responses: a server-side compaction request (its last input
    /// item is a `compaction_trigger`): the reply is one compaction item.
    pub compaction: bool,
}

impl ParsedRequest {
    /// The reply options for this request made at `created` (Unix seconds).
    pub fn reply_options(&self, call: &ModelCall, created: u64) -> ReplyOptions {
        ReplyOptions {
            created,
            include_usage: self.include_usage,
            framing: call.framing,
            response_format: self.request.response_format.clone(),
            compaction: self.compaction,
        }
    }
}

/// What a reply needs besides the [`ChatResponse`] or events.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplyOptions {
    /// Creation time, Unix seconds (`created`, `created_at`).
    pub created: u64,
    /// Send a usage chunk at the end of a Chat stream.
    pub include_usage: bool,
    /// How the reply is framed.
    pub framing: Framing,
    /// The structured output asked for, echoed where the API echoes it
    /// (Responses `text.format`; OpenAI Chat, Anthropic and Gemini replies
    /// carry no echo).
    pub response_format: Option<crate::ResponseFormat>,
    /// Answer with one compaction item (OpenAI Responses; see
    /// [`ParsedRequest::compaction`]).
    pub compaction: bool,
}

/// One wire protocol.
pub trait Protocol {
    /// The API.
    const API: Api;
    /// Its stream encoder.
    type Encoder: StreamEncoder;
    /// Parse a request body into the normalized model.
    fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError>;
    /// The complete (non-streamed) reply body.
    fn response_body(resp: &ChatResponse, opts: &ReplyOptions) -> Bytes;
    /// A stream encoder for one reply.
    fn encoder(opts: &ReplyOptions) -> Self::Encoder;
    /// Status and body reporting `err`.
    fn error_body(err: &ProviderError) -> (u16, Value);
}

/// Turns [`StreamEvent`]s, one at a time as they arrive, into the bytes of
/// an API's stream.
pub trait StreamEncoder {
    /// Encode one event (may be empty when the API has nothing to send yet).
    fn push(&mut self, event: &StreamEvent) -> Bytes;
    /// The API's mid-stream error form; the stream is over after it.
    fn error(&mut self, err: &ProviderError) -> Bytes;
    /// Whether the stream is complete (after `Finish` or an error).
    fn is_done(&self) -> bool;
}

/// Encode a whole event list (replaying a complete reply as a stream).
pub fn encode_all(enc: &mut impl StreamEncoder, events: &[StreamEvent]) -> Bytes {
    let mut out = Vec::new();
    for ev in events {
        out.extend_from_slice(&enc.push(ev));
    }
    Bytes::from(out)
}

/// Parse a model call's body held as a tree (tests, tools): written out
/// and read as the agent reads bodies, with [`parse_request`].
pub fn parse_request_value(call: &ModelCall, body: &Value) -> Result<ParsedRequest, ProviderError> {
    let text = serde_json::to_vec(body)
        .map_err(|e| ProviderError::invalid(format!("the request body is not JSON: {e}")))?;
    let doc = Doc::parse(&text)
        .map_err(|e| ProviderError::invalid(format!("the request body is not JSON: {e}")))?;
    parse_request(call, doc.root())
}

/// Parse a model call's body.
pub fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError> {
    match call.api {
        Api::AnthropicMessages => anthropic::Anthropic::parse_request(call, body),
        Api::OpenaiChat => openai_chat::OpenaiChat::parse_request(call, body),
        Api::OpenaiResponses => openai_responses::OpenaiResponses::parse_request(call, body),
        Api::Gemini => gemini::Gemini::parse_request(call, body),
    }
}

/// The complete reply body in `api`'s shape.
pub fn response_body(api: Api, resp: &ChatResponse, opts: &ReplyOptions) -> Bytes {
    match api {
        Api::AnthropicMessages => anthropic::Anthropic::response_body(resp, opts),
        Api::OpenaiChat => openai_chat::OpenaiChat::response_body(resp, opts),
        Api::OpenaiResponses => openai_responses::OpenaiResponses::response_body(resp, opts),
        Api::Gemini => gemini::Gemini::response_body(resp, opts),
    }
}

/// A stream encoder for any API.
#[derive(Debug)]
pub enum Encoder {
    /// Anthropic Messages.
    Anthropic(anthropic::Encoder),
    /// OpenAI Chat Completions.
    OpenaiChat(openai_chat::Encoder),
    /// OpenAI Responses (boxed: its state is by far the largest).
    OpenaiResponses(Box<openai_responses::Encoder>),
    /// Gemini.
    Gemini(gemini::Encoder),
}

/// A stream encoder for a reply in `api`.
pub fn encoder(api: Api, opts: &ReplyOptions) -> Encoder {
    match api {
        Api::AnthropicMessages => Encoder::Anthropic(anthropic::Anthropic::encoder(opts)),
        Api::OpenaiChat => Encoder::OpenaiChat(openai_chat::OpenaiChat::encoder(opts)),
        Api::OpenaiResponses => {
            Encoder::OpenaiResponses(Box::new(openai_responses::OpenaiResponses::encoder(opts)))
        }
        Api::Gemini => Encoder::Gemini(gemini::Gemini::encoder(opts)),
    }
}

impl StreamEncoder for Encoder {
    fn push(&mut self, event: &StreamEvent) -> Bytes {
        match self {
            Self::Anthropic(e) => e.push(event),
            Self::OpenaiChat(e) => e.push(event),
            Self::OpenaiResponses(e) => e.push(event),
            Self::Gemini(e) => e.push(event),
        }
    }

    fn error(&mut self, err: &ProviderError) -> Bytes {
        match self {
            Self::Anthropic(e) => e.error(err),
            Self::OpenaiChat(e) => e.error(err),
            Self::OpenaiResponses(e) => e.error(err),
            Self::Gemini(e) => e.error(err),
        }
    }

    fn is_done(&self) -> bool {
        match self {
            Self::Anthropic(e) => e.is_done(),
            Self::OpenaiChat(e) => e.is_done(),
            Self::OpenaiResponses(e) => e.is_done(),
            Self::Gemini(e) => e.is_done(),
        }
    }
}

// ---------------------------------------------------------------- events <-> reply

pub use crate::assemble;

/// The events that stream `resp` (for replaying a non-streamed backend reply
/// as a stream). `assemble(&events_of(r)) == r` for replies whose content is
/// empty or one non-empty text part and whose reasoning has no `encrypted`,
/// token fields aside.
pub fn events_of(resp: &ChatResponse) -> Vec<StreamEvent> {
    let mut out = vec![StreamEvent::Start {
        id: resp.id.clone(),
        model: resp.model.clone(),
        prompt_tokens: Some(resp.usage.prompt_tokens),
    }];
    if let Some(r) = &resp.message.reasoning {
        if !r.text.is_empty() {
            out.push(StreamEvent::ReasoningDelta {
                text: r.text.clone(),
            });
        }
        out.push(StreamEvent::ReasoningDone {
            signature: r.signature.clone(),
        });
    }
    let text = resp.message.joined_text();
    if !text.is_empty() {
        out.push(StreamEvent::TextDelta { text });
    }
    for (i, c) in resp.message.tool_calls.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        out.push(StreamEvent::ToolCallStart {
            index,
            id: c.id.clone(),
            name: c.name.clone(),
        });
        if !c.arguments.is_empty() {
            out.push(StreamEvent::ToolCallDelta {
                index,
                arguments: c.arguments.clone(),
            });
        }
    }
    out.push(StreamEvent::Finish {
        finish_reason: resp.finish_reason.clone(),
        usage: resp.usage,
    });
    out
}

// ---------------------------------------------------------------- previous_response_id

/// Key in [`Message::extra`] naming where a message came from when that
/// matters later (`"instructions"`: OpenAI Responses `instructions`, which
/// a `previous_response_id` continuation does not inherit).
pub const SOURCE_KEY: &str = "polar_source";

/// The conversation to store under a reply's id for a later
/// `previous_response_id`: the request's messages and the reply.
pub fn conversation_after(req: &ChatRequest, resp: &ChatResponse) -> Vec<Message> {
    let mut out = req.messages.clone();
    out.push(resp.message.clone());
    out
}

/// The full request for a `previous_response_id` continuation: the new
/// request's `instructions` first (the old ones are not inherited), then the
/// stored conversation, then the new input.
pub fn with_history(prior: &[Message], mut req: ChatRequest) -> ChatRequest {
    let is_instr =
        |m: &Message| m.extra.get(SOURCE_KEY).and_then(Value::as_str) == Some("instructions");
    let (instr, rest): (Vec<Message>, Vec<Message>) = std::mem::take(&mut req.messages)
        .into_iter()
        .partition(is_instr);
    let mut messages = instr;
    messages.extend(prior.iter().filter(|m| !is_instr(m)).cloned());
    messages.extend(rest);
    req.messages = messages;
    req
}

// ---------------------------------------------------------------- shared helpers

/// Append `{"index": index, ...fields}` to the array `extra[key]` (the
/// unknown fields of a block or part, kept by position); nothing when
/// `fields` is empty.
pub(crate) fn push_indexed(
    extra: &mut Map<String, Value>,
    key: &str,
    index: usize,
    fields: Map<String, Value>,
) {
    if fields.is_empty() {
        return;
    }
    let mut e = Map::new();
    e.insert("index".into(), Value::from(index));
    e.extend(fields);
    if let Value::Array(list) = extra.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
        list.push(Value::Object(e));
    }
}

/// Appends `value` as compact JSON to `out`. What is written here (the
/// replies' own types, trees of JSON) always serializes; were something
/// not to, `null` would stand in for it.
pub(crate) fn write_json(out: &mut Vec<u8>, value: &impl Serialize) {
    let start = out.len();
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.truncate(start);
        out.extend_from_slice(b"null");
    }
}

/// `value` as compact JSON.
pub(crate) fn json_bytes(value: &impl Serialize) -> Bytes {
    let mut out = Vec::new();
    write_json(&mut out, value);
    Bytes::from(out)
}

/// `id` with `prefix` (kept when it already has it); other characters than
/// `[A-Za-z0-9_-]` are dropped so the result is safe in any API.
pub(crate) fn prefixed_id(prefix: &str, id: &str) -> String {
    if id.starts_with(prefix) {
        return id.to_owned();
    }
    let clean: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        .collect();
    let clean = ["chatcmpl-", "chatcmpl_", "resp_", "resp-", "msg_", "msg-"]
        .iter()
        .find_map(|p| clean.strip_prefix(p))
        .unwrap_or(&clean);
    if clean.is_empty() {
        format!("{prefix}0")
    } else {
        format!("{prefix}{clean}")
    }
}

/// Split a `data:` URL into its media type and base64 payload.
pub(crate) fn parse_data_url(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let media = meta.strip_suffix(";base64")?;
    Some((media.to_owned(), data.to_owned()))
}

/// An image part from a URL (a `data:` URL becomes inline data).
pub(crate) fn image_from_url(url: &str) -> Part {
    match parse_data_url(url) {
        Some((media, data)) => Part::Image {
            media_type: Some(media),
            data: Some(data),
            url: None,
        },
        None => Part::Image {
            media_type: None,
            data: None,
            url: Some(url.to_owned()),
        },
    }
}

/// Parse tool-call arguments text as a JSON object for APIs that carry
/// arguments as objects (Anthropic `input`, Gemini `args`). Empty text is
/// `{}`; text that is not a JSON object is kept as `{"arguments": <text>}`
/// so nothing generated is lost.
pub(crate) fn arguments_object(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => serde_json::json!({ "arguments": arguments }),
    }
}

/// The effective finish reason: a `Stop` with tool calls is a tool-call stop.
pub(crate) fn effective_finish(reason: &FinishReason, has_tool_calls: bool) -> FinishReason {
    match reason {
        FinishReason::Stop | FinishReason::Abort if has_tool_calls => FinishReason::ToolCalls,
        other => other.clone(),
    }
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Harness => "harness",
            Self::Backend => "backend",
            Self::Agent => "agent",
        })
    }
}

#[cfg(test)]
mod tests;
