//! Serving HTTP/1.1 and HTTP/2 on one accepted (and possibly decrypted)
//! connection: limits (header read timeout, body size, HTTP/2 stream and
//! reset limits), the session's fair shares per request (a stream place,
//! the body charged as it is buffered: [`super::shares`]), reading the body
//! in full, and handing the request to the model pipeline with its context.
//! The stream place and the body's charge are held by the reply's body, so
//! they are returned when its last byte is sent or the client goes away.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
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
use super::shares::{BodyCharge, ChargedBuf, Shares};

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

/// Reads a request body in full, refusing it past `limit` bytes, charging
/// the buffer to `charge` as it grows (the charge stays with `charge`'s
/// holders; an error drops the buffer at once).
pub async fn read_body<B>(body: B, limit: u64, charge: &BodyCharge) -> Result<Bytes, ProxyError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut buf = ChargedBuf::new(charge.clone(), limit_usize);
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ProxyError::BadRequest(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if !buf.extend(&data).await? {
            return Err(ProxyError::TooLarge { limit });
        }
    }
    Ok(buf.into_bytes())
}

/// `resp` with `guard` held until its body is dropped (sent or abandoned).
fn holding<G: Send + Sync + 'static>(resp: Response<ProxyBody>, guard: G) -> Response<ProxyBody> {
    resp.map(|body| {
        body.map_frame(move |f| {
            let _held = &guard;
            f
        })
        .boxed()
    })
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
    shares: Arc<Shares>,
) -> Response<ProxyBody> {
    let api = api_of(req.method(), req.uri(), req.headers());
    let ctx = match source.context(&req) {
        Ok(ctx) => ctx,
        Err(e) => {
            shares.stats().count_error(&e);
            if matches!(e, ProxyError::SessionMismatch { .. }) {
                tracing::warn!(error = %e, "request naming another session refused");
            }
            return e.into_response(api);
        }
    };
    let stream = match shares.stream(ctx.session.as_ref()) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(session = ?ctx.session, error = %e, "request refused");
            return ProxyError::from(e).into_response(api);
        }
    };
    let resp = serve_request(req, ctx, api, pipeline, limits, &shares).await;
    holding(resp, stream)
}

/// One request under its stream place: the body read under its charge,
/// then the pipeline.
async fn serve_request(
    req: Request<Incoming>,
    mut ctx: RequestContext,
    api: Option<Api>,
    pipeline: Arc<dyn ModelPipeline>,
    limits: HttpLimits,
    shares: &Arc<Shares>,
) -> Response<ProxyBody> {
    let session = ctx.session.clone();
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
    let charge = shares.body(session.as_ref());
    let body = match read_body(body, limits.max_body_bytes, &charge).await {
        Ok(b) => b,
        Err(e) => {
            if matches!(e, ProxyError::OverCap(_)) {
                tracing::debug!(session = ?session, error = %e, "request refused");
            }
            return e.into_response(api);
        }
    };
    let req = ModelRequest {
        head,
        body,
        charge: charge.clone(),
    };
    holding(pipeline.call(ctx, req).await, charge)
}

/// Serves HTTP/1.1 or HTTP/2 (by preface) on `io` until the client is done.
pub async fn serve<I, S>(
    io: I,
    source: Arc<S>,
    pipeline: Arc<dyn ModelPipeline>,
    limits: HttpLimits,
    shares: Arc<Shares>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: ContextSource + ?Sized,
{
    // No connection may run more streams than its session may.
    let streams = shares.limits().session_streams.min(128);
    let service = service_fn(move |req: Request<Incoming>| {
        let source = Arc::clone(&source);
        let pipeline = Arc::clone(&pipeline);
        let shares = Arc::clone(&shares);
        async move {
            Ok::<_, std::convert::Infallible>(handle(req, source, pipeline, limits, shares).await)
        }
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
        .max_concurrent_streams(streams)
        .max_pending_accept_reset_streams(Some(32))
        .max_local_error_reset_streams(Some(256))
        .keep_alive_interval(Some(limits.idle_timeout / 2))
        .keep_alive_timeout(Duration::from_secs(20));
    let conn = builder.serve_connection(TokioIo::new(io), service);
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "http connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use hyper::body::{Body, Frame};

    use super::*;
    use crate::shares::{ShareLimits, Shares};

    /// A request body that yields `chunks`, then fails (the client went
    /// away mid-body) or ends.
    struct Chunks {
        chunks: VecDeque<Bytes>,
        then_fail: bool,
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
            Poll::Ready(match self.chunks.pop_front() {
                Some(c) => Some(Ok(Frame::data(c))),
                None if self.then_fail => Some(Err("connection reset")),
                None => None,
            })
        }
    }

    fn shares() -> Arc<Shares> {
        Arc::new(Shares::new(
            ShareLimits {
                node_connections: 8,
                session_connections: 8,
                session_streams: 8,
                session_body_bytes: 1 << 20,
                body_budget_bytes: 2 << 20,
                wait: Duration::from_millis(20),
            },
            Arc::default(),
        ))
    }

    fn body(n: usize, then_fail: bool) -> Chunks {
        Chunks {
            chunks: (0..n).map(|_| Bytes::from(vec![b'x'; 10_000])).collect(),
            then_fail,
        }
    }

    #[tokio::test]
    async fn a_client_gone_mid_body_returns_every_byte() {
        let sh = shares();
        let s: polar_ids::SessionId = "s".parse().unwrap();
        let charge = sh.body(Some(&s));
        let e = read_body(body(20, true), 1 << 20, &charge)
            .await
            .unwrap_err();
        assert!(matches!(e, ProxyError::BadRequest(_)), "{e:?}");
        assert!(sh.body_bytes_in_use() > 0);
        drop(charge);
        assert_eq!(sh.body_bytes_in_use(), 0);
    }

    #[tokio::test]
    async fn bodies_over_the_limit_or_the_share_are_refused_and_returned() {
        let sh = shares();
        let s: polar_ids::SessionId = "s".parse().unwrap();
        let charge = sh.body(Some(&s));
        let e = read_body(body(20, false), 100_000, &charge)
            .await
            .unwrap_err();
        assert!(matches!(e, ProxyError::TooLarge { .. }), "{e:?}");
        drop(charge);
        // Over the session's 1 MiB share: 429 naming the key.
        let charge = sh.body(Some(&s));
        let e = read_body(body(200, false), 4 << 20, &charge)
            .await
            .unwrap_err();
        let resp = e.into_response(None);
        assert_eq!(resp.status(), http::StatusCode::TOO_MANY_REQUESTS);
        let text = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(
            String::from_utf8_lossy(&text).contains("proxy.max_session_body_bytes"),
            "{text:?}"
        );
        drop(charge);
        assert_eq!(sh.body_bytes_in_use(), 0);
        // A whole body: held while the bytes are in use, then returned.
        let charge = sh.body(Some(&s));
        let b = read_body(body(5, false), 1 << 20, &charge).await.unwrap();
        assert_eq!(b.len(), 50_000);
        assert!(sh.body_bytes_in_use() >= 50_000);
        drop((b, charge));
        assert_eq!(sh.body_bytes_in_use(), 0);
    }

    #[tokio::test]
    async fn a_reply_holds_its_guard_until_its_body_is_dropped() {
        let sh = shares();
        let s: polar_ids::SessionId = "s".parse().unwrap();
        let permit = sh.stream(Some(&s)).unwrap();
        let resp = holding(
            Response::new(super::super::body::full(Bytes::from("hi"))),
            permit,
        );
        for _ in 0..7 {
            std::mem::forget(sh.stream(Some(&s)).unwrap());
        }
        assert!(sh.stream(Some(&s)).is_err());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hi");
        assert!(sh.stream(Some(&s)).is_ok());
    }
}
