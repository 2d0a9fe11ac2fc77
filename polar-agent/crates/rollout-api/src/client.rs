//! [`RolloutClient`]: the rollout API from the caller's side, for the CLI
//! (`polar submit`, `polar status`), gateways (the simulated one, later the
//! real one) and tests. One method per endpoint; errors keep the server's
//! status, code and field.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::http::{HttpClient, bearer_value, client, default_client, join};
use polar_rollout_types::{
    DrainReply, ErrorBody, Heartbeat, HeartbeatReply, NodeList, NodeRegistration, RegisterReply,
    ServerStatus, SessionProgress, SessionResult, SubmitReply, TaskList, TaskStatus, TaskView,
};

/// Largest reply read.
const MAX_REPLY: usize = 64 << 20;

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached or the exchange broke off.
    #[error("{url}: {reason}")]
    Transport {
        /// The URL called.
        url: String,
        /// Why.
        reason: String,
    },
    /// No reply within the timeout.
    #[error("{url}: no reply within {timeout:?}")]
    Timeout {
        /// The URL called.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The server answered with an error status.
    #[error("{status}: {message}")]
    Status {
        /// The HTTP status.
        status: StatusCode,
        /// The error code from the body (`invalid_request`...).
        code: String,
        /// The field at fault, if named.
        field: Option<String>,
        /// The message.
        message: String,
    },
    /// The reply is not what the API promises.
    #[error("{url}: unexpected reply: {reason}")]
    Reply {
        /// The URL called.
        url: String,
        /// Why.
        reason: String,
    },
}

impl ClientError {
    /// The HTTP status of a server error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The rollout API client.
#[derive(Clone, Debug)]
pub struct RolloutClient {
    base: String,
    token: Option<String>,
    http: HttpClient,
    timeout: Duration,
}

impl RolloutClient {
    /// A client for the server at `base` (`http://127.0.0.1:7070`,
    /// `https://...` verified against the system's roots).
    pub fn new(base: impl Into<String>, token: Option<String>) -> Self {
        Self {
            base: base.into(),
            token,
            http: default_client(),
            timeout: Duration::from_secs(30),
        }
    }

    /// The same client verifying the server (and presenting a client
    /// certificate) with `tls`.
    #[must_use]
    pub fn with_tls(mut self, tls: rustls::ClientConfig) -> Self {
        self.http = client(tls);
        self
    }

    /// The same client presenting another token (rotation).
    #[must_use]
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// The token it presents.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The same client with another per-call timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Sends a request and returns the status and body, whatever the
    /// status.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let url = join(&self.base, path);
        let mut builder = Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            builder = builder.header(header::AUTHORIZATION, bearer_value(t));
        }
        if body.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        let req = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Transport {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let exchange = async {
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| ClientError::Transport {
                    url: url.clone(),
                    reason: polar_io::chain(&e),
                })?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_REPLY)
                .collect()
                .await
                .map_err(|e| ClientError::Transport {
                    url: url.clone(),
                    reason: e.to_string(),
                })?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                url: url.clone(),
                timeout: self.timeout,
            })?
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let (status, bytes) = self.raw(method, path, body).await?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(e) => ClientError::Status {
                    status,
                    code: e.error.code,
                    field: e.error.field,
                    message: e.error.message,
                },
                Err(_) => ClientError::Status {
                    status,
                    code: "http".into(),
                    field: None,
                    message: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
                },
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Reply {
            url: join(&self.base, path),
            reason: e.to_string(),
        })
    }

    fn body<T: Serialize>(value: &T) -> Option<Vec<u8>> {
        Some(serde_json::to_vec(value).unwrap_or_default())
    }

    /// `POST /v1/tasks` with any JSON (checked by the server).
    pub async fn submit<T: Serialize>(&self, task: &T) -> Result<SubmitReply, ClientError> {
        self.call(Method::POST, "/v1/tasks", Self::body(task)).await
    }

    /// `GET /v1/tasks/{id}`.
    pub async fn task(&self, task_id: &str) -> Result<TaskView, ClientError> {
        self.call(Method::GET, &format!("/v1/tasks/{task_id}"), None)
            .await
    }

    /// `GET /v1/tasks[?status=...]`.
    pub async fn tasks(&self, status: Option<TaskStatus>) -> Result<TaskList, ClientError> {
        let path = match status {
            Some(s) => format!("/v1/tasks?status={}", s.as_str()),
            None => "/v1/tasks".to_owned(),
        };
        self.call(Method::GET, &path, None).await
    }

    /// `POST /v1/tasks/{id}/cancel`.
    pub async fn cancel(&self, task_id: &str) -> Result<TaskView, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/tasks/{task_id}/cancel"),
            Some(b"{}".to_vec()),
        )
        .await
    }

    /// `GET /v1/status`.
    pub async fn status(&self) -> Result<ServerStatus, ClientError> {
        self.call(Method::GET, "/v1/status", None).await
    }

    /// `GET /v1/nodes`.
    pub async fn nodes(&self) -> Result<NodeList, ClientError> {
        self.call(Method::GET, "/v1/nodes", None).await
    }

    /// `POST /v1/nodes/register`.
    pub async fn register(&self, reg: &NodeRegistration) -> Result<RegisterReply, ClientError> {
        self.call(Method::POST, "/v1/nodes/register", Self::body(reg))
            .await
    }

    /// `POST /v1/nodes/{id}/heartbeat`.
    pub async fn heartbeat(
        &self,
        node_id: &str,
        hb: &Heartbeat,
    ) -> Result<HeartbeatReply, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/nodes/{node_id}/heartbeat"),
            Self::body(hb),
        )
        .await
    }

    /// `POST /v1/nodes/{id}/drain`.
    pub async fn drain(&self, node_id: &str, draining: bool) -> Result<DrainReply, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/nodes/{node_id}/drain"),
            Some(format!("{{\"draining\":{draining}}}").into_bytes()),
        )
        .await
    }

    /// `POST /v1/sessions/{id}/state`.
    pub async fn progress(
        &self,
        session_id: &str,
        p: &SessionProgress,
    ) -> Result<serde_json::Value, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/sessions/{session_id}/state"),
            Self::body(p),
        )
        .await
    }

    /// `POST /v1/sessions/{id}/result`.
    pub async fn result(
        &self,
        session_id: &str,
        r: &SessionResult,
    ) -> Result<serde_json::Value, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/sessions/{session_id}/result"),
            Self::body(r),
        )
        .await
    }
}
