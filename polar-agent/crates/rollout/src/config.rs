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
//! tokens = ["trainer-secret"]       # trainers, dashboards, `polar submit`
//! node_tokens = ["node-secret"]     # gateways (default: `tokens`)
//! gateway_token = "server-secret"   # sent to gateways (default: first node token)
//! heartbeat_interval_ms = 2000
//! heartbeat_timeout_ms = 10000
//! max_retries = 2
//! [rollout.callback]
//! max_attempts = 8
//! [rollout.policy]                  # optional: refuse tasks outside it at submission
//! upload_roots = ["/srv/tasks"]     # the keys of a gateway's [gateway.policy]
//! ```
//!
//! `[rollout.policy]` is the node-side policy ([`polar_spec::policy`]) as
//! the server knows it: when present, a task whose spec asks for more is a
//! 400 naming the field, before any node sees it. The nodes check again
//! against their own `[gateway.policy]` whatever the server did.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use polar_spec::KeyPath;
use polar_spec::policy::{Policy, RawPolicy};

/// The environment variable adding a trainer token.
pub const TOKEN_ENV: &str = "POLAR_ROLLOUT_TOKEN";
/// The environment variable adding a gateway token.
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
    /// The TOML does not parse or has a wrong type or unknown key.
    #[error("{key}: {reason}")]
    Parse {
        /// The key path (`rollout.listen`).
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A value is out of range.
    #[error("{key}: {reason}")]
    Invalid {
        /// The key path.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(key: &str, reason: impl Into<String>) -> RolloutConfigError {
    RolloutConfigError::Invalid {
        key: format!("rollout.{key}"),
        reason: reason.into(),
    }
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
    /// Gateway tokens.
    pub node_tokens: Option<Vec<String>>,
    /// Token sent to gateways.
    pub gateway_token: Option<String>,
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
    /// Largest request body.
    pub max_body_bytes: Option<u64>,
    /// `normal` or `full`.
    pub synchronous: Option<String>,
    /// `[rollout.callback]`.
    #[serde(default)]
    pub callback: RawCallback,
    /// `[rollout.policy]`.
    pub policy: Option<RawPolicy>,
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
    /// Bearer tokens accepted on the trainer API (tasks, events, status).
    pub tokens: Vec<String>,
    /// Bearer tokens accepted on the gateway API (nodes, sessions).
    pub node_tokens: Vec<String>,
    /// Bearer token the server presents to gateways.
    pub gateway_token: String,
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
    /// Largest request body.
    pub max_body_bytes: usize,
    /// SQLite durability.
    pub synchronous: Synchronous,
    /// Callback delivery.
    pub callback: CallbackConfig,
    /// The policy submissions are checked against (`None`: only their
    /// form is checked; the nodes check their own policy).
    pub policy: Option<Policy>,
}

impl RolloutConfig {
    /// Defaults with the given database and one token for both sides.
    pub fn new(database: impl Into<PathBuf>, token: impl Into<String>) -> Self {
        let token = token.into();
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            database: database.into(),
            tokens: vec![token.clone()],
            node_tokens: vec![token.clone()],
            gateway_token: token,
            callback_token: None,
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(10),
            max_retries: 2,
            result_grace: Duration::from_secs(60),
            no_node_timeout: Duration::from_secs(600),
            push_timeout: Duration::from_secs(5),
            max_body_bytes: 8 << 20,
            synchronous: Synchronous::Normal,
            callback: CallbackConfig::default(),
            policy: None,
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
        let de = toml::Deserializer::parse(text).map_err(|e| RolloutConfigError::Parse {
            key: "top level".into(),
            reason: e.message().to_owned(),
        })?;
        let raw: RawFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            RolloutConfigError::Parse {
                key: if key == "." { "top level".into() } else { key },
                reason: e.into_inner().message().to_owned(),
            }
        })?;
        Self::try_from_raw(raw.rollout, base)
    }

    /// Applies the defaults and checks every value.
    pub fn try_from_raw(
        raw: RawRolloutConfig,
        base: Option<&Path>,
    ) -> Result<Self, RolloutConfigError> {
        let mut cfg = Self::new("rollout.sqlite", String::new());
        cfg.tokens.clear();
        cfg.node_tokens.clear();
        if let Some(listen) = raw.listen {
            cfg.listen = listen
                .parse()
                .map_err(|e| invalid("listen", format!("{listen:?}: {e}")))?;
        }
        if let Some(db) = raw.database {
            if db.is_empty() {
                return Err(invalid("database", "must not be empty"));
            }
            cfg.database = PathBuf::from(db);
        }
        if cfg.database.is_relative()
            && let Some(base) = base
        {
            cfg.database = base.join(&cfg.database);
        }
        cfg.tokens = raw.tokens.unwrap_or_default();
        cfg.node_tokens = raw.node_tokens.unwrap_or_default();
        for (key, list) in [("tokens", &cfg.tokens), ("node_tokens", &cfg.node_tokens)] {
            if let Some(i) = list.iter().position(|t| t.len() < 8) {
                return Err(invalid(
                    &format!("{key}[{i}]"),
                    "a token must be at least 8 characters",
                ));
            }
        }
        cfg.gateway_token = raw.gateway_token.unwrap_or_default();
        cfg.callback_token = raw.callback_token;
        let ms = |key: &str, v: Option<u64>, default: Duration, min: u64| match v {
            None => Ok(default),
            Some(v) if v < min => Err(invalid(key, format!("must be at least {min}"))),
            Some(v) => Ok(Duration::from_millis(v)),
        };
        cfg.heartbeat_interval = ms(
            "heartbeat_interval_ms",
            raw.heartbeat_interval_ms,
            cfg.heartbeat_interval,
            10,
        )?;
        cfg.heartbeat_timeout = ms(
            "heartbeat_timeout_ms",
            raw.heartbeat_timeout_ms,
            cfg.heartbeat_timeout,
            100,
        )?;
        if cfg.heartbeat_timeout <= cfg.heartbeat_interval {
            return Err(invalid(
                "heartbeat_timeout_ms",
                "must be longer than heartbeat_interval_ms",
            ));
        }
        cfg.max_retries = raw.max_retries.unwrap_or(cfg.max_retries);
        cfg.result_grace = ms("result_grace_ms", raw.result_grace_ms, cfg.result_grace, 0)?;
        cfg.no_node_timeout = ms(
            "no_node_timeout_ms",
            raw.no_node_timeout_ms,
            cfg.no_node_timeout,
            100,
        )?;
        cfg.push_timeout = ms("push_timeout_ms", raw.push_timeout_ms, cfg.push_timeout, 10)?;
        if let Some(n) = raw.max_body_bytes {
            if n < 1024 {
                return Err(invalid("max_body_bytes", "must be at least 1024"));
            }
            cfg.max_body_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        cfg.synchronous = match raw.synchronous.as_deref() {
            None | Some("normal") => Synchronous::Normal,
            Some("full") => Synchronous::Full,
            Some(other) => {
                return Err(invalid(
                    "synchronous",
                    format!("{other:?}: use \"normal\" or \"full\""),
                ));
            }
        };
        let cb = raw.callback;
        let d = CallbackConfig::default();
        cfg.callback = CallbackConfig {
            max_attempts: match cb.max_attempts {
                Some(0) => return Err(invalid("callback.max_attempts", "must be at least 1")),
                Some(n) => n,
                None => d.max_attempts,
            },
            initial_backoff: ms(
                "callback.initial_backoff_ms",
                cb.initial_backoff_ms,
                d.initial_backoff,
                1,
            )?,
            max_backoff: ms(
                "callback.max_backoff_ms",
                cb.max_backoff_ms,
                d.max_backoff,
                1,
            )?,
            timeout: ms("callback.timeout_ms", cb.timeout_ms, d.timeout, 10)?,
        };
        cfg.policy = raw
            .policy
            .as_ref()
            .map(|p| Policy::from_raw(p, &KeyPath::root().key("rollout").key("policy")))
            .transpose()
            .map_err(|e| RolloutConfigError::Invalid {
                key: e.key.to_string(),
                reason: e.reason,
            })?;
        Ok(cfg)
    }

    /// Adds tokens from the environment ([`TOKEN_ENV`], [`NODE_TOKEN_ENV`])
    /// and flags, fills the defaults that depend on them, and checks that
    /// both sides have a token.
    pub fn finish_tokens(
        &mut self,
        tokens: impl IntoIterator<Item = String>,
        node_tokens: impl IntoIterator<Item = String>,
    ) -> Result<(), RolloutConfigError> {
        self.tokens
            .extend(tokens.into_iter().filter(|t| !t.is_empty()));
        self.node_tokens
            .extend(node_tokens.into_iter().filter(|t| !t.is_empty()));
        if self.tokens.is_empty() {
            return Err(invalid(
                "tokens",
                format!("no trainer token: set rollout.tokens, {TOKEN_ENV} or --token"),
            ));
        }
        if self.node_tokens.is_empty() {
            self.node_tokens.clone_from(&self.tokens);
        }
        if self.gateway_token.is_empty() {
            self.gateway_token.clone_from(&self.node_tokens[0]);
        }
        Ok(())
    }
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
heartbeat_timeout_ms = 500
heartbeat_interval_ms = 100
[rollout.callback]
max_attempts = 3
"#;
        let mut cfg = RolloutConfig::from_toml(text, Some(Path::new("/etc/polar"))).unwrap();
        cfg.finish_tokens([], []).unwrap();
        assert_eq!(cfg.listen.port(), 9000);
        assert_eq!(cfg.database, PathBuf::from("/etc/polar/r.sqlite"));
        assert_eq!(cfg.node_tokens, vec!["trainer-token".to_owned()]);
        assert_eq!(cfg.gateway_token, "trainer-token");
        assert_eq!(cfg.callback.max_attempts, 3);
        assert_eq!(cfg.policy, None);
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
    fn the_example_file_parses() {
        let text = include_str!("../../../../config/rollout.example.toml");
        let mut cfg = RolloutConfig::from_toml(text, None).unwrap();
        cfg.finish_tokens([], []).unwrap();
        assert_eq!(cfg.gateway_token, "change-me-node-token");
        assert_eq!(cfg.heartbeat_timeout, Duration::from_secs(10));
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
            ("[rollout]\ntokens = [\"short\"]", "rollout.tokens[0]:"),
            (
                "[rollout.policy]\nupload_roots = [\"rel\"]",
                "rollout.policy.upload_roots[0]:",
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
        assert!(e.to_string().starts_with("rollout.tokens:"), "{e}");
    }
}
