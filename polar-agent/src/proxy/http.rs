//! Serving HTTP/1.1 and HTTP/2 on one accepted (and possibly decrypted)
//! connection: limits (header read timeout, body size, HTTP/2 stream and
//! reset limits), reading the body in full, and handing the request to the
//! model pipeline with its context.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};

use polar_chat::Api;
use polar_chat::provider::{self, Detected};

use super::body::ProxyBody;
use super::error::ProxyError;
use super::pipeline::{ModelPipeline, ModelRequest, RequestContext};

/// Limits applied to every HTTP connection.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Time allowed for a request's headers to arrive.
    pub header_timeout: Duration,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: u64,
    /// Idle keep-alive connections are closed after this.
    pub idle_timeout: Duration,
}

/// The harness API of a request, from its method, path and headers, for
/// errors in the right shape before the body is read.
pub fn api_of(method: &http::Method, uri: &http::Uri, headers: &http::HeaderMap) -> Option<Api> {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    match provider::detect(method.as_str(), path, headers, &serde_json::Value::Null) {
        Detected::Model(call) => Some(call.api),
        Detected::Side(_) => None,
    }
}

/// Reads a request body in full, refusing it past `limit` bytes.
pub async fn read_body(body: Incoming, limit: u64) -> Result<Bytes, ProxyError> {
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(body, limit_usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ProxyError::TooLarge { limit }),
        Err(e) => Err(ProxyError::BadRequest(e.to_string())),
    }
}

/// How a request's context is found (fixed per connection in transparent
/// mode; per request in base-URL mode, from headers).
pub trait ContextSource: Send + Sync + 'static {
    /// The context of `req`, or the error to answer with.
    fn context(&self, req: &Request<Incoming>) -> Result<RequestContext, ProxyError>;
}

impl ContextSource for RequestContext {
    fn context(&self, _req: &Request<Incoming>) -> Result<RequestContext, ProxyError> {
        Ok(self.clone())
    }
}

async fn handle<S: ContextSource + ?Sized>(
    req: Request<Incoming>,
    source: Arc<S>,
    pipeline: Arc<dyn ModelPipeline>,
    limits: HttpLimits,
) -> Response<ProxyBody> {
    let api = api_of(req.method(), req.uri(), req.headers());
    let mut ctx = match source.context(&req) {
        Ok(ctx) => ctx,
        Err(e) => return e.into_response(api),
    };
    if req.version() >= http::Version::HTTP_2 {
        // Concurrent streams: they share the forwarding stage's pool.
        ctx.upstream_conn = None;
    }
    if let Some(len) = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limits.max_body_bytes
    {
        return ProxyError::TooLarge {
            limit: limits.max_body_bytes,
        }
        .into_response(api);
    }
    let (head, body) = req.into_parts();
    let body = match read_body(body, limits.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.into_response(api),
    };
    pipeline.call(ctx, ModelRequest { head, body }).await
}

/// Serves HTTP/1.1 or HTTP/2 (by preface) on `io` until the client is done.
pub async fn serve<I, S>(
    io: I,
    source: Arc<S>,
    pipeline: Arc<dyn ModelPipeline>,
    limits: HttpLimits,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: ContextSource + ?Sized,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let source = Arc::clone(&source);
        let pipeline = Arc::clone(&pipeline);
        async move { Ok::<_, std::convert::Infallible>(handle(req, source, pipeline, limits).await) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(128)
        .max_pending_accept_reset_streams(Some(32))
        .max_local_error_reset_streams(Some(256))
        .keep_alive_interval(Some(limits.idle_timeout / 2))
        .keep_alive_timeout(Duration::from_secs(20));
    let conn = builder.serve_connection(TokioIo::new(io), service);
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "http connection ended with an error");
    }
}
