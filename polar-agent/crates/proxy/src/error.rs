//! The proxy's errors and the one place that turns them into responses in
//! the harness's API shape (Anthropic, OpenAI or Gemini error bodies, with a
//! fitting status), using the provider layer's error shapes.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use polar_chat::Api;
use polar_chat::provider::{self, ErrorKind, ProviderError, Side};

use super::body::{ProxyBody, full};
use super::shares::OverCap;

/// Where a request named its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedBy {
    /// The `x-polar-session` header.
    Header,
    /// An API key (or `x-polar-key`) issued to a session.
    Key,
}

impl NamedBy {
    /// Its label on the metrics page.
    pub fn label(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::Key => "key",
        }
    }
}

/// What went wrong serving a request.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The request body is over the configured limit.
    #[error("request body over the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// The request could not be read.
    #[error("reading the request: {0}")]
    BadRequest(String),
    /// The session is unknown, or no key proves it (base-URL mode).
    #[error("unknown session: {0}")]
    UnknownSession(String),
    /// The request names a session other than the one the kernel
    /// attributed its connection to.
    #[error("this connection belongs to session {attributed}; its {} names another session", match .via { NamedBy::Header => "x-polar-session header", NamedBy::Key => "API key" })]
    SessionMismatch {
        /// Where it named the other session.
        via: NamedBy,
        /// The connection's session.
        attributed: String,
    },
    /// A fair-share cap was reached.
    #[error(transparent)]
    OverCap(#[from] OverCap),
    /// The upstream could not be reached.
    #[error("upstream {upstream} unreachable: {message}")]
    UpstreamUnreachable {
        /// The upstream.
        upstream: String,
        /// The cause.
        message: String,
    },
    /// The upstream did not answer in time.
    #[error("upstream {upstream} timed out")]
    UpstreamTimeout {
        /// The upstream.
        upstream: String,
    },
    /// No route sends this request anywhere.
    #[error("no model route for {0}")]
    NoRoute(String),
    /// A bug or a local failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ProxyError {
    /// The side at fault and the kind, as the provider layer classifies them.
    pub fn classify(&self) -> (Side, ErrorKind) {
        match self {
            Self::TooLarge { .. } => (Side::Harness, ErrorKind::TooLarge),
            Self::BadRequest(_) => (Side::Harness, ErrorKind::InvalidRequest),
            Self::UnknownSession(_) | Self::SessionMismatch { .. } => {
                (Side::Harness, ErrorKind::InvalidRequest)
            }
            Self::OverCap(_) => (Side::Harness, ErrorKind::Overloaded),
            Self::NoRoute(_) => (Side::Harness, ErrorKind::NotFound),
            Self::UpstreamUnreachable { .. } => (Side::Backend, ErrorKind::BackendUnavailable),
            Self::UpstreamTimeout { .. } => (Side::Backend, ErrorKind::BackendTimeout),
            Self::Internal(_) => (Side::Agent, ErrorKind::Internal),
        }
    }

    /// The response the harness gets, in its API's shape (`api` detected
    /// from the request; OpenAI's shape when unknown).
    pub fn into_response(self, api: Option<Api>) -> Response<ProxyBody> {
        let (side, kind) = self.classify();
        let err = ProviderError::new(side, kind, self.to_string());
        let api = api.unwrap_or(Api::OpenaiChat);
        let (status, body) = provider::error_response(api, &err);
        let status = match &self {
            // No credential, or an unknown one: 401.
            Self::UnknownSession(_) => StatusCode::UNAUTHORIZED,
            // The caller is known (the kernel said whose connection it is)
            // and is asking to act as someone else: 403, which retrying with
            // other credentials on this connection cannot fix.
            Self::SessionMismatch { .. } => StatusCode::FORBIDDEN,
            // The session's own share: 429 (back off); the node's: 503.
            Self::OverCap(o) if o.cap.is_session() => StatusCode::TOO_MANY_REQUESTS,
            Self::OverCap(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        };
        let mut resp = Response::new(full(Bytes::from(body.to_string())));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// A plain response with a JSON body (used for canned answers).
pub fn json_response(status: StatusCode, body: Bytes) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
