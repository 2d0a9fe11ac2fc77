//! [`Config`]: the validated configuration, built from a [`RawConfig`] with
//! `TryFrom` (defaults, range checks, routes, checks across sections), or
//! from TOML text or a file, with errors that name the key and its line.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use super::defaults;
use super::error::{ConfigError, KeyPath};
use super::harness::{CustomHarness, validate_harnesses};
use super::host::HostPattern;
use super::locate::{SpanIndex, from_toml_error};
use super::raw::RawConfig;
use super::route::{Route, RouteAction, check_route_set, validate_route};
use super::rules::Rules;
use super::sections::{
    AgentConfig, CaConfig, DnsConfig, ProxyConfig, SandboxConfig, in_fake_range, validate_agent,
    validate_ca, validate_dns, validate_proxy, validate_sandbox,
};
use super::upstream::UpstreamHost;
use polar_inference::BackendConfig;

/// Where the routes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteSource {
    /// The file has `[[route]]` tables (or `route = []`).
    File,
    /// The file has no `route` key: the built-in model routes apply.
    BuiltIn,
}

/// The validated configuration. Every value is in range and every key has
/// been checked; [`Config::default`] is what an empty file gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `[agent]`.
    pub agent: AgentConfig,
    /// `[proxy]`.
    pub proxy: ProxyConfig,
    /// `[ca]`.
    pub ca: CaConfig,
    /// `[dns]`.
    pub dns: DnsConfig,
    /// `[sandbox]`.
    pub sandbox: SandboxConfig,
    /// `[[route]]` and `default_action`, compiled.
    pub rules: Rules,
    /// Whether the routes are the file's or the built-in ones.
    pub route_source: RouteSource,
    /// `[[backend]]`: the inference backends, each valid, names unique; at
    /// least one unless the file says `backend = []`.
    pub backends: Vec<BackendConfig>,
    /// `[harness.NAME]`: the harnesses defined here, by name.
    pub harnesses: BTreeMap<String, CustomHarness>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            agent: AgentConfig::default(),
            proxy: ProxyConfig::default(),
            ca: CaConfig::default(),
            dns: DnsConfig::default(),
            sandbox: SandboxConfig::default(),
            rules: Rules::new(
                defaults::builtin_routes(defaults::LOCAL_BACKEND),
                Default::default(),
            ),
            route_source: RouteSource::BuiltIn,
            backends: defaults::builtin_backends(),
            harnesses: BTreeMap::new(),
        }
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigError;

    /// Applies defaults and checks everything; the first problem found is
    /// returned (without line numbers: see [`Config::from_toml_str`]).
    fn try_from(raw: RawConfig) -> Result<Self, ConfigError> {
        let agent = validate_agent(&raw.agent)?;
        let proxy = validate_proxy(&raw.proxy)?;
        let ca = validate_ca(&raw.ca)?;
        let dns = validate_dns(&raw.dns)?;
        let sandbox = validate_sandbox(&raw.sandbox)?;
        let backends = match &raw.backend {
            None => defaults::builtin_backends(),
            Some(list) => validate_backends(list)?,
        };
        let names: Vec<&str> = backends.iter().map(|b| b.name.as_str()).collect();
        let (routes, route_source) = match &raw.route {
            None => match names.first() {
                Some(first) => (defaults::builtin_routes(first), RouteSource::BuiltIn),
                None => (Vec::new(), RouteSource::BuiltIn),
            },
            Some(raw_routes) => {
                let routes = raw_routes
                    .iter()
                    .enumerate()
                    .map(|(index, raw)| validate_route(index, raw, &names))
                    .collect::<Result<Vec<_>, _>>()?;
                check_route_set(&routes)?;
                (routes, RouteSource::File)
            }
        };
        check_addresses(&proxy, &dns, &routes)?;
        check_replica_addresses(&proxy, &dns, &backends)?;
        let harnesses = validate_harnesses(&raw.harness)?;
        Ok(Self {
            agent,
            proxy,
            ca,
            dns,
            sandbox,
            rules: Rules::new(routes, raw.default_action.unwrap_or_default()),
            route_source,
            backends,
            harnesses,
        })
    }
}

/// Checks each `[[backend]]` (errors at `backend[i].<key>`) and that names
/// are unique.
fn validate_backends(list: &[BackendConfig]) -> Result<Vec<BackendConfig>, ConfigError> {
    for (i, b) in list.iter().enumerate() {
        let key = KeyPath::root().key("backend").index(i);
        b.validate().map_err(|e| e.under(&key))?;
        if let Some(first) = list[..i].iter().position(|o| o.name == b.name) {
            return Err(ConfigError::invalid(
                key.key("name"),
                format!("name {:?} is already used by backend[{first}]", b.name),
            ));
        }
    }
    Ok(list.to_vec())
}

/// Checks across sections: nothing configured may use a fake address, and
/// no model route may forward to the agent's own base-URL listener.
fn check_addresses(
    proxy: &ProxyConfig,
    dns: &DnsConfig,
    routes: &[Route],
) -> Result<(), ConfigError> {
    let fake = |ip: IpAddr| in_fake_range(dns, ip);
    if let Some(listen) = proxy.base_url_listen
        && fake(listen.ip())
    {
        return Err(ConfigError::invalid(
            KeyPath::root().key("proxy").key("base_url_listen"),
            format!("{listen} is inside dns.fake_range {}", dns.fake_range),
        ));
    }
    for (index, route) in routes.iter().enumerate() {
        let key = KeyPath::root().key("route").index(index);
        if let HostPattern::Ip(ip) = route.host
            && fake(ip)
        {
            return Err(ConfigError::invalid(
                key.key("host"),
                format!(
                    "{ip} is inside dns.fake_range {}: those addresses are the agent's",
                    dns.fake_range
                ),
            ));
        }
        let RouteAction::Model {
            upstream: Some(upstream),
            ..
        } = &route.action
        else {
            continue;
        };
        let UpstreamHost::Ip(ip) = upstream.host() else {
            continue;
        };
        if fake(*ip) {
            return Err(ConfigError::invalid(
                key.key("upstream"),
                format!("{upstream} is inside dns.fake_range {}", dns.fake_range),
            ));
        }
        if proxy
            .base_url_listen
            .is_some_and(|listen| is_same_listener(listen, SocketAddr::new(*ip, upstream.port())))
        {
            return Err(ConfigError::invalid(
                key.key("upstream"),
                format!("{upstream} is the agent's own proxy.base_url_listen (a loop)"),
            ));
        }
    }
    Ok(())
}

/// Backend replicas may neither use a fake address nor be the agent's own
/// base-URL listener.
fn check_replica_addresses(
    proxy: &ProxyConfig,
    dns: &DnsConfig,
    backends: &[BackendConfig],
) -> Result<(), ConfigError> {
    for (i, b) in backends.iter().enumerate() {
        for (j, url) in b.replicas.iter().enumerate() {
            let key = KeyPath::root()
                .key("backend")
                .index(i)
                .key("replicas")
                .index(j);
            let Ok(up) = super::upstream::Upstream::parse(url) else {
                continue;
            };
            let UpstreamHost::Ip(ip) = up.host() else {
                continue;
            };
            if in_fake_range(dns, *ip) {
                return Err(ConfigError::invalid(
                    key,
                    format!("{url} is inside dns.fake_range {}", dns.fake_range),
                ));
            }
            if proxy
                .base_url_listen
                .is_some_and(|listen| is_same_listener(listen, SocketAddr::new(*ip, up.port())))
            {
                return Err(ConfigError::invalid(
                    key,
                    format!("{url} is the agent's own proxy.base_url_listen (a loop)"),
                ));
            }
        }
    }
    Ok(())
}

/// Whether a connection to `target` would reach a listener on `listen`.
fn is_same_listener(listen: SocketAddr, target: SocketAddr) -> bool {
    listen.port() == target.port()
        && (listen.ip() == target.ip()
            || (listen.ip().is_unspecified() && target.ip().is_loopback()))
}

impl Config {
    /// Parses and validates TOML text. Errors name the key path and, when
    /// the key is written in the text, its line and column.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| from_toml_error(text, &e))?;
        Self::try_from(raw).map_err(|mut error| {
            if let (Some(key), Ok(index)) = (error.key().cloned(), SpanIndex::parse(text))
                && let Some(location) = index.locate(&key)
            {
                error.set_location(location);
            }
            error
        })
    }

    /// Reads and validates the file at `path`; errors carry the path.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|error| ConfigError::InFile {
            path: path.to_owned(),
            source: Box::new(error),
        })
    }
}

#[cfg(test)]
mod tests;
