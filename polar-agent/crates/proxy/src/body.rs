//! The body type of the proxy's responses: any stream of bytes that can
//! fail (a forwarded upstream body, a translated stream, a fixed buffer),
//! and a body fed through a channel for replies streamed as they are made
//! ([`polar_io::body`] with the proxy's error type).

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use polar_io::body;
pub use polar_io::body::BodySender;

/// Errors inside a response body stream.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of every proxy response.
pub type ProxyBody = BoxBody<Bytes, BodyError>;

/// A body holding `bytes`.
pub fn full(bytes: Bytes) -> ProxyBody {
    body::full(bytes)
}

/// Chunks queued between the producer of a streamed reply and the
/// connection (a slow reader holds the producer back).
pub const CHANNEL_DEPTH: usize = 16;

/// A body that yields what the sender queues and ends when every sender is
/// dropped.
pub fn channel() -> (BodySender, ProxyBody) {
    body::channel(CHANNEL_DEPTH)
}
