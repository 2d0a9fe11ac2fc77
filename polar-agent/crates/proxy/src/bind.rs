//! Pass routes bound to their names: which addresses a passed connection
//! may be relayed to. The route is chosen by the name the sandbox sent
//! (SNI or `Host`), and the sandbox also chose the address it dialled; a
//! pass route opens only the addresses behind its name, so:
//!
//! - a route whose `host` is a name (`registry.npmjs.org`, or a wildcard
//!   `*.example.com`) relays only to an address the name the connection
//!   sent resolves to on the node ([`polar_redirect::dns::Answers`]: the answers the
//!   agent's DNS gave the sandbox, or the agent's own lookup), or to one of
//!   the route's `addresses`;
//! - a route whose `host` is an IP literal relays only to that address (or
//!   its `addresses`);
//! - `default_action = "pass"` relays anywhere: the operator passed
//!   everything no route names.
//!
//! The dialled address is checked, not replaced by a resolved one: the
//! sandbox's client picked it from the answers the agent gave it (keeping
//! its own choice among several records, its failover and its happy
//! eyeballs), and a connection to an address the name does not resolve to
//! is refused and logged rather than silently sent elsewhere. Pure: the
//! lookup is the caller's.

use std::net::IpAddr;

use polar_config::{Decision, HostPattern, IpNet, MatchedRule, Rules, SeenHost, normalize_seen};

/// Where a passed connection may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// No route matched and the default passes: where it was dialled.
    Anywhere,
    /// An IP-literal route: its address and its `addresses`.
    Listed(Vec<IpNet>),
    /// A name route: the addresses `name` (the name the connection sent,
    /// normalised) resolves to, and the route's `addresses`.
    Name {
        /// The name to resolve.
        name: String,
        /// The route's `addresses`.
        listed: Vec<IpNet>,
    },
    /// A name route matched without a usable name (cannot happen through
    /// [`Rules::route`]; refused).
    Nowhere,
}

/// Where a connection that `decision` passes may go; `host` is the name it
/// was routed by (SNI, `Host`, or the name behind a fake address).
pub fn allowed(rules: &Rules, decision: &Decision, host: Option<&str>) -> Allowed {
    let MatchedRule::Route { index, .. } = &decision.matched else {
        return Allowed::Anywhere;
    };
    let Some(route) = rules.routes().get(*index) else {
        return Allowed::Nowhere;
    };
    let listed = route.addresses.clone();
    match &route.host {
        HostPattern::Ip(ip) => {
            let mut nets = vec![IpNet::addr(*ip)];
            nets.extend(listed);
            Allowed::Listed(nets)
        }
        HostPattern::Exact(_) | HostPattern::Suffix(_) => match host.and_then(normalize_seen) {
            Some(SeenHost::Name(name)) => Allowed::Name {
                name: name.into_owned(),
                listed,
            },
            _ => Allowed::Nowhere,
        },
    }
}

impl Allowed {
    /// Whether `ip` is allowed without a lookup: anywhere, or listed.
    pub fn listed(&self, ip: IpAddr) -> bool {
        match self {
            Self::Anywhere => true,
            Self::Listed(nets) | Self::Name { listed: nets, .. } => {
                nets.iter().any(|n| n.contains(ip))
            }
            Self::Nowhere => false,
        }
    }

    /// The name whose resolution allows more addresses, if any.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Name { name, .. } => Some(name),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_config::{DefaultAction, RawConfig, RawRoute};

    fn rules(default: DefaultAction) -> Rules {
        let raw = |host: &str, addresses: Option<Vec<&str>>| RawRoute {
            host: host.into(),
            ports: None,
            action: polar_config::ActionKind::Pass,
            provider: None,
            upstream: None,
            backend: None,
            addresses: addresses.map(|a| a.into_iter().map(String::from).collect()),
            name: None,
        };
        let config = polar_config::Config::try_from(RawConfig {
            route: Some(vec![
                raw("registry.example", None),
                raw("*.cdn.example", Some(vec!["10.9.0.0/16"])),
                raw("10.0.0.5", Some(vec!["10.0.0.6"])),
            ]),
            default_action: Some(default),
            ..RawConfig::default()
        })
        .unwrap();
        config.rules
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_name_route_is_bound_to_the_name_sent() {
        let r = rules(DefaultAction::Deny);
        let d = r.route(Some("Registry.Example."), Some(ip("127.0.0.1")), 443);
        let a = allowed(&r, &d, Some("Registry.Example."));
        assert_eq!(a.name(), Some("registry.example"));
        assert!(!a.listed(ip("127.0.0.1")));
        // A wildcard: the name actually sent, plus the listed network.
        let d = r.route(Some("a.b.cdn.example"), Some(ip("169.254.169.254")), 443);
        let a = allowed(&r, &d, Some("a.b.cdn.example"));
        assert_eq!(a.name(), Some("a.b.cdn.example"));
        assert!(a.listed(ip("10.9.3.4")));
        assert!(!a.listed(ip("169.254.169.254")));
    }

    #[test]
    fn an_ip_route_is_bound_to_its_address() {
        let r = rules(DefaultAction::Deny);
        // Routed by the literal in the Host header, dialled elsewhere.
        let d = r.route(Some("10.0.0.5"), Some(ip("127.0.0.1")), 80);
        let a = allowed(&r, &d, Some("10.0.0.5"));
        assert_eq!(a.name(), None);
        assert!(a.listed(ip("10.0.0.5")) && a.listed(ip("::ffff:10.0.0.5")));
        assert!(a.listed(ip("10.0.0.6")));
        assert!(!a.listed(ip("127.0.0.1")));
    }

    #[test]
    fn the_default_pass_goes_where_it_was_dialled() {
        let r = rules(DefaultAction::Pass);
        let d = r.route(Some("other.example"), Some(ip("127.0.0.1")), 443);
        assert_eq!(allowed(&r, &d, Some("other.example")), Allowed::Anywhere);
        assert!(Allowed::Anywhere.listed(ip("127.0.0.1")));
        assert!(!Allowed::Nowhere.listed(ip("127.0.0.1")));
    }
}
