//! Base-URL mode: the model pipeline reachable directly over plain HTTP,
//! for harnesses set up with a base URL instead of being redirected. Who a
//! request is from, and what it may claim:
//!
//! - **A connection the kernel attributed** (from inside a sandbox: its
//!   connection to the base-URL address was redirected into the session's
//!   listener, `polar_node::harness::base_url`) belongs to that session and no
//!   other. The `x-polar-session` header and the API key may only confirm
//!   it: a header naming another session, or a key issued to another
//!   session, is refused with 403 in the API's error shape and counted
//!   (`polar_proxy_session_mismatch_total`); a key issued to no session is
//!   refused with 401. Without either, the kernel's word is enough.
//! - **The host listener** (`proxy.base_url_listen`, [`serve`]) has no
//!   kernel attribution. A request must prove its session with the secret
//!   key issued to it ([`SessionDirectory::register`]), sent as `x-polar-key`
//!   or wherever its API puts an API key; every registered key is compared
//!   in constant time. A bare session id in `x-polar-session` proves
//!   nothing: without a key the request is refused with 401, and a header
//!   naming a session other than the key's with 403. Sessions are never
//!   created here: an unknown key gets 401.
//!
//! The one trusted case is `polar proxy` (no sandbox at all, so every
//! client is the operator's own), whose sessions' keys are their ids unless
//! given: that is its documented interface.
//!
//! Connections of the host listener count against the node's connection
//! cap; their requests go through their session's stream and body caps
//! like any other ([`super::shares`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use http::Request;
use hyper::body::Incoming;

use polar_chat::Api;
use polar_config::{LiveRules, ProviderHint, Route, RouteAction, Rules};
use polar_ids::SessionId;
use polar_io::tasks::Tasks;

use super::error::{NamedBy, ProxyError};
use super::http::{ContextSource, HttpLimits, api_of};
use super::pipeline::{ModelPipeline, RequestContext};
use super::shares::Shares;
use super::upstream_conn::UpstreamConn;

/// Header naming the session (a claim, never a proof).
pub const SESSION_HEADER: &str = "x-polar-session";

/// Header carrying the session's secret key, for clients whose API-key
/// header is taken by something else.
pub const KEY_HEADER: &str = "x-polar-key";

/// Sessions the base-URL listener accepts, by id and by API key.
#[derive(Debug, Default)]
pub struct SessionDirectory {
    ids: RwLock<HashMap<SessionId, ()>>,
    keys: RwLock<HashMap<String, SessionId>>,
}

impl SessionDirectory {
    /// Accepts `session`, optionally with its own secret API key (without
    /// one, the session is reachable only through connections the kernel
    /// attributes to it).
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

    /// The session a request belongs to. `attributed` is the session the
    /// kernel attributed its connection to, if any: then the request may
    /// only confirm it. Without it, the request's key must prove its
    /// session.
    pub fn resolve<B>(
        &self,
        req: &Request<B>,
        attributed: Option<&SessionId>,
    ) -> Result<SessionId, ProxyError> {
        let named = match req.headers().get(SESSION_HEADER) {
            Some(v) => {
                let text = v.to_str().unwrap_or_default();
                Some(
                    text.parse::<SessionId>()
                        .map_err(|_| ProxyError::UnknownSession(text.to_owned()))?,
                )
            }
            None => None,
        };
        let keyed = match api_key(req) {
            Some(k) => Some(
                session_of_key(&read(&self.keys), &k)
                    .ok_or_else(|| ProxyError::UnknownSession("an unregistered API key".into()))?,
            ),
            None => None,
        };
        let Some(owner) = attributed.cloned().or_else(|| keyed.clone()) else {
            return Err(ProxyError::UnknownSession(format!(
                "no session key (an API key or {KEY_HEADER}); {SESSION_HEADER} alone is not one"
            )));
        };
        let mismatch = |via| ProxyError::SessionMismatch {
            via,
            attributed: owner.to_string(),
        };
        if keyed.as_ref().is_some_and(|k| *k != owner) {
            return Err(mismatch(NamedBy::Key));
        }
        if named.as_ref().is_some_and(|n| *n != owner) {
            return Err(mismatch(NamedBy::Header));
        }
        if !read(&self.ids).contains_key(&owner) {
            return Err(ProxyError::UnknownSession(owner.to_string()));
        }
        Ok(owner)
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

/// The session key of a request: `x-polar-key`, else its API key wherever
/// its API puts it: `x-api-key`, `Authorization: Bearer`, `x-goog-api-key`
/// or a `key` query parameter.
pub fn api_key<B>(req: &Request<B>) -> Option<String> {
    let h = req.headers();
    let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    header(KEY_HEADER)
        .or_else(|| header("x-api-key"))
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
    /// The session the kernel attributed the connection to (`None` on the
    /// host listener).
    pub attributed: Option<SessionId>,
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
        let session = self.sessions.resolve(req, self.attributed.as_ref())?;
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

/// Serves base-URL mode on `listener` until shutdown, every connection
/// under the node's connection cap and every request under its session's
/// shares; each connection is counted in `stats`
/// ([`super::count_base_url`]).
#[expect(
    clippy::too_many_arguments,
    reason = "the agent's parts a listener needs, all distinct"
)]
pub async fn serve(
    listener: tokio::net::TcpListener,
    sessions: Arc<SessionDirectory>,
    rules: impl Into<LiveRules>,
    pipeline: Arc<dyn ModelPipeline>,
    limits: HttpLimits,
    shares: Arc<Shares>,
    stats: Arc<super::ProxyStats>,
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
        super::count_base_url(&stats);
        // Replies are streamed in small writes: no Nagle delay on them.
        let _ = stream.set_nodelay(true);
        let source = Arc::new(BaseUrlSource {
            sessions: Arc::clone(&sessions),
            attributed: None,
            rules: rules.clone(),
            peer,
            upstream_conn: Arc::default(),
        });
        let pipeline = Arc::clone(&pipeline);
        let shares = Arc::clone(&shares);
        tasks.spawn(async move {
            let Ok(_slot) = shares.connection(None).await else {
                tracing::debug!(%peer, "base-URL connection refused: node connection cap; closing");
                return;
            };
            super::http::serve(stream, source, pipeline, limits, Arc::clone(&shares)).await;
        });
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
    fn the_host_listener_takes_keys_and_never_a_bare_header() {
        let d = SessionDirectory::default();
        let s: SessionId = "s-1".parse().unwrap();
        let t: SessionId = "s-2".parse().unwrap();
        d.register(&s, Some("polar-key-1"));
        d.register(&t, Some("polar-key-2"));
        for h in [
            ("x-api-key", "polar-key-1"),
            ("authorization", "Bearer polar-key-1"),
            (KEY_HEADER, "polar-key-1"),
        ] {
            assert_eq!(d.resolve(&req(&[h], "/"), None).unwrap(), s, "{h:?}");
        }
        assert_eq!(
            d.resolve(
                &req(&[], "/v1beta/models/m:generateContent?key=polar-key-1"),
                None
            )
            .unwrap(),
            s
        );
        // The header confirms the key's session, and proves nothing alone.
        let both = [(SESSION_HEADER, "s-1"), (KEY_HEADER, "polar-key-1")];
        assert_eq!(d.resolve(&req(&both, "/"), None).unwrap(), s);
        let bare = d.resolve(&req(&[(SESSION_HEADER, "s-1")], "/"), None);
        assert!(
            matches!(bare, Err(ProxyError::UnknownSession(_))),
            "{bare:?}"
        );
        let other = [(SESSION_HEADER, "s-2"), (KEY_HEADER, "polar-key-1")];
        assert!(matches!(
            d.resolve(&req(&other, "/"), None),
            Err(ProxyError::SessionMismatch {
                via: NamedBy::Header,
                ..
            })
        ));
        assert!(
            d.resolve(&req(&[("x-api-key", "other")], "/"), None)
                .is_err()
        );
        assert!(d.resolve(&req(&[], "/"), None).is_err());
        d.unregister(&s);
        assert!(
            d.resolve(&req(&[("x-api-key", "polar-key-1")], "/"), None)
                .is_err()
        );
    }

    #[test]
    fn a_kernel_attributed_connection_may_only_confirm_its_session() {
        let d = SessionDirectory::default();
        let s: SessionId = "task-s0".parse().unwrap();
        let t: SessionId = "task-s1".parse().unwrap();
        d.register(&s, Some("key-s0"));
        d.register(&t, Some("key-s1"));
        let own = Some(&s);
        assert_eq!(d.resolve(&req(&[], "/"), own).unwrap(), s);
        assert_eq!(
            d.resolve(
                &req(&[("x-api-key", "key-s0"), (SESSION_HEADER, "task-s0")], "/"),
                own
            )
            .unwrap(),
            s
        );
        for (h, via) in [
            ((SESSION_HEADER, "task-s1"), NamedBy::Header),
            (("x-api-key", "key-s1"), NamedBy::Key),
            (("authorization", "Bearer key-s1"), NamedBy::Key),
        ] {
            match d.resolve(&req(&[h], "/"), own) {
                Err(ProxyError::SessionMismatch { via: v, attributed }) => {
                    assert_eq!((v, attributed.as_str()), (via, "task-s0"));
                }
                other => panic!("{h:?}: {other:?}"),
            }
        }
        // A key of no session is refused; so is a session that ended.
        assert!(matches!(
            d.resolve(&req(&[("x-api-key", "guess")], "/"), own),
            Err(ProxyError::UnknownSession(_))
        ));
        d.unregister(&s);
        assert!(d.resolve(&req(&[], "/"), own).is_err());
    }

    #[test]
    fn routes_by_api() {
        let rules = polar_config::Config::default().rules;
        let r = route_for(&rules, Some(Api::Gemini)).unwrap();
        assert_eq!(r.host.to_string(), "generativelanguage.googleapis.com");
        let r = route_for(&rules, Some(Api::AnthropicMessages)).unwrap();
        assert_eq!(r.host.to_string(), "api.anthropic.com");
        assert!(route_for(&rules, None).is_some());
    }
}
