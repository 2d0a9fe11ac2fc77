//! Reading a connection's first bytes to decide what it is: a TLS
//! ClientHello (with SNI and ALPN), plain HTTP (with its `Host` header when
//! the request head is complete), or something else. The bounded read; the
//! verdict is `polar_wire::sniff`'s.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

pub use polar_wire::sniff::Sniffed;
use polar_wire::sniff::verdict;

/// Reads until the first bytes are classified (and, for plain HTTP without
/// a known host, until the request head is complete), within `timeout` and
/// at most [`polar_wire::peek::MAX_PEEK_LEN`] bytes. Returns what was read, to be put back.
pub async fn sniff<R: AsyncRead + Unpin>(
    stream: &mut R,
    timeout: Duration,
    need_http_host: bool,
) -> (Bytes, Sniffed) {
    let mut buf = BytesMut::with_capacity(2048);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = verdict(&buf, need_http_host) {
            return (buf.freeze(), v);
        }
        match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return (buf.freeze(), Sniffed::Silent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sniffs_http_head_and_garbage() {
        let mut r: &[u8] = b"GET /x HTTP/1.1\r\nHost: example.com\r\n\r\nrest";
        let (bytes, s) = sniff(&mut r, Duration::from_secs(1), true).await;
        assert_eq!(
            s,
            Sniffed::Http {
                host: Some("example.com".into())
            }
        );
        assert!(bytes.starts_with(b"GET /x"));
        let mut r: &[u8] = b"\x00\x01garbage";
        assert_eq!(
            sniff(&mut r, Duration::from_secs(1), true).await.1,
            Sniffed::Other
        );
        let mut r: &[u8] = b"";
        assert_eq!(
            sniff(&mut r, Duration::from_secs(1), true).await.1,
            Sniffed::Silent
        );
    }
}
