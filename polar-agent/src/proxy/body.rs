//! The body type of the proxy's responses: any stream of bytes that can
//! fail (a forwarded upstream body, a translated stream, a fixed buffer),
//! and a body fed through a channel for replies streamed as they are made.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame};
use tokio::sync::mpsc;

/// Errors inside a response body stream.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of every proxy response.
pub type ProxyBody = BoxBody<Bytes, BodyError>;

/// A body holding `bytes`.
pub fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// Chunks queued between the producer of a streamed reply and the
/// connection (a slow reader holds the producer back).
pub const CHANNEL_DEPTH: usize = 16;

/// The sending side of a [`channel`] body.
#[derive(Debug, Clone)]
pub struct BodySender {
    tx: mpsc::Sender<Bytes>,
}

impl BodySender {
    /// Queues `bytes` (nothing for empty ones); false once the client is
    /// gone (the body was dropped).
    pub async fn send(&self, bytes: Bytes) -> bool {
        if bytes.is_empty() {
            return !self.tx.is_closed();
        }
        self.tx.send(bytes).await.is_ok()
    }

    /// Resolves when the client is gone.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Whether the client is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// A body that yields what the sender queues and ends when every sender is
/// dropped.
pub fn channel() -> (BodySender, ProxyBody) {
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    (BodySender { tx }, ChannelBody { rx }.boxed())
}
