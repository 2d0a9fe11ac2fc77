//! Base-URL mode: the model pipeline reachable directly over plain HTTP on a
//! configured address, for harnesses set up with a base URL instead of being
//! redirected. Without the kernel to attribute a connection, the session
//! comes from the `x-polar-session` header or from the API key the harness
//! sends (a per-session key the agent issued); requests of unknown sessions
//! are refused with 401 in the API's error shape, never given a new session.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use http::Request;
use hyper::body::Incoming;

use crate::config::{LiveRules, ProviderHint, Route, RouteAction, Rules};
use polar_chat::Api;
use polar_ids::SessionId;
use polar_io::tasks::Tasks;

use super::error::ProxyError;
use super::http::{ContextSource, HttpLimits, api_of};
use super::pipeline::{ModelPipeline, RequestContext};
use super::upstream_conn::UpstreamConn;

/// Header naming the session.
pub const SESSION_HEADER: &str = "x-polar-session";

/// Sessions the base-URL listener accepts, by id and by API key.
#[derive(Debug, Default)]
pub struct SessionDirectory {
    ids: RwLock<HashMap<SessionId, ()>>,
    keys: RwLock<HashMap<String, SessionId>>,
}

impl SessionDirectory {
    /// Accepts `session`, optionally with its own API key.
    pub fn register(&self, session: &SessionId, api_key: Option<&str>) {
        write(&self.ids).insert(session.clone(), ());
        if let Some(k) = api_key {
            write(&self.keys).insert(k.to_owned(), session.clone());
        }
    }

    /// Stops accepting `session` and its keys.
    pub fn unregister(&self, session: &SessionId) {
        write(&self.ids).remove(session);
        write(&self.keys).retain(|_, s| s != session);
    }

    /// The session a request belongs to.
    pub fn resolve<B>(&self, req: &Request<B>) -> Result<SessionId, ProxyError> {
        if let Some(v) = req.headers().get(SESSION_HEADER) {
            let text = v.to_str().unwrap_or_default();
            let id: SessionId = text
                .parse()
                .map_err(|_| ProxyError::UnknownSession(text.to_owned()))?;
            return if read(&self.ids).contains_key(&id) {
                Ok(id)
            } else {
                Err(ProxyError::UnknownSession(id.to_string()))
            };
        }
        match api_key(req) {
            Some(k) => session_of_key(&read(&self.keys), &k)
                .ok_or_else(|| ProxyError::UnknownSession("an unregistered API key".into())),
            None => Err(ProxyError::UnknownSession(format!(
                "no {SESSION_HEADER} header and no API key"
            ))),
        }
    }
}

/// The session whose API key is `given`: every registered key is compared,
/// in constant time each (no hash lookup or early exit whose timing would
/// tell how close a guess came).
fn session_of_key(keys: &HashMap<String, SessionId>, given: &str) -> Option<SessionId> {
    let mut found = None;
    for (key, session) in keys {
        if polar_io::auth::token_eq(key.as_bytes(), given.as_bytes()) {
            found = Some(session);
        }
    }
    found.cloned()
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The API key of a request, wherever its API puts it: `x-api-key`,
/// `Authorization: Bearer`, `x-goog-api-key` or a `key` query parameter.
pub fn api_key<B>(req: &Request<B>) -> Option<String> {
    let h = req.headers();
    let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    header("x-api-key")
        .or_else(|| header("x-goog-api-key"))
        .or_else(|| {
            header("authorization").and_then(|a| {
                a.strip_prefix("Bearer ")
                    .or_else(|| a.strip_prefix("bearer "))
                    .map(str::to_owned)
            })
        })
        .or_else(|| {
            req.uri()
                .query()?
                .split('&')
                .find_map(|kv| kv.strip_prefix("key=").map(str::to_owned))
        })
}

fn hint_serves(hint: ProviderHint, api: Api) -> bool {
    matches!(
        (hint, api),
        (ProviderHint::Anthropic, Api::AnthropicMessages)
            | (ProviderHint::OpenAi, Api::OpenaiChat | Api::OpenaiResponses)
            | (ProviderHint::OpenAiResponses, Api::OpenaiResponses)
            | (ProviderHint::Gemini, Api::Gemini)
    )
}

/// The model route for a request in base-URL mode: the first whose provider
/// hint serves the request's API, else the first `auto` one, else the first
/// model route.
pub fn route_for(rules: &Rules, api: Option<Api>) -> Option<&Route> {
    let models = || {
        rules
            .routes()
            .iter()
            .filter(|r| matches!(r.action, RouteAction::Model { .. }))
    };
    let hint = |r: &&Route| match &r.action {
        RouteAction::Model { provider, .. } => Some(*provider),
        _ => None,
    };
    api.and_then(|api| models().find(|r| hint(r).is_some_and(|h| hint_serves(h, api))))
        .or_else(|| models().find(|r| hint(r) == Some(ProviderHint::Auto)))
        .or_else(|| models().next())
}

/// Finds each request's context from its headers.
pub struct BaseUrlSource {
    /// Accepted sessions.
    pub sessions: Arc<SessionDirectory>,
    /// The routing rules in force (model routes give the backends and
    /// upstreams); read once per request.
    pub rules: LiveRules,
    /// The client.
    pub peer: SocketAddr,
    /// The connection's own upstream connection (forwarded requests).
    pub upstream_conn: Arc<UpstreamConn>,
}

impl ContextSource for BaseUrlSource {
    fn context(&self, req: &Request<Incoming>) -> Result<RequestContext, ProxyError> {
        let session = self.sessions.resolve(req)?;
        let api = api_of(req.method(), req.uri(), req.headers());
        let rules = self.rules.current();
        let route = route_for(&rules, api)
            .ok_or_else(|| ProxyError::NoRoute(req.uri().path().to_owned()))?;
        let RouteAction::Model {
            provider,
            backend,
            upstream,
        } = &route.action
        else {
            return Err(ProxyError::NoRoute(req.uri().path().to_owned()));
        };
        let host = req
            .headers()
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Ok(RequestContext {
            session: Some(session),
            orig: None,
            host,
            peer: self.peer,
            backend: backend.clone(),
            upstream: upstream.clone(),
            provider: *provider,
            tls: false,
            upstream_conn: Some(Arc::clone(&self.upstream_conn)),
        })
    }
}

/// Serves base-URL mode on `listener` until shutdown.
pub async fn serve(
    listener: tokio::net::TcpListener,
    sessions: Arc<SessionDirectory>,
    rules: impl Into<LiveRules>,
    pipeline: Arc<dyn ModelPipeline>,
    limits: HttpLimits,
    tasks: Tasks,
) {
    let rules = rules.into();
    let shutdown = tasks.shutdown_token();
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "base-URL accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Replies are streamed in small writes: no Nagle delay on them.
        let _ = stream.set_nodelay(true);
        let source = Arc::new(BaseUrlSource {
            sessions: Arc::clone(&sessions),
            rules: rules.clone(),
            peer,
            upstream_conn: Arc::default(),
        });
        let pipeline = Arc::clone(&pipeline);
        tasks.spawn(async move { super::http::serve(stream, source, pipeline, limits).await });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)], uri: &str) -> Request<()> {
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn sessions_from_header_or_key_and_unknown_refused() {
        let d = SessionDirectory::default();
        let s: SessionId = "s-1".parse().unwrap();
        d.register(&s, Some("polar-key-1"));
        assert_eq!(d.resolve(&req(&[(SESSION_HEADER, "s-1")], "/")).unwrap(), s);
        assert_eq!(
            d.resolve(&req(&[("x-api-key", "polar-key-1")], "/"))
                .unwrap(),
            s
        );
        assert_eq!(
            d.resolve(&req(&[("authorization", "Bearer polar-key-1")], "/"))
                .unwrap(),
            s
        );
        assert_eq!(
            d.resolve(&req(
                &[],
                "/v1beta/models/m:generateContent?key=polar-key-1"
            ))
            .unwrap(),
            s
        );
        assert!(d.resolve(&req(&[(SESSION_HEADER, "s-2")], "/")).is_err());
        assert!(d.resolve(&req(&[("x-api-key", "other")], "/")).is_err());
        assert!(d.resolve(&req(&[], "/")).is_err());
        d.unregister(&s);
        assert!(d.resolve(&req(&[(SESSION_HEADER, "s-1")], "/")).is_err());
        assert!(
            d.resolve(&req(&[("x-api-key", "polar-key-1")], "/"))
                .is_err()
        );
    }

    #[test]
    fn routes_by_api() {
        let rules = crate::config::Config::default().rules;
        let r = route_for(&rules, Some(Api::Gemini)).unwrap();
        assert_eq!(r.host.to_string(), "generativelanguage.googleapis.com");
        let r = route_for(&rules, Some(Api::AnthropicMessages)).unwrap();
        assert_eq!(r.host.to_string(), "api.anthropic.com");
        assert!(route_for(&rules, None).is_some());
    }
}
