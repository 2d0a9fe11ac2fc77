//! Validated routing rules: [`Route`], what a route does ([`RouteAction`]),
//! what applies when none matches ([`DefaultAction`]), and the checks that
//! turn `[[route]]` tables into routes.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;

use super::error::{KeyError, KeyPath};
use super::host::HostPattern;
use super::net::IpNet;
use super::raw::RawRoute;
use super::upstream::Upstream;

/// Ports a route applies to when it lists none.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// Which wire protocol a model route's traffic is expected to speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum ProviderHint {
    /// Detect from each request (path and body).
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// Anthropic Messages.
    #[serde(rename = "anthropic")]
    Anthropic,
    /// OpenAI Chat Completions.
    #[serde(rename = "openai")]
    OpenAi,
    /// OpenAI Responses.
    #[serde(rename = "openai_responses")]
    OpenAiResponses,
    /// Google Gemini.
    #[serde(rename = "gemini")]
    Gemini,
}

impl ProviderHint {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
            Self::OpenAiResponses => "openai_responses",
            Self::Gemini => "gemini",
        }
    }
}

/// The three things a route can do, without their parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionKind {
    /// Terminate TLS and run the model pipeline.
    Model,
    /// Relay the bytes untouched to the original destination.
    Pass,
    /// Refuse the connection.
    Deny,
}

impl ActionKind {
    /// `model`, `pass` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Pass => "pass",
            Self::Deny => "deny",
        }
    }
}

impl fmt::Display for ActionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens to connections that no route matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultAction {
    /// Refuse them (and answer NXDOMAIN to their DNS questions).
    #[default]
    Deny,
    /// Relay them untouched.
    Pass,
}

impl DefaultAction {
    /// The matching [`ActionKind`].
    pub fn kind(self) -> ActionKind {
        match self {
            Self::Deny => ActionKind::Deny,
            Self::Pass => ActionKind::Pass,
        }
    }
}

/// What a matched route does, with what it needs to do it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteAction {
    /// Terminate TLS and hand the traffic to the model pipeline. At least one
    /// of `backend` and `upstream` is set.
    Model {
        /// The expected wire protocol.
        provider: ProviderHint,
        /// The `[[backend]]` model calls are translated for, sent to and
        /// captured from (the capture stage).
        backend: Option<Arc<str>>,
        /// Where requests are forwarded unchanged: every request when there
        /// is no backend (the forwarding stage, nothing captured), else only
        /// the side traffic the capture stage does not answer itself.
        upstream: Option<Arc<Upstream>>,
    },
    /// Relay untouched to the original destination.
    Pass,
    /// Refuse.
    Deny,
}

impl RouteAction {
    /// The action without its parameters.
    pub fn kind(&self) -> ActionKind {
        match self {
            Self::Model { .. } => ActionKind::Model,
            Self::Pass => ActionKind::Pass,
            Self::Deny => ActionKind::Deny,
        }
    }
}

impl From<DefaultAction> for RouteAction {
    fn from(action: DefaultAction) -> Self {
        match action {
            DefaultAction::Deny => Self::Deny,
            DefaultAction::Pass => Self::Pass,
        }
    }
}

/// One validated `[[route]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The optional label from the file.
    pub name: Option<Arc<str>>,
    /// What host the route matches.
    pub host: HostPattern,
    /// The ports it matches: not empty, no 0, no duplicates.
    pub ports: Vec<u16>,
    /// What it does.
    pub action: RouteAction,
    /// Pass routes: addresses and networks a connection may be relayed to
    /// besides those its name resolves to on the node (empty: only those).
    pub addresses: Vec<IpNet>,
}

/// Validates `[[route]]` number `index` (key path `route[index]`) against
/// the names of the configured backends (the first is the default backend
/// of model routes that name neither a backend nor an upstream).
pub(crate) fn validate_route(
    index: usize,
    raw: &RawRoute,
    backends: &[&str],
) -> Result<Route, KeyError> {
    let key = KeyPath::root().key("route").index(index);
    let host = HostPattern::parse(&raw.host).map_err(|why| KeyError::new(key.key("host"), why))?;
    let ports = ports(&key, raw.ports.as_deref())?;
    let action = action(&key, raw, backends)?;
    let addresses = addresses(&key, raw)?;
    let name = match &raw.name {
        None => None,
        Some(name) => Some(Arc::from(
            check_name(name).map_err(|why| KeyError::new(key.key("name"), why))?,
        )),
    };
    Ok(Route {
        name,
        host,
        ports,
        action,
        addresses,
    })
}

/// `ports`: [443, 80] unless given; each a port, none twice.
fn ports(key: &KeyPath, ports: Option<&[u16]>) -> Result<Vec<u16>, KeyError> {
    let Some(ports) = ports else {
        return Ok(DEFAULT_PORTS.to_vec());
    };
    if ports.is_empty() {
        return Err(KeyError::new(
            key.key("ports"),
            "must list at least one port (leave it out for [443, 80])",
        ));
    }
    for (i, port) in ports.iter().enumerate() {
        if *port == 0 {
            return Err(KeyError::new(
                key.key("ports").index(i),
                "port 0 is not a port (1 to 65535)",
            ));
        }
        if ports[..i].contains(port) {
            return Err(KeyError::new(
                key.key("ports").index(i),
                format!("port {port} is listed twice"),
            ));
        }
    }
    Ok(ports.to_vec())
}

/// `action` with the keys only a model route takes (`provider`,
/// `upstream`, `backend`).
fn action(key: &KeyPath, raw: &RawRoute, backends: &[&str]) -> Result<RouteAction, KeyError> {
    let not_model = |field: &str| {
        Err(KeyError::new(
            key.key(field),
            format!(
                "only allowed with action = \"model\" (this route is \"{}\")",
                raw.action
            ),
        ))
    };
    match raw.action {
        ActionKind::Model => model_action(key, raw, backends),
        ActionKind::Pass | ActionKind::Deny if raw.provider.is_some() => not_model("provider"),
        ActionKind::Pass | ActionKind::Deny if raw.upstream.is_some() => not_model("upstream"),
        ActionKind::Pass | ActionKind::Deny if raw.backend.is_some() => not_model("backend"),
        ActionKind::Pass => Ok(RouteAction::Pass),
        ActionKind::Deny => Ok(RouteAction::Deny),
    }
}

/// A model route: its upstream, and its backend (the first configured
/// one when it names neither).
fn model_action(key: &KeyPath, raw: &RawRoute, backends: &[&str]) -> Result<RouteAction, KeyError> {
    let upstream = match &raw.upstream {
        None => None,
        Some(text) => Some(Arc::new(
            Upstream::parse(text).map_err(|why| KeyError::new(key.key("upstream"), why))?,
        )),
    };
    let backend = match (&raw.backend, &upstream) {
        (Some(name), _) if backends.contains(&name.as_str()) => Some(Arc::from(name.as_str())),
        (Some(name), _) => {
            let configured = if backends.is_empty() {
                "none".to_owned()
            } else {
                backends.join(", ")
            };
            return Err(KeyError::new(
                key.key("backend"),
                format!("no [[backend]] is named {name:?} (configured: {configured})"),
            ));
        }
        (None, Some(_)) => None,
        (None, None) => Some(Arc::from(*backends.first().ok_or_else(|| {
            KeyError::new(
                key.key("backend"),
                "a model route needs a `backend` or an `upstream`, and no [[backend]] is configured",
            )
        })?)),
    };
    Ok(RouteAction::Model {
        provider: raw.provider.unwrap_or_default(),
        backend,
        upstream,
    })
}

/// `addresses`: a pass route's only, at least one, each an address or a
/// network.
fn addresses(key: &KeyPath, raw: &RawRoute) -> Result<Vec<IpNet>, KeyError> {
    match (&raw.addresses, raw.action) {
        (None, _) => Ok(Vec::new()),
        (Some(_), ActionKind::Model | ActionKind::Deny) => Err(KeyError::new(
            key.key("addresses"),
            format!(
                "only allowed with action = \"pass\" (this route is \"{}\")",
                raw.action
            ),
        )),
        (Some(list), ActionKind::Pass) if list.is_empty() => Err(KeyError::new(
            key.key("addresses"),
            "must list at least one address (leave it out for the name's own)",
        )),
        (Some(list), ActionKind::Pass) => list
            .iter()
            .enumerate()
            .map(|(i, text)| {
                text.parse::<IpNet>()
                    .map_err(|why| KeyError::new(key.key("addresses").index(i), why))
            })
            .collect(),
    }
}

/// Route names are labels for logs: short, printable, and not `default`.
fn check_name(name: &str) -> Result<&str, String> {
    if name.is_empty() {
        return Err("must not be empty (leave it out instead)".into());
    }
    if name.len() > 64 {
        return Err("longer than 64 characters".into());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/')))
    {
        return Err(format!(
            "character {bad:?} is not allowed (letters, digits and - _ . : / only)"
        ));
    }
    if name == "default" {
        return Err("\"default\" is reserved for connections no route matches".into());
    }
    Ok(name)
}

/// Checks rules against each other: no two with the same host pattern and a
/// common port (the second could never match), no two with the same name.
pub(crate) fn check_route_set(routes: &[Route]) -> Result<(), KeyError> {
    let mut seen: HashMap<(&HostPattern, u16), usize> = HashMap::new();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (index, route) in routes.iter().enumerate() {
        let key = KeyPath::root().key("route").index(index);
        for port in &route.ports {
            if let Some(first) = seen.insert((&route.host, *port), index) {
                return Err(KeyError::new(
                    key.key("host"),
                    format!(
                        "duplicate rule: route[{first}] already matches host \"{}\" on port {port}",
                        route.host
                    ),
                ));
            }
        }
        if let Some(name) = route.name.as_deref()
            && let Some(first) = names.insert(name, index)
        {
            return Err(KeyError::new(
                key.key("name"),
                format!("name \"{name}\" is already used by route[{first}]"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(host: &str, action: ActionKind) -> RawRoute {
        RawRoute {
            host: host.into(),
            ports: None,
            action,
            provider: None,
            upstream: None,
            backend: None,
            addresses: None,
            name: None,
        }
    }

    fn model(host: &str) -> RawRoute {
        RawRoute {
            upstream: Some("http://127.0.0.1:8000".into()),
            ..raw(host, ActionKind::Model)
        }
    }

    const BACKENDS: &[&str] = &["local", "other"];

    fn error(index: usize, raw: &RawRoute) -> String {
        match validate_route(index, raw, BACKENDS) {
            Ok(route) => panic!("{raw:?} should be refused, got {route:?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn defaults_apply() {
        let Ok(route) = validate_route(0, &model("API.anthropic.com"), BACKENDS) else {
            panic!("valid route");
        };
        assert_eq!(route.ports, vec![443, 80]);
        assert_eq!(route.host.to_string(), "api.anthropic.com");
        assert!(matches!(
            route.action,
            RouteAction::Model {
                provider: ProviderHint::Auto,
                backend: None,
                upstream: Some(_),
            }
        ));
        assert_eq!(route.name, None);
        let Ok(route) = validate_route(0, &raw("a", ActionKind::Model), BACKENDS) else {
            panic!("valid route");
        };
        let RouteAction::Model {
            backend, upstream, ..
        } = route.action
        else {
            panic!("model route");
        };
        assert_eq!((backend.as_deref(), upstream), (Some("local"), None));
    }

    #[test]
    fn host_errors_name_the_key() {
        assert_eq!(
            error(2, &raw("*.", ActionKind::Pass)),
            "route[2].host: \"*.\" is not a valid host pattern: nothing follows \"*.\""
        );
        assert_eq!(
            error(0, &raw("", ActionKind::Pass)),
            "route[0].host: must not be empty"
        );
    }

    #[test]
    fn ports_are_checked() {
        let zero = RawRoute {
            ports: Some(vec![443, 0]),
            ..raw("a.example", ActionKind::Pass)
        };
        assert!(error(1, &zero).starts_with("route[1].ports[1]: port 0"));
        let empty = RawRoute {
            ports: Some(vec![]),
            ..raw("a.example", ActionKind::Pass)
        };
        assert!(error(0, &empty).starts_with("route[0].ports: must list"));
        let twice = RawRoute {
            ports: Some(vec![443, 8443, 443]),
            ..raw("a.example", ActionKind::Pass)
        };
        assert!(error(0, &twice).starts_with("route[0].ports[2]: port 443 is listed twice"));
    }

    #[test]
    fn model_only_keys() {
        let pass_with_provider = RawRoute {
            provider: Some(ProviderHint::Anthropic),
            ..raw("a.example", ActionKind::Pass)
        };
        assert_eq!(
            error(3, &pass_with_provider),
            "route[3].provider: only allowed with action = \"model\" (this route is \"pass\")"
        );
        let deny_with_upstream = RawRoute {
            upstream: Some("http://127.0.0.1:1".into()),
            ..raw("a.example", ActionKind::Deny)
        };
        assert!(error(0, &deny_with_upstream).starts_with("route[0].upstream: only allowed"));
        let pass_with_backend = RawRoute {
            backend: Some("local".into()),
            ..raw("a.example", ActionKind::Pass)
        };
        assert!(error(0, &pass_with_backend).starts_with("route[0].backend: only allowed"));
        let unknown_backend = RawRoute {
            backend: Some("gpu".into()),
            ..raw("a.example", ActionKind::Model)
        };
        assert_eq!(
            error(1, &unknown_backend),
            "route[1].backend: no [[backend]] is named \"gpu\" (configured: local, other)"
        );
        assert!(
            validate_route(0, &raw("a.example", ActionKind::Model), &[])
                .unwrap_err()
                .to_string()
                .starts_with("route[0].backend: a model route needs")
        );
        let bad_upstream = RawRoute {
            upstream: Some("ftp://x".into()),
            ..raw("a.example", ActionKind::Model)
        };
        assert!(error(0, &bad_upstream).starts_with("route[0].upstream: \"ftp://x\""));
    }

    #[test]
    fn pass_addresses_are_checked() {
        let listed = RawRoute {
            addresses: Some(vec!["10.0.0.5".into(), "10.1.0.0/16".into()]),
            ..raw("a.example", ActionKind::Pass)
        };
        let route = validate_route(0, &listed, BACKENDS).unwrap();
        let shown: Vec<String> = route.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.5", "10.1.0.0/16"]);
        let bad = RawRoute {
            addresses: Some(vec!["10.0.0.5".into(), "10.0.0.1/8".into()]),
            ..raw("a.example", ActionKind::Pass)
        };
        assert_eq!(
            error(2, &bad),
            "route[2].addresses[1]: \"10.0.0.1/8\": host bits are set after the /8"
        );
        let empty = RawRoute {
            addresses: Some(vec![]),
            ..raw("a.example", ActionKind::Pass)
        };
        assert!(error(0, &empty).starts_with("route[0].addresses: must list"));
        let on_deny = RawRoute {
            addresses: Some(vec!["10.0.0.5".into()]),
            ..raw("a.example", ActionKind::Deny)
        };
        assert_eq!(
            error(0, &on_deny),
            "route[0].addresses: only allowed with action = \"pass\" (this route is \"deny\")"
        );
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", "default", "has space", "é", &"n".repeat(65)] {
            let named = RawRoute {
                name: Some(bad.into()),
                ..raw("a.example", ActionKind::Pass)
            };
            assert!(error(0, &named).starts_with("route[0].name: "), "{bad:?}");
        }
    }

    fn validated(raws: &[RawRoute]) -> Vec<Route> {
        raws.iter()
            .enumerate()
            .filter_map(|(i, raw)| validate_route(i, raw, BACKENDS).ok())
            .collect()
    }

    #[test]
    fn duplicates_are_refused() {
        let routes = validated(&[
            raw("a.example", ActionKind::Pass),
            RawRoute {
                ports: Some(vec![8443, 80]),
                ..raw("A.example", ActionKind::Deny)
            },
        ]);
        let Err(error) = check_route_set(&routes) else {
            panic!("duplicate must be refused");
        };
        assert_eq!(
            error.to_string(),
            "route[1].host: duplicate rule: route[0] already matches host \"a.example\" on port 80"
        );

        // Same host on other ports, or exact and wildcard of one name: fine.
        let routes = validated(&[
            raw("a.example", ActionKind::Pass),
            RawRoute {
                ports: Some(vec![8443]),
                ..raw("a.example", ActionKind::Deny)
            },
            raw("*.a.example", ActionKind::Deny),
        ]);
        assert!(check_route_set(&routes).is_ok());

        let named = |name: &str, host: &str| RawRoute {
            name: Some(name.into()),
            ..raw(host, ActionKind::Pass)
        };
        let routes = validated(&[named("x", "a.example"), named("x", "b.example")]);
        let Err(error) = check_route_set(&routes) else {
            panic!("duplicate name must be refused");
        };
        assert!(
            error
                .to_string()
                .starts_with("route[1].name: name \"x\" is already used")
        );
    }
}
