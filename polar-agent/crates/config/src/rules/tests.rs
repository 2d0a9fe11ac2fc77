//! Tests of [`Rules`]: one per precedence rule, DNS answers, and property
//! tests against a straightforward reference matcher.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::route::ProviderHint;
use crate::upstream::Upstream;

fn pattern(host: &str) -> HostPattern {
    match HostPattern::parse(host) {
        Ok(pattern) => pattern,
        Err(why) => panic!("{host:?}: {why}"),
    }
}

fn rule(host: &str, ports: &[u16], action: ActionKind) -> Route {
    let action = match action {
        ActionKind::Model => RouteAction::Model {
            provider: ProviderHint::Auto,
            backend: None,
            upstream: Some(Arc::new(Upstream::local_http(8000))),
        },
        ActionKind::Pass => RouteAction::Pass,
        ActionKind::Deny => RouteAction::Deny,
    };
    Route {
        name: None,
        host: pattern(host),
        ports: ports.to_vec(),
        action,
        addresses: Vec::new(),
    }
}

fn named(name: &str, route: Route) -> Route {
    Route {
        name: Some(Arc::from(name)),
        ..route
    }
}

/// The index of the rule that decides, `None` for the default.
fn winner(rules: &Rules, host: Option<&str>, ip: Option<IpAddr>, port: u16) -> Option<usize> {
    match rules.route(host, ip, port).matched {
        MatchedRule::Route { index, .. } => Some(index),
        MatchedRule::Default => None,
    }
}

const WEB: &[u16] = &[443, 80];
use ActionKind::{Deny, Model, Pass};

#[test]
fn exact_beats_wildcard_wherever_written() {
    let rules = Rules::new(
        vec![
            rule("*.example.com", WEB, Deny),
            rule("api.example.com", WEB, Pass),
        ],
        DefaultAction::Deny,
    );
    assert_eq!(winner(&rules, Some("api.example.com"), None, 443), Some(1));
    assert_eq!(winner(&rules, Some("www.example.com"), None, 443), Some(0));
}

#[test]
fn longer_suffix_beats_shorter() {
    let rules = Rules::new(
        vec![
            rule("*.example.com", WEB, Deny),
            rule("*.eu.example.com", WEB, Pass),
        ],
        DefaultAction::Deny,
    );
    assert_eq!(winner(&rules, Some("a.eu.example.com"), None, 443), Some(1));
    assert_eq!(
        winner(&rules, Some("x.a.eu.example.com"), None, 443),
        Some(1)
    );
    // The bare suffix is not matched by its own wildcard, only by shorter ones.
    assert_eq!(winner(&rules, Some("eu.example.com"), None, 443), Some(0));
    assert_eq!(winner(&rules, Some("example.com"), None, 443), None);
}

#[test]
fn first_rule_wins_among_equals() {
    let rules = Rules::new(
        vec![
            rule("api.example.com", &[443], Pass),
            rule("api.example.com", &[443, 8443], Deny),
            rule("*.example.com", &[443], Pass),
            rule("*.example.com", &[443, 80], Deny),
        ],
        DefaultAction::Deny,
    );
    assert_eq!(winner(&rules, Some("api.example.com"), None, 443), Some(0));
    assert_eq!(winner(&rules, Some("api.example.com"), None, 8443), Some(1));
    assert_eq!(winner(&rules, Some("b.example.com"), None, 443), Some(2));
    assert_eq!(winner(&rules, Some("b.example.com"), None, 80), Some(3));
}

#[test]
fn rules_only_match_their_ports() {
    let rules = Rules::new(
        vec![
            rule("api.example.com", &[443], Model),
            rule("*.example.com", &[80], Pass),
        ],
        DefaultAction::Deny,
    );
    assert_eq!(winner(&rules, Some("api.example.com"), None, 443), Some(0));
    // No exact rule on port 80: the wildcard applies.
    assert_eq!(winner(&rules, Some("api.example.com"), None, 80), Some(1));
    assert_eq!(winner(&rules, Some("api.example.com"), None, 22), None);
}

#[test]
fn names_are_case_insensitive_and_dot_terminated() {
    let rules = Rules::new(
        vec![rule("api.example.com", WEB, Pass)],
        DefaultAction::Deny,
    );
    for host in ["API.Example.COM", "api.example.com.", "Api.Example.Com."] {
        assert_eq!(winner(&rules, Some(host), None, 443), Some(0), "{host}");
    }
    assert_eq!(winner(&rules, Some("api.example.co"), None, 443), None);
    assert_eq!(winner(&rules, Some("xapi.example.com"), None, 443), None);
}

#[test]
fn ip_rules_match_when_no_name_rule_does() {
    let v4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5));
    let rules = Rules::new(
        vec![
            rule("mirror.internal", WEB, Deny),
            rule("10.0.0.5", WEB, Pass),
        ],
        DefaultAction::Deny,
    );
    // No name known: by address.
    assert_eq!(winner(&rules, None, Some(v4), 443), Some(1));
    // IPv4-mapped IPv6 (dual-stack sockets) is the same address.
    let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 5).to_ipv6_mapped());
    assert_eq!(winner(&rules, None, Some(mapped), 443), Some(1));
    // A name rule that matches wins over the address.
    assert_eq!(
        winner(&rules, Some("mirror.internal"), Some(v4), 443),
        Some(0)
    );
    // A name no rule matches falls back to the address.
    assert_eq!(
        winner(&rules, Some("other.internal"), Some(v4), 443),
        Some(1)
    );
    // An IP literal as host (a `Host: 10.0.0.5` header) matches by IP.
    assert_eq!(winner(&rules, Some("10.0.0.5"), None, 443), Some(1));
    assert_eq!(winner(&rules, Some("10.0.0.5"), None, 22), None);
    assert_eq!(winner(&rules, None, None, 443), None);

    let v6 = Rules::new(vec![rule("[2001:db8::1]", WEB, Pass)], DefaultAction::Deny);
    let addr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));
    assert_eq!(winner(&v6, None, Some(addr), 80), Some(0));
    assert_eq!(winner(&v6, Some("[2001:DB8::1]"), None, 80), Some(0));
}

#[test]
fn decisions_carry_action_and_rule() {
    let rules = Rules::new(
        vec![named("claude", rule("api.anthropic.com", WEB, Model))],
        DefaultAction::Pass,
    );
    let decision = rules.route(Some("api.anthropic.com"), None, 443);
    assert_eq!(decision.matched.to_string(), "route[0] (claude)");
    let RouteAction::Model {
        provider,
        upstream: Some(upstream),
        ..
    } = decision.action
    else {
        panic!("model route expected, got {decision:?}");
    };
    assert_eq!(provider, ProviderHint::Auto);
    assert_eq!(upstream.to_string(), "http://127.0.0.1:8000");

    let other = rules.route(Some("example.org"), None, 443);
    assert_eq!(other.action, RouteAction::Pass);
    assert_eq!(other.matched, MatchedRule::Default);
    assert_eq!(other.matched.to_string(), "default");
    let denied = Rules::new(Vec::new(), DefaultAction::Deny).route(None, None, 443);
    assert_eq!(denied.action, RouteAction::Deny);
}

#[test]
fn dns_answers() {
    let rules = Rules::new(
        vec![
            rule("api.example.com", &[443], Model),
            rule("*.example.com", WEB, Pass),
            rule("bad.example.com", WEB, Deny),
            rule("*.telemetry.example.com", WEB, Deny),
            rule("10.0.0.1", WEB, Pass),
        ],
        DefaultAction::Deny,
    );
    assert_eq!(rules.dns_answer("API.example.com."), DnsDecision::Fake);
    assert_eq!(rules.dns_answer("www.example.com"), DnsDecision::Resolve);
    assert_eq!(rules.dns_answer("bad.example.com"), DnsDecision::NxDomain);
    assert_eq!(
        rules.dns_answer("x.telemetry.example.com"),
        DnsDecision::NxDomain
    );
    // The bare suffix is matched by nothing here.
    assert_eq!(rules.dns_answer("example.com"), DnsDecision::NxDomain);
    assert_eq!(rules.dns_answer("example.org"), DnsDecision::NxDomain);
    assert_eq!(rules.dns_answer(""), DnsDecision::NxDomain);
    assert_eq!(rules.dns_answer("."), DnsDecision::NxDomain);
    assert_eq!(rules.dns_answer("10.0.0.1"), DnsDecision::NxDomain);

    let open = Rules::new(
        vec![rule("bad.example.com", WEB, Deny)],
        DefaultAction::Pass,
    );
    assert_eq!(open.dns_answer("example.org"), DnsDecision::Resolve);
    assert_eq!(open.dns_answer("bad.example.com"), DnsDecision::NxDomain);

    // Exact rules of one name on different ports: model wins, then pass.
    let mixed = Rules::new(
        vec![
            rule("h.example", &[22], Deny),
            rule("h.example", &[443], Model),
        ],
        DefaultAction::Deny,
    );
    assert_eq!(mixed.dns_answer("h.example"), DnsDecision::Fake);
    let mixed = Rules::new(
        vec![
            rule("h.example", &[22], Deny),
            rule("h.example", &[443], Pass),
        ],
        DefaultAction::Deny,
    );
    assert_eq!(mixed.dns_answer("h.example"), DnsDecision::Resolve);

    // An exact rule on one port does not hide a wildcard on another.
    let layered = Rules::new(
        vec![
            rule("h.example", &[80], Deny),
            rule("*.example", &[443], Model),
        ],
        DefaultAction::Pass,
    );
    assert_eq!(layered.dns_answer("h.example"), DnsDecision::Fake);
    // Ports no rule of the name lists do not count.
    let denied = Rules::new(vec![rule("h.example", &[443], Deny)], DefaultAction::Pass);
    assert_eq!(denied.dns_answer("h.example"), DnsDecision::NxDomain);
}

#[test]
fn intercepted_hosts_are_the_model_patterns() {
    let rules = Rules::new(
        vec![
            rule("api.example.com", &[443], Model),
            rule("*.models.example", WEB, Model),
            rule("api.example.com", &[80], Model),
            rule("www.example.com", WEB, Pass),
            rule("10.1.1.1", WEB, Model),
        ],
        DefaultAction::Deny,
    );
    let hosts: Vec<String> = rules
        .intercepted_hosts()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(hosts, ["api.example.com", "*.models.example", "10.1.1.1"]);
}

// ---- property tests ----

/// A straightforward matcher: scan all rules, rank each match, keep the best.
fn reference(routes: &[Route], host: Option<&str>, port: u16) -> Option<usize> {
    let host = host.map(|h| h.trim_end_matches('.').to_ascii_lowercase());
    let mut best: Option<(usize, usize)> = None; // (rank, index)
    for (index, route) in routes.iter().enumerate() {
        if !route.ports.contains(&port) {
            continue;
        }
        let Some(host) = host.as_deref() else {
            continue;
        };
        let rank = match &route.host {
            HostPattern::Exact(name) if name.as_str() == host => usize::MAX,
            HostPattern::Suffix(suffix) if host.ends_with(&format!(".{}", suffix.as_str())) => {
                suffix.as_str().len()
            }
            _ => continue,
        };
        if best.is_none_or(|(best_rank, _)| rank > best_rank) {
            best = Some((rank, index));
        }
    }
    best.map(|(_, index)| index)
}

const LABELS: &[&str] = &["a", "b", "api", "x-1", "com"];
const PORTS: &[u16] = &[80, 443, 8443];

fn name_strategy() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(LABELS), 1..4).prop_map(|labels| labels.join("."))
}

fn route_strategy() -> impl Strategy<Value = Route> {
    (
        any::<bool>(),
        name_strategy(),
        prop::sample::subsequence(PORTS, 1..=PORTS.len()),
        prop::sample::select(&[Model, Pass, Deny][..]),
    )
        .prop_map(|(wildcard, name, ports, action)| {
            let host = if wildcard { format!("*.{name}") } else { name };
            rule(&host, &ports, action)
        })
}

/// Flips the case of the letters selected by `mask`.
fn mix_case(host: &str, mask: u64) -> String {
    host.chars()
        .enumerate()
        .map(|(i, c)| {
            if mask >> (i % 64) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

proptest! {
    #[test]
    fn routing_matches_the_reference(
        routes in prop::collection::vec(route_strategy(), 0..8),
        host in name_strategy(),
        port in prop::sample::select(PORTS),
        pass_default in any::<bool>(),
    ) {
        let default = if pass_default { DefaultAction::Pass } else { DefaultAction::Deny };
        let rules = Rules::new(routes.clone(), default);
        let expected = reference(&routes, Some(&host), port);
        prop_assert_eq!(winner(&rules, Some(&host), None, port), expected);
        let decision = rules.route(Some(&host), None, port);
        let expected_action = expected.map_or_else(
            || RouteAction::from(default),
            |i| routes[i].action.clone(),
        );
        prop_assert_eq!(decision.action, expected_action);
    }

    #[test]
    fn routing_is_deterministic_and_case_insensitive(
        routes in prop::collection::vec(route_strategy(), 0..8),
        host in name_strategy(),
        mask in any::<u64>(),
        trailing_dot in any::<bool>(),
        port in prop::sample::select(PORTS),
    ) {
        let rules = Rules::new(routes.clone(), DefaultAction::Deny);
        let first = rules.route(Some(&host), None, port);
        prop_assert_eq!(&rules.route(Some(&host), None, port), &first);
        // A second compilation of the same rules decides the same.
        prop_assert_eq!(&Rules::new(routes, DefaultAction::Deny).route(Some(&host), None, port), &first);
        let mut variant = mix_case(&host, mask);
        if trailing_dot {
            variant.push('.');
        }
        prop_assert_eq!(&rules.route(Some(&variant), None, port), &first);
        prop_assert_eq!(rules.dns_answer(&variant), rules.dns_answer(&host));
    }

    #[test]
    fn dns_answer_agrees_with_routing(
        routes in prop::collection::vec(route_strategy(), 0..8),
        host in name_strategy(),
    ) {
        // Under a deny default, ports no rule of the name lists are denied,
        // so the answer follows from the decisions on the ports in use.
        let rules = Rules::new(routes, DefaultAction::Deny);
        let kinds: Vec<ActionKind> = PORTS
            .iter()
            .map(|&port| rules.route(Some(&host), None, port).action.kind())
            .collect();
        let expected = if kinds.contains(&Model) {
            DnsDecision::Fake
        } else if kinds.contains(&Pass) {
            DnsDecision::Resolve
        } else {
            DnsDecision::NxDomain
        };
        prop_assert_eq!(rules.dns_answer(&host), expected);
    }
}
