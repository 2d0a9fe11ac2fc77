//! Request bodies as the capture stage reads them: `content-encoding: gzip`
//! inflated (`polar_wire::gzip`; Claude Code sometimes compresses its bodies) within the body
//! limit, the inflated bytes charged to the request's fair share as they
//! inflate (over a cap: `overloaded` in the API's shape, naming the cap),
//! then read as JSON ([`Decoded::parse`], a [`Doc`] on the bytes).

use bytes::Bytes;
use http::HeaderMap;

use polar_chat::provider::{ErrorKind, ProviderError, Side};
use polar_json::{Doc, JsonError};
use polar_wire::gzip::{InflateError, inflate};

use crate::shares::{BodyCharge, ChargedBuf};

/// A body that is already decoded.
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The decoded bytes.
    pub bytes: Bytes,
}

impl Decoded {
    /// The body as a JSON document; `None` when it is empty or blank.
    pub(crate) fn parse(&self) -> Result<Option<Doc<'_>>, JsonError> {
        if self.bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        Doc::parse_shared(&self.bytes).map(Some)
    }
}

/// The decoded body of a request.
pub(super) fn body(
    headers: &HeaderMap,
    raw: &Bytes,
    limit: u64,
    charge: &BodyCharge,
) -> Result<Decoded, ProviderError> {
    let bytes = match encoding(headers)?.as_deref() {
        None | Some("identity") => raw.clone(),
        Some("gzip" | "x-gzip") => gunzip(raw, limit, charge)?,
        Some(other) => {
            return Err(ProviderError::new(
                Side::Harness,
                ErrorKind::Unsupported,
                format!("content-encoding {other:?} is not supported (gzip and identity are)"),
            ));
        }
    };
    Ok(Decoded { bytes })
}

/// The content coding, lower-cased; one coding only.
fn encoding(headers: &HeaderMap) -> Result<Option<String>, ProviderError> {
    let mut codings = headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty());
    let first = codings.next();
    if codings.next().is_some() {
        return Err(ProviderError::new(
            Side::Harness,
            ErrorKind::Unsupported,
            "more than one content-encoding is not supported",
        ));
    }
    Ok(first)
}

/// Inflates a gzip body, refusing more than `limit` bytes of output and
/// charging the output buffer to `charge` as it grows.
pub(super) fn gunzip(raw: &[u8], limit: u64, charge: &BodyCharge) -> Result<Bytes, ProviderError> {
    let too_large = || {
        ProviderError::new(
            Side::Harness,
            ErrorKind::TooLarge,
            format!("the request body inflates to more than {limit} bytes"),
        )
    };
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut out = ChargedBuf::new(charge.clone(), limit);
    match inflate(raw, |step| out.try_extend(step)) {
        Ok(()) => Ok(out.into_bytes()),
        Err(InflateError::Corrupt(e)) => Err(ProviderError::invalid(format!(
            "the gzip-encoded request body is corrupt: {e}"
        ))),
        Err(InflateError::TooLarge) => Err(too_large()),
        Err(InflateError::Sink(over)) => Err(ProviderError::new(
            Side::Harness,
            ErrorKind::Overloaded,
            format!("inflating the request body: {over}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gz(data: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        Bytes::from(e.finish().unwrap())
    }

    fn headers(enc: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(e) = enc {
            h.insert(http::header::CONTENT_ENCODING, e.parse().unwrap());
        }
        h
    }

    #[test]
    fn gzip_bodies_are_inflated() {
        let json = br#"{"model":"m","messages":[]}"#;
        let d = body(
            &headers(Some("gzip")),
            &gz(json),
            1024,
            &BodyCharge::uncounted(),
        )
        .unwrap();
        let model = |d: &Decoded| {
            d.parse()
                .unwrap()
                .unwrap()
                .root()
                .get("model")
                .unwrap()
                .raw()
                .to_owned()
        };
        assert_eq!(model(&d), "\"m\"");
        assert_eq!(&d.bytes[..], json);
        let d = body(
            &headers(None),
            &Bytes::from_static(json),
            1024,
            &BodyCharge::uncounted(),
        )
        .unwrap();
        assert_eq!(model(&d), "\"m\"");
    }

    #[test]
    fn limits_corruption_and_unknown_codings_are_refused() {
        let big = vec![b' '; 10_000];
        let e = body(
            &headers(Some("gzip")),
            &gz(&big),
            1000,
            &BodyCharge::uncounted(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::TooLarge);
        let e = body(
            &headers(Some("gzip")),
            &Bytes::from_static(b"nope"),
            1000,
            &BodyCharge::uncounted(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        let e = body(
            &headers(Some("br")),
            &Bytes::from_static(b"{}"),
            1000,
            &BodyCharge::uncounted(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
        let e = body(
            &headers(Some("gzip, br")),
            &Bytes::new(),
            1000,
            &BodyCharge::uncounted(),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
    }

    #[tokio::test]
    async fn inflation_is_charged_as_it_grows_and_refused_over_the_share() {
        use crate::shares::{ShareLimits, Shares};
        let shares = std::sync::Arc::new(Shares::new(
            ShareLimits {
                node_connections: 1,
                session_connections: 1,
                session_streams: 1,
                session_body_bytes: 1 << 20,
                body_budget_bytes: 1 << 20,
                wait: std::time::Duration::ZERO,
            },
            Default::default(),
        ));
        let s: polar_ids::SessionId = "s".parse().unwrap();
        let charge = shares.body(Some(&s));
        let small = gz(&vec![b' '; 300_000]);
        let d = body(&headers(Some("gzip")), &small, 4 << 20, &charge).unwrap();
        assert_eq!(d.bytes.len(), 300_000);
        assert!(charge.bytes() >= 300_000 && charge.bytes() < 600_000);
        drop((d, charge));
        assert_eq!(shares.body_bytes_in_use(), 0);
        // A bomb: 64 KiB that inflates past the session's 1 MiB share.
        let bomb = gz(&vec![b' '; 8 << 20]);
        assert!(bomb.len() < 64 << 10);
        let charge = shares.body(Some(&s));
        let e = body(&headers(Some("gzip")), &bomb, 32 << 20, &charge).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Overloaded);
        assert!(e.message.contains("proxy.max_session_body_bytes"), "{e:?}");
        drop(charge);
        assert_eq!(shares.body_bytes_in_use(), 0);
    }

    #[test]
    fn non_json_is_noted_not_fatal() {
        let d = body(
            &headers(None),
            &Bytes::from_static(b"{oops"),
            1000,
            &BodyCharge::uncounted(),
        )
        .unwrap();
        assert!(d.parse().is_err());
        let d = body(
            &headers(None),
            &Bytes::new(),
            1000,
            &BodyCharge::uncounted(),
        )
        .unwrap();
        assert!(d.parse().unwrap().is_none());
        let d = body(
            &headers(None),
            &Bytes::from_static(b" \n"),
            1000,
            &BodyCharge::uncounted(),
        )
        .unwrap();
        assert!(d.parse().unwrap().is_none());
    }
}
