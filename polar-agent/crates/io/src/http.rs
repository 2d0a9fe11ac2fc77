//! Outgoing HTTP clients, built in one place: a pooled hyper client with
//! TCP_NODELAY and the timeouts and pool limits a caller asks for, over
//! plain HTTP ([`client`]: inference replicas) or HTTPS-or-HTTP with the
//! caller's TLS configuration ([`https_client`]: the proxy's shared
//! upstream pool, the control plane's clients; [`https_client_named`]:
//! the same with the TLS server name chosen per URI, for the rollout
//! server's pushes to gateways known by their node id).
//!
//! What does not fit here, and why, is said where it is built (the proxy's
//! per-connection upstream connections are single hyper connections, not
//! a pool).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Body;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Builder, Client};
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::ServerName;

/// A pooled plain-HTTP client.
pub type HttpClient<B = Full<Bytes>> = Client<HttpConnector, B>;

/// A pooled client of `https` (HTTP/1.1 or HTTP/2 by ALPN) and `http` URLs.
pub type HttpsClient<B = Full<Bytes>> = Client<HttpsConnector<HttpConnector>, B>;

/// The knobs of a client; unset ones keep hyper's defaults (no connect
/// timeout, idle connections kept 90 s, no limit on them per host).
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    connect_timeout: Option<Duration>,
    pool_idle_timeout: Option<Duration>,
    pool_max_idle_per_host: Option<usize>,
}

impl ClientOptions {
    /// hyper's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a TCP connect may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long an idle pooled connection is kept.
    pub fn pool_idle_timeout(mut self, timeout: Duration) -> Self {
        self.pool_idle_timeout = Some(timeout);
        self
    }

    /// How many idle connections are kept per host.
    pub fn pool_max_idle_per_host(mut self, max: usize) -> Self {
        self.pool_max_idle_per_host = Some(max);
        self
    }

    fn connector(&self) -> HttpConnector {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(self.connect_timeout);
        connector
    }

    fn builder(&self) -> Builder {
        let mut builder = Client::builder(TokioExecutor::new());
        if let Some(t) = self.pool_idle_timeout {
            builder.pool_idle_timeout(t);
        }
        if let Some(n) = self.pool_max_idle_per_host {
            builder.pool_max_idle_per_host(n);
        }
        builder
    }
}

/// A pooled HTTP/1 client of `http` URLs (others are refused).
pub fn client<B>(opts: &ClientOptions) -> HttpClient<B>
where
    B: Body + Send,
    B::Data: Send,
{
    opts.builder().build(opts.connector())
}

/// A pooled client of `https` URLs, with `tls` (its ALPN protocols are set
/// to HTTP/2 and HTTP/1.1), and of `http` ones.
pub fn https_client<B>(opts: &ClientOptions, tls: rustls::ClientConfig) -> HttpsClient<B>
where
    B: Body + Send,
    B::Data: Send,
{
    let mut http = opts.connector();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    opts.builder().build(https)
}

/// [`https_client`] whose TLS server name (the name the server's
/// certificate must carry) is `name(uri)` rather than the URI's host.
pub fn https_client_named<B, F>(
    opts: &ClientOptions,
    mut tls: rustls::ClientConfig,
    name: F,
) -> HttpsClient<B>
where
    B: Body + Send,
    B::Data: Send,
    F: Fn(&hyper::Uri) -> Result<ServerName<'static>, String> + Send + Sync + 'static,
{
    let mut http = opts.connector();
    http.enforce_http(false);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let https = HttpsConnector::new(http, tls, false, std::sync::Arc::new(name));
    opts.builder().build(https)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::BodyExt as _;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    use super::*;

    #[tokio::test]
    async fn a_client_reuses_its_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            // One connection serves every request.
            let (tcp, _) = listener.accept().await.unwrap();
            let svc = service_fn(|_req| async {
                Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
            });
            http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await
                .unwrap();
        });
        let c: HttpClient = client(
            &ClientOptions::new()
                .connect_timeout(Duration::from_secs(5))
                .pool_idle_timeout(Duration::from_secs(60))
                .pool_max_idle_per_host(4),
        );
        let calls = async {
            for _ in 0..3 {
                let req = hyper::Request::get(format!("http://{addr}/"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let resp = c.request(req).await.unwrap();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(&body[..], b"ok");
            }
        };
        // A second connection would never be served.
        tokio::time::timeout(Duration::from_secs(10), calls)
            .await
            .unwrap();
        drop(c);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_plain_client_refuses_https() {
        let c: HttpClient = client(&ClientOptions::new());
        let req = hyper::Request::get("https://127.0.0.1:1/")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert!(c.request(req).await.is_err());
    }
}
