//! [`Rules`]: the routing rules compiled for lookup. Decides what happens to
//! a connection ([`Rules::route`]) and to a DNS question
//! ([`Rules::dns_answer`]), and lists the hosts the CA must be allowed to
//! sign for ([`Rules::intercepted_hosts`]). Pure: no I/O.
//!
//! Precedence, for a connection to `host:port`:
//! 1. a rule whose `host` is exactly the name beats any wildcard;
//! 2. among wildcards, the longer suffix wins (`*.b.example` over `*.example`);
//! 3. among equals, the rule written first wins;
//! 4. when no name rule matches (in particular when no name is known), IP
//!    literal rules match the host if it is an IP literal, then the
//!    connection's address;
//! 5. otherwise `default_action`.
//!
//! A rule only matches on the ports it lists. Names are compared
//! case-insensitively and without a trailing dot.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use super::host::{HostPattern, SeenHost, normalize_seen};
use super::route::{ActionKind, DefaultAction, Route, RouteAction};

/// Which rule decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchedRule {
    /// `route[index]`, with its name if it has one.
    Route {
        /// Position in the file (or in the built-in list).
        index: usize,
        /// The route's `name`.
        name: Option<Arc<str>>,
    },
    /// No rule matched: `default_action` applied.
    Default,
}

impl fmt::Display for MatchedRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Route {
                index,
                name: Some(name),
            } => write!(f, "route[{index}] ({name})"),
            Self::Route { index, name: None } => write!(f, "route[{index}]"),
            Self::Default => f.write_str("default"),
        }
    }
}

/// What to do with a connection, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The action, with provider hint and upstream for model routes.
    pub action: RouteAction,
    /// The rule that decided.
    pub matched: MatchedRule,
}

/// How the agent's resolver answers a question for a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DnsDecision {
    /// Answer with an address from the fake range (a model host: the agent
    /// terminates its connections and must know the name behind the address).
    Fake,
    /// Resolve through the host's resolver (a passed host).
    Resolve,
    /// Answer NXDOMAIN (a denied host).
    NxDomain,
}

/// The routing rules, compiled.
#[derive(Debug, Clone)]
pub struct Rules {
    routes: Vec<Route>,
    default_action: DefaultAction,
    /// Rule indices by exact name, in file order.
    exact: HashMap<Arc<str>, Vec<usize>>,
    /// Rule indices by wildcard suffix (without `*.`), in file order.
    suffix: HashMap<Arc<str>, Vec<usize>>,
    /// Rule indices by IP literal, in file order.
    ip: HashMap<IpAddr, Vec<usize>>,
    /// Patterns of model routes, first occurrence order, no duplicates.
    intercepted: Vec<HostPattern>,
}

impl PartialEq for Rules {
    fn eq(&self, other: &Self) -> bool {
        self.routes == other.routes && self.default_action == other.default_action
    }
}

impl Eq for Rules {}

impl Rules {
    /// Compiles `routes` (already validated) with `default_action` for
    /// everything they do not match.
    pub fn new(routes: Vec<Route>, default_action: DefaultAction) -> Self {
        let mut exact: HashMap<Arc<str>, Vec<usize>> = HashMap::new();
        let mut suffix: HashMap<Arc<str>, Vec<usize>> = HashMap::new();
        let mut ip: HashMap<IpAddr, Vec<usize>> = HashMap::new();
        let mut intercepted = Vec::new();
        for (index, route) in routes.iter().enumerate() {
            match &route.host {
                HostPattern::Exact(name) => {
                    exact
                        .entry(Arc::from(name.as_str()))
                        .or_default()
                        .push(index);
                }
                HostPattern::Suffix(name) => {
                    suffix
                        .entry(Arc::from(name.as_str()))
                        .or_default()
                        .push(index);
                }
                HostPattern::Ip(addr) => ip.entry(addr.to_canonical()).or_default().push(index),
            }
            if route.action.kind() == ActionKind::Model && !intercepted.contains(&route.host) {
                intercepted.push(route.host.clone());
            }
        }
        Self {
            routes,
            default_action,
            exact,
            suffix,
            ip,
            intercepted,
        }
    }

    /// The routes, in file order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// What applies when no route matches.
    pub fn default_action(&self) -> DefaultAction {
        self.default_action
    }

    /// Decides a connection to `port`, knowing its name (`host`: SNI or
    /// `Host` header, possibly an IP literal) and/or its original
    /// destination address (`ip`). See the module docs for precedence.
    pub fn route(&self, host: Option<&str>, ip: Option<IpAddr>, port: u16) -> Decision {
        let found = match host.and_then(normalize_seen) {
            Some(SeenHost::Name(name)) => self.match_name(&name, port),
            Some(SeenHost::Ip(addr)) => self.match_ip(addr, port),
            None => None,
        };
        let found = found.or_else(|| ip.and_then(|addr| self.match_ip(addr, port)));
        match found {
            Some(index) => self.decision(index),
            None => Decision {
                action: self.default_action.into(),
                matched: MatchedRule::Default,
            },
        }
    }

    /// How the agent's resolver answers for `name`: the routing decision
    /// for the name on every port that a rule matching the name lists gives
    /// [`DnsDecision::Fake`] if any port goes to `model`, else
    /// [`DnsDecision::Resolve`] if any is passed, else
    /// [`DnsDecision::NxDomain`]. A name no rule matches follows
    /// `default_action`; IP literal rules play no part.
    pub fn dns_answer(&self, name: &str) -> DnsDecision {
        let name = match normalize_seen(name) {
            None => return DnsDecision::NxDomain,
            Some(SeenHost::Ip(_)) => None,
            Some(SeenHost::Name(name)) => Some(name),
        };
        let mut ports: Vec<u16> = Vec::new();
        if let Some(name) = &name {
            let exact = self.exact.get(name.as_ref()).into_iter();
            let wildcards = suffixes(name).filter_map(|suffix| self.suffix.get(suffix));
            for index in exact.chain(wildcards).flatten() {
                ports.extend(&self.routes[*index].ports);
            }
        }
        let (Some(name), false) = (name, ports.is_empty()) else {
            return match self.default_action {
                DefaultAction::Pass => DnsDecision::Resolve,
                DefaultAction::Deny => DnsDecision::NxDomain,
            };
        };
        ports.sort_unstable();
        ports.dedup();
        let mut answer = DnsDecision::NxDomain;
        for port in ports {
            match self
                .match_name(&name, port)
                .map(|i| self.routes[i].action.kind())
            {
                Some(ActionKind::Model) => return DnsDecision::Fake,
                Some(ActionKind::Pass) => answer = DnsDecision::Resolve,
                Some(ActionKind::Deny) | None => {}
            }
        }
        answer
    }

    /// The host patterns of model routes: the names and suffixes (and any IP
    /// literals) the CA's name constraints must permit.
    pub fn intercepted_hosts(&self) -> &[HostPattern] {
        &self.intercepted
    }

    fn decision(&self, index: usize) -> Decision {
        let route = &self.routes[index];
        Decision {
            action: route.action.clone(),
            matched: MatchedRule::Route {
                index,
                name: route.name.clone(),
            },
        }
    }

    /// The first rule of `candidates` that lists `port`.
    fn first_on_port(&self, candidates: Option<&Vec<usize>>, port: u16) -> Option<usize> {
        candidates?
            .iter()
            .copied()
            .find(|&i| self.routes[i].ports.contains(&port))
    }

    /// `name` is lower case without trailing dot.
    fn match_name(&self, name: &str, port: u16) -> Option<usize> {
        if let Some(index) = self.first_on_port(self.exact.get(name), port) {
            return Some(index);
        }
        // Suffixes from the longest (drop the first label) to the shortest.
        suffixes(name).find_map(|suffix| self.first_on_port(self.suffix.get(suffix), port))
    }

    fn match_ip(&self, addr: IpAddr, port: u16) -> Option<usize> {
        self.first_on_port(self.ip.get(&addr.to_canonical()), port)
    }
}

/// The proper suffixes of `name` at label boundaries, longest first:
/// `a.b.c` gives `b.c`, then `c`.
fn suffixes(name: &str) -> impl Iterator<Item = &str> {
    name.match_indices('.')
        .map(move |(dot, _)| &name[dot + 1..])
        .filter(|suffix| !suffix.is_empty())
}

#[cfg(test)]
mod tests;
