//! Base-URL mode from inside a sandbox. The harness is given
//! `http://<addr>` (the configured `proxy.base_url_listen`, or
//! [`DEFAULT_ADDR`]) and a per-session API key. Its connection to that
//! address is redirected into the session's listener like any other; this
//! handler recognises it by its original destination and serves it as
//! base-URL mode, and hands every other connection to the interception
//! proxy.
//!
//! The session of such a connection is the one the kernel attributed it to
//! (its redirect record, or the listener's own session): the key and the
//! `x-polar-session` header may only confirm it, and naming a sibling
//! session is refused with 403 (`polar_proxy::base_url`). The connection
//! takes its place under the same connection caps as intercepted ones
//! (`polar_proxy::shares`). The key is 128 random bits: it is what proves
//! the session on the host listener, where the kernel says nothing.

use std::net::SocketAddr;
use std::sync::Arc;

use polar_config::LiveRules;
use polar_ids::SessionId;
use polar_proxy::Proxy;
use polar_proxy::base_url::{BaseUrlSource, SessionDirectory};
use polar_redirect::listener::{Accepted, Handler};

/// The base-URL address used when the configuration names none.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8787";

/// The proxy, plus base-URL mode on one original destination.
pub struct WithBaseUrl {
    /// The interception proxy.
    pub proxy: Arc<Proxy>,
    /// The base-URL address the harness was given.
    pub addr: SocketAddr,
    /// Accepted sessions and keys.
    pub sessions: Arc<SessionDirectory>,
    /// Routing rules in force (model routes give the upstreams).
    pub rules: LiveRules,
}

fn same(a: SocketAddr, b: SocketAddr) -> bool {
    let canon = |s: SocketAddr| match s {
        SocketAddr::V6(v6) => v6
            .ip()
            .to_ipv4_mapped()
            .map_or(s, |v4| SocketAddr::from((v4, v6.port()))),
        v4 => v4,
    };
    canon(a) == canon(b)
}

impl Handler for WithBaseUrl {
    async fn handle(&self, conn: Accepted) {
        if conn.orig.is_some_and(|o| same(o.0, self.addr)) {
            polar_proxy::count_base_url(&self.proxy.stats);
            let Some(_slot) = self.proxy.admit(conn.session.as_ref(), conn.peer).await else {
                return;
            };
            let source = Arc::new(BaseUrlSource {
                sessions: Arc::clone(&self.sessions),
                attributed: conn.session.clone(),
                rules: self.rules.clone(),
                peer: conn.peer,
                upstream_conn: Arc::default(),
            });
            polar_proxy::http::serve(
                conn.stream,
                source,
                self.proxy.pipeline(),
                self.proxy.limits(),
                Arc::clone(self.proxy.shares()),
            )
            .await;
        } else {
            self.proxy.handle(conn).await;
        }
    }
}

/// A fresh per-session API key: 128 random bits.
pub fn session_key(session: &SessionId) -> String {
    format!("polar-{session}-{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_mapped_addresses_match() {
        let a: SocketAddr = "127.0.0.1:8787".parse().unwrap();
        let b: SocketAddr = "[::ffff:127.0.0.1]:8787".parse().unwrap();
        assert!(same(a, b));
        assert!(!same(a, "127.0.0.1:8788".parse().unwrap()));
        let k = session_key(&"s-1".parse().unwrap());
        assert!(k.starts_with("polar-s-1-") && k.len() > 20);
    }
}
