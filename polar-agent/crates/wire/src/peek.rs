//! Classification of the first bytes of an accepted connection: a TLS
//! ClientHello (with its SNI host name and ALPN list), plain HTTP (an
//! HTTP/1.x request line or the HTTP/2 prior-knowledge preface), something
//! else, or "not enough bytes yet".
//!
//! [`classify`] is pure and I/O-free and never panics on any input. It parses
//! the TLS record layer and the ClientHello by hand, bounds-checked, and
//! reassembles a ClientHello split across several handshake records.
//!
//! Decisions for inputs that are not well formed:
//! - A first byte of `0x16` (handshake record) commits to TLS. A record layer
//!   that breaks framing (another content type before the hello is complete,
//!   a major version other than 3, an empty or oversized record), a first
//!   handshake message that is not a ClientHello, a ClientHello larger than
//!   [`MAX_CLIENT_HELLO_LEN`] or spread over more than [`MAX_HELLO_RECORDS`]
//!   records, or a structurally malformed ClientHello (lengths that do not
//!   add up, duplicate extensions, a malformed SNI or ALPN extension) gives
//!   [`Peek::Other`]: rustls would refuse that hello anyway, so terminating
//!   it is pointless, and the routing rules for unknown traffic decide.
//! - A well-formed SNI extension whose host name is not a valid DNS name (an
//!   IP literal, non-ASCII bytes, a trailing dot, bad labels) gives a
//!   [`Peek::Tls`] with `sni: None`: the hello is fine, the name is unusable.
//! - Once `buf.len() >= MAX_PEEK_LEN`, the answer is never [`Peek::NeedMore`],
//!   so a caller that reads up to [`MAX_PEEK_LEN`] bytes always gets a verdict.

use std::collections::BTreeSet;

/// Largest ClientHello handshake message (4-byte header included) we accept.
pub const MAX_CLIENT_HELLO_LEN: usize = 16 * 1024;
/// Largest number of TLS records a ClientHello may be split across.
pub const MAX_HELLO_RECORDS: usize = 16;
/// Size of a TLS record header.
const RECORD_HEADER_LEN: usize = 5;
/// Largest plaintext TLS record payload (RFC 8446 section 5.1).
const MAX_RECORD_PAYLOAD: usize = 16 * 1024;
/// Bytes after which [`classify`] always returns a verdict.
pub const MAX_PEEK_LEN: usize = MAX_CLIENT_HELLO_LEN + MAX_HELLO_RECORDS * RECORD_HEADER_LEN;

const CONTENT_TYPE_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_CLIENT_HELLO: u8 = 0x01;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;
const SNI_HOST_NAME: u8 = 0;

/// HTTP/1.x methods recognised at the start of a plain-text connection.
const HTTP_METHODS: &[&str] = &[
    "GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE",
];
/// The HTTP/2 prior-knowledge connection preface (RFC 9113 section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the first bytes of a connection are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// The bytes so far are a valid prefix of something recognisable; read more.
    NeedMore,
    /// A complete TLS ClientHello.
    Tls(ClientHelloInfo),
    /// Plain HTTP: `method` is the HTTP/1.x method, or `PRI` for the HTTP/2 preface.
    Http { method: String },
    /// Anything else (including malformed TLS; see the module docs).
    Other,
}

/// What the listener needs from a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientHelloInfo {
    /// The SNI host name, lower-cased, if present and a valid DNS name.
    pub sni: Option<String>,
    /// The ALPN protocol names offered, in the client's order (empty if none).
    pub alpn: Vec<Vec<u8>>,
}

/// Classifies the first bytes of a connection. See the module docs.
pub fn classify(buf: &[u8]) -> Peek {
    match buf.first() {
        None => Peek::NeedMore,
        Some(&CONTENT_TYPE_HANDSHAKE) => classify_tls(buf),
        Some(_) => classify_http(buf),
    }
}

fn classify_http(buf: &[u8]) -> Peek {
    let mut partial = false;
    for method in HTTP_METHODS {
        let token = method.as_bytes();
        match buf.get(..token.len()) {
            Some(head) if head == token => match buf.get(token.len()) {
                Some(b' ') => {
                    return Peek::Http {
                        method: (*method).to_owned(),
                    };
                }
                Some(_) => {}
                None => partial = true,
            },
            Some(_) => {}
            None => partial |= token.starts_with(buf),
        }
    }
    if buf.len() >= H2_PREFACE.len() {
        if buf.starts_with(H2_PREFACE) {
            return Peek::Http {
                method: "PRI".to_owned(),
            };
        }
    } else if H2_PREFACE.starts_with(buf) {
        partial = true;
    }
    if partial { Peek::NeedMore } else { Peek::Other }
}

/// Checks the bytes of a record header that are present.
fn header_prefix_ok(header: &[u8]) -> bool {
    let type_ok = header.first().is_none_or(|&t| t == CONTENT_TYPE_HANDSHAKE);
    let major_ok = header.get(1).is_none_or(|&v| v == 3);
    let minor_ok = header.get(2).is_none_or(|&v| v <= 4);
    type_ok && major_ok && minor_ok
}

fn classify_tls(buf: &[u8]) -> Peek {
    let mut handshake: Vec<u8> = Vec::new();
    let mut pos = 0usize;
    let mut records = 0usize;
    loop {
        let rest = buf.get(pos..).unwrap_or_default();
        let Some(header) = rest.get(..RECORD_HEADER_LEN) else {
            return if header_prefix_ok(rest) {
                Peek::NeedMore
            } else {
                Peek::Other
            };
        };
        if !header_prefix_ok(header) {
            return Peek::Other;
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        records += 1;
        if len == 0 || len > MAX_RECORD_PAYLOAD || records > MAX_HELLO_RECORDS {
            return Peek::Other;
        }
        let payload = rest.get(RECORD_HEADER_LEN..).unwrap_or_default();
        let available = payload.len().min(len);
        handshake.extend_from_slice(payload.get(..available).unwrap_or_default());

        if handshake
            .first()
            .is_some_and(|&t| t != HANDSHAKE_CLIENT_HELLO)
        {
            return Peek::Other;
        }
        if let Some(h) = handshake.get(1..4) {
            let body_len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            if body_len + 4 > MAX_CLIENT_HELLO_LEN {
                return Peek::Other;
            }
            if let Some(body) = handshake.get(4..4 + body_len) {
                return match parse_client_hello(body) {
                    Some(info) => Peek::Tls(info),
                    None => Peek::Other,
                };
            }
        }
        if available < len {
            return Peek::NeedMore;
        }
        pos += RECORD_HEADER_LEN + len;
    }
}

/// A bounds-checked cursor over a byte slice.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).and_then(|b| b.first().copied())
    }

    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]))
    }

    /// A vector with a one-byte length prefix.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length prefix.
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// Parses a ClientHello body (after the 4-byte handshake header). `None`
/// means structurally malformed.
fn parse_client_hello(body: &[u8]) -> Option<ClientHelloInfo> {
    let mut r = Reader::new(body);
    let _legacy_version = r.u16()?;
    let _random = r.take(32)?;
    if r.vec8()?.len() > 32 {
        return None;
    }
    let suites = r.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return None;
    }
    if r.vec8()?.is_empty() {
        return None;
    }
    let mut info = ClientHelloInfo::default();
    if r.is_empty() {
        // A TLS 1.2 hello may carry no extensions at all.
        return Some(info);
    }
    let mut exts = Reader::new(r.vec16()?);
    if !r.is_empty() {
        return None;
    }
    let mut seen = BTreeSet::new();
    while !exts.is_empty() {
        let ext_type = exts.u16()?;
        let data = exts.vec16()?;
        if !seen.insert(ext_type) {
            return None;
        }
        match ext_type {
            EXT_SERVER_NAME => info.sni = parse_sni(data)?,
            EXT_ALPN => info.alpn = parse_alpn(data)?,
            _ => {}
        }
    }
    Some(info)
}

/// Parses the server_name extension: `None` if malformed, `Some(None)` if it
/// holds no usable DNS host name.
fn parse_sni(data: &[u8]) -> Option<Option<String>> {
    let mut outer = Reader::new(data);
    let mut list = Reader::new(outer.vec16()?);
    if !outer.is_empty() || list.is_empty() {
        return None;
    }
    let mut host = None;
    while !list.is_empty() {
        let name_type = list.u8()?;
        let name = list.vec16()?;
        if name.is_empty() {
            return None;
        }
        if name_type == SNI_HOST_NAME && host.is_none() {
            host = Some(std::str::from_utf8(name).ok().and_then(normalize_dns_name));
        }
    }
    Some(host.flatten())
}

/// Parses the ALPN extension; `None` if malformed.
fn parse_alpn(data: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut outer = Reader::new(data);
    let mut list = Reader::new(outer.vec16()?);
    if !outer.is_empty() || list.is_empty() {
        return None;
    }
    let mut protocols = Vec::new();
    while !list.is_empty() {
        let proto = list.vec8()?;
        if proto.is_empty() {
            return None;
        }
        protocols.push(proto.to_vec());
    }
    Some(protocols)
}

/// Validates a DNS host name and returns it lower-cased: ASCII letters,
/// digits, `-` and `_`, labels of 1 to 63 bytes not starting or ending with
/// `-`, at most 253 bytes, no trailing dot, and a last label that is not all
/// digits (which rules out IPv4 literals).
pub fn normalize_dns_name(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > 253 {
        return None;
    }
    let lower = name.to_ascii_lowercase();
    for label in lower.split('.') {
        let bytes = label.as_bytes();
        if bytes.is_empty() || bytes.len() > 63 {
            return None;
        }
        if bytes.first() == Some(&b'-') || bytes.last() == Some(&b'-') {
            return None;
        }
        if !bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'_')
        {
            return None;
        }
    }
    let last = lower.rsplit('.').next().unwrap_or_default();
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(lower)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use rustls::pki_types::ServerName;
    use rustls::{ClientConfig, ClientConnection, RootCertStore};

    use super::*;

    /// A real ClientHello, as rustls's client writes it.
    fn rustls_hello(server_name: &str, alpn: &[&[u8]]) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let name = ServerName::try_from(server_name.to_owned()).unwrap();
        let mut conn = ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    /// Re-frames the handshake bytes of a single-record hello into records
    /// of at most `chunk` bytes.
    fn reframe(hello: &[u8], chunk: usize) -> Vec<u8> {
        let handshake = &hello[RECORD_HEADER_LEN..];
        let mut out = Vec::new();
        for piece in handshake.chunks(chunk) {
            out.extend_from_slice(&[0x16, 0x03, 0x01]);
            out.extend_from_slice(&u16::try_from(piece.len()).unwrap().to_be_bytes());
            out.extend_from_slice(piece);
        }
        out
    }

    fn anthropic_hello() -> Vec<u8> {
        rustls_hello("api.anthropic.com", &[b"h2", b"http/1.1"])
    }

    fn expected_anthropic() -> Peek {
        Peek::Tls(ClientHelloInfo {
            sni: Some("api.anthropic.com".to_owned()),
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        })
    }

    #[test]
    fn real_client_hello_gives_sni_and_alpn() {
        assert_eq!(classify(&anthropic_hello()), expected_anthropic());
    }

    #[test]
    fn real_client_hello_without_sni() {
        let hello = rustls_hello("127.0.0.1", &[]);
        let expected = Peek::Tls(ClientHelloInfo {
            sni: None,
            alpn: vec![],
        });
        assert_eq!(classify(&hello), expected);
    }

    #[test]
    fn hello_split_across_records_is_reassembled() {
        let hello = anthropic_hello();
        for chunk in [1usize, 3, 4, 50, 100, 1000] {
            let framed = reframe(&hello, chunk);
            let records = hello.len().div_ceil(chunk);
            let expected = if records > MAX_HELLO_RECORDS {
                Peek::Other
            } else {
                expected_anthropic()
            };
            assert_eq!(classify(&framed), expected, "chunk {chunk}");
        }
    }

    #[test]
    fn trailing_bytes_after_hello_are_ignored() {
        let mut hello = anthropic_hello();
        hello.extend_from_slice(b"\x16\x03\x01garbage");
        assert_eq!(classify(&hello), expected_anthropic());
    }

    #[test]
    fn largest_hello_needs_at_most_max_peek_len() {
        let body_len = MAX_CLIENT_HELLO_LEN - 4;
        let mut handshake = vec![HANDSHAKE_CLIENT_HELLO, 0, 0, 0];
        handshake[1..4].copy_from_slice(&u32::try_from(body_len).unwrap().to_be_bytes()[1..]);
        handshake.resize(MAX_CLIENT_HELLO_LEN, 0);
        let mut single = vec![0x16, 0x03, 0x01, 0, 0];
        single[3..5].copy_from_slice(&u16::try_from(handshake.len()).unwrap().to_be_bytes());
        single.extend_from_slice(&handshake);
        let framed = reframe(&single, MAX_CLIENT_HELLO_LEN / MAX_HELLO_RECORDS);
        assert!(framed.len() <= MAX_PEEK_LEN);
        assert_eq!(classify(&framed[..framed.len() - 1]), Peek::NeedMore);
        // The body is zeros: a malformed hello, but a verdict.
        assert_eq!(classify(&framed), Peek::Other);
    }

    #[test]
    fn oversized_or_foreign_handshakes_are_other() {
        // ClientHello claiming 64 KiB.
        assert_eq!(classify(&[0x16, 3, 1, 0, 4, 1, 1, 0, 0]), Peek::Other);
        // ServerHello instead of ClientHello.
        assert_eq!(classify(&[0x16, 3, 3, 0, 4, 2, 0, 0, 0]), Peek::Other);
        // Zero-length record, bad major version, oversized record.
        assert_eq!(classify(&[0x16, 3, 1, 0, 0]), Peek::Other);
        assert_eq!(classify(&[0x16, 2, 0]), Peek::Other);
        assert_eq!(classify(&[0x16, 3, 1, 0x40, 0x01]), Peek::Other);
        // Partial but plausible headers.
        assert_eq!(classify(&[0x16]), Peek::NeedMore);
        assert_eq!(classify(&[0x16, 3, 1, 0]), Peek::NeedMore);
    }

    #[test]
    fn malformed_sni_host_gives_tls_without_sni() {
        let hello = anthropic_hello();
        let at = hello
            .windows(b"api.anthropic.com".len())
            .position(|w| w == b"api.anthropic.com")
            .unwrap();
        let mut bad = hello.clone();
        bad[at + 3] = b'/';
        assert_eq!(
            classify(&bad),
            Peek::Tls(ClientHelloInfo {
                sni: None,
                alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            })
        );
        let mut upper = hello;
        upper[at..at + 3].copy_from_slice(b"API");
        assert_eq!(classify(&upper), expected_anthropic());
    }

    #[test]
    fn http_methods_and_preface() {
        let http = |m: &str| Peek::Http {
            method: m.to_owned(),
        };
        assert_eq!(classify(b"GET / HTTP/1.1\r\n"), http("GET"));
        assert_eq!(classify(b"POST /v1/messages HTTP/1.1"), http("POST"));
        assert_eq!(classify(b"OPTIONS * HTTP/1.1"), http("OPTIONS"));
        assert_eq!(classify(H2_PREFACE), http("PRI"));
        assert_eq!(classify(b"PRI * HTTP/2"), Peek::NeedMore);
        assert_eq!(classify(b"G"), Peek::NeedMore);
        assert_eq!(classify(b"DELETE"), Peek::NeedMore);
        assert_eq!(classify(b""), Peek::NeedMore);
        assert_eq!(classify(b"GETX / HTTP/1.1"), Peek::Other);
        assert_eq!(classify(b"get / HTTP/1.1"), Peek::Other);
        assert_eq!(classify(b"SSH-2.0-OpenSSH_9.6\r\n"), Peek::Other);
        assert_eq!(classify(b"PRI * HTTP/1.1\r\n\r\nSM\r\n\r\n"), Peek::Other);
    }

    #[test]
    fn dns_name_validation() {
        assert_eq!(
            normalize_dns_name("API.Anthropic.COM").as_deref(),
            Some("api.anthropic.com")
        );
        assert!(normalize_dns_name("_dmarc.x-y.example").is_some());
        for bad in [
            "",
            "127.0.0.1",
            "a..b",
            "x.com.",
            "-x.com",
            "x-.com",
            "*.x.com",
            "x com",
            "1.2.3",
            "é.com",
        ] {
            assert_eq!(normalize_dns_name(bad), None, "{bad:?}");
        }
        assert_eq!(normalize_dns_name(&"a".repeat(64)), None);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let _ = classify(&bytes);
        }

        #[test]
        fn tls_looking_bytes_never_panic(
            minor in 0u8..5,
            rest in proptest::collection::vec(any::<u8>(), 0..4096),
        ) {
            let mut bytes = vec![0x16, 0x03, minor];
            bytes.extend_from_slice(&rest);
            let _ = classify(&bytes);
        }

        #[test]
        fn truncated_hello_needs_more(cut in any::<prop::sample::Index>(), chunk in 200usize..2000) {
            let hello = reframe(&anthropic_hello(), chunk);
            let cut = cut.index(hello.len());
            prop_assert_eq!(classify(&hello[..cut]), Peek::NeedMore);
        }

        #[test]
        fn mutated_hello_never_panics(
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut hello = anthropic_hello();
            let at = at.index(hello.len());
            hello[at] = byte;
            let cut = cut.index(hello.len() + 1);
            let _ = classify(&hello[..cut]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn max_peek_len_always_gives_a_verdict(
            minor in 0u8..5,
            rest in proptest::collection::vec(any::<u8>(), MAX_PEEK_LEN..MAX_PEEK_LEN + 64),
        ) {
            let mut bytes = vec![0x16, 0x03, minor];
            bytes.extend_from_slice(&rest);
            prop_assert_ne!(classify(&bytes), Peek::NeedMore);
        }
    }
}
