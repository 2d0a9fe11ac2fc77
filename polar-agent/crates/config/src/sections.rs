//! The validated `[agent]`, `[proxy]`, `[ca]`, `[dns]` and `[sandbox]` sections, their
//! defaults, and the range checks that build them from their raw form.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::cidr::Ipv4Cidr;
use super::defaults;
use super::error::{KeyError, KeyPath};
use super::raw::{RawAgent, RawCa, RawDns, RawProxy, RawSandbox};

/// How the agent writes its logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[agent]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// Absolute directory for the CA, session logs and exports.
    pub state_dir: PathBuf,
    /// Log format.
    pub log_format: LogFormat,
    /// What a captured call's record survives once the harness may see its
    /// reply complete.
    pub capture_durability: polar_capture::Durability,
    /// `power` mode: the size at which the capture journal's segment is
    /// rotated (its session logs synced, the segment removed).
    pub capture_journal_bytes: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from(defaults::STATE_DIR),
            log_format: LogFormat::default(),
            capture_durability: polar_capture::Durability::default(),
            capture_journal_bytes: polar_capture::DEFAULT_JOURNAL_BYTES,
        }
    }
}

/// `[sandbox]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Each sandbox's disk quota for its workspace, HOME and `/tmp`
    /// together (a tmpfs of this size: the agent's `runtime::quota`), 16 MiB to
    /// 1 TiB. A runtime spec's `limits.disk_bytes` may only lower it.
    pub disk_bytes: u64,
    /// The memory limit of a sandbox whose runtime spec sets none (every
    /// `polar sandbox run -- CMD`), 16 MiB to 16 TiB.
    pub memory_bytes: u64,
    /// The process and thread limit of a sandbox whose runtime spec sets
    /// none, 8 to 4194304.
    pub pids: u32,
    /// The Docker engine the docker runtime uses, `unix:///path` (the
    /// engine must run on this node: its containers join the session's
    /// cgroup and network namespace); `None` is the docker CLI's default.
    pub docker_host: Option<String>,
    /// The sandboxes' uids, one leased per session
    /// (`polar-agent`'s `sandbox::uids` leases them).
    pub uids: crate::UidRange,
    /// Host directories native sandboxes are shown read-only at the same
    /// path, besides the system's (the agent's `runtime::view`).
    pub view_dirs: Vec<PathBuf>,
}

impl SandboxConfig {
    /// The limits a sandbox gets where its spec sets none.
    pub fn default_limits(&self) -> polar_spec::runtime::Limits {
        polar_spec::runtime::Limits {
            memory_bytes: Some(self.memory_bytes),
            pids: Some(self.pids),
            cpu: None,
            disk_bytes: None,
        }
    }
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            disk_bytes: defaults::SANDBOX_DISK_BYTES,
            memory_bytes: defaults::SANDBOX_MEMORY_BYTES,
            pids: defaults::SANDBOX_PIDS,
            docker_host: None,
            uids: crate::UidRange::default(),
            view_dirs: Vec::new(),
        }
    }
}

pub(crate) fn validate_sandbox(raw: &RawSandbox) -> Result<SandboxConfig, KeyError> {
    let key = KeyPath::root().key("sandbox");
    let disk_bytes = in_range(
        &key.key("disk_bytes"),
        raw.disk_bytes.unwrap_or(defaults::SANDBOX_DISK_BYTES),
        defaults::MIN_SANDBOX_DISK_BYTES,
        1 << 40,
        " bytes",
    )?;
    let memory_bytes = in_range(
        &key.key("memory_bytes"),
        raw.memory_bytes.unwrap_or(defaults::SANDBOX_MEMORY_BYTES),
        16 << 20,
        1 << 44,
        " bytes",
    )?;
    let pids = in_range(
        &key.key("pids"),
        raw.pids.unwrap_or(defaults::SANDBOX_PIDS),
        8,
        4_194_304,
        "",
    )?;
    let docker_host = raw
        .docker_host
        .as_deref()
        .map(|h| docker_host(key.key("docker_host"), h))
        .transpose()?;
    let uids = crate::UidRange {
        first: raw.uid_first.unwrap_or(crate::DEFAULT_FIRST),
        count: raw.uid_count.unwrap_or(crate::DEFAULT_COUNT),
    };
    if let Some(why) = uids.problem() {
        return Err(KeyError::new(
            key.key("uid_first"),
            format!(
                "the range {}..={} (uid_first, uid_count) {why}",
                uids.first,
                uids.last()
            ),
        ));
    }
    let mut view_dirs = Vec::new();
    for (i, d) in raw.view_dirs.iter().flatten().enumerate() {
        let p = Path::new(d);
        let plain = p.is_absolute()
            && p.components().count() > 1
            && p.components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !plain {
            return Err(KeyError::new(
                key.key("view_dirs").index(i),
                format!("{d:?} is not an absolute path below `/` without `.` or `..`"),
            ));
        }
        view_dirs.push(p.to_path_buf());
    }
    Ok(SandboxConfig {
        disk_bytes,
        memory_bytes,
        pids,
        docker_host,
        uids,
        view_dirs,
    })
}

/// `sandbox.docker_host`: a unix socket on this node (`unix:///path`,
/// absolute, no `..`): an engine elsewhere could not put its containers in
/// the session's cgroup and network namespace.
fn docker_host(key: KeyPath, host: &str) -> Result<String, KeyError> {
    let path = host.strip_prefix("unix://").map(std::path::Path::new);
    match path {
        Some(p)
            if p.is_absolute()
                && !p
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir)) =>
        {
            Ok(host.to_owned())
        }
        _ => Err(KeyError::new(
            key,
            format!(
                "{host:?} is not `unix:///absolute/path`: the docker runtime needs an engine \
                 on this node, reached by its unix socket"
            ),
        )),
    }
}

/// `[proxy]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Where base-URL mode listens, if enabled (never port 0).
    pub base_url_listen: Option<SocketAddr>,
    /// Largest request body accepted, 1 KiB to 1 GiB.
    pub max_body_bytes: u64,
    /// Time allowed to receive a request's headers.
    pub header_timeout: Duration,
    /// Longest silence allowed on a connection.
    pub idle_timeout: Duration,
    /// Open connections across all sandboxes, at least 1.
    pub max_connections: u32,
    /// Open connections of one session, 1 to `max_connections`.
    pub max_session_connections: u32,
    /// Requests in flight (HTTP/2 streams, HTTP/1 requests) of one session.
    pub max_session_streams: u32,
    /// Request-body bytes one session buffers at once (gzip inflation
    /// included), `max_body_bytes` to `body_budget_bytes`.
    pub max_session_body_bytes: u64,
    /// Request-body bytes buffered at once on the node.
    pub body_budget_bytes: u64,
    /// How long a connection or a body waits for a node-wide cap (and a
    /// connection for its session's) before it is refused.
    pub admission_wait: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            base_url_listen: None,
            max_body_bytes: defaults::MAX_BODY_BYTES,
            header_timeout: Duration::from_millis(defaults::HEADER_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(defaults::IDLE_TIMEOUT_MS),
            max_connections: defaults::MAX_CONNECTIONS,
            max_session_connections: defaults::MAX_SESSION_CONNECTIONS,
            max_session_streams: defaults::MAX_SESSION_STREAMS,
            max_session_body_bytes: defaults::MAX_SESSION_BODY_BYTES,
            body_budget_bytes: defaults::BODY_BUDGET_BYTES,
            admission_wait: Duration::from_millis(defaults::ADMISSION_WAIT_MS),
        }
    }
}

/// `[ca]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaConfig {
    /// Lifetime of the CA certificate, 1 to 3650 days.
    pub validity_days: u32,
    /// Lifetime of each leaf, at least 1 hour and at most the CA's.
    pub leaf_validity_hours: u32,
    /// Leaf certificates kept in memory, 1 to 1,000,000.
    pub leaf_cache_size: usize,
}

impl Default for CaConfig {
    fn default() -> Self {
        Self {
            validity_days: defaults::CA_VALIDITY_DAYS,
            leaf_validity_hours: defaults::LEAF_VALIDITY_HOURS,
            leaf_cache_size: defaults::LEAF_CACHE_SIZE as usize,
        }
    }
}

/// `[dns]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// Range of fake addresses for model hosts: at least 256 addresses,
    /// inside 127.0.0.0/8 (not holding 127.0.0.1) or 198.18.0.0/15.
    pub fake_range: Ipv4Cidr,
    /// TTL of the agent's answers, 1 s to 1 day.
    pub ttl_secs: u32,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            fake_range: defaults::FAKE_RANGE,
            ttl_secs: defaults::DNS_TTL_SECS,
        }
    }
}

/// Checks that `value` of `key` lies in `min..=max`.
fn in_range<T>(key: &KeyPath, value: T, min: T, max: T, unit: &str) -> Result<T, KeyError>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if value < min || value > max {
        return Err(KeyError::new(
            key.clone(),
            format!("{value} is out of range (expected {min} to {max}{unit})"),
        ));
    }
    Ok(value)
}

pub(crate) fn validate_agent(raw: &RawAgent) -> Result<AgentConfig, KeyError> {
    let key = KeyPath::root().key("agent");
    let state_dir = match &raw.state_dir {
        None => PathBuf::from(defaults::STATE_DIR),
        Some(dir) => {
            check_state_dir(dir).map_err(|why| KeyError::new(key.key("state_dir"), why))?
        }
    };
    let capture_journal_bytes = in_range(
        &key.key("capture_journal_bytes"),
        raw.capture_journal_bytes
            .unwrap_or(polar_capture::DEFAULT_JOURNAL_BYTES),
        1 << 20,
        1 << 36,
        " bytes",
    )?;
    Ok(AgentConfig {
        state_dir,
        log_format: raw.log_format.unwrap_or_default(),
        capture_durability: raw.capture_durability.unwrap_or_default(),
        capture_journal_bytes,
    })
}

fn check_state_dir(dir: &str) -> Result<PathBuf, String> {
    if dir.contains('\0') {
        return Err("must not contain NUL".into());
    }
    let path = Path::new(dir);
    if !path.is_absolute() {
        return Err(format!("{dir:?} must be an absolute path"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{dir:?} must not contain \"..\""));
    }
    if path.parent().is_none() {
        return Err("must not be the root directory".into());
    }
    Ok(path.components().collect())
}

pub(crate) fn validate_proxy(raw: &RawProxy) -> Result<ProxyConfig, KeyError> {
    let key = KeyPath::root().key("proxy");
    let base_url_listen = match &raw.base_url_listen {
        None => None,
        Some(text) => {
            Some(parse_listen(text).map_err(|why| KeyError::new(key.key("base_url_listen"), why))?)
        }
    };
    let max_body_bytes = in_range(
        &key.key("max_body_bytes"),
        raw.max_body_bytes.unwrap_or(defaults::MAX_BODY_BYTES),
        1024,
        1 << 30,
        " bytes",
    )?;
    let header_timeout_ms = in_range(
        &key.key("header_timeout_ms"),
        raw.header_timeout_ms.unwrap_or(defaults::HEADER_TIMEOUT_MS),
        1,
        3_600_000,
        " ms",
    )?;
    let idle_timeout_ms = in_range(
        &key.key("idle_timeout_ms"),
        raw.idle_timeout_ms.unwrap_or(defaults::IDLE_TIMEOUT_MS),
        1,
        86_400_000,
        " ms",
    )?;
    let max_connections = in_range(
        &key.key("max_connections"),
        raw.max_connections.unwrap_or(defaults::MAX_CONNECTIONS),
        1,
        1_000_000,
        "",
    )?;
    let max_session_connections = in_range(
        &key.key("max_session_connections"),
        raw.max_session_connections
            .unwrap_or(defaults::MAX_SESSION_CONNECTIONS.min(max_connections)),
        1,
        max_connections,
        " (proxy.max_connections)",
    )?;
    let max_session_streams = in_range(
        &key.key("max_session_streams"),
        raw.max_session_streams
            .unwrap_or(defaults::MAX_SESSION_STREAMS),
        1,
        1_000_000,
        "",
    )?;
    let body_budget_bytes = in_range(
        &key.key("body_budget_bytes"),
        raw.body_budget_bytes
            .unwrap_or(defaults::BODY_BUDGET_BYTES.max(max_body_bytes)),
        max_body_bytes,
        1 << 40,
        " bytes; at least proxy.max_body_bytes",
    )?;
    let max_session_body_bytes = in_range(
        &key.key("max_session_body_bytes"),
        raw.max_session_body_bytes.unwrap_or(
            defaults::MAX_SESSION_BODY_BYTES
                .max(max_body_bytes)
                .min(body_budget_bytes),
        ),
        max_body_bytes,
        body_budget_bytes,
        " bytes: proxy.max_body_bytes to proxy.body_budget_bytes",
    )?;
    let admission_wait_ms = in_range(
        &key.key("admission_wait_ms"),
        raw.admission_wait_ms.unwrap_or(defaults::ADMISSION_WAIT_MS),
        0,
        60_000,
        " ms",
    )?;
    Ok(ProxyConfig {
        base_url_listen,
        max_body_bytes,
        header_timeout: Duration::from_millis(header_timeout_ms),
        idle_timeout: Duration::from_millis(idle_timeout_ms),
        max_connections,
        max_session_connections,
        max_session_streams,
        max_session_body_bytes,
        body_budget_bytes,
        admission_wait: Duration::from_millis(admission_wait_ms),
    })
}

fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = text.parse().map_err(|_| {
        format!("{text:?} is not a socket address (expected \"127.0.0.1:8787\" or \"[::1]:8787\")")
    })?;
    if addr.port() == 0 {
        return Err(format!(
            "{text:?}: port 0 is not allowed (harnesses must know the port)"
        ));
    }
    Ok(addr)
}

pub(crate) fn validate_ca(raw: &RawCa) -> Result<CaConfig, KeyError> {
    let key = KeyPath::root().key("ca");
    let validity_days = in_range(
        &key.key("validity_days"),
        raw.validity_days.unwrap_or(defaults::CA_VALIDITY_DAYS),
        1,
        3650,
        " days",
    )?;
    let leaf_validity_hours = in_range(
        &key.key("leaf_validity_hours"),
        raw.leaf_validity_hours
            .unwrap_or(defaults::LEAF_VALIDITY_HOURS),
        1,
        validity_days.saturating_mul(24),
        " hours: a leaf cannot outlive its CA",
    )?;
    let leaf_cache_size = in_range(
        &key.key("leaf_cache_size"),
        raw.leaf_cache_size.unwrap_or(defaults::LEAF_CACHE_SIZE),
        1,
        1_000_000,
        "",
    )?;
    Ok(CaConfig {
        validity_days,
        leaf_validity_hours,
        leaf_cache_size: leaf_cache_size as usize,
    })
}

/// Where fake addresses may come from.
const LOOPBACK: Ipv4Cidr = match Ipv4Cidr::new(Ipv4Addr::new(127, 0, 0, 0), 8) {
    Some(range) => range,
    None => panic!("127.0.0.0/8 is a valid CIDR"),
};
const BENCHMARK: Ipv4Cidr = match Ipv4Cidr::new(Ipv4Addr::new(198, 18, 0, 0), 15) {
    Some(range) => range,
    None => panic!("198.18.0.0/15 is a valid CIDR"),
};

pub(crate) fn validate_dns(raw: &RawDns) -> Result<DnsConfig, KeyError> {
    let key = KeyPath::root().key("dns");
    let fake_range = match &raw.fake_range {
        None => defaults::FAKE_RANGE,
        Some(text) => {
            check_fake_range(text).map_err(|why| KeyError::new(key.key("fake_range"), why))?
        }
    };
    let ttl_secs = in_range(
        &key.key("ttl_secs"),
        raw.ttl_secs.unwrap_or(defaults::DNS_TTL_SECS),
        1,
        86_400,
        " seconds",
    )?;
    Ok(DnsConfig {
        fake_range,
        ttl_secs,
    })
}

fn check_fake_range(text: &str) -> Result<Ipv4Cidr, String> {
    let range: Ipv4Cidr = text.parse()?;
    if !range.is_within(&LOOPBACK) && !range.is_within(&BENCHMARK) {
        return Err(format!(
            "{range} must lie inside 127.0.0.0/8 or 198.18.0.0/15 (addresses nobody else answers for)"
        ));
    }
    if range.contains(Ipv4Addr::LOCALHOST) {
        return Err(format!("{range} must not contain 127.0.0.1"));
    }
    if range.size() < 256 {
        return Err(format!(
            "{range} is too small (at least 256 addresses, a /24)"
        ));
    }
    Ok(range)
}

/// Whether `ip` is inside the fake range.
pub(crate) fn in_fake_range(dns: &DnsConfig, ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => dns.fake_range.contains(v4),
        IpAddr::V6(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(result: Result<impl std::fmt::Debug, KeyError>) -> String {
        match result {
            Ok(value) => panic!("should be refused, got {value:?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn absent_keys_take_the_defaults() {
        assert!(
            matches!(validate_agent(&RawAgent::default()), Ok(a) if a == AgentConfig::default())
        );
        assert!(
            matches!(validate_proxy(&RawProxy::default()), Ok(p) if p == ProxyConfig::default())
        );
        assert!(matches!(validate_ca(&RawCa::default()), Ok(c) if c == CaConfig::default()));
        assert!(matches!(validate_dns(&RawDns::default()), Ok(d) if d == DnsConfig::default()));
    }

    #[test]
    fn state_dir_must_be_absolute_and_plain() {
        for bad in ["", "var/lib/polar", "/var/../etc", "/", "/a\0b"] {
            let raw = RawAgent {
                state_dir: Some(bad.into()),
                log_format: None,
                capture_durability: None,
                capture_journal_bytes: None,
            };
            assert!(
                message(validate_agent(&raw)).starts_with("agent.state_dir: "),
                "{bad:?}"
            );
        }
        let raw = RawAgent {
            state_dir: Some("/srv//polar/./state/".into()),
            log_format: Some(LogFormat::Json),
            capture_durability: Some(polar_capture::Durability::Process),
            capture_journal_bytes: Some(8 << 20),
        };
        let Ok(agent) = validate_agent(&raw) else {
            panic!("valid");
        };
        assert_eq!(agent.state_dir, PathBuf::from("/srv/polar/state"));
        assert_eq!(agent.capture_durability, polar_capture::Durability::Process);
        assert_eq!(agent.capture_journal_bytes, 8 << 20);
        let small = RawAgent {
            capture_journal_bytes: Some(4096),
            ..raw
        };
        assert!(message(validate_agent(&small)).starts_with("agent.capture_journal_bytes: "));
    }

    #[test]
    fn docker_host_is_a_unix_socket_on_this_node() {
        let with = |h: &str| RawSandbox {
            docker_host: Some(h.into()),
            ..RawSandbox::default()
        };
        assert_eq!(
            validate_sandbox(&RawSandbox::default())
                .unwrap()
                .docker_host,
            None
        );
        assert_eq!(
            validate_sandbox(&with("unix:///run/d/docker.sock"))
                .unwrap()
                .docker_host
                .as_deref(),
            Some("unix:///run/d/docker.sock")
        );
        for bad in [
            "tcp://127.0.0.1:2375",
            "ssh://host",
            "/run/docker.sock",
            "unix://run/docker.sock",
            "unix:///run/../etc/x",
            "",
        ] {
            let m = message(validate_sandbox(&with(bad)));
            assert!(m.starts_with("sandbox.docker_host: "), "{bad:?}: {m}");
        }
    }

    #[test]
    fn sandbox_disk_bytes_has_a_default_and_a_range() {
        assert_eq!(
            validate_sandbox(&RawSandbox::default()).unwrap().disk_bytes,
            2 << 30
        );
        let limits = validate_sandbox(&RawSandbox::default())
            .unwrap()
            .default_limits();
        assert_eq!(limits.memory_bytes, Some(8 << 30));
        assert_eq!(limits.pids, Some(4096));
        for (key, raw) in [
            (
                "memory_bytes",
                RawSandbox {
                    memory_bytes: Some(1 << 20),
                    ..RawSandbox::default()
                },
            ),
            (
                "pids",
                RawSandbox {
                    pids: Some(4),
                    ..RawSandbox::default()
                },
            ),
        ] {
            let m = message(validate_sandbox(&raw));
            assert!(m.starts_with(&format!("sandbox.{key}: ")), "{m}");
        }
        for bad in [1 << 20, (1 << 40) + 1] {
            let raw = RawSandbox {
                disk_bytes: Some(bad),
                ..RawSandbox::default()
            };
            let m = message(validate_sandbox(&raw));
            assert!(m.starts_with("sandbox.disk_bytes: "), "{m}");
            assert!(m.contains("out of range"), "{m}");
        }
    }

    #[test]
    fn proxy_ranges() {
        let raw = |f: fn(&mut RawProxy)| {
            let mut raw = RawProxy::default();
            f(&mut raw);
            raw
        };
        assert_eq!(
            message(validate_proxy(&raw(|r| r.max_body_bytes = Some(0)))),
            "proxy.max_body_bytes: 0 is out of range (expected 1024 to 1073741824 bytes)"
        );
        assert!(
            message(validate_proxy(&raw(|r| r.header_timeout_ms = Some(0))))
                .starts_with("proxy.header_timeout_ms: ")
        );
        assert!(
            message(validate_proxy(&raw(
                |r| r.idle_timeout_ms = Some(86_400_001)
            )))
            .starts_with("proxy.idle_timeout_ms: ")
        );
        assert!(
            message(validate_proxy(&raw(|r| r.max_connections = Some(0))))
                .starts_with("proxy.max_connections: ")
        );
        // The shares: each names its key, and they nest (a session's body
        // share holds a largest body and fits the node's budget).
        for (f, key) in [
            (
                (|r: &mut RawProxy| r.max_session_connections = Some(5000)) as fn(&mut RawProxy),
                "proxy.max_session_connections: ",
            ),
            (
                |r| r.max_session_streams = Some(0),
                "proxy.max_session_streams: ",
            ),
            (
                |r| r.max_session_body_bytes = Some(1 << 20),
                "proxy.max_session_body_bytes: ",
            ),
            (
                |r| r.max_session_body_bytes = Some(2 << 30),
                "proxy.max_session_body_bytes: ",
            ),
            (
                |r| r.body_budget_bytes = Some(1 << 20),
                "proxy.body_budget_bytes: ",
            ),
            (
                |r| r.admission_wait_ms = Some(60_001),
                "proxy.admission_wait_ms: ",
            ),
        ] {
            let m = message(validate_proxy(&raw(f)));
            assert!(m.starts_with(key), "{m}");
        }
        let small = validate_proxy(&RawProxy {
            max_connections: Some(10),
            max_body_bytes: Some(2048),
            body_budget_bytes: Some(4096),
            ..RawProxy::default()
        })
        .unwrap();
        assert_eq!(small.max_session_connections, 10);
        assert_eq!(small.max_session_body_bytes, 4096);
        for bad in ["127.0.0.1", "localhost:8787", "127.0.0.1:0", "::1:8787", ""] {
            let raw = RawProxy {
                base_url_listen: Some(bad.into()),
                ..RawProxy::default()
            };
            assert!(
                message(validate_proxy(&raw)).starts_with("proxy.base_url_listen: "),
                "{bad:?}"
            );
        }
        let listen = RawProxy {
            base_url_listen: Some("[::1]:8787".into()),
            ..RawProxy::default()
        };
        assert!(
            matches!(validate_proxy(&listen), Ok(p) if p.base_url_listen.is_some_and(|a| a.port() == 8787))
        );
    }

    #[test]
    fn leaf_cannot_outlive_the_ca() {
        let raw = RawCa {
            validity_days: Some(1),
            leaf_validity_hours: Some(25),
            leaf_cache_size: None,
        };
        assert_eq!(
            message(validate_ca(&raw)),
            "ca.leaf_validity_hours: 25 is out of range (expected 1 to 24 hours: a leaf cannot outlive its CA)"
        );
        let zero = RawCa {
            leaf_cache_size: Some(0),
            ..RawCa::default()
        };
        assert!(message(validate_ca(&zero)).starts_with("ca.leaf_cache_size: "));
        let long = RawCa {
            validity_days: Some(3651),
            ..RawCa::default()
        };
        assert!(message(validate_ca(&long)).starts_with("ca.validity_days: "));
    }

    #[test]
    fn fake_range_must_be_private_and_large_enough() {
        for good in [
            "127.100.0.0/16",
            "127.64.0.0/10",
            "198.18.0.0/15",
            "198.19.1.0/24",
        ] {
            let raw = RawDns {
                fake_range: Some(good.into()),
                ttl_secs: None,
            };
            assert!(validate_dns(&raw).is_ok(), "{good:?}");
        }
        for bad in [
            "10.0.0.0/8",
            "127.0.0.0/8",
            "127.0.0.0/24",
            "126.0.0.0/7",
            "198.18.0.0/14",
            "127.100.0.0/25",
            "127.100.0.1/16",
            "127.100.0.0",
        ] {
            let raw = RawDns {
                fake_range: Some(bad.into()),
                ttl_secs: None,
            };
            assert!(
                message(validate_dns(&raw)).starts_with("dns.fake_range: "),
                "{bad:?}"
            );
        }
        let raw = RawDns {
            fake_range: None,
            ttl_secs: Some(0),
        };
        assert!(message(validate_dns(&raw)).starts_with("dns.ttl_secs: "));
    }
}
