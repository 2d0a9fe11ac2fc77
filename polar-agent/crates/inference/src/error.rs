//! The errors of inference calls, classified by how far the call got: never
//! reached a replica, refused by the backend (HTTP status), too slow, cut
//! after the reply began, aborted by the backend, or not understood. Every variant but `Config` is
//! the backend's side.

use std::time::Duration;

/// Why an inference call failed.
#[derive(Debug, thiserror::Error)]
pub enum InferenceError {
    /// The backend's settings are invalid (the agent's side).
    #[error("backend {backend}: `{key}`: {reason}")]
    Config {
        /// Backend name.
        backend: String,
        /// The key at fault.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// No replica could be reached: every attempt failed before a byte of
    /// the request was sent (connection refused or connect timeout).
    #[error("backend {backend}: no replica reachable after {attempts} attempt(s): {last}")]
    Unreachable {
        /// Backend name.
        backend: String,
        /// Replicas tried.
        attempts: usize,
        /// The last cause.
        last: String,
    },
    /// The backend answered with a non-success HTTP status.
    #[error("backend {backend} ({replica}) answered HTTP {status}: {body}")]
    Status {
        /// Backend name.
        backend: String,
        /// Replica URL.
        replica: String,
        /// HTTP status.
        status: u16,
        /// The reply body (truncated).
        body: String,
    },
    /// Nothing arrived within the request timeout (the reply head, or the
    /// next part of the body).
    #[error(
        "backend {backend} ({replica}): nothing within {timeout:?} waiting for {waiting_for} ({events} event(s) yielded)"
    )]
    Timeout {
        /// Backend name.
        backend: String,
        /// Replica URL.
        replica: String,
        /// The timeout.
        timeout: Duration,
        /// `reply head` or `reply body`.
        waiting_for: &'static str,
        /// Events yielded before.
        events: usize,
    },
    /// The request reached the replica but the connection failed before a
    /// reply head arrived.
    #[error(
        "backend {backend} ({replica}): connection failed after the request was sent: {reason}"
    )]
    Disconnected {
        /// Backend name.
        backend: String,
        /// Replica URL.
        replica: String,
        /// The cause.
        reason: String,
    },
    /// The reply began (head received) but broke before its end: the
    /// connection dropped, or the backend sent an error inside the stream.
    /// `events` events were yielded before.
    #[error("backend {backend} ({replica}): reply cut after {events} event(s): {reason}")]
    StreamCut {
        /// Backend name.
        backend: String,
        /// Replica URL.
        replica: String,
        /// Events yielded before.
        events: usize,
        /// The cause.
        reason: String,
    },
    /// The backend stopped generating before the end of the turn and said
    /// so with an `abort` finish (SGLang's `/abort_request` and
    /// `/pause_generation`, vLLM's abort of a request): an HTTP 200 reply
    /// that is no end of turn. `events` events were yielded before (the
    /// tokens generated before the abort are in the stream's token data).
    #[error(
        "backend {backend} ({replica}): generation aborted (finish reason abort) after {events} event(s)"
    )]
    Aborted {
        /// Backend name.
        backend: String,
        /// Replica URL.
        replica: String,
        /// Events yielded before.
        events: usize,
    },
    /// The request needs what this backend cannot do (constrained decoding
    /// on a backend configured with `constrained_decoding = false`): the
    /// harness's side, refused before anything is sent.
    #[error("backend {backend} cannot honour {feature} (constrained_decoding = false)")]
    Unsupported {
        /// Backend name.
        backend: String,
        /// What the request asked for.
        feature: &'static str,
    },
    /// The model's chat template cannot render the request (it raised,
    /// or the request holds content a text model cannot take, such as an
    /// image): the harness's side, refused before anything is sent.
    #[error("backend {backend}: the model's chat template cannot render the request: {reason}")]
    Unrenderable {
        /// Backend name.
        backend: String,
        /// Why.
        reason: String,
    },
    /// The model's tokenizer failed on a rendered prompt: the node's model
    /// files are at fault.
    #[error("backend {backend}: the model's tokenizer failed: {reason}")]
    Tokenizer {
        /// Backend name.
        backend: String,
        /// Why.
        reason: String,
    },
    /// A prompt Polar rendered does not fit the model's context (refused
    /// before anything is sent).
    #[error("backend {backend}: the prompt has {prompt} tokens, the model's context holds {max}")]
    PromptTooLong {
        /// Backend name.
        backend: String,
        /// The prompt's tokens.
        prompt: u32,
        /// The model's context length.
        max: u32,
    },
    /// The reply could not be understood.
    #[error("backend {backend} ({replica}): malformed reply: {reason}")]
    Malformed {
        /// Backend name.
        backend: String,
        /// Replica URL.
        replica: String,
        /// What is wrong.
        reason: String,
    },
}

impl InferenceError {
    /// Whether the request reached a replica (so it may have been processed).
    pub fn reached_backend(&self) -> bool {
        !matches!(
            self,
            Self::Config { .. }
                | Self::Unreachable { .. }
                | Self::Unsupported { .. }
                | Self::Unrenderable { .. }
                | Self::Tokenizer { .. }
                | Self::PromptTooLong { .. }
        )
    }

    /// The replica that answered or was reached, when one was.
    pub fn replica(&self) -> Option<&str> {
        match self {
            Self::Config { .. }
            | Self::Unreachable { .. }
            | Self::Unsupported { .. }
            | Self::Unrenderable { .. }
            | Self::Tokenizer { .. }
            | Self::PromptTooLong { .. } => None,
            Self::Status { replica, .. }
            | Self::Timeout { replica, .. }
            | Self::Disconnected { replica, .. }
            | Self::StreamCut { replica, .. }
            | Self::Aborted { replica, .. }
            | Self::Malformed { replica, .. } => Some(replica),
        }
    }

    /// The backend's refusal of a request over the model's context (an
    /// HTTP 400, 413 or 422 whose text says so), if this is one.
    pub fn context_overflow(&self) -> Option<crate::ContextOverflow> {
        match self {
            Self::Status {
                status: 400 | 413 | 422,
                body,
                ..
            } => crate::context_overflow(body),
            Self::PromptTooLong { prompt, max, .. } => Some(crate::ContextOverflow {
                prompt: *prompt,
                completion: None,
                max: *max,
            }),
            _ => None,
        }
    }

    /// Whether this is a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }
}
