//! The accept loop of both control-plane servers (the rollout server and
//! each gateway node): HTTP/1.1 with keep-alive and TCP_NODELAY, over TLS
//! when given a rustls configuration (the handshake shares the header-read
//! timeout; a verified client certificate reaches the handler as the
//! request's [`PeerCert`] extension), a header-read timeout (a client that
//! does not finish its request head in time is dropped, so idle or slow
//! connections cannot pile up), a cap on open connections (at the cap no
//! more are accepted: new ones wait in the kernel's backlog until one
//! closes), and a graceful stop when the tasks' shutdown token fires
//! (connections finish their request for up to 2 s). Both limits are
//! settings of each server ([`ServeLimits::from_settings`]).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::http::Body;
use polar_io::tasks::Tasks;
use polar_spec::{KeyError, KeyPath};

/// How long an open connection may take to send a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once by default.
pub const MAX_CONNECTIONS: usize = 4096;

/// The limits of [`serve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`MAX_CONNECTIONS`].
    pub max_connections: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

impl ServeLimits {
    /// The limits of a server's settings (`header_read_timeout_ms`,
    /// `max_connections` of the table `table`), defaults where unset; the
    /// error names the key.
    pub fn from_settings(
        table: &str,
        header_read_timeout_ms: Option<u64>,
        max_connections: Option<u64>,
    ) -> Result<Self, KeyError> {
        let mut limits = Self::default();
        if let Some(ms) = header_read_timeout_ms {
            if !(100..=3_600_000).contains(&ms) {
                return Err(KeyError::new(
                    KeyPath::dotted(table).key("header_read_timeout_ms"),
                    "must be from 100 to 3600000 (one hour)",
                ));
            }
            limits.header_read_timeout = Duration::from_millis(ms);
        }
        if let Some(n) = max_connections {
            limits.max_connections = usize::try_from(n)
                .ok()
                .filter(|n| (1..=1 << 20).contains(n))
                .ok_or_else(|| {
                    KeyError::new(
                        KeyPath::dotted(table).key("max_connections"),
                        "must be from 1 to 1048576",
                    )
                })?;
        }
        Ok(limits)
    }
}

/// The verified certificate chain a TLS client presented (leaf first), in
/// each request's extensions; absent over plain HTTP or without one.
#[derive(Clone, Debug)]
pub struct PeerCert(pub Arc<Vec<CertificateDer<'static>>>);

impl PeerCert {
    /// The DNS names of the leaf (a node's certificate names its node id).
    pub fn dns_names(&self) -> Vec<String> {
        self.0
            .first()
            .map(polar_io::tls::dns_names)
            .unwrap_or_default()
    }
}

/// Serves `listener` with `handle` until `tasks` shut down; each
/// connection runs as one of `tasks`, over TLS with `tls`. `name` labels
/// the logs.
pub async fn serve<H, F>(
    name: &'static str,
    listener: TcpListener,
    tasks: &Tasks,
    limits: ServeLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    handle: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let acceptor = tls.map(TlsAcceptor::from);
    let stop = tasks.shutdown_token();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let permit = tokio::select! {
            () = stop.cancelled() => break,
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(server = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        let stop = stop.clone();
        let acceptor = acceptor.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let Some(acceptor) = acceptor else {
                connection((name, peer), stream, None, limits, stop, handle).await;
                return;
            };
            let tls =
                match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream))
                    .await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(server = name, %peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(server = name, %peer, "TLS handshake timed out");
                        return;
                    }
                };
            let cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .map(|c| PeerCert(Arc::new(c.to_vec())));
            connection((name, peer), tls, cert, limits, stop, handle).await;
        });
    }
}

/// Serves one connection (plain or TLS) until it ends or the stop fires.
async fn connection<S, H, F>(
    (name, peer): (&'static str, std::net::SocketAddr),
    stream: S,
    cert: Option<PeerCert>,
    limits: ServeLimits,
    stop: tokio_util::sync::CancellationToken,
    handle: H,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let service = service_fn(move |mut req: Request<Incoming>| {
        let handle = handle.clone();
        if let Some(c) = &cert {
            req.extensions_mut().insert(c.clone());
        }
        async move { Ok::<_, Infallible>(handle(req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(Duration::from_secs(2), conn.as_mut()).await {
                Ok(r) => r,
                Err(_) => Ok(()),
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(server = name, %peer, error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    async fn start(limits: ServeLimits) -> (Tasks, std::net::SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tasks = Tasks::new();
        let t = tasks.clone();
        tasks.spawn(async move {
            serve("test", listener, &t, limits, None, |_req| async {
                super::super::http::json(http::StatusCode::OK, &serde_json::json!({"ok": true}))
            })
            .await;
        });
        (tasks, addr)
    }

    async fn get(stream: &mut TcpStream) -> String {
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_head_is_dropped() {
        let (tasks, addr) = start(ServeLimits {
            header_read_timeout: Duration::from_millis(200),
            max_connections: 8,
        })
        .await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nhost:").await.unwrap();
        let mut buf = [0u8; 512];
        // The server closes it (after a 408 or at once): read ends.
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match slow.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(read.is_ok(), "the slow connection is still open");
        tasks.shutdown_token().cancel();
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_until_one_closes() {
        let (tasks, addr) = start(ServeLimits {
            header_read_timeout: Duration::from_secs(30),
            max_connections: 2,
        })
        .await;
        let mut a = TcpStream::connect(addr).await.unwrap();
        let mut b = TcpStream::connect(addr).await.unwrap();
        assert!(get(&mut a).await.starts_with("HTTP/1.1 200"));
        assert!(get(&mut b).await.starts_with("HTTP/1.1 200"));
        // The third is connected by the kernel but not served.
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let early = tokio::time::timeout(Duration::from_millis(300), c.read(&mut buf)).await;
        assert!(early.is_err(), "served beyond the cap");
        drop(a);
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        drop(b);
        tasks.shutdown_token().cancel();
    }
}
