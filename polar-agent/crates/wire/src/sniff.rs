//! What the first bytes of a connection say, as the proxy needs it: a TLS
//! ClientHello (with its SNI), plain HTTP (with the `Host` header's host
//! once the request head is complete), something else, or not enough bytes
//! yet ([`verdict`], fed by the agent's bounded read,
//! `polar_proxy::sniff`).

use super::peek::{MAX_PEEK_LEN, Peek, classify};

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

/// The verdict on the bytes read so far, `None` to read more: plain HTTP
/// waits for its complete request head when `need_http_host` (or
/// [`MAX_PEEK_LEN`] bytes); at [`MAX_PEEK_LEN`] bytes there is always one.
pub fn verdict(buf: &[u8], need_http_host: bool) -> Option<Sniffed> {
    let verdict = match classify(buf) {
        Peek::NeedMore => None,
        Peek::Tls(info) => Some(Sniffed::Tls { sni: info.sni }),
        Peek::Http { .. } => {
            let complete = head_end(buf).is_some() || buf.len() >= MAX_PEEK_LEN;
            (!need_http_host || complete).then(|| Sniffed::Http {
                host: http_host(buf),
            })
        }
        Peek::Other => Some(Sniffed::Other),
    };
    match verdict {
        None if buf.len() >= MAX_PEEK_LEN => Some(Sniffed::Other),
        v => v,
    }
}

/// The host of a `Host` header in a (possibly partial) HTTP/1 request head.
pub fn http_host(head: &[u8]) -> Option<String> {
    let end = head_end(head).unwrap_or(head.len());
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

/// Where the request head ends (its blank line), if it does.
fn head_end(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n")
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

    #[test]
    fn verdicts() {
        let head = b"GET /x HTTP/1.1\r\nHost: example.com\r\n";
        assert_eq!(verdict(head, true), None, "the head is not complete");
        assert_eq!(
            verdict(head, false),
            Some(Sniffed::Http {
                host: Some("example.com".into())
            })
        );
        assert_eq!(verdict(b"", true), None);
        assert_eq!(verdict(b"\x00\x01garbage", true), Some(Sniffed::Other));
        let long = [b"GET /".as_slice(), &[b'a'; MAX_PEEK_LEN]].concat();
        assert_eq!(verdict(&long, true), Some(Sniffed::Http { host: None }));
    }
}
