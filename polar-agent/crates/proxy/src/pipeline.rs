//! The model pipeline: what happens to a request the router sent to a model
//! API, after TLS is terminated and HTTP is parsed. The proxy knows only this
//! interface; the stages behind it (forwarding, provider translation,
//! inference, capture) are interchangeable.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http::request::Parts;

use polar_config::{ProviderHint, Upstream};
use polar_ids::{OrigDst, SessionId};

use super::body::ProxyBody;
use super::shares::BodyCharge;
use super::upstream_conn::UpstreamConn;

/// Everything known about a request besides its bytes.
#[derive(Clone, Debug)]
pub struct RequestContext {
    /// The session it came from (kernel attribution, or base-URL header/key).
    pub session: Option<SessionId>,
    /// Where the harness was going (transparent mode).
    pub orig: Option<OrigDst>,
    /// The host the harness addressed (SNI, fake DNS name or Host header).
    pub host: String,
    /// The client's address as the agent saw it.
    pub peer: SocketAddr,
    /// The route's backend (the capture stage sends model calls there).
    pub backend: Option<Arc<str>>,
    /// The route's upstream (the forwarding stage sends requests there).
    pub upstream: Option<Arc<Upstream>>,
    /// The route's provider hint.
    pub provider: ProviderHint,
    /// Whether the connection was TLS.
    pub tls: bool,
    /// The downstream connection's own upstream connection (HTTP/1.1
    /// requests the forwarding stage sends on); `None` for HTTP/2.
    pub upstream_conn: Option<Arc<UpstreamConn>>,
}

/// A request with its body read in full (bounded by the body limit).
#[derive(Debug)]
pub struct ModelRequest {
    /// Method, URI, headers.
    pub head: Parts,
    /// The body.
    pub body: Bytes,
    /// What the body is charged to under the fair shares (a stage that
    /// buffers more of it, inflating it, charges the same).
    pub charge: BodyCharge,
}

/// A boxed response future.
pub type ResponseFuture = Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send>>;

/// A stage that answers model-API requests.
pub trait ModelPipeline: Send + Sync + 'static {
    /// Serves one request; errors come back as responses in the API's shape.
    fn call(self: Arc<Self>, ctx: RequestContext, req: ModelRequest) -> ResponseFuture;
}
