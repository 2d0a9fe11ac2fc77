//! The forwarding stage: sends a model-API request unchanged to the route's
//! upstream and streams the answer back. Hop-by-hop headers are dropped and
//! `Host` is set to the upstream; the path is appended to the upstream's
//! path prefix. Requests of an HTTP/1.1 downstream connection go on that
//! connection's own upstream connection ([`UpstreamConn`]); HTTP/2 ones
//! through a shared pool.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_rustls::ConfigBuilderExt as _;
use polar_io::http::{ClientOptions, HttpsClient};
use tokio_rustls::TlsConnector;

use polar_config::{Upstream, UpstreamHost};

use super::body::ProxyBody;
use super::error::ProxyError;
use super::http::api_of;
use super::pipeline::{ModelPipeline, ModelRequest, RequestContext, ResponseFuture};

/// Forwards requests to their route's upstream.
pub struct Forward {
    client: HttpsClient,
    /// TLS (HTTP/1.1 only) for the per-connection upstream connections.
    tls: TlsConnector,
    timeout: Duration,
}

impl Forward {
    /// A forwarder with the system's trust roots for `https` upstreams.
    pub fn new(timeout: Duration) -> Result<Self, ProxyError> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ProxyError::Internal(format!("TLS client: {e}")))?
        .with_native_roots()
        .map_err(|e| ProxyError::Internal(format!("loading system trust roots: {e}")))?
        .with_no_client_auth();
        let mut h1_only = config.clone();
        h1_only.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = polar_io::http::https_client(
            &ClientOptions::new().connect_timeout(Duration::from_secs(10)),
            config,
        );
        Ok(Self {
            client,
            tls: TlsConnector::from(Arc::new(h1_only)),
            timeout,
        })
    }
}

/// `scheme://authority` of an upstream.
pub fn authority(up: &Upstream) -> String {
    match up.host() {
        UpstreamHost::Name(n) => format!("{}:{}", n.as_str(), up.port()),
        UpstreamHost::Ip(ip) if ip.is_ipv6() => format!("[{ip}]:{}", up.port()),
        UpstreamHost::Ip(ip) => format!("{ip}:{}", up.port()),
    }
}

/// The origin-form URI (path and query) of a request path at `up`.
pub fn origin_uri(up: &Upstream, path_and_query: &str) -> Result<Uri, ProxyError> {
    if up.path().is_empty() {
        return path_and_query
            .parse()
            .map_err(|e| ProxyError::Internal(format!("upstream URI: {e}")));
    }
    format!("{}{}", up.path(), path_and_query)
        .parse()
        .map_err(|e| ProxyError::Internal(format!("upstream URI: {e}")))
}

/// The upstream URI for a request path.
pub fn upstream_uri(up: &Upstream, path_and_query: &str) -> Result<Uri, ProxyError> {
    format!(
        "{}://{}{}{}",
        up.scheme().as_str(),
        authority(up),
        up.path(),
        path_and_query
    )
    .parse()
    .map_err(|e| ProxyError::Internal(format!("upstream URI: {e}")))
}

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes hop-by-hop headers (and those named in `Connection`).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<String> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|s| s.trim().to_ascii_lowercase())
            .collect();
        for h in &named {
            headers.remove(h.as_str());
        }
    }
    // Most requests carry none: one pass over the names, no lookups.
    if headers.keys().any(|k| HOP_BY_HOP.contains(&k.as_str())) {
        for h in HOP_BY_HOP {
            headers.remove(*h);
        }
    }
}

impl ModelPipeline for Forward {
    fn call(self: Arc<Self>, ctx: RequestContext, req: ModelRequest) -> ResponseFuture {
        Box::pin(async move {
            let api = api_of(&req.head.method, &req.head.uri, &req.head.headers);
            match self.forward(&ctx, req).await {
                Ok(resp) => resp,
                Err(e) => {
                    tracing::warn!(session = ?ctx.session, host = %ctx.host, error = %e, "forwarding failed");
                    e.into_response(api)
                }
            }
        })
    }
}

impl Forward {
    async fn forward(
        &self,
        ctx: &RequestContext,
        req: ModelRequest,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let Some(up) = &ctx.upstream else {
            return Err(ProxyError::NoRoute(format!(
                "{} (the route has no upstream to forward to)",
                req.head.uri.path()
            )));
        };
        let pq = req
            .head
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let mut out = Request::new(Full::new(req.body));
        *out.method_mut() = req.head.method.clone();
        *out.uri_mut() = match &ctx.upstream_conn {
            Some(_) => origin_uri(up, &pq)?,
            None => upstream_uri(up, &pq)?,
        };
        let mut headers = req.head.headers;
        strip_hop_by_hop(&mut headers);
        headers.insert(
            header::HOST,
            HeaderValue::from_str(&authority(up))
                .map_err(|e| ProxyError::Internal(e.to_string()))?,
        );
        *out.headers_mut() = headers;
        let sent = match &ctx.upstream_conn {
            Some(conn) => tokio::time::timeout(self.timeout, conn.send(up, &self.tls, out)).await,
            None => {
                tokio::time::timeout(self.timeout, async {
                    self.client
                        .request(out)
                        .await
                        .map_err(|e| ProxyError::UpstreamUnreachable {
                            upstream: up.to_string(),
                            message: e.to_string(),
                        })
                })
                .await
            }
        };
        let resp = match sent {
            Err(_) => {
                return Err(ProxyError::UpstreamTimeout {
                    upstream: up.to_string(),
                });
            }
            Ok(r) => r?,
        };
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(
            parts,
            body.map_err(Into::into).boxed(),
        ))
    }
}
