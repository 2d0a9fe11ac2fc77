//! Reading a connection's first bytes to decide what it is: a TLS
//! ClientHello (with SNI and ALPN), plain HTTP (with its `Host` header when
//! the request head is complete), or something else. Pure helpers plus the
//! bounded read that feeds them.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::tls::{MAX_PEEK_LEN, Peek, classify};

/// What the first bytes say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// A TLS ClientHello.
    Tls {
        /// The server name, if sent.
        sni: Option<String>,
    },
    /// Plain HTTP, with the `Host` header's host when it was seen.
    Http {
        /// The host (lower-case, without port).
        host: Option<String>,
    },
    /// Neither.
    Other,
    /// The client sent nothing classifiable in time or closed.
    Silent,
}

/// The host of a `Host` header in a (possibly partial) HTTP/1 request head.
pub fn http_host(head: &[u8]) -> Option<String> {
    let end = find_head_end(head).unwrap_or(head.len());
    let text = std::str::from_utf8(&head[..end]).ok()?;
    text.split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        if !name.trim().eq_ignore_ascii_case("host") {
            return None;
        }
        let value = value.trim();
        let host = if let Some(rest) = value.strip_prefix('[') {
            rest.split(']').next()?
        } else {
            value.rsplit_once(':').map_or(value, |(h, p)| {
                if p.bytes().all(|b| b.is_ascii_digit()) {
                    h
                } else {
                    value
                }
            })
        };
        (!host.is_empty()).then(|| host.to_ascii_lowercase())
    })
}

fn find_head_end(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Reads until the first bytes are classified (and, for plain HTTP without
/// a known host, until the request head is complete), within `timeout` and
/// at most [`MAX_PEEK_LEN`] bytes. Returns what was read, to be put back.
pub async fn sniff<R: AsyncRead + Unpin>(
    stream: &mut R,
    timeout: Duration,
    need_http_host: bool,
) -> (Bytes, Sniffed) {
    let mut buf = BytesMut::with_capacity(2048);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let verdict = match classify(&buf) {
            Peek::NeedMore => None,
            Peek::Tls(info) => Some(Sniffed::Tls { sni: info.sni }),
            Peek::Http { .. } => {
                let complete = find_head_end(&buf).is_some() || buf.len() >= MAX_PEEK_LEN;
                if !need_http_host || complete {
                    Some(Sniffed::Http {
                        host: http_host(&buf),
                    })
                } else {
                    None
                }
            }
            Peek::Other => Some(Sniffed::Other),
        };
        if let Some(v) = verdict {
            return (buf.freeze(), v);
        }
        if buf.len() >= MAX_PEEK_LEN {
            return (buf.freeze(), Sniffed::Other);
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

    #[test]
    fn host_header() {
        let req = b"POST /v1/messages HTTP/1.1\r\nContent-Type: x\r\nHOST: API.Anthropic.com:8080\r\n\r\n";
        assert_eq!(http_host(req).as_deref(), Some("api.anthropic.com"));
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n").as_deref(),
            Some("::1")
        );
        assert_eq!(http_host(b"GET / HTTP/1.1\r\nX: y\r\n\r\n"), None);
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: a.b"),
            Some("a.b".into())
        );
        assert_eq!(http_host(&[0xff, 0xfe]), None);
    }

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
