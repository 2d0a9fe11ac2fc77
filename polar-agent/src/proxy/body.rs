//! The body type of the proxy's responses: any stream of bytes that can
//! fail (a forwarded upstream body, a translated stream, a fixed buffer).

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};

/// Errors inside a response body stream.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of every proxy response.
pub type ProxyBody = BoxBody<Bytes, BodyError>;

/// A body holding `bytes`.
pub fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}
