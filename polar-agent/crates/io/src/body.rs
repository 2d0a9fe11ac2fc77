//! Response bodies shared by the agent's HTTP servers (the proxy, the
//! rollout server and gateway, the mock backend): a whole buffer, and a
//! body fed through a channel for replies streamed as they are made. Each
//! server picks its body's error type.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use tokio::sync::mpsc;

/// A body holding `bytes`.
pub fn full<E: 'static>(bytes: impl Into<Bytes>) -> BoxBody<Bytes, E> {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

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

struct ChannelBody<E> {
    rx: mpsc::Receiver<Bytes>,
    error: PhantomData<fn() -> E>,
}

impl<E> Body for ChannelBody<E> {
    type Data = Bytes;
    type Error = E;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        self.rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// A body that yields what the sender queues, `depth` chunks at most in
/// flight (a slow reader holds the producer back), and ends when every
/// sender is dropped.
pub fn channel<E: 'static>(depth: usize) -> (BodySender, BoxBody<Bytes, E>) {
    let (tx, rx) = mpsc::channel(depth);
    let body = ChannelBody {
        rx,
        error: PhantomData,
    };
    (BodySender { tx }, body.boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_channel_body_yields_what_is_sent_and_ends_with_its_senders() {
        let (tx, body) = channel::<std::io::Error>(2);
        let producer = tokio::spawn(async move {
            assert!(tx.send(Bytes::from_static(b"a")).await);
            assert!(tx.send(Bytes::new()).await);
            assert!(tx.send(Bytes::from_static(b"b")).await);
        });
        let bytes = body.collect().await.unwrap().to_bytes();
        producer.await.unwrap();
        assert_eq!(&bytes[..], b"ab");
    }

    #[tokio::test]
    async fn a_sender_learns_that_the_body_was_dropped() {
        let (tx, body) = channel::<std::io::Error>(1);
        drop(body);
        tx.closed().await;
        assert!(tx.is_closed());
        assert!(!tx.send(Bytes::from_static(b"x")).await);
        assert!(!tx.send(Bytes::new()).await);
    }
}
