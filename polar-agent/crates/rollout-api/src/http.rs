//! HTTP plumbing shared by the rollout server, its client and the simulated
//! gateway: response bodies, JSON replies and errors, bounded body reads,
//! bearer tokens, and one outgoing client (HTTPS or loopback HTTP) with a
//! connection pool.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Limited};
use polar_io::http::ClientOptions;
use serde::Serialize;

use polar_rollout_types::{ErrorBody, ErrorDetail};

/// The body of every response the rollout side sends.
pub type Body = BoxBody<Bytes, io::Error>;

/// The outgoing client of `https://` and `http://` URLs (gateways,
/// callbacks, the rollout server); whether plain HTTP may be used is the
/// settings' rule ([`crate::tls`]), checked where the URL is taken.
pub type HttpClient = polar_io::http::HttpsClient;

/// A pooled client with TCP_NODELAY, verifying and authenticating with
/// `tls` (see [`crate::tls::TlsSettings::configs`]).
pub fn client(tls: rustls::ClientConfig) -> HttpClient {
    polar_io::http::https_client(&options(), tls)
}

fn options() -> ClientOptions {
    ClientOptions::new()
        .connect_timeout(Duration::from_secs(5))
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(256)
}

/// [`client`] verifying a server's certificate as `name(uri)` says (the
/// rollout server's pushes, to gateways verified by node id).
pub fn client_named(
    tls: rustls::ClientConfig,
    name: impl Fn(&http::Uri) -> Result<rustls::pki_types::ServerName<'static>, String>
    + Send
    + Sync
    + 'static,
) -> HttpClient {
    polar_io::http::https_client_named(&options(), tls, name)
}

/// [`client`] trusting the system's roots, without a client certificate.
pub fn default_client() -> HttpClient {
    client(polar_io::tls::default_client_config())
}

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    polar_io::body::full(bytes)
}

/// A JSON response.
pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => json_bytes(status, bytes),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            None,
            &e.to_string(),
        ),
    }
}

/// A JSON body already serialized (off the async workers, for a large one)
/// as a response with the JSON content type.
pub fn json_bytes(status: StatusCode, bytes: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// An error response (`{"error": {"code", "field", "message"}}`).
pub fn error(status: StatusCode, code: &str, field: Option<&str>, message: &str) -> Response<Body> {
    let body = ErrorBody {
        error: ErrorDetail {
            code: code.to_owned(),
            field: field.map(str::to_owned),
            message: message.to_owned(),
        },
    };
    let mut resp = Response::new(full(serde_json::to_vec(&body).unwrap_or_default()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"polar-rollout\""),
        );
    }
    resp
}

/// A request body the servers read: hyper's, or any other body (tests
/// make `Full` ones, without a socket).
pub trait RequestBody: hyper::body::Body<Error: Into<BoxError>> {}

impl<B: hyper::body::Body<Error: Into<BoxError>>> RequestBody for B {}

/// Any body's error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Reads a body of at most `limit` bytes; `None` when it is larger or
/// breaks off.
pub async fn read_body(body: impl RequestBody, limit: usize) -> Option<Bytes> {
    Limited::new(body, limit)
        .collect()
        .await
        .ok()
        .map(|c| c.to_bytes())
}

/// The bearer token of a request.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether `given` is one of `accepted`, compared in constant time per
/// candidate, every candidate compared.
pub fn token_ok(given: Option<&str>, accepted: &[String]) -> bool {
    given.is_some_and(|g| polar_io::auth::token_in(g, accepted.iter().map(String::as_str)))
}

/// The `Authorization` value for a token.
pub fn bearer_value(token: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("Bearer {token}"))
        .unwrap_or_else(|_| HeaderValue::from_static("Bearer invalid"))
}

/// Joins a base URL and a path (`http://h:1/` + `/v1/x`).
pub fn join(base: &str, path: &str) -> String {
    format!("{}{path}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer abc"),
        );
        assert_eq!(bearer(&h), Some("abc"));
        let accepted = vec!["abc".to_owned(), "other-token".to_owned()];
        assert!(token_ok(Some("abc"), &accepted));
        assert!(!token_ok(Some("abd"), &accepted));
        assert!(!token_ok(Some(""), &accepted));
        assert!(!token_ok(None, &accepted));
        assert_eq!(join("http://h:1/", "/v1/x"), "http://h:1/v1/x");
    }
}
