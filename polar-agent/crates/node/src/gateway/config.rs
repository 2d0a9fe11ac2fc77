//! The gateway's settings: the `[gateway]` table of the agent's config file
//! (`polar agent --config FILE`), parsed into [`RawGatewayConfig`] (serde, no
//! unknown keys) and checked into [`GatewayConfig`] with errors naming the
//! key (`gateway.running_workers: must be at least 1`).
//!
//! ```toml
//! [gateway]
//! server = "https://10.0.0.2:7070"    # the rollout server (required)
//! node_id = "node-a"                  # default: the host name
//! listen = "10.0.0.5:7071"            # where the server pushes sessions
//! advertise = "https://10.0.0.5:7071" # URL the server uses (default https://<listen>)
//! # (POLAR_GATEWAY_NODE_ID and POLAR_GATEWAY_ADVERTISE override node_id and advertise)
//! token = "<node token>"              # presented to the server (or POLAR_GATEWAY_TOKEN, token_file)
//! accept_tokens = ["<server token>"]  # the server's gateway_token (required; or accept_token_files)
//! max_sessions = 64                   # sessions held at once, all stages
//! init_workers = 8                    # runtimes started at once
//! ready_buffer = 8                    # prepared sessions waiting ahead of RUNNING
//! running_workers = 32                # harnesses at once (backend concurrency)
//! postrun_workers = 4                 # evaluations/exports at once
//! agent_timeout_secs = 1800           # RUNNING limit (an agent option overrides)
//! heartbeat_interval_ms = 2000
//! header_read_timeout_ms = 30000      # a connection's request head, and its TLS handshake
//! max_connections = 4096              # connections served at once
//! drain_timeout_secs = 120            # on SIGTERM: let sessions finish this long
//! export = "/mnt/shared/trajectories" # a directory or s3://bucket/prefix
//! formats = ["parquet", "jsonl"]
//! export_calls = true                 # every session's calls file beside its trajectories
//! keep_failed_secs = 86400            # a failed session's directories stay this long
//! max_kept_bytes = 10737418240        # all kept sessions' directories together
//! [gateway.s3]                        # for export = "s3://...": endpoint, region,
//! endpoint = "http://10.0.0.9:9000"   # allow_http, access_key_id, ... (else AWS_* vars)
//! [gateway.tls]                       # HTTPS (polar_rollout_api::tls; docs/CONFIG.md)
//! cert_file = "/etc/polar/tls/{node_id}.crt" # served to the server, and presented to it (mTLS)
//! key_file = "/etc/polar/tls/{node_id}.key"   # ({node_id}: this node's id)
//! ca_file = "/etc/polar/tls/ca.crt"   # the rollout server is verified against it
//! [gateway.policy]                    # what task specs may ask of this node
//! upload_roots = ["/srv/tasks"]       # (default: nothing beyond the safe; see
//! mount_roots = ["/data"]             #  polar_spec::policy for every key)
//! ```
//!
//! Plain HTTP is refused before anything starts: a listen address that is
//! not loopback without `[gateway.tls]` `cert_file`, or an `http://` server
//! URL to a host that is not loopback, unless `allow_plain_http = true`.
//! (`POLAR_GATEWAY_LISTEN` overrides `listen`: Kubernetes' pod address.)
//!
//! The node token and the tokens accepted from the server are required and
//! distinct (the node never accepts its own token from a caller), at least
//! 8 characters, and none of the shipped examples'; each may be read from a
//! file (a Kubernetes secret), trimmed.
//!
//! `[gateway.policy]` is the node-side policy ([`polar_spec::policy`]):
//! checked here (paths absolute, a writable mount root overlapping a root
//! the node reads from is refused) and against the node's secrets (its
//! state directory and config file) by `polar agent` before anything
//! starts; every assignment is checked against it at INIT.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use polar_export::Format;
use polar_gateway::stages::StageLimits;
use polar_rollout_api::serve::ServeLimits;
use polar_rollout_api::tls::{RawTls, TlsSettings};
use polar_spec::policy::{Policy, RawPolicy};
use polar_spec::{KeyError, KeyPath};

/// How long a failed session's directories are kept by default (a day).
pub const DEFAULT_KEEP_FAILED_SECS: u64 = 86_400;
/// The default ceiling of kept sessions' directories (10 GiB).
pub const DEFAULT_MAX_KEPT_BYTES: u64 = 10 << 30;

/// The environment variable holding the node token (used when the file
/// has no `token`).
pub const TOKEN_ENV: &str = "POLAR_GATEWAY_TOKEN";
/// The environment variable overriding `node_id` (Kubernetes: the node's
/// name from the downward API).
pub const NODE_ID_ENV: &str = "POLAR_GATEWAY_NODE_ID";
/// The environment variable overriding `advertise` (Kubernetes: built from
/// the pod's IP).
pub const ADVERTISE_ENV: &str = "POLAR_GATEWAY_ADVERTISE";
/// The environment variable overriding `listen` (Kubernetes: the pod's IP
/// and port, so the gateway does not listen on every interface).
pub const LISTEN_ENV: &str = "POLAR_GATEWAY_LISTEN";

/// A settings problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum GatewayConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A wrong type, an unknown key or a bad value.
    #[error(transparent)]
    Invalid(#[from] KeyError),
}

/// `gateway.KEY`.
fn key(key: &str) -> KeyPath {
    KeyPath::root().key("gateway").key(key)
}

#[derive(Debug, Default, Deserialize)]
struct RawFile {
    gateway: Option<toml::Value>,
}

/// `[gateway]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGatewayConfig {
    /// Rollout server URL.
    pub server: Option<String>,
    /// Node id.
    pub node_id: Option<String>,
    /// Listen address.
    pub listen: Option<String>,
    /// URL given to the server.
    pub advertise: Option<String>,
    /// Node token.
    pub token: Option<String>,
    /// A file holding the node token.
    pub token_file: Option<PathBuf>,
    /// A directory of node token files: this node's is `<dir>/<node_id>`.
    pub token_dir: Option<PathBuf>,
    /// Tokens the server may present.
    pub accept_tokens: Option<Vec<String>>,
    /// Files holding a token the server may present each.
    pub accept_token_files: Option<Vec<PathBuf>>,
    /// Sessions held.
    pub max_sessions: Option<u32>,
    /// INIT workers.
    pub init_workers: Option<u32>,
    /// READY buffer.
    pub ready_buffer: Option<u32>,
    /// RUNNING workers.
    pub running_workers: Option<u32>,
    /// POSTRUN workers.
    pub postrun_workers: Option<u32>,
    /// RUNNING limit.
    pub agent_timeout_secs: Option<u64>,
    /// Heartbeat interval.
    pub heartbeat_interval_ms: Option<u64>,
    /// Drain grace.
    pub drain_timeout_secs: Option<u64>,
    /// How long a connection may take to send its request head.
    pub header_read_timeout_ms: Option<u64>,
    /// Connections served at once.
    pub max_connections: Option<u64>,
    /// `[gateway.tls]`.
    pub tls: Option<RawTls>,
    /// Export destination.
    pub export: Option<String>,
    /// Export formats.
    pub formats: Option<Vec<String>>,
    /// Whether each session's calls file is exported too.
    pub export_calls: Option<bool>,
    /// `[gateway.s3]`: the S3-compatible store of an `s3://` export.
    pub s3: Option<polar_export::S3Options>,
    /// How long a failed session's directories are kept.
    pub keep_failed_secs: Option<u64>,
    /// The ceiling of the kept sessions' directories, in bytes.
    pub max_kept_bytes: Option<u64>,
    /// `[gateway.policy]`: what task specs may ask of this node.
    pub policy: Option<RawPolicy>,
}

/// The validated settings.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// The rollout server's base URL.
    pub server: String,
    /// This node's id.
    pub node_id: String,
    /// Where the server pushes sessions.
    pub listen: SocketAddr,
    /// The URL the server is given (`None`: `http://<bound address>`).
    pub advertise: Option<String>,
    /// The token presented to the server (read from `token_file` by
    /// [`GatewayConfig::finish_tokens`] when that is set).
    pub token: String,
    /// Where the node token is read from at start (`token_file`, or
    /// `<token_dir>/<node_id>`).
    pub token_file: Option<PathBuf>,
    /// Tokens the server may present.
    pub accept_tokens: Vec<String>,
    /// Files holding more of them, read at start.
    pub accept_token_files: Vec<PathBuf>,
    /// Sessions held at once.
    pub max_sessions: u32,
    /// The stage pools.
    pub limits: StageLimits,
    /// The RUNNING limit unless the task's agent options say otherwise.
    pub agent_timeout: Duration,
    /// Heartbeat interval until the server says otherwise.
    pub heartbeat_interval: Duration,
    /// How long a stop lets sessions finish.
    pub drain_timeout: Duration,
    /// The accept loop's header-read timeout and connection cap.
    pub serve_limits: ServeLimits,
    /// HTTPS, the server's CA, client certificates, the plain-HTTP opt-in.
    pub tls: TlsSettings,
    /// Where trajectories go (`None`: `<state_dir>/trajectories`).
    pub export: Option<String>,
    /// In which formats.
    pub formats: Vec<Format>,
    /// Whether each session's calls file (every capture record, bodies
    /// included) is exported beside its trajectories (default: yes). Off,
    /// the trajectories cannot be re-derived once the node removed the
    /// session's directory.
    pub export_calls: bool,
    /// The S3-compatible store's options.
    pub s3: polar_export::S3Options,
    /// What is kept of failed sessions' directories (an exported session's
    /// are removed).
    pub keep: super::retention::Keep,
    /// What task specs may ask of this node (the default: nothing beyond
    /// the safe).
    pub policy: Policy,
}

/// Where the policy is in the file.
pub fn policy_key() -> KeyPath {
    KeyPath::root().key("gateway").key("policy")
}

fn positive(at: &str, v: Option<u32>, default: u32) -> Result<u32, KeyError> {
    match v {
        Some(0) => Err(KeyError::new(key(at), "must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(default),
    }
}

fn secs(at: &str, v: Option<u64>, default: u64) -> Result<Duration, KeyError> {
    match v {
        Some(0) => Err(KeyError::new(key(at), "must be at least 1")),
        v => Ok(Duration::from_secs(v.unwrap_or(default))),
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node".into())
}

fn url(at: &str, v: &str) -> Result<String, KeyError> {
    let rest = v
        .strip_prefix("http://")
        .or_else(|| v.strip_prefix("https://"))
        .ok_or_else(|| {
            KeyError::new(key(at), format!("{v:?} is not an http:// or https:// URL"))
        })?;
    if rest.trim_end_matches('/').is_empty() || rest.contains(char::is_whitespace) {
        return Err(KeyError::new(key(at), format!("{v:?} has no host")));
    }
    Ok(v.trim_end_matches('/').to_owned())
}

/// `node_id`: the host's name unless set; 1 to 128 of `[A-Za-z0-9._-]`.
fn node_id(raw: &RawGatewayConfig) -> Result<String, KeyError> {
    let node_id = raw.node_id.clone().unwrap_or_else(host_name);
    let fits = !node_id.is_empty()
        && node_id.len() <= 128
        && node_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !fits {
        return Err(KeyError::new(
            key("node_id"),
            format!("{node_id:?}: 1-128 of [A-Za-z0-9._-]"),
        ));
    }
    Ok(node_id)
}

/// The node token and the server's, as far as the file says them
/// (files are read by [`GatewayConfig::finish_tokens`]).
struct Tokens {
    token: String,
    token_file: Option<PathBuf>,
    accept_tokens: Vec<String>,
    accept_token_files: Vec<PathBuf>,
}

fn tokens(
    raw: &RawGatewayConfig,
    env_token: Option<String>,
    node_id: &str,
) -> Result<Tokens, KeyError> {
    let token_file = match (&raw.token, &raw.token_file, &raw.token_dir) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
            return Err(KeyError::new(
                key("token_file"),
                "give one of token, token_file and token_dir",
            ));
        }
        (None, Some(p), None) => Some(p.clone()),
        (None, None, Some(d)) => Some(d.join(node_id)),
        _ => None,
    };
    let token = raw
        .token
        .clone()
        .or(env_token)
        .filter(|t| !t.is_empty())
        .unwrap_or_default();
    if token.is_empty() && token_file.is_none() {
        return Err(KeyError::new(
            key("token"),
            format!("missing: the node token (or token_file, token_dir, or set {TOKEN_ENV})"),
        ));
    }
    let accept_tokens = raw.accept_tokens.clone().unwrap_or_default();
    let accept_token_files = raw.accept_token_files.clone().unwrap_or_default();
    if accept_tokens.is_empty() && accept_token_files.is_empty() {
        return Err(KeyError::new(
            key("accept_tokens"),
            "missing: the server's gateway_token (or accept_token_files); \
             it must not be the node token",
        ));
    }
    if let Some(i) = accept_tokens.iter().position(|t| *t == token) {
        return Err(KeyError::new(
            key("accept_tokens").index(i),
            "the node token itself: the server presents its own gateway_token, \
             so a node token cannot push sessions to nodes",
        ));
    }
    Ok(Tokens {
        token,
        token_file,
        accept_tokens,
        accept_token_files,
    })
}

/// The stage pools and the sessions held at once.
fn limits(raw: &RawGatewayConfig) -> Result<(u32, StageLimits), KeyError> {
    let running = positive("running_workers", raw.running_workers, 32)?;
    let max_sessions = positive("max_sessions", raw.max_sessions, 64)?;
    let ready = raw.ready_buffer.unwrap_or(running.min(8));
    let limits = StageLimits {
        init: positive("init_workers", raw.init_workers, 8)? as usize,
        ready_buffer: ready as usize,
        running: running as usize,
        postrun: positive("postrun_workers", raw.postrun_workers, 4)? as usize,
    };
    Ok((max_sessions, limits))
}

/// `formats` (Parquet unless set) and a non-empty `export`.
fn export(raw: &RawGatewayConfig) -> Result<Vec<Format>, KeyError> {
    if let Some(e) = &raw.export
        && e.is_empty()
    {
        return Err(KeyError::new(key("export"), "empty"));
    }
    match &raw.formats {
        None => Ok(vec![Format::Parquet]),
        Some(f) if f.is_empty() => Err(KeyError::new(key("formats"), "name at least one format")),
        Some(f) => f
            .iter()
            .enumerate()
            .map(|(i, s)| match s.as_str() {
                "parquet" => Ok(Format::Parquet),
                "jsonl" => Ok(Format::Jsonl),
                other => Err(KeyError::new(
                    key("formats").index(i),
                    format!("unknown format {other:?} (parquet, jsonl)"),
                )),
            })
            .collect(),
    }
}

/// `[gateway.tls]` (`{node_id}` in its paths is this node's id), checked
/// against the listen address and the server's URL.
fn tls(
    raw: &RawGatewayConfig,
    node_id: &str,
    listen: SocketAddr,
    server: &str,
) -> Result<TlsSettings, KeyError> {
    let mut raw_tls = raw.tls.clone().unwrap_or_default();
    // `{node_id}` in the certificate's paths: one Secret of every
    // node's certificates, mounted on each (Kubernetes).
    for path in [&mut raw_tls.cert_file, &mut raw_tls.key_file]
        .into_iter()
        .flatten()
    {
        *path = PathBuf::from(path.to_string_lossy().replace("{node_id}", node_id));
    }
    let tls = TlsSettings::from_raw(&raw_tls, "gateway.tls", None)?;
    tls.check_listen("gateway.listen", listen)?;
    tls.check_target(server)
        .map_err(|reason| KeyError::new(key("server"), reason))?;
    Ok(tls)
}

impl GatewayConfig {
    /// The start-up step of the tokens (`polar agent`, before anything
    /// starts): reads the token files, then checks that each token is at
    /// least 8 characters, none of the shipped examples', and that the
    /// node never accepts its own token.
    pub fn finish_tokens(&mut self) -> Result<(), GatewayConfigError> {
        let read = |at: KeyPath, p: &Path| {
            polar_io::auth::read_token_file(p)
                .map_err(|e| KeyError::new(at, format!("{}: {e}", p.display())))
        };
        if let Some(p) = &self.token_file {
            self.token = read(key("token_file"), p)?;
        }
        for (i, p) in self.accept_token_files.iter().enumerate() {
            let t = read(key("accept_token_files").index(i), p)?;
            if !self.accept_tokens.contains(&t) {
                self.accept_tokens.push(t);
            }
        }
        let keyed = std::iter::once((key("token"), &self.token)).chain(
            self.accept_tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (key("accept_tokens").index(i), t)),
        );
        for (at, t) in keyed {
            if let Some(why) = polar_io::auth::token_weakness(t) {
                return Err(KeyError::new(at, why).into());
            }
        }
        if let Some(i) = self.accept_tokens.iter().position(|t| *t == self.token) {
            return Err(KeyError::new(
                key("accept_tokens").index(i),
                "the node token itself: the server presents its own gateway_token",
            )
            .into());
        }
        Ok(())
    }

    /// Checks the table, one part after the other; `env_token` is the
    /// value of [`TOKEN_ENV`], used when the file has no `token`.
    pub fn from_raw(raw: &RawGatewayConfig, env_token: Option<String>) -> Result<Self, KeyError> {
        let server = url(
            "server",
            raw.server
                .as_deref()
                .ok_or_else(|| KeyError::new(key("server"), "missing: the rollout server's URL"))?,
        )?;
        let listen = match &raw.listen {
            Some(s) => s
                .parse()
                .map_err(|e| KeyError::new(key("listen"), format!("{s:?}: {e}")))?,
            None => SocketAddr::from(([127, 0, 0, 1], 7071)),
        };
        let advertise = raw
            .advertise
            .as_deref()
            .map(|a| url("advertise", a))
            .transpose()?;
        let node_id = node_id(raw)?;
        let tokens = tokens(raw, env_token, &node_id)?;
        let (max_sessions, limits) = limits(raw)?;
        let heartbeat_interval = match raw.heartbeat_interval_ms {
            Some(ms) if ms < 50 => {
                return Err(KeyError::new(key("heartbeat_interval_ms"), "at least 50"));
            }
            v => Duration::from_millis(v.unwrap_or(2000)),
        };
        let serve_limits =
            ServeLimits::from_settings("gateway", raw.header_read_timeout_ms, raw.max_connections)?;
        let tls = tls(raw, &node_id, listen, &server)?;
        let policy = Policy::from_raw(&raw.policy.clone().unwrap_or_default(), &policy_key())?;
        Ok(Self {
            server,
            node_id,
            listen,
            advertise,
            token: tokens.token,
            token_file: tokens.token_file,
            accept_tokens: tokens.accept_tokens,
            accept_token_files: tokens.accept_token_files,
            max_sessions,
            limits,
            agent_timeout: secs("agent_timeout_secs", raw.agent_timeout_secs, 1800)?,
            heartbeat_interval,
            drain_timeout: secs("drain_timeout_secs", raw.drain_timeout_secs, 120)?,
            serve_limits,
            tls,
            export: raw.export.clone(),
            formats: export(raw)?,
            export_calls: raw.export_calls.unwrap_or(true),
            s3: raw.s3.clone().unwrap_or_default(),
            keep: super::retention::Keep {
                failed_for: Duration::from_secs(
                    raw.keep_failed_secs.unwrap_or(DEFAULT_KEEP_FAILED_SECS),
                ),
                max_bytes: raw.max_kept_bytes.unwrap_or(DEFAULT_MAX_KEPT_BYTES),
            },
            policy,
        })
    }

    /// Reads `[gateway]` from TOML text (other tables belong to their
    /// owners), with the process's environment overrides. `Ok(None)` when
    /// the file has no `[gateway]`.
    pub fn from_toml_str(text: &str) -> Result<Option<Self>, GatewayConfigError> {
        Self::from_toml_with_env(text, |k| std::env::var(k).ok())
    }

    /// [`GatewayConfig::from_toml_str`] with the environment `env` gives
    /// ([`NODE_ID_ENV`], [`ADVERTISE_ENV`], [`LISTEN_ENV`], [`TOKEN_ENV`]).
    pub fn from_toml_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, GatewayConfigError> {
        let file: RawFile = toml::from_str(text)
            .map_err(|e| KeyError::new(KeyPath::root().key("gateway"), e.message()))?;
        let Some(table) = file.gateway else {
            return Ok(None);
        };
        let mut raw: RawGatewayConfig = table.try_into().map_err(|e: toml::de::Error| {
            KeyError::new(KeyPath::root().key("gateway"), e.message())
        })?;
        // The pod's overrides (Kubernetes: the downward API).
        let env = |k: &str| env(k).filter(|v| !v.is_empty());
        if let Some(id) = env(NODE_ID_ENV) {
            raw.node_id = Some(id);
        }
        if let Some(a) = env(ADVERTISE_ENV) {
            raw.advertise = Some(a);
        }
        if let Some(l) = env(LISTEN_ENV) {
            raw.listen = Some(l);
        }
        Ok(Some(Self::from_raw(&raw, env(TOKEN_ENV))?))
    }

    /// Reads `[gateway]` from a file.
    pub fn load(path: &Path) -> Result<Option<Self>, GatewayConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| GatewayConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKENS: &str = "token = \"node-token-1\"\naccept_tokens = [\"server-token-1\"]\n";

    fn parse(t: &str) -> Result<GatewayConfig, String> {
        GatewayConfig::from_toml_str(t)
            .map(|c| c.unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_overrides() {
        let c = parse(&format!(
            "[gateway]\nserver = \"http://127.0.0.1:7070/\"\n{TOKENS}node_id = \"n1\"\n"
        ))
        .unwrap();
        assert_eq!(c.server, "http://127.0.0.1:7070");
        assert_eq!(c.token, "node-token-1");
        assert_eq!(c.accept_tokens, vec!["server-token-1".to_owned()]);
        assert_eq!(c.limits.running, 32);
        assert_eq!(c.limits.ready_buffer, 8);
        assert_eq!(c.formats, vec![Format::Parquet]);
        assert!(c.export_calls, "the calls are exported by default");
        assert_eq!(c.policy, Policy::default());
        let c = parse(&format!(
            "[gateway]\nserver = \"https://s\"\n{TOKENS}node_id = \"n\"\nrunning_workers = 2\nready_buffer = 0\nformats = [\"jsonl\"]\n",
        ))
        .unwrap();
        assert_eq!(c.limits.running, 2);
        assert_eq!(c.limits.ready_buffer, 0);
        assert_eq!(c.formats, vec![Format::Jsonl]);
        assert!(
            !parse(&format!(
                "[gateway]\nserver = \"https://s\"\n{TOKENS}node_id = \"n\"\nexport_calls = false\n"
            ))
            .unwrap()
            .export_calls
        );
        assert!(
            GatewayConfig::from_toml_str("[agent]\nstate_dir = \"/x\"\n")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_example_config_s_gateway_table_parses() {
        let example = include_str!("../../../../../config/polar.example.toml");
        let block: String = example
            .lines()
            .skip_while(|l| *l != "# [gateway]")
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches('#').trim_start()))
            .collect();
        let c = parse(&block).unwrap();
        assert_eq!(c.node_id, "gpu-07");
        assert_eq!(c.accept_tokens, vec!["server-secret".to_owned()]);
        // The example's tokens are refused at start: a node needs its own.
        let e = c.clone().finish_tokens().unwrap_err().to_string();
        assert!(
            e.starts_with("gateway.token: this is an example token"),
            "{e}"
        );
        assert_eq!(c.formats, vec![Format::Parquet, Format::Jsonl]);
        assert_eq!(c.export.as_deref(), Some("/mnt/shared/trajectories"));
        assert!(c.export_calls);
        let policy: String = example
            .lines()
            .skip_while(|l| *l != "# [gateway.policy]")
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches('#').trim_start()))
            .collect();
        let c = parse(&format!("{block}{policy}")).unwrap();
        assert_eq!(c.policy.upload_roots, vec![PathBuf::from("/srv/tasks")]);
        assert_eq!(c.policy.ceilings.cpu, Some(8.0));
        assert!(!c.policy.allow_host_network);
    }

    #[test]
    fn errors_name_the_key() {
        let base = format!("[gateway]\nserver = \"https://s\"\n{TOKENS}node_id = \"n\"\n");
        for (extra, key) in [
            ("running_workers = 0\n", "gateway.running_workers"),
            ("listen = \"nowhere\"\n", "gateway.listen"),
            ("formats = [\"csv\"]\n", "gateway.formats"),
            ("bogus = 1\n", "bogus"),
            (
                "heartbeat_interval_ms = 1\n",
                "gateway.heartbeat_interval_ms",
            ),
            (
                "[gateway.policy]\nmount_roots = [\"data\"]\n",
                "gateway.policy.mount_roots[0]: \"data\" must be an absolute",
            ),
            (
                "[gateway.policy]\nupload_roots = [\"/srv\"]\nwritable_mount_roots = [\"/srv/x\"]\n",
                "gateway.policy.writable_mount_roots[0]: /srv/x overlaps upload_roots[0]",
            ),
            (
                "[gateway.policy]\nallow_pass_routes = true\n",
                "allow_pass_routes",
            ),
        ] {
            let e = parse(&format!("{base}{extra}")).unwrap_err();
            assert!(e.contains(key), "{extra}: {e}");
        }
        let e = parse(&format!("[gateway]\n{TOKENS}")).unwrap_err();
        assert!(e.contains("gateway.server: missing"), "{e}");
        let e = parse(&format!("[gateway]\nserver = \"ftp://x\"\n{TOKENS}")).unwrap_err();
        assert!(e.contains("gateway.server"), "{e}");
        let e = parse(&format!(
            "[gateway]\nserver = \"https://s\"\nnode_id = \"a b\"\n{TOKENS}"
        ))
        .unwrap_err();
        assert!(e.contains("gateway.node_id"), "{e}");
    }

    #[test]
    fn the_node_token_and_the_server_s_are_required_and_distinct() {
        let base = "[gateway]\nserver = \"https://s\"\nnode_id = \"n\"\n";
        for (tokens, want) in [
            (
                "token = \"node-token-1\"\n",
                "gateway.accept_tokens: missing",
            ),
            (
                "token = \"node-token-1\"\naccept_tokens = [\"node-token-1\"]\n",
                "gateway.accept_tokens[0]: the node token itself",
            ),
        ] {
            let e = parse(&format!("{base}{tokens}")).unwrap_err();
            assert!(e.contains(want), "{tokens}: {e}");
        }
        for (tokens, want) in [
            (
                "token = \"change-me-node-token\"\naccept_tokens = [\"server-token-1\"]\n",
                "gateway.token: this is an example token",
            ),
            (
                "token = \"short\"\naccept_tokens = [\"server-token-1\"]\n",
                "gateway.token: a token must be at least 8 characters",
            ),
            (
                "token = \"node-token-1\"\naccept_tokens = [\"change-me\"]\n",
                "gateway.accept_tokens[0]: this is an example token",
            ),
        ] {
            let mut c = parse(&format!("{base}{tokens}")).unwrap();
            let e = c.finish_tokens().unwrap_err().to_string();
            assert!(e.starts_with(want), "{tokens}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let (t, a) = (dir.path().join("token"), dir.path().join("accept"));
        std::fs::write(&t, "node-token-from-file\n").unwrap();
        std::fs::write(&a, "server-token-from-file\n").unwrap();
        let mut c = parse(&format!(
            "{base}token_file = {t:?}\naccept_token_files = [{a:?}]\n"
        ))
        .unwrap();
        c.finish_tokens().unwrap();
        assert_eq!(c.token, "node-token-from-file");
        assert_eq!(c.accept_tokens, ["server-token-from-file"]);
        // token_dir: this node's file of the directory.
        std::fs::write(dir.path().join("n"), "node-n-token-from-dir\n").unwrap();
        let mut c = parse(&format!(
            "{base}token_dir = {:?}\naccept_token_files = [{a:?}]\n",
            dir.path()
        ))
        .unwrap();
        c.finish_tokens().unwrap();
        assert_eq!(c.token, "node-n-token-from-dir");
    }

    #[test]
    fn plain_http_beyond_loopback_is_refused_unless_opted_in() {
        let base = format!("[gateway]\nnode_id = \"n\"\n{TOKENS}");
        let e = parse(&format!(
            "{base}server = \"http://127.0.0.1:7070\"\nlisten = \"0.0.0.0:7071\"\n"
        ))
        .unwrap_err();
        assert!(
            e.starts_with("gateway.listen: 0.0.0.0:7071 is not a loopback address"),
            "{e}"
        );
        let e = parse(&format!("{base}server = \"http://10.0.0.2:7070\"\n")).unwrap_err();
        assert!(
            e.starts_with("gateway.server: http://10.0.0.2:7070 is plain HTTP"),
            "{e}"
        );
        let c = parse(&format!(
            "{base}server = \"http://10.0.0.2:7070\"\nlisten = \"0.0.0.0:7071\"\n\
             [gateway.tls]\nallow_plain_http = true\n"
        ))
        .unwrap();
        assert!(c.tls.allow_plain_http);
        let c = parse(&format!(
            "{base}server = \"https://10.0.0.2:7070\"\nlisten = \"10.0.0.5:7071\"\n\
             header_read_timeout_ms = 5000\nmax_connections = 64\n\
             [gateway.tls]\ncert_file = \"/t/n.crt\"\nkey_file = \"/t/n.key\"\nca_file = \"/t/ca.crt\"\n"
        ))
        .unwrap();
        assert!(c.tls.serves_https());
        assert_eq!(c.serve_limits.max_connections, 64);
        assert_eq!(c.serve_limits.header_read_timeout, Duration::from_secs(5));
        let c = parse(&format!(
            "{base}server = \"https://s\"\n[gateway.tls]\ncert_file = \"/t/{{node_id}}.crt\"\n\
             key_file = \"/t/{{node_id}}.key\"\n"
        ))
        .unwrap();
        assert_eq!(c.tls.identity, Some(("/t/n.crt".into(), "/t/n.key".into())));
        for (extra, want) in [
            (
                "max_connections = 0\n",
                "gateway.max_connections: must be from 1",
            ),
            (
                "header_read_timeout_ms = 10\n",
                "gateway.header_read_timeout_ms: must be from 100",
            ),
            (
                "[gateway.tls]\ncert_file = \"/x\"\n",
                "gateway.tls.key_file: missing",
            ),
        ] {
            let e = parse(&format!("{base}server = \"http://127.0.0.1:1\"\n{extra}")).unwrap_err();
            assert!(e.starts_with(want), "{extra}: {e}");
        }
    }
}
