//! The dashboard's files, embedded in the binary at build time
//! (`include_bytes!` of `polar-agent/crates/rollout/ui/`): nothing is read
//! from disk or fetched from elsewhere at run time. Each is served with
//! its type, `no-cache` (a new binary serves new files), `nosniff`, no
//! referrer, and a Content-Security-Policy that lets the pages load
//! scripts, styles and data from this origin only.

use http::{HeaderValue, Response, StatusCode, header};

use polar_rollout_api::http::{Body, error, full};

/// The policy every file is served with: this origin only, no inline
/// script or style, no framing, no form posts.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                       img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
                       form-action 'none'; frame-ancestors 'none'";

/// `(name under /ui/, content type, bytes)`.
const FILES: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../../ui/index.html"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("../../ui/style.css"),
    ),
    ("app.js", JS, include_bytes!("../../ui/app.js")),
    ("api.js", JS, include_bytes!("../../ui/api.js")),
    ("dom.js", JS, include_bytes!("../../ui/dom.js")),
    ("overview.js", JS, include_bytes!("../../ui/overview.js")),
    ("task.js", JS, include_bytes!("../../ui/task.js")),
    ("session.js", JS, include_bytes!("../../ui/session.js")),
    ("timeline.js", JS, include_bytes!("../../ui/timeline.js")),
    ("tokens.js", JS, include_bytes!("../../ui/tokens.js")),
    (
        "trajectory.js",
        JS,
        include_bytes!("../../ui/trajectory.js"),
    ),
    ("compare.js", JS, include_bytes!("../../ui/compare.js")),
    ("calls.js", JS, include_bytes!("../../ui/calls.js")),
];

const JS: &str = "text/javascript; charset=utf-8";

/// The file at `/ui/{rest}` (`/ui` and `/ui/` are `index.html`), or 404.
pub fn asset(rest: &str) -> Response<Body> {
    let name = if rest.is_empty() { "index.html" } else { rest };
    let Some((_, kind, bytes)) = FILES.iter().find(|(n, ..)| *n == name) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            None,
            &format!("no dashboard file {name:?}"),
        );
    };
    let mut resp = Response::new(full(*bytes));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    resp
}

/// Every embedded file's name (tests).
#[cfg(test)]
pub fn names() -> impl Iterator<Item = &'static str> {
    FILES.iter().map(|(n, ..)| *n)
}
