//! The rollout server's settings: the `[rollout]` table of a TOML file
//! (other top-level tables are left to their owners, so the agent's config
//! file can carry it), parsed into [`RawRolloutConfig`] (serde, no unknown
//! keys) and checked into [`RolloutConfig`] with errors naming the key
//! (`rollout.heartbeat_timeout_ms: must be at least 100`).
//!
//! ```toml
//! [rollout]
//! listen = "127.0.0.1:7070"
//! database = "/var/lib/polar/rollout.sqlite"
//! tokens = ["<trainer token>"]      # trainers, `polar submit` (or token_files): read and control
//! viewer_tokens = ["<viewer token>"] # read-only: the dashboard (/ui), status, events (or viewer_token_files)
//! gateway_token = "<server token>"  # sent to gateways (or gateway_token_file)
//! node_token_dir = "/run/secrets/polar-nodes" # one file per node id (and/or [rollout.node_tokens])
//! heartbeat_interval_ms = 2000
//! heartbeat_timeout_ms = 10000
//! max_retries = 2
//! header_read_timeout_ms = 30000   # a connection's request head, and its TLS handshake
//! max_connections = 4096            # served at once (more wait in the backlog)
//! [rollout.callback]
//! max_attempts = 8
//! verify_gateway_as = "address"     # or "node_id": the name a gateway's certificate carries
//! [rollout.tls]                     # HTTPS (polar_rollout_api::tls; docs/CONFIG.md)
//! cert_file = "/etc/polar/tls/rollout.crt"
//! key_file = "/etc/polar/tls/rollout.key"
//! ca_file = "/etc/polar/tls/ca.crt"        # gateways and callbacks are verified against it
//! client_ca_file = "/etc/polar/tls/ca.crt" # mTLS: nodes present a certificate naming their id
//! [rollout.policy]                  # optional: refuse tasks outside it at submission
//! upload_roots = ["/srv/tasks"]     # the keys of a gateway's [gateway.policy]
//! [rollout.dashboard]               # optional: what /ui may read besides the API
//! export_roots = ["/srv/polar/trajectories"] # exported files are read beneath these only
//! max_file_bytes = 268435456
//! s3_roots = ["s3://rollouts/runs"] # and exported objects beneath these (AWS_* credentials)
//! tokenizer = "/models/policy/tokenizer.json" # token text in the viewer (loaded at start)
//! [rollout.dashboard.s3]            # the store of s3_roots
//! endpoint = "http://127.0.0.1:9000"
//! region = "us-east-1"
//! allow_http = false
//! ```
//!
//! Identities: trainer tokens, node tokens and the gateway token are
//! required and distinct (viewer tokens, optional, too) (a token given for two roles, to two nodes, or
//! one of the shipped examples' is refused at start-up, naming the key).
//! Each node token is bound to its node id (`[rollout.node_tokens]`
//! `node-a = "..."`, or the files of `node_token_dir`, named by node id):
//! the server takes reports, heartbeats and results for that node only.
//! Tokens read from files are read again by [`RolloutConfig::reload_tokens`]
//! (`polar rollout serve` on SIGHUP), so they rotate without a restart.
//!
//! Plain HTTP is refused at start-up on a listen address that is not
//! loopback unless `[rollout.tls]` says `allow_plain_http = true`; the same
//! rule refuses `http://` node addresses (at registration) and callback
//! URLs (at submission) to hosts that are not loopback. With
//! `client_ca_file`, a node must present a certificate of that CA whose
//! DNS names include its node id (403 otherwise); trainers need none.
//!
//! `[rollout.policy]` is the node-side policy ([`polar_spec::policy`]) as
//! the server knows it: when present, a task whose spec asks for more is a
//! 400 naming the field, before any node sees it. The nodes check again
//! against their own `[gateway.policy]` whatever the server did.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use polar_rollout_api::serve::ServeLimits;
use polar_rollout_api::tls::{RawTls, TlsSettings};
use polar_spec::policy::{Policy, RawPolicy};
use polar_spec::{KeyError, KeyPath};

pub use crate::ui::settings::{DashboardSettings, RawDashboard};

/// The environment variable adding a trainer token.
pub const TOKEN_ENV: &str = "POLAR_ROLLOUT_TOKEN";
/// The environment variable adding a node token, as `NODE_ID=TOKEN`.
pub const NODE_TOKEN_ENV: &str = "POLAR_ROLLOUT_NODE_TOKEN";

/// A settings problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum RolloutConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TOML does not parse, a wrong type or an unknown key, or a value
    /// out of range.
    #[error(transparent)]
    Invalid(#[from] KeyError),
}

/// `rollout.KEY`.
fn key(key: &str) -> KeyPath {
    KeyPath::root().key("rollout").key(key)
}

/// The key path of a deserializer's error.
fn path_of(path: &serde_path_to_error::Path) -> KeyPath {
    path.iter()
        .fold(KeyPath::root(), |at, segment| match segment {
            serde_path_to_error::Segment::Seq { index } => at.index(*index),
            serde_path_to_error::Segment::Map { key } => at.key(key),
            serde_path_to_error::Segment::Enum { variant } => at.key(variant),
            serde_path_to_error::Segment::Unknown => at,
        })
}

/// The file as written.
#[derive(Debug, Default, Deserialize)]
struct RawFile {
    #[serde(default)]
    rollout: RawRolloutConfig,
}

/// `[rollout]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRolloutConfig {
    /// Listen address.
    pub listen: Option<String>,
    /// SQLite database file.
    pub database: Option<String>,
    /// Trainer tokens.
    pub tokens: Option<Vec<String>>,
    /// Files holding a trainer token each.
    pub token_files: Option<Vec<PathBuf>>,
    /// Read-only tokens (dashboards).
    pub viewer_tokens: Option<Vec<String>>,
    /// Files holding a read-only token each.
    pub viewer_token_files: Option<Vec<PathBuf>>,
    /// Node tokens by node id (a list is refused with the fix).
    pub node_tokens: Option<RawNodeTokens>,
    /// A directory of files named by node id, holding each node's token.
    pub node_token_dir: Option<PathBuf>,
    /// Token sent to gateways.
    pub gateway_token: Option<String>,
    /// A file holding the token sent to gateways.
    pub gateway_token_file: Option<PathBuf>,
    /// Token sent to callback URLs.
    pub callback_token: Option<String>,
    /// Heartbeat interval told to gateways.
    pub heartbeat_interval_ms: Option<u64>,
    /// Heartbeat timeout.
    pub heartbeat_timeout_ms: Option<u64>,
    /// Re-dispatches after a node loss.
    pub max_retries: Option<u32>,
    /// Wait after a session's deadline.
    pub result_grace_ms: Option<u64>,
    /// Pending sessions fail after this long without any healthy node.
    pub no_node_timeout_ms: Option<u64>,
    /// Timeout of a push to a gateway.
    pub push_timeout_ms: Option<u64>,
    /// Finished tasks are deleted this long after they finished.
    pub retention_secs: Option<u64>,
    /// Largest request body.
    pub max_body_bytes: Option<u64>,
    /// `normal` or `full`.
    pub synchronous: Option<String>,
    /// How long a connection may take to send its request head.
    pub header_read_timeout_ms: Option<u64>,
    /// Connections served at once.
    pub max_connections: Option<u64>,
    /// `[rollout.tls]`.
    #[serde(default)]
    pub tls: RawTls,
    /// `address` or `node_id`: the name a gateway's certificate must carry.
    pub verify_gateway_as: Option<String>,
    /// `[rollout.callback]`.
    #[serde(default)]
    pub callback: RawCallback,
    /// `[rollout.policy]`.
    pub policy: Option<RawPolicy>,
    /// `[rollout.dashboard]`.
    #[serde(default)]
    pub dashboard: RawDashboard,
}

/// `rollout.node_tokens` as written: a table of node id to token (the
/// list form of earlier versions is parsed to be refused with the fix).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawNodeTokens {
    /// `[rollout.node_tokens]` `node-a = "..."`.
    Bound(BTreeMap<String, String>),
    /// `node_tokens = ["..."]`: refused.
    Shared(Vec<String>),
}

/// Where the tokens came from, to read them again on reload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenSources {
    /// Trainer tokens written in the file, the environment or flags.
    pub tokens: Vec<String>,
    /// Files holding a trainer token each.
    pub token_files: Vec<PathBuf>,
    /// Read-only tokens written in the file.
    pub viewer_tokens: Vec<String>,
    /// Files holding a read-only token each.
    pub viewer_token_files: Vec<PathBuf>,
    /// Node tokens written in the file or given by the environment/flags.
    pub node_tokens: BTreeMap<String, String>,
    /// The directory of node token files.
    pub node_token_dir: Option<PathBuf>,
    /// The gateway token written in the file.
    pub gateway_token: Option<String>,
    /// The file holding the gateway token.
    pub gateway_token_file: Option<PathBuf>,
}

/// `[rollout.callback]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCallback {
    /// POSTs tried at most.
    pub max_attempts: Option<u32>,
    /// First backoff.
    pub initial_backoff_ms: Option<u64>,
    /// Largest backoff.
    pub max_backoff_ms: Option<u64>,
    /// Timeout of one POST.
    pub timeout_ms: Option<u64>,
}

/// The name a gateway's certificate must carry when the server pushes to
/// it over HTTPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayName {
    /// The host of its advertised address (a DNS name or IP SAN), as any
    /// HTTPS client checks.
    Address,
    /// Its node id (a DNS name of the certificate), whatever address it
    /// advertises: pod addresses that no certificate can know in advance
    /// (Kubernetes), with certificates issued per node id.
    NodeId,
}

/// How hard SQLite syncs each commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// `synchronous=NORMAL` in WAL mode: a commit survives a crash of the
    /// server process; the last commits may be lost on power loss.
    Normal,
    /// `synchronous=FULL`: every commit is fsynced.
    Full,
}

/// Callback delivery settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackConfig {
    /// POSTs tried at most (at least 1).
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubles each time.
    pub initial_backoff: Duration,
    /// Largest backoff.
    pub max_backoff: Duration,
    /// Timeout of one POST.
    pub timeout: Duration,
}

impl Default for CallbackConfig {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
        }
    }
}

/// The validated settings. Tests build it directly.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutConfig {
    /// Where the API listens.
    pub listen: SocketAddr,
    /// The SQLite database file (created if missing).
    pub database: PathBuf,
    /// Bearer tokens accepted on the trainer API (tasks, events, status),
    /// reading and changing.
    pub tokens: Vec<String>,
    /// Read-only bearer tokens (the dashboard): every `GET` of the
    /// trainer side, nothing that changes a task or a node.
    pub viewer_tokens: Vec<String>,
    /// Bearer tokens accepted on the gateway API (nodes, sessions), by the
    /// node id each is bound to.
    pub node_tokens: BTreeMap<String, String>,
    /// Bearer token the server presents to gateways.
    pub gateway_token: String,
    /// Where the tokens came from ([`RolloutConfig::reload_tokens`]).
    pub token_sources: TokenSources,
    /// Bearer token the server presents to callback URLs, if any.
    pub callback_token: Option<String>,
    /// How often gateways are told to heartbeat.
    pub heartbeat_interval: Duration,
    /// A node without a heartbeat this long is lost; its sessions are
    /// dispatched again.
    pub heartbeat_timeout: Duration,
    /// How many times a session is dispatched again after losing its node
    /// (or a retryable failure) before it is reported failed.
    pub max_retries: u32,
    /// How long after a session's deadline the server waits for its result
    /// before reporting it failed.
    pub result_grace: Duration,
    /// Pending sessions fail when no node has been healthy for this long.
    pub no_node_timeout: Duration,
    /// Timeout of one push to a gateway.
    pub push_timeout: Duration,
    /// Finished tasks (with their sessions) are deleted this long after
    /// they finished (`None`: kept until `DELETE /v1/tasks/{id}`).
    pub retention: Option<Duration>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// SQLite durability.
    pub synchronous: Synchronous,
    /// The accept loop's header-read timeout and connection cap.
    pub limits: ServeLimits,
    /// HTTPS, the peers' CA, client certificates, the plain-HTTP opt-in.
    pub tls: TlsSettings,
    /// The name a gateway's certificate is verified against.
    pub verify_gateway_as: GatewayName,
    /// Callback delivery.
    pub callback: CallbackConfig,
    /// The policy submissions are checked against (`None`: only their
    /// form is checked; the nodes check their own policy).
    pub policy: Option<Policy>,
    /// What the dashboard may read besides the server's own state.
    pub dashboard: DashboardSettings,
}

impl RolloutConfig {
    /// Defaults with the given database and trainer token; no node is
    /// known and there is no gateway token yet (both required to start).
    pub fn new(database: impl Into<PathBuf>, token: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            database: database.into(),
            tokens: vec![token.into()],
            viewer_tokens: Vec::new(),
            node_tokens: BTreeMap::new(),
            gateway_token: String::new(),
            token_sources: TokenSources::default(),
            callback_token: None,
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(10),
            max_retries: 2,
            result_grace: Duration::from_secs(60),
            no_node_timeout: Duration::from_secs(600),
            push_timeout: Duration::from_secs(5),
            retention: None,
            max_body_bytes: 8 << 20,
            synchronous: Synchronous::Normal,
            limits: ServeLimits::default(),
            tls: TlsSettings::plain("rollout.tls"),
            verify_gateway_as: GatewayName::Address,
            callback: CallbackConfig::default(),
            policy: None,
            dashboard: DashboardSettings::default(),
        }
    }

    /// Reads the `[rollout]` table of `path`.
    pub fn load(path: &Path) -> Result<Self, RolloutConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| RolloutConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text, path.parent())
    }

    /// Parses TOML text; a relative `database` is taken from `base`.
    pub fn from_toml(text: &str, base: Option<&Path>) -> Result<Self, RolloutConfigError> {
        let de = toml::Deserializer::parse(text)
            .map_err(|e| KeyError::new(KeyPath::root(), e.message()))?;
        let raw: RawFile = serde_path_to_error::deserialize(de)
            .map_err(|e| KeyError::new(path_of(e.path()), e.into_inner().message()))?;
        Ok(Self::try_from_raw(raw.rollout, base)?)
    }

    /// Applies the defaults and checks every value, one part of the table
    /// after the other.
    pub fn try_from_raw(raw: RawRolloutConfig, base: Option<&Path>) -> Result<Self, KeyError> {
        let mut cfg = Self::new("rollout.sqlite", String::new());
        cfg.tokens.clear();
        cfg.node_tokens.clear();
        if let Some(listen) = &raw.listen {
            cfg.listen = listen
                .parse()
                .map_err(|e| KeyError::new(key("listen"), format!("{listen:?}: {e}")))?;
        }
        cfg.database = rebase(database(raw.database.as_deref(), &cfg.database)?, base);
        cfg.token_sources = token_sources(&raw, base)?;
        cfg.callback_token = raw.callback_token.clone();
        timings(&raw, &mut cfg)?;
        storage(&raw, &mut cfg)?;
        cfg.limits =
            ServeLimits::from_settings("rollout", raw.header_read_timeout_ms, raw.max_connections)?;
        cfg.tls = TlsSettings::from_raw(&raw.tls, "rollout.tls", base)?;
        cfg.verify_gateway_as = match raw.verify_gateway_as.as_deref() {
            None | Some("address") => GatewayName::Address,
            Some("node_id") => GatewayName::NodeId,
            Some(other) => {
                return Err(KeyError::new(
                    key("verify_gateway_as"),
                    format!("{other:?}: use \"address\" or \"node_id\""),
                ));
            }
        };
        cfg.callback = callback(&raw.callback)?;
        cfg.policy = raw
            .policy
            .as_ref()
            .map(|p| Policy::from_raw(p, &key("policy")))
            .transpose()?;
        cfg.dashboard =
            DashboardSettings::from_raw(&raw.dashboard).map_err(|e| e.under(&key("dashboard")))?;
        Ok(cfg)
    }

    /// Adds tokens from the environment ([`TOKEN_ENV`], [`NODE_TOKEN_ENV`]
    /// as `NODE_ID=TOKEN`) and flags, reads the token files, and checks the
    /// identities ([`RolloutConfig::check_identities`]).
    pub fn finish_tokens(
        &mut self,
        tokens: impl IntoIterator<Item = String>,
        node_tokens: impl IntoIterator<Item = String>,
    ) -> Result<(), RolloutConfigError> {
        let src = &mut self.token_sources;
        src.tokens
            .extend(tokens.into_iter().filter(|t| !t.is_empty()));
        for given in node_tokens.into_iter().filter(|t| !t.is_empty()) {
            let Some((node, token)) = given.split_once('=') else {
                return Err(KeyError::new(
                    key("node_tokens"),
                    format!("{NODE_TOKEN_ENV} / --node-token take NODE_ID=TOKEN"),
                )
                .into());
            };
            src.node_tokens.insert(node.to_owned(), token.to_owned());
        }
        self.reload_tokens()
    }

    /// Reads the tokens again from their sources (the files may have
    /// changed: rotation) and checks them; on an error nothing changes.
    pub fn reload_tokens(&mut self) -> Result<(), RolloutConfigError> {
        let src = &self.token_sources;
        let read = |at: KeyPath, path: &Path| {
            polar_io::auth::read_token_file(path)
                .map_err(|e| KeyError::new(at, format!("{}: {e}", path.display())))
        };
        let mut tokens = src.tokens.clone();
        for (i, p) in src.token_files.iter().enumerate() {
            tokens.push(read(key("token_files").index(i), p)?);
        }
        let mut viewer_tokens = src.viewer_tokens.clone();
        for (i, p) in src.viewer_token_files.iter().enumerate() {
            viewer_tokens.push(read(key("viewer_token_files").index(i), p)?);
        }
        let mut node_tokens = src.node_tokens.clone();
        if let Some(dir) = &src.node_token_dir {
            for (node, path) in node_token_files(dir)? {
                if node_tokens.contains_key(&node) {
                    return Err(KeyError::new(
                        key("node_token_dir"),
                        format!("node {node:?} also has a token in rollout.node_tokens"),
                    )
                    .into());
                }
                let token = read(key("node_token_dir"), &path)?;
                node_tokens.insert(node, token);
            }
        }
        let gateway_token = match (&src.gateway_token, &src.gateway_token_file) {
            (Some(_), Some(_)) => {
                return Err(KeyError::new(
                    key("gateway_token_file"),
                    "give gateway_token or gateway_token_file, not both",
                )
                .into());
            }
            (Some(t), None) => t.clone(),
            (None, Some(p)) => read(key("gateway_token_file"), p)?,
            (None, None) => String::new(),
        };
        let mut next = self.clone();
        next.tokens = tokens;
        next.viewer_tokens = viewer_tokens;
        next.node_tokens = node_tokens;
        next.gateway_token = gateway_token;
        next.check_identities()?;
        *self = next;
        Ok(())
    }

    /// Every role has its own tokens: trainer tokens, node tokens (one
    /// per node id) and the gateway token are present, at least 8
    /// characters, none of the shipped examples', and no token serves two
    /// roles or two nodes (nor the callback token any of them).
    pub fn check_identities(&self) -> Result<(), RolloutConfigError> {
        if self.tokens.is_empty() {
            return Err(KeyError::new(
                key("tokens"),
                format!(
                    "no trainer token: set rollout.tokens, token_files, {TOKEN_ENV} or --token"
                ),
            )
            .into());
        }
        if self.node_tokens.is_empty() {
            return Err(KeyError::new(
                key("node_tokens"),
                format!(
                    "no node token: set [rollout.node_tokens], node_token_dir, \
                     {NODE_TOKEN_ENV}=NODE_ID=TOKEN or --node-token"
                ),
            )
            .into());
        }
        if self.gateway_token.is_empty() {
            return Err(KeyError::new(
                key("gateway_token"),
                "missing: the token this server presents to gateways \
                 (gateway_token or gateway_token_file; not a node or trainer token)",
            )
            .into());
        }
        let mut seen: Vec<(KeyPath, &str)> = Vec::new();
        let mut all: Vec<(KeyPath, &str)> = Vec::new();
        for (i, t) in self.tokens.iter().enumerate() {
            all.push((key("tokens").index(i), t));
        }
        for (i, t) in self.viewer_tokens.iter().enumerate() {
            all.push((key("viewer_tokens").index(i), t));
        }
        for (node, t) in &self.node_tokens {
            if !polar_rollout_api::validate::is_valid_id(node) {
                return Err(KeyError::new(
                    key("node_tokens").key(node),
                    format!(
                        "not a node id: 1 to {} characters from [A-Za-z0-9._-], not starting with '.'",
                        polar_rollout_api::validate::MAX_ID_LEN
                    ),
                ).into());
            }
            all.push((key("node_tokens").key(node), t));
        }
        all.push((key("gateway_token"), &self.gateway_token));
        if let Some(t) = &self.callback_token {
            all.push((key("callback_token"), t));
        }
        for (at, token) in all {
            if let Some(why) = polar_io::auth::token_weakness(token) {
                return Err(KeyError::new(at, why).into());
            }
            if let Some((other, _)) = seen.iter().find(|(_, t)| *t == token) {
                return Err(KeyError::new(
                    at,
                    format!(
                        "the same token as {other}: each role and each node \
                         needs its own token"
                    ),
                )
                .into());
            }
            seen.push((at, token));
        }
        Ok(())
    }
}

/// `path` taken from `base` when relative.
/// `rollout.database`: not empty when given.
fn database(db: Option<&str>, default: &Path) -> Result<PathBuf, KeyError> {
    match db {
        Some("") => Err(KeyError::new(key("database"), "must not be empty")),
        Some(db) => Ok(PathBuf::from(db)),
        None => Ok(default.to_owned()),
    }
}

/// Where the tokens come from: the file's lists and files (relative to
/// `base`); node tokens bound to their node ids.
fn token_sources(raw: &RawRolloutConfig, base: Option<&Path>) -> Result<TokenSources, KeyError> {
    let node_tokens = match &raw.node_tokens {
        None => BTreeMap::new(),
        Some(RawNodeTokens::Bound(map)) => map.clone(),
        Some(RawNodeTokens::Shared(_)) => {
            return Err(KeyError::new(
                key("node_tokens"),
                "bind each node token to its node: [rollout.node_tokens] \
                 with `<node id> = \"<token>\"` lines, or node_token_dir",
            ));
        }
    };
    let files = |list: &Option<Vec<PathBuf>>| -> Vec<PathBuf> {
        list.iter()
            .flatten()
            .map(|p| rebase(p.clone(), base))
            .collect()
    };
    Ok(TokenSources {
        tokens: raw.tokens.clone().unwrap_or_default(),
        token_files: files(&raw.token_files),
        viewer_tokens: raw.viewer_tokens.clone().unwrap_or_default(),
        viewer_token_files: files(&raw.viewer_token_files),
        node_tokens,
        node_token_dir: raw.node_token_dir.clone().map(|p| rebase(p, base)),
        gateway_token: raw.gateway_token.clone(),
        gateway_token_file: raw.gateway_token_file.clone().map(|p| rebase(p, base)),
    })
}

/// A duration in milliseconds at `at`: `default` when unset, at least `min`.
fn ms(at: KeyPath, v: Option<u64>, default: Duration, min: u64) -> Result<Duration, KeyError> {
    match v {
        None => Ok(default),
        Some(v) if v < min => Err(KeyError::new(at, format!("must be at least {min}"))),
        Some(v) => Ok(Duration::from_millis(v)),
    }
}

/// Heartbeats, retries and the waits of the scheduler.
fn timings(raw: &RawRolloutConfig, cfg: &mut RolloutConfig) -> Result<(), KeyError> {
    cfg.heartbeat_interval = ms(
        key("heartbeat_interval_ms"),
        raw.heartbeat_interval_ms,
        cfg.heartbeat_interval,
        10,
    )?;
    cfg.heartbeat_timeout = ms(
        key("heartbeat_timeout_ms"),
        raw.heartbeat_timeout_ms,
        cfg.heartbeat_timeout,
        100,
    )?;
    if cfg.heartbeat_timeout <= cfg.heartbeat_interval {
        return Err(KeyError::new(
            key("heartbeat_timeout_ms"),
            "must be longer than heartbeat_interval_ms",
        ));
    }
    cfg.max_retries = raw.max_retries.unwrap_or(cfg.max_retries);
    cfg.result_grace = ms(
        key("result_grace_ms"),
        raw.result_grace_ms,
        cfg.result_grace,
        0,
    )?;
    cfg.no_node_timeout = ms(
        key("no_node_timeout_ms"),
        raw.no_node_timeout_ms,
        cfg.no_node_timeout,
        100,
    )?;
    cfg.push_timeout = ms(
        key("push_timeout_ms"),
        raw.push_timeout_ms,
        cfg.push_timeout,
        10,
    )?;
    Ok(())
}

/// The database's retention, request bodies and durability.
fn storage(raw: &RawRolloutConfig, cfg: &mut RolloutConfig) -> Result<(), KeyError> {
    cfg.retention = match raw.retention_secs {
        None => None,
        Some(0) => return Err(KeyError::new(key("retention_secs"), "must be at least 1")),
        Some(s) => Some(Duration::from_secs(s)),
    };
    if let Some(n) = raw.max_body_bytes {
        if n < 1024 {
            return Err(KeyError::new(
                key("max_body_bytes"),
                "must be at least 1024",
            ));
        }
        cfg.max_body_bytes = usize::try_from(n).unwrap_or(usize::MAX);
    }
    cfg.synchronous = match raw.synchronous.as_deref() {
        None | Some("normal") => Synchronous::Normal,
        Some("full") => Synchronous::Full,
        Some(other) => {
            return Err(KeyError::new(
                key("synchronous"),
                format!("{other:?}: use \"normal\" or \"full\""),
            ));
        }
    };
    Ok(())
}

/// `[rollout.callback]`.
fn callback(cb: &RawCallback) -> Result<CallbackConfig, KeyError> {
    let at = |k: &str| key("callback").key(k);
    let d = CallbackConfig::default();
    Ok(CallbackConfig {
        max_attempts: match cb.max_attempts {
            Some(0) => return Err(KeyError::new(at("max_attempts"), "must be at least 1")),
            Some(n) => n,
            None => d.max_attempts,
        },
        initial_backoff: ms(
            at("initial_backoff_ms"),
            cb.initial_backoff_ms,
            d.initial_backoff,
            1,
        )?,
        max_backoff: ms(at("max_backoff_ms"), cb.max_backoff_ms, d.max_backoff, 1)?,
        timeout: ms(at("timeout_ms"), cb.timeout_ms, d.timeout, 10)?,
    })
}

fn rebase(path: PathBuf, base: Option<&Path>) -> PathBuf {
    match base {
        Some(b) if path.is_relative() => b.join(path),
        _ => path,
    }
}

/// The files of a node token directory, by node id (dot files, as the
/// `..data` links of a mounted Kubernetes secret, are skipped).
fn node_token_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, KeyError> {
    let err =
        |e: std::io::Error| KeyError::new(key("node_token_dir"), format!("{}: {e}", dir.display()));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        if path.is_file() {
            out.push((name, path));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_with_other_tables_parses() {
        let text = r#"
[agent]
state_dir = "/x"
[rollout]
listen = "127.0.0.1:9000"
database = "r.sqlite"
tokens = ["trainer-token"]
gateway_token = "gateway-token"
heartbeat_timeout_ms = 500
heartbeat_interval_ms = 100
[rollout.node_tokens]
node-a = "token-of-node-a"
[rollout.callback]
max_attempts = 3
"#;
        let mut cfg = RolloutConfig::from_toml(text, Some(Path::new("/etc/polar"))).unwrap();
        cfg.finish_tokens([], ["node-b=token-of-node-b".into()])
            .unwrap();
        assert_eq!(cfg.listen.port(), 9000);
        assert_eq!(cfg.database, PathBuf::from("/etc/polar/r.sqlite"));
        assert_eq!(
            cfg.node_tokens.keys().collect::<Vec<_>>(),
            ["node-a", "node-b"]
        );
        assert_eq!(cfg.gateway_token, "gateway-token");
        assert_eq!(cfg.callback.max_attempts, 3);
        assert_eq!(cfg.policy, None);
        assert_eq!(cfg.limits, ServeLimits::default());
        assert!(!cfg.tls.serves_https());
        let cfg = RolloutConfig::from_toml(
            "[rollout]\nmax_connections = 16\nheader_read_timeout_ms = 2500\n\
             [rollout.tls]\ncert_file = \"tls/s.crt\"\nkey_file = \"tls/s.key\"\n\
             client_ca_file = \"/ca.crt\"\n",
            Some(Path::new("/etc/polar")),
        )
        .unwrap();
        assert_eq!(cfg.limits.max_connections, 16);
        assert_eq!(cfg.limits.header_read_timeout, Duration::from_millis(2500));
        assert_eq!(
            cfg.tls.identity,
            Some(("/etc/polar/tls/s.crt".into(), "/etc/polar/tls/s.key".into()))
        );
        assert_eq!(cfg.tls.client_ca_file, Some("/ca.crt".into()));
        let cfg = RolloutConfig::from_toml(
            "[rollout.policy]\nupload_roots = [\"/srv/tasks\"]\nallow_host_network = true",
            None,
        )
        .unwrap();
        let p = cfg.policy.unwrap();
        assert_eq!(p.upload_roots, vec![PathBuf::from("/srv/tasks")]);
        assert!(p.allow_host_network);
    }

    #[test]
    fn the_example_file_parses_and_its_tokens_are_refused() {
        let text = include_str!("../../../../config/rollout.example.toml");
        let mut cfg = RolloutConfig::from_toml(text, None).unwrap();
        assert_eq!(cfg.heartbeat_timeout, Duration::from_secs(10));
        let e = cfg.finish_tokens([], []).unwrap_err().to_string();
        assert!(
            e.starts_with("rollout.tokens[0]: this is an example token"),
            "{e}"
        );
    }

    fn identities(text: &str) -> Result<RolloutConfig, String> {
        let mut cfg = RolloutConfig::from_toml(text, None).map_err(|e| e.to_string())?;
        cfg.finish_tokens([], []).map_err(|e| e.to_string())?;
        Ok(cfg)
    }

    #[test]
    fn every_role_needs_its_own_token() {
        let ok = "[rollout]\ntokens = [\"trainer-token-1\"]\ngateway_token = \"gateway-token-1\"\n\
                  [rollout.node_tokens]\nnode-a = \"node-a-token-1\"\nnode-b = \"node-b-token-1\"\n";
        identities(ok).unwrap();
        let cases = [
            // A trainer token reused as a node token.
            (
                ok.replace("node-a-token-1", "trainer-token-1"),
                "rollout.node_tokens.node-a: the same token as rollout.tokens[0]: \
                 each role and each node needs its own token",
            ),
            // Two nodes sharing one token.
            (
                ok.replace("node-b-token-1", "node-a-token-1"),
                "rollout.node_tokens.node-b: the same token as rollout.node_tokens.node-a",
            ),
            // The gateway token is a node's.
            (
                ok.replace("gateway-token-1", "node-b-token-1"),
                "rollout.gateway_token: the same token as rollout.node_tokens.node-b",
            ),
            (
                ok.replace("gateway_token = \"gateway-token-1\"\n", ""),
                "rollout.gateway_token: missing",
            ),
            (
                "[rollout]\ntokens = [\"trainer-token-1\"]\ngateway_token = \"gateway-token-1\"\n"
                    .to_owned(),
                "rollout.node_tokens: no node token",
            ),
            (
                ok.replace("node-a-token-1", "change-me-node-token"),
                "rollout.node_tokens.node-a: this is an example token",
            ),
            (
                ok.replace("node-a = ", "\"a b\" = "),
                "rollout.node_tokens.\"a b\": not a node id",
            ),
            (
                ok.replace("trainer-token-1", "short"),
                "rollout.tokens[0]: a token must be at least 8 characters",
            ),
        ];
        for (text, want) in cases {
            let e = identities(&text).unwrap_err();
            assert!(e.starts_with(want), "{text}\n{e}");
        }
        // The list form of earlier versions names the fix.
        let e = RolloutConfig::from_toml("[rollout]\nnode_tokens = [\"node-token-1\"]", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("rollout.node_tokens: bind each node token to its node"),
            "{e}"
        );
        // The environment's form is NODE_ID=TOKEN.
        let mut cfg = RolloutConfig::from_toml(ok, None).unwrap();
        let e = cfg
            .finish_tokens([], ["no-equals-sign".into()])
            .unwrap_err();
        assert!(e.to_string().contains("NODE_ID=TOKEN"), "{e}");
    }

    #[test]
    fn tokens_come_from_files_and_rotate_on_reload() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("nodes")).unwrap();
        std::fs::write(d.join("trainer"), "trainer-from-file\n").unwrap();
        std::fs::write(d.join("gateway"), "gateway-from-file\n").unwrap();
        std::fs::write(d.join("nodes/node-a"), "node-a-from-file\n").unwrap();
        // A mounted Kubernetes secret's own links are skipped.
        std::fs::write(d.join("nodes/..data"), "not-a-node-token").unwrap();
        let text = "[rollout]\ntoken_files = [\"trainer\"]\ngateway_token_file = \"gateway\"\n\
                    node_token_dir = \"nodes\"\n";
        let mut cfg = RolloutConfig::from_toml(text, Some(d)).unwrap();
        cfg.finish_tokens([], []).unwrap();
        assert_eq!(cfg.tokens, ["trainer-from-file"]);
        assert_eq!(cfg.gateway_token, "gateway-from-file");
        assert_eq!(cfg.node_tokens["node-a"], "node-a-from-file");
        // Rotation: new files, a reload.
        std::fs::write(d.join("nodes/node-a"), "node-a-rotated\n").unwrap();
        std::fs::write(d.join("nodes/node-b"), "node-b-added\n").unwrap();
        cfg.reload_tokens().unwrap();
        assert_eq!(cfg.node_tokens["node-a"], "node-a-rotated");
        assert_eq!(cfg.node_tokens["node-b"], "node-b-added");
        // A reload that would break the rules changes nothing.
        std::fs::write(d.join("nodes/node-b"), "trainer-from-file").unwrap();
        let e = cfg.reload_tokens().unwrap_err().to_string();
        assert!(e.contains("the same token as rollout.tokens[0]"), "{e}");
        assert_eq!(cfg.node_tokens["node-b"], "node-b-added");
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("[rollout]\nlisten = \"nope\"", "rollout.listen:"),
            (
                "[rollout]\nheartbeat_timeout_ms = 5",
                "rollout.heartbeat_timeout_ms:",
            ),
            ("[rollout]\ncolour = 1", "rollout"),
            ("[rollout]\nmax_retries = \"x\"", "rollout.max_retries:"),
            (
                "[rollout.callback]\nmax_attempts = 0",
                "rollout.callback.max_attempts:",
            ),
            (
                "[rollout.policy]\nupload_roots = [\"rel\"]",
                "rollout.policy.upload_roots[0]:",
            ),
            (
                "[rollout]\nheader_read_timeout_ms = 5",
                "rollout.header_read_timeout_ms: must be from 100",
            ),
            (
                "[rollout]\nmax_connections = 0",
                "rollout.max_connections: must be from 1",
            ),
            (
                "[rollout.tls]\nkey_file = \"k\"",
                "rollout.tls.cert_file: missing",
            ),
            (
                "[rollout.tls]\nverify = true",
                "rollout.tls.verify: unknown field `verify`",
            ),
            (
                "[rollout]\nverify_gateway_as = \"name\"",
                "rollout.verify_gateway_as: \"name\": use",
            ),
            (
                "[rollout.policy]\nupload_roots = [\"/a\"]\nwritable_mount_roots = [\"/a/b\"]",
                "rollout.policy.writable_mount_roots[0]: /a/b overlaps upload_roots[0]",
            ),
        ];
        for (text, want) in cases {
            let e = RolloutConfig::from_toml(text, None).unwrap_err();
            assert!(e.to_string().starts_with(want), "{text}: {e}");
        }
        let mut cfg = RolloutConfig::from_toml("", None).unwrap();
        let e = cfg.finish_tokens([], []).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("rollout.tokens: no trainer token"),
            "{e}"
        );
    }
}
