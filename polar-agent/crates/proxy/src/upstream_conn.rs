//! The upstream connection of one downstream HTTP/1.1 connection.
//!
//! Requests on an HTTP/1.1 connection come one after the other, so the
//! forwarding stage gives each downstream connection its own upstream
//! connection, opened at its first forwarded request and reused for the
//! next ones: no shared pool to check out from and return to, no connector
//! call per request. It closes when the downstream connection does (its
//! [`UpstreamConn`] is dropped with the connection's context). HTTP/2
//! downstream connections multiplex requests and use the shared pool.
//!
//! A held connection the upstream has closed in the meantime is replaced
//! before the request is written; a request is never sent twice.
//!
//! This is the one outgoing connection not built by
//! [`polar_io::http`]: it is a single hyper HTTP/1 connection owned by one
//! downstream connection (with the forwarder's HTTP/1.1-only TLS config),
//! not a pooled client, which is the point of it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use polar_config::{Scheme, Upstream, UpstreamHost};

use super::error::ProxyError;

/// Time allowed to open an upstream connection (TCP and TLS).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The slot for one downstream connection's upstream connection.
#[derive(Default)]
pub struct UpstreamConn {
    held: Mutex<Option<Held>>,
}

impl std::fmt::Debug for UpstreamConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConn").finish_non_exhaustive()
    }
}

struct Held {
    upstream: Arc<Upstream>,
    send: SendRequest<Full<Bytes>>,
}

impl UpstreamConn {
    /// The held connection, if it goes to `up` and is still open.
    fn take(&self, up: &Arc<Upstream>) -> Option<SendRequest<Full<Bytes>>> {
        let held = self.held.lock().ok()?.take()?;
        let same = Arc::ptr_eq(&held.upstream, up) || *held.upstream == **up;
        (same && !held.send.is_closed()).then_some(held.send)
    }

    fn put(&self, upstream: &Arc<Upstream>, send: SendRequest<Full<Bytes>>) {
        if let Ok(mut slot) = self.held.lock() {
            *slot = Some(Held {
                upstream: Arc::clone(upstream),
                send,
            });
        }
    }

    /// Sends `req` (origin-form URI, `Host` set) to `up` on this
    /// connection's upstream connection, opening one when there is none.
    pub async fn send(
        &self,
        up: &Arc<Upstream>,
        tls: &TlsConnector,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, ProxyError> {
        let mut reused = self.take(up);
        loop {
            let fresh = reused.is_none();
            let mut send = match reused.take() {
                Some(s) => s,
                None => connect(up, tls).await?,
            };
            if send.ready().await.is_err() && !fresh {
                // Closed by the upstream while idle: nothing was sent.
                continue;
            }
            let answer = send.try_send_request(req);
            // The next request waits in `ready` until this answer is read.
            self.put(up, send);
            match answer.await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if !fresh => req = unsent,
                    _ => return Err(unreachable(up, &e.into_error())),
                },
            }
        }
    }
}

/// Opens an HTTP/1.1 connection to `up` (over TLS for `https`).
async fn connect(
    up: &Upstream,
    tls: &TlsConnector,
) -> Result<SendRequest<Full<Bytes>>, ProxyError> {
    match tokio::time::timeout(CONNECT_TIMEOUT, open(up, tls)).await {
        Ok(opened) => opened,
        Err(_) => Err(unreachable(
            up,
            &format!("no connection within {CONNECT_TIMEOUT:?}"),
        )),
    }
}

fn unreachable(up: &Upstream, cause: &dyn std::fmt::Display) -> ProxyError {
    ProxyError::UpstreamUnreachable {
        upstream: up.to_string(),
        message: cause.to_string(),
    }
}

async fn open(up: &Upstream, tls: &TlsConnector) -> Result<SendRequest<Full<Bytes>>, ProxyError> {
    let tcp = match up.host() {
        UpstreamHost::Name(n) => TcpStream::connect((n.as_str(), up.port())).await,
        UpstreamHost::Ip(ip) => TcpStream::connect((*ip, up.port())).await,
    }
    .map_err(|e| unreachable(up, &e))?;
    tcp.set_nodelay(true).map_err(|e| unreachable(up, &e))?;
    let send = match up.scheme() {
        Scheme::Http => handshake(tcp).await,
        Scheme::Https => {
            let name = match up.host() {
                UpstreamHost::Name(n) => {
                    ServerName::try_from(n.as_str().to_owned()).map_err(|e| unreachable(up, &e))?
                }
                UpstreamHost::Ip(ip) => ServerName::IpAddress((*ip).into()),
            };
            let stream = tls
                .connect(name, tcp)
                .await
                .map_err(|e| unreachable(up, &format!("TLS: {e}")))?;
            handshake(stream).await
        }
    };
    send.map_err(|e| unreachable(up, &e))
}

async fn handshake<T>(io: T) -> Result<SendRequest<Full<Bytes>>, hyper::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = http1::handshake(TokioIo::new(io)).await?;
    // Ends when the upstream closes or the downstream connection (which
    // holds the only `SendRequest`) is gone.
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    Ok(send)
}
