//! Request routing for the rollout server (`server.rs`) and the gateway's
//! HTTP side (`polar-gateway`): a [`Table`], built once when a server is
//! made, maps a path to the endpoint of each method it serves and says what
//! is missing otherwise: no such path (404) or not this method (405, with
//! the `Allow` value). Path parameters and query values come out
//! percent-decoded.
//!
//! `matchit` rather than axum's `Router`: hyper already is the server on
//! both sides and only the path table was missing, and matchit is the
//! router axum itself uses underneath, without the tower service stack
//! around it. Query strings are `application/x-www-form-urlencoded` (`+`
//! is a space), read with `form_urlencoded`, the `url` project's parser;
//! path segments are not form-encoded, so they are decoded with
//! `percent-encoding` (the same project's), which leaves `+` as it is.

use std::borrow::Cow;

use http::{HeaderValue, Method, Response, StatusCode, header};

use super::http::{Body, error};

/// Why a route table could not be built (a mistake in the table itself).
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// A path that does not parse, or overlaps one added before.
    #[error("route {path}: {source}")]
    Insert {
        /// The path as written in the table.
        path: String,
        /// Why matchit refused it.
        #[source]
        source: matchit::InsertError,
    },
    /// A method list that makes no `Allow` header value.
    #[error("route {path}: the methods {methods:?} make no Allow header")]
    Allow {
        /// The path as written in the table.
        path: String,
        /// The methods, joined.
        methods: String,
    },
}

/// One path: what it carries for every method (`R`, such as who may call
/// it), its endpoints by method, and the `Allow` value listing them.
#[derive(Debug)]
struct Entry<R, E> {
    data: R,
    methods: Vec<(Method, E)>,
    allow: HeaderValue,
}

/// The routes of one server, built once.
#[derive(Debug)]
pub struct Table<R, E> {
    router: matchit::Router<Entry<R, E>>,
}

/// What a request's method and path lead to.
#[derive(Debug)]
pub enum Found<'a, R, E> {
    /// A route: its data, the method's endpoint and the path parameters.
    Endpoint {
        /// The path's data.
        data: &'a R,
        /// The endpoint.
        endpoint: E,
        /// The path parameters, percent-decoded.
        params: Params<'a>,
    },
    /// A path served under other methods (405).
    WrongMethod {
        /// The path's data.
        data: &'a R,
        /// The methods it serves, for the `Allow` header.
        allow: &'a HeaderValue,
    },
    /// No route (404); `data` is the path's when the table reserves it
    /// without any method.
    NotFound {
        /// The reserved path's data.
        data: Option<&'a R>,
    },
}

impl<'a, R, E> Found<'a, R, E> {
    /// The data of the path, if the table has it.
    pub fn data(&self) -> Option<&'a R> {
        match self {
            Self::Endpoint { data, .. } | Self::WrongMethod { data, .. } => Some(data),
            Self::NotFound { data } => *data,
        }
    }
}

/// The parameters of a matched path, percent-decoded.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Params<'a>(Vec<(&'a str, String)>);

impl Params<'_> {
    /// The value of parameter `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find_map(|(k, v)| (*k == name).then_some(v.as_str()))
    }
}

impl<R, E> Default for Table<R, E> {
    fn default() -> Self {
        Self {
            router: matchit::Router::new(),
        }
    }
}

impl<R, E: Copy> Table<R, E> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `path` (matchit syntax: `/v1/tasks/{id}`, `{*rest}` for the
    /// rest) with `data` and its endpoints by method. A path with no
    /// method is reserved: it answers 404 but carries its data.
    pub fn route(
        mut self,
        path: &str,
        data: R,
        methods: &[(Method, E)],
    ) -> Result<Self, RouteError> {
        let joined = methods
            .iter()
            .map(|(m, _)| m.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let allow = HeaderValue::from_str(&joined).map_err(|_| RouteError::Allow {
            path: path.to_owned(),
            methods: joined.clone(),
        })?;
        let entry = Entry {
            data,
            methods: methods.to_vec(),
            allow,
        };
        self.router
            .insert(path, entry)
            .map_err(|source| RouteError::Insert {
                path: path.to_owned(),
                source,
            })?;
        Ok(self)
    }

    /// Looks a request up. Slashes at either end of `path` do not count
    /// (`/v1/tasks/` is `/v1/tasks`); an empty segment matches no
    /// parameter.
    pub fn find(&self, method: &Method, path: &str) -> Found<'_, R, E> {
        let key = format!("/{}", path.trim_matches('/'));
        let Ok(m) = self.router.at(&key) else {
            return Found::NotFound { data: None };
        };
        let entry = m.value;
        if entry.methods.is_empty() {
            return Found::NotFound {
                data: Some(&entry.data),
            };
        }
        match entry.methods.iter().find(|(em, _)| em == method) {
            Some((_, endpoint)) => Found::Endpoint {
                data: &entry.data,
                endpoint: *endpoint,
                params: Params(
                    m.params
                        .iter()
                        .map(|(k, v)| (k, decode_segment(v)))
                        .collect(),
                ),
            },
            None => Found::WrongMethod {
                data: &entry.data,
                allow: &entry.allow,
            },
        }
    }
}

/// A path segment percent-decoded (`+` stays `+`). Bytes that are not
/// UTF-8 once decoded become U+FFFD: ids are ASCII, so such a segment
/// names nothing and finds nothing, as before.
fn decode_segment(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned()
}

/// The first value of `key` in a query string, form-decoded (`%xx` and
/// `+`); a key given without `=` has the empty value. Other keys and
/// later repeats are ignored.
pub fn query<'q>(query: Option<&'q str>, key: &str) -> Option<Cow<'q, str>> {
    form_urlencoded::parse(query?.as_bytes()).find_map(|(k, v)| (k == key).then_some(v))
}

/// The 405 reply, in the API's error shape, with `Allow`.
pub fn method_not_allowed(allow: &HeaderValue) -> Response<Body> {
    let mut resp = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        None,
        "method not allowed",
    );
    resp.headers_mut().insert(header::ALLOW, allow.clone());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum E {
        List,
        Add,
        One,
    }

    fn table() -> Table<u8, E> {
        Table::new()
            .route(
                "/v1/items",
                1,
                &[(Method::GET, E::List), (Method::POST, E::Add)],
            )
            .unwrap()
            .route("/v1/items/{id}", 2, &[(Method::GET, E::One)])
            .unwrap()
            .route("/v1/reserved/{*rest}", 3, &[])
            .unwrap()
    }

    #[test]
    fn paths_methods_and_parameters() {
        let t = table();
        assert!(matches!(
            t.find(&Method::POST, "/v1/items"),
            Found::Endpoint {
                data: 1,
                endpoint: E::Add,
                ..
            }
        ));
        // Slashes at the ends do not count.
        assert!(matches!(
            t.find(&Method::GET, "//v1/items/"),
            Found::Endpoint {
                endpoint: E::List,
                ..
            }
        ));
        let Found::Endpoint { params, .. } = t.find(&Method::GET, "/v1/items/a%2Fb+c%20d") else {
            panic!("no match");
        };
        assert_eq!(params.get("id"), Some("a/b+c d"));
        assert_eq!(params.get("other"), None);
        let Found::WrongMethod { data, allow } = t.find(&Method::DELETE, "/v1/items") else {
            panic!("not a 405");
        };
        assert_eq!((*data, allow.to_str().unwrap()), (1, "GET, POST"));
        assert!(matches!(
            t.find(&Method::GET, "/v1/items/x/y"),
            Found::NotFound { data: None }
        ));
        assert!(matches!(
            t.find(&Method::GET, "/v1//items"),
            Found::NotFound { data: None }
        ));
        assert!(matches!(
            t.find(&Method::GET, "/v1/reserved/a/b"),
            Found::NotFound { data: Some(3) }
        ));
        // Not UTF-8 once decoded: replaced, so it names nothing.
        let Found::Endpoint { params, .. } = t.find(&Method::GET, "/v1/items/%FF") else {
            panic!("no match");
        };
        assert_eq!(params.get("id"), Some("\u{FFFD}"));
    }

    #[test]
    fn overlapping_paths_are_refused() {
        let err = table()
            .route("/v1/items/{name}", 4, &[(Method::GET, E::One)])
            .unwrap_err();
        assert!(matches!(err, RouteError::Insert { .. }), "{err}");
    }

    #[test]
    fn query_values_are_decoded_and_the_first_wins() {
        let q = Some("status=queued&limit=5&status=running&x&t=a%2Db+c&st%61tus=no");
        assert_eq!(query(q, "status").as_deref(), Some("queued"));
        assert_eq!(query(q, "limit").as_deref(), Some("5"));
        assert_eq!(query(q, "x").as_deref(), Some(""));
        assert_eq!(query(q, "t").as_deref(), Some("a-b c"));
        assert_eq!(query(q, "missing"), None);
        assert_eq!(query(None, "status"), None);
    }

    #[test]
    fn method_not_allowed_has_the_error_shape_and_allow() {
        let resp = method_not_allowed(&HeaderValue::from_static("GET, POST"));
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(resp.headers()[header::ALLOW], "GET, POST");
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
    }
}
