//! The record of one captured model call: what the harness sent (native and
//! normalized), what the backend answered, and the token-level data the
//! trajectory builders need. One per call in a session's log (see
//! `polar-capture-log`: one line, or two joined by the reader).
//!
//! Pure: above `polar-chat` and `polar-json` only, so the trajectory
//! builders read records without the capture log's I/O. Tests: the log's
//! round-trip tests in `polar-capture-log`.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

use polar_chat::{Api, ChatRequest, ChatResponse, FinishReason};
/// How a call's prompt reached the backend ([`BackendInfo::serving`]).
pub use polar_faithful::Serving;
use polar_json::RawJson;

/// Version of the record layout, stored in every record.
pub const RECORD_VERSION: u32 = 1;

/// The request as the harness sent it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NativeRequest {
    /// The API.
    pub api: Api,
    /// HTTP method.
    pub method: String,
    /// Host the harness addressed.
    pub host: String,
    /// Path and query.
    pub path: String,
    /// The JSON body, as the harness sent it (a body that is not JSON is
    /// kept as a JSON string of its text).
    pub body: RawJson,
}

/// Outcome of a call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CallStatus {
    /// The backend answered completely.
    Completed,
    /// The call failed; the harness got an error in its API's shape.
    Failed {
        /// Which side failed: `harness` (a bad request, one the backend
        /// refused included, such as a prompt over its context; or the
        /// harness went away), `backend` (the backend failed: an error
        /// status, a cut, a timeout, an `abort` finish), `agent` (Polar).
        side: String,
        /// The error message.
        error: String,
    },
}

/// Timings in milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// The request arrived at the agent.
    pub received_ms: u64,
    /// The request left the agent for its replica: `sent_ms - received_ms`
    /// is the call's wait in the agent (a paused generation, reading and
    /// normalizing the request), apart from the backend's time to first
    /// token after it. Absent in records written before this field and in
    /// calls that never reached a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_ms: Option<u64>,
    /// The first token reached the agent (streams).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_ms: Option<u64>,
    /// The backend finished.
    pub finished_ms: u64,
}

/// The backend that served a call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendInfo {
    /// Backend name from the config.
    pub name: String,
    /// Replica URL.
    pub replica: String,
    /// The model name the backend served.
    pub served_model: String,
    /// The backend's own weight version, when it reported one for this
    /// call (SGLang's `meta_info.weight_version` or top-level
    /// `metadata.weight_version`, an `x-weight-version` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// How the prompt reached the backend: rendered by Polar and sent as
    /// token ids (and how those were built), or rendered by the backend's
    /// chat endpoint. Absent in records older than token-faithful serving
    /// and for calls that never reached a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<polar_faithful::Serving>,
}

/// A reply that went on after its backend failed: resumed from the tokens
/// generated so far, or sent again whole (a part with no ids: a replica
/// that failed before its reply began, or before any output), on the same
/// or another replica, and the harness got one reply. Its token ids and logprobs are
/// those of every part, in order, in the record's `response_token_ids` and
/// `response_logprobs`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// The replica of each part, in order (the first is the one that
    /// failed first; the last one finished the reply).
    pub replicas: Vec<String>,
    /// The number of response token ids each part generated.
    pub part_tokens: Vec<u32>,
    /// The weight version each part's replica reported (empty string when
    /// it reported none): parts generated on both sides of a weight update
    /// differ.
    pub weight_versions: Vec<String>,
    /// Why each part but the last ended (a cut, an `abort` finish...).
    pub faults: Vec<String>,
}

/// One captured model call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionRecord {
    /// Layout version ([`RECORD_VERSION`]).
    pub version: u32,
    /// Unique id of this call.
    pub call_id: String,
    /// Position of the call in its session (0, 1, ...).
    pub seq: u64,
    /// The session.
    pub session_id: String,
    /// The task, when the session belongs to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The policy version the session ran under, as its task (or the
    /// session) named it (`metadata.policy_version`) when the call arrived;
    /// what the backend itself reported is [`BackendInfo::weight_version`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<String>,
    /// What the harness sent.
    pub native_request: NativeRequest,
    /// The normalized request sent to the backend.
    pub request: ChatRequest,
    /// The normalized reply (absent when the call failed before one existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ChatResponse>,
    /// The prompt token ids as the server tokenized them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The generated token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_token_ids: Option<Vec<u32>>,
    /// Log-probabilities of the generated tokens (same length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_logprobs: Option<Vec<f32>>,
    /// True when the backend gave no token ids: such a call is never filled
    /// in by re-tokenizing text.
    pub token_ids_missing: bool,
    /// Why generation stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// The backend.
    pub backend: BackendInfo,
    /// Timings.
    pub timings: Timings,
    /// Set when the reply was resumed after a backend fault (absent
    /// otherwise, and in logs written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Resumed>,
    /// Outcome.
    #[serde(flatten)]
    pub status: CallStatus,
}
