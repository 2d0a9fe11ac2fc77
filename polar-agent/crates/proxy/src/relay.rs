//! Pass-through: relays a connection's raw bytes (its first bytes, the
//! ClientHello included, then everything else) to its original destination
//! without terminating anything. The agent's own connection is never
//! redirected (the agent is outside the sandbox cgroups). A relay in which
//! neither side sends anything for the idle timeout is closed.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf, copy_bidirectional};
use tokio::net::TcpStream;

use super::rewind::Rewind;

/// Errors of a relay.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The destination could not be reached.
    #[error("connecting to {0}: {1}")]
    Connect(SocketAddr, #[source] io::Error),
    /// The destination did not accept in time.
    #[error("connecting to {0}: timed out")]
    ConnectTimeout(SocketAddr),
    /// The relay broke.
    #[error("relaying: {0}")]
    Io(#[source] io::Error),
}

/// How a relay ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Relayed {
    /// Bytes from the client to the destination.
    pub up: u64,
    /// Bytes from the destination to the client.
    pub down: u64,
    /// Whether it was cut for being idle.
    pub idle_cut: bool,
}

/// A stream that notes when bytes last moved.
struct Activity<T> {
    inner: T,
    start: Instant,
    last_ms: Arc<AtomicU64>,
}

impl<T> Activity<T> {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Activity<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Activity<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Connects to `dst`, sends the client's first bytes, then relays both ways
/// until both sides are done or nothing moves for `idle`.
pub async fn relay(
    client: Rewind<TcpStream>,
    dst: SocketAddr,
    connect_timeout: Duration,
    idle: Duration,
) -> Result<Relayed, RelayError> {
    let mut upstream = match tokio::time::timeout(connect_timeout, TcpStream::connect(dst)).await {
        Err(_) => return Err(RelayError::ConnectTimeout(dst)),
        Ok(Err(e)) => return Err(RelayError::Connect(dst, e)),
        Ok(Ok(s)) => s,
    };
    let _ = upstream.set_nodelay(true);
    let (prefix, client) = client.into_parts();
    upstream.write_all(&prefix).await.map_err(RelayError::Io)?;
    let start = Instant::now();
    let last_ms = Arc::new(AtomicU64::new(0));
    let mut client = Activity {
        inner: client,
        start,
        last_ms: Arc::clone(&last_ms),
    };
    let mut upstream = Activity {
        inner: upstream,
        start,
        last_ms: Arc::clone(&last_ms),
    };
    let first = prefix.len() as u64;
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
    let mut tick = tokio::time::interval((idle / 4).max(Duration::from_millis(10)));
    let copy = copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    loop {
        tokio::select! {
            r = &mut copy => {
                let (up, down) = r.map_err(RelayError::Io)?;
                return Ok(Relayed { up: up + first, down, idle_cut: false });
            }
            _ = tick.tick() => {
                let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
                if now.saturating_sub(last_ms.load(Ordering::Relaxed)) > idle_ms {
                    return Ok(Relayed { up: first, down: 0, idle_cut: true });
                }
            }
        }
    }
}
