//! Servers the proxy tests talk to, all on loopback: an HTTP upstream that
//! answers with what it received, and a "remote" TLS server with its own
//! certificate for pass-through.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A request an upstream received.
#[derive(Clone, Debug)]
pub struct Received {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The Host header.
    pub host: String,
    /// The body.
    pub body: Bytes,
}

/// An HTTP/1.1 + HTTP/2 upstream answering
/// `{"upstream": NAME, "path": ..., "received_bytes": N}`.
pub struct EchoUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it received.
    pub received: Arc<Mutex<Vec<Received>>>,
    stop: CancellationToken,
}

impl EchoUpstream {
    /// Starts on `bind` (a loopback address, port 0 for any).
    pub async fn start(bind: &str, name: &'static str) -> Result<Self> {
        Self::start_with_delay(bind, name, std::time::Duration::ZERO).await
    }

    /// Like [`EchoUpstream::start`], answering each request after `delay`
    /// (a stand-in for an upstream's service time).
    pub async fn start_with_delay(
        bind: &str,
        name: &'static str,
        delay: std::time::Duration,
    ) -> Result<Self> {
        Self::start_full(bind, name, delay, None).await
    }

    /// An upstream serving HTTPS with a self-signed certificate for `host`;
    /// returns it and the certificate (PEM) for the client's trust.
    pub async fn start_tls(bind: &str, name: &'static str, host: &str) -> Result<(Self, String)> {
        let (acceptor, pem) = self_signed_acceptor(host, &[b"h2", b"http/1.1"])?;
        Ok((
            Self::start_full(bind, name, std::time::Duration::ZERO, Some(acceptor)).await?,
            pem,
        ))
    }

    async fn start_full(
        bind: &str,
        name: &'static str,
        delay: std::time::Duration,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Result<Self> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (rec, token) = (Arc::clone(&received), stop.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    () = token.cancelled() => return,
                    r = listener.accept() => match r { Ok(v) => v, Err(_) => continue },
                };
                let rec = Arc::clone(&rec);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let rec = Arc::clone(&rec);
                        async move {
                            let method = req.method().to_string();
                            let path = req
                                .uri()
                                .path_and_query()
                                .map(|p| p.to_string())
                                .unwrap_or_default();
                            let host = req
                                .headers()
                                .get(http::header::HOST)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_owned();
                            let body = req
                                .into_body()
                                .collect()
                                .await
                                .map(|c| c.to_bytes())
                                .unwrap_or_default();
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            let answer = serde_json::json!({
                                "upstream": name, "path": path, "received_bytes": body.len(),
                            });
                            if let Ok(mut r) = rec.lock() {
                                // A copy: the collected body may be a slice of a
                                // much larger read buffer it would keep alive.
                                let body = Bytes::copy_from_slice(&body);
                                r.push(Received {
                                    method,
                                    path,
                                    host,
                                    body,
                                });
                            }
                            let mut resp =
                                Response::new(Full::new(Bytes::from(answer.to_string())));
                            resp.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                            }
                        }
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                        }
                    }
                });
            }
        });
        Ok(Self {
            addr,
            received,
            stop,
        })
    }

    /// The requests received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for EchoUpstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A TLS acceptor with a fresh self-signed certificate for `name` offering
/// the `alpn` protocols, and the certificate as PEM.
pub fn self_signed_acceptor(
    name: &str,
    alpn: &[&[u8]],
) -> Result<(tokio_rustls::TlsAcceptor, String)> {
    let cert = rcgen::generate_simple_self_signed(vec![name.to_owned()])?;
    let cert_pem = cert.cert.pem();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
        .map_err(|e| anyhow::anyhow!("key: {e}"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .context("server config")?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok((tokio_rustls::TlsAcceptor::from(Arc::new(config)), cert_pem))
}

/// A TLS server with its own self-signed certificate for `name`, answering
/// every request with `token` as body.
pub struct RemoteTls {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its certificate (PEM), for the client's trust.
    pub cert_pem: String,
    stop: CancellationToken,
}

impl RemoteTls {
    /// Starts on `bind`.
    pub async fn start(bind: &str, name: &str, token: &'static str) -> Result<Self> {
        // It answers HTTP/1.1 only.
        let (acceptor, cert_pem) = self_signed_acceptor(name, &[b"http/1.1"])?;
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let token_c = stop.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    () = token_c.cancelled() => return,
                    r = listener.accept() => match r { Ok(v) => v, Err(_) => continue },
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{token}",
                        token.len()
                    );
                    let _ = tls.write_all(resp.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Ok(Self {
            addr,
            cert_pem,
            stop,
        })
    }
}

impl Drop for RemoteTls {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A host port a sandbox must not reach: a listener on each of the given
/// loopback addresses (one port for all), greeting every connection with
/// `BANNER` and counting the connections it accepted.
pub struct Banner {
    /// The port, the same on every address.
    pub port: u16,
    accepted: Arc<std::sync::atomic::AtomicU64>,
}

impl Banner {
    /// Listens on `addrs` (loopback addresses such as `127.0.0.1` and a
    /// "host address" `127.10.0.7`), on one free port.
    pub fn start(addrs: &[&str]) -> Result<Self> {
        let (first, rest) = addrs.split_first().context("Banner: no address")?;
        let mut last_err = None;
        // Another process may take the port on the other addresses between
        // the binds: try a few ports.
        for _ in 0..16 {
            let l = std::net::TcpListener::bind((*first, 0))?;
            let port = l.local_addr()?.port();
            let others: std::io::Result<Vec<_>> = rest
                .iter()
                .map(|a| std::net::TcpListener::bind((*a, port)))
                .collect();
            match others {
                Ok(others) => {
                    let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
                    for l in std::iter::once(l).chain(others) {
                        let count = Arc::clone(&accepted);
                        std::thread::spawn(move || {
                            use std::io::Write as _;
                            for mut c in l.incoming().map_while(std::io::Result::ok) {
                                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let _ = c.write_all(b"BANNER");
                            }
                        });
                    }
                    return Ok(Self { port, accepted });
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.map_or_else(|| anyhow::anyhow!("Banner: no port"), Into::into))
    }

    /// The connections accepted so far, on all addresses.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(std::sync::atomic::Ordering::Relaxed)
    }
}
