//! The agent's listener: accepts redirected connections, asks the redirect
//! where each was going and for which session, and hands it to a handler.
//! The handler here logs what it captured (the session, the original
//! destination and the bytes seen) and closes; the TLS proxy plugs in as
//! another handler.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::Redirect;
use crate::dns::FakeIps;
use polar_ids::{OrigDst, SessionId};
use polar_io::tasks::Tasks;

/// A connection the listener accepted.
pub struct Accepted {
    /// The stream.
    pub stream: TcpStream,
    /// The client's address as the agent sees it.
    pub peer: SocketAddr,
    /// Where the client was going, when it was redirected.
    pub orig: Option<OrigDst>,
    /// The host name behind a fake DNS address, when it was one.
    pub host: Option<String>,
    /// The session the connection belongs to.
    pub session: Option<SessionId>,
}

/// Something that serves accepted connections.
pub trait Handler: Send + Sync + 'static {
    /// Serves one connection to its end.
    fn handle(&self, conn: Accepted) -> impl Future<Output = ()> + Send;
}

/// Where accepted connections go and what they are checked against.
pub struct AcceptContext<H> {
    /// The redirect, for original destinations (`None` for a listener that
    /// only takes direct connections).
    pub redirect: Option<Redirect>,
    /// Fake DNS addresses, for host names.
    pub fake: Arc<FakeIps>,
    /// The session that owns the listener (isolated sandboxes have one
    /// each), used when the redirect has no record (a direct connection).
    pub session: Option<SessionId>,
    /// The handler.
    pub handler: Arc<H>,
    /// Where handlers run.
    pub handlers: Tasks,
}

/// Accepts on `listener` until `stop` fires, then accepts what is already
/// queued (connections the sandbox made before it ended) and returns, so
/// every connection is looked up while its session still exists.
pub async fn accept_loop<H: Handler>(
    listener: TcpListener,
    ctx: Arc<AcceptContext<H>>,
    stop: CancellationToken,
) {
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        dispatch(&ctx, stream, peer);
    }
    while let Ok(Ok((stream, peer))) = tokio::time::timeout(Duration::ZERO, listener.accept()).await
    {
        dispatch(&ctx, stream, peer);
    }
}

fn dispatch<H: Handler>(ctx: &AcceptContext<H>, stream: TcpStream, peer: SocketAddr) {
    // Replies are streamed in small writes: no Nagle delay on them.
    let _ = stream.set_nodelay(true);
    let AcceptContext {
        redirect,
        fake,
        session,
        handler,
        handlers,
    } = ctx;
    let found = redirect
        .as_ref()
        .map(|r| r.original_destination(&stream, peer))
        .transpose();
    let (orig, session) = match found {
        Ok(Some(Some((orig, s)))) => (Some(orig), Some(s)),
        Ok(_) => (None, session.clone()),
        Err(e) => {
            tracing::warn!(error = %e, %peer, "original destination lookup failed");
            (None, session.clone())
        }
    };
    let host = orig.and_then(|o| fake.name_of(o.0.ip()));
    let conn = Accepted {
        stream,
        peer,
        orig,
        host,
        session,
    };
    let h = Arc::clone(handler);
    handlers.spawn(async move { h.handle(conn).await });
}

/// Logs each connection with what it sent (up to a limit), then closes it.
#[derive(Default)]
pub struct LogHandler {
    captured: AtomicU64,
    /// How long to wait for the client's first bytes.
    pub read_timeout: Duration,
}

impl LogHandler {
    /// A handler waiting up to `read_timeout` for data.
    pub fn new(read_timeout: Duration) -> Self {
        Self {
            captured: AtomicU64::new(0),
            read_timeout,
        }
    }

    /// Connections logged so far.
    pub fn captured(&self) -> u64 {
        self.captured.load(Ordering::Relaxed)
    }
}

const MAX_LOGGED_BYTES: usize = 64 * 1024;

impl Handler for LogHandler {
    async fn handle(&self, mut conn: Accepted) {
        let mut buf = vec![0u8; MAX_LOGGED_BYTES];
        let mut seen = 0usize;
        let deadline = tokio::time::Instant::now() + self.read_timeout;
        while seen < buf.len() {
            match tokio::time::timeout_at(deadline, conn.stream.read(&mut buf[seen..])).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                Ok(Ok(n)) => seen += n,
            }
        }
        self.captured.fetch_add(1, Ordering::Relaxed);
        let preview = preview(&buf[..seen]);
        tracing::info!(
            session = conn.session.as_ref().map(SessionId::as_str).unwrap_or("-"),
            orig_dst = %conn.orig.map(|o| o.to_string()).unwrap_or_else(|| "direct".into()),
            host = conn.host.as_deref().unwrap_or("-"),
            peer = %conn.peer,
            bytes = seen,
            preview = %preview,
            "captured connection"
        );
    }
}

/// The first bytes, printable ASCII kept and the rest escaped, at most 80.
fn preview(b: &[u8]) -> String {
    b.iter()
        .take(80)
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect()
}
