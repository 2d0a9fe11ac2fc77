//! [`RawConfig`]: the config file exactly as written, deserialized by serde
//! with `deny_unknown_fields` everywhere. Absent keys stay `None` here; the
//! defaults and all checks are applied by `validated.rs`.

use serde::Deserialize;

use super::route::{ActionKind, DefaultAction, ProviderHint};
use super::sections::LogFormat;
use polar_inference::BackendConfig;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[agent]`.
    #[serde(default)]
    pub agent: RawAgent,
    /// `[proxy]`.
    #[serde(default)]
    pub proxy: RawProxy,
    /// `[ca]`.
    #[serde(default)]
    pub ca: RawCa,
    /// `[dns]`.
    #[serde(default)]
    pub dns: RawDns,
    /// `[sandbox]`.
    #[serde(default)]
    pub sandbox: RawSandbox,
    /// `default_action`, a top-level key.
    pub default_action: Option<DefaultAction>,
    /// `[[route]]`; `None` (no route key at all) selects the built-in routes,
    /// `route = []` means no routes.
    pub route: Option<Vec<RawRoute>>,
    /// `[[backend]]`: inference backends, in the inference module's own
    /// serde form; `None` (no backend key at all) selects the built-in
    /// `local` backend.
    pub backend: Option<Vec<BackendConfig>>,
    /// `[gateway]`: the gateway's settings, checked by
    /// the agent's `gateway::config` (`polar agent`).
    pub gateway: Option<toml::Table>,
    /// `[rollout]`: the rollout server's settings, checked by
    /// `polar_rollout::config` (`polar rollout serve`).
    pub rollout: Option<toml::Table>,
    /// `[harness.NAME]`: harnesses defined here, which a task names
    /// `custom:NAME`.
    #[serde(default)]
    pub harness: std::collections::BTreeMap<String, super::harness::RawHarness>,
}

/// `[agent]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAgent {
    /// `state_dir`: where the agent keeps its CA, session logs and exports.
    pub state_dir: Option<String>,
    /// `log_format`: `text` or `json`.
    pub log_format: Option<LogFormat>,
    /// `capture_durability`: `power` or `process`.
    pub capture_durability: Option<polar_capture::Durability>,
    /// `capture_journal_bytes`: the capture journal's segment size.
    pub capture_journal_bytes: Option<u64>,
}

/// `[sandbox]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSandbox {
    /// `disk_bytes`: each sandbox's disk quota (workspace, HOME and /tmp
    /// together).
    pub disk_bytes: Option<u64>,
    /// `memory_bytes`: the memory limit of a sandbox whose spec sets none.
    pub memory_bytes: Option<u64>,
    /// `pids`: the process limit of a sandbox whose spec sets none.
    pub pids: Option<u32>,
    /// `docker_host`: the Docker engine of the docker runtime.
    pub docker_host: Option<String>,
    /// `uid_first`: the first of the sandboxes' uids (one per session).
    pub uid_first: Option<u32>,
    /// `uid_count`: how many uids the sandboxes may take.
    pub uid_count: Option<u32>,
    /// `view_dirs`: host directories native sandboxes are shown read-only
    /// besides the system's (`/opt`, ...).
    pub view_dirs: Option<Vec<String>>,
}

/// `[proxy]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProxy {
    /// `base_url_listen`: socket address for base-URL mode.
    pub base_url_listen: Option<String>,
    /// `max_body_bytes`: largest request body accepted.
    pub max_body_bytes: Option<u64>,
    /// `header_timeout_ms`: time allowed to receive request headers.
    pub header_timeout_ms: Option<u64>,
    /// `idle_timeout_ms`: longest silence on a connection.
    pub idle_timeout_ms: Option<u64>,
    /// `max_connections`: open connections across all sandboxes.
    pub max_connections: Option<u32>,
    /// `max_session_connections`: open connections of one session.
    pub max_session_connections: Option<u32>,
    /// `max_session_streams`: requests in flight of one session.
    pub max_session_streams: Option<u32>,
    /// `max_session_body_bytes`: request-body bytes one session buffers.
    pub max_session_body_bytes: Option<u64>,
    /// `body_budget_bytes`: request-body bytes buffered on the node.
    pub body_budget_bytes: Option<u64>,
    /// `admission_wait_ms`: how long a connection or body waits for a cap.
    pub admission_wait_ms: Option<u64>,
}

/// `[ca]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCa {
    /// `validity_days`: lifetime of the CA certificate.
    pub validity_days: Option<u32>,
    /// `leaf_validity_hours`: lifetime of each leaf certificate.
    pub leaf_validity_hours: Option<u32>,
    /// `leaf_cache_size`: leaf certificates kept in memory.
    pub leaf_cache_size: Option<u32>,
}

/// `[dns]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDns {
    /// `fake_range`: IPv4 CIDR the fake answers for model hosts come from.
    pub fake_range: Option<String>,
    /// `ttl_secs`: TTL of the agent's DNS answers.
    pub ttl_secs: Option<u32>,
}

/// One `[[route]]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// `host`: `name.example`, `*.suffix.example` or an IP literal.
    pub host: String,
    /// `ports`: defaults to `[443, 80]`.
    pub ports: Option<Vec<u16>>,
    /// `action`: `model`, `pass` or `deny`.
    pub action: ActionKind,
    /// `provider`: wire-protocol hint, model routes only.
    pub provider: Option<ProviderHint>,
    /// `upstream`: base URL the forwarding stage sends to, model routes only.
    pub upstream: Option<String>,
    /// `backend`: name of the `[[backend]]` model calls go to, model routes
    /// only.
    pub backend: Option<String>,
    /// `addresses`: addresses and networks a pass route may relay to
    /// besides what its name resolves to, pass routes only.
    pub addresses: Option<Vec<String>>,
    /// `name`: optional label.
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RawConfig, String> {
        toml::from_str(text).map_err(|e| e.message().to_owned())
    }

    #[test]
    fn empty_file_is_all_absent() {
        assert_eq!(parse(""), Ok(RawConfig::default()));
    }

    #[test]
    fn mirrors_the_file() {
        let raw = parse(
            "default_action = \"pass\"\n\
             [agent]\nlog_format = \"json\"\n\
             [[route]]\nhost = \"h\"\naction = \"model\"\nprovider = \"openai_responses\"\n",
        );
        let Ok(raw) = raw else {
            panic!("{raw:?}");
        };
        assert_eq!(raw.default_action, Some(DefaultAction::Pass));
        assert_eq!(raw.agent.log_format, Some(LogFormat::Json));
        let routes = raw.route.unwrap_or_default();
        assert_eq!(routes.len(), 1);
        assert_eq!(routes[0].provider, Some(ProviderHint::OpenAiResponses));
        assert_eq!(parse("route = []").map(|r| r.route), Ok(Some(vec![])));
    }

    #[test]
    fn unknown_keys_and_values_are_refused_everywhere() {
        for (text, needle) in [
            ("bogus = 1", "unknown field `bogus`"),
            ("[agent]\nstate = \"/x\"", "unknown field `state`"),
            ("[proxy]\nmax_body = 1", "unknown field `max_body`"),
            ("[ca]\nvalidity = 1", "unknown field `validity`"),
            ("[dns]\nrange = \"x\"", "unknown field `range`"),
            (
                "[[route]]\nhots = \"a\"\naction = \"pass\"",
                "unknown field `hots`",
            ),
            (
                "[[route]]\nhost = \"a\"\naction = \"modle\"",
                "unknown variant `modle`",
            ),
            (
                "[[route]]\nhost = \"a\"\naction = \"model\"\nprovider = \"claude\"",
                "unknown variant `claude`",
            ),
            ("default_action = \"model\"", "unknown variant `model`"),
            ("[agent]\nlog_format = \"xml\"", "unknown variant `xml`"),
            ("[[route]]\nhost = \"a\"", "missing field `action`"),
            (
                "[[backend]]\nname = \"b\"\ndialect = \"vllm\"\nreplicas = []\nserved_model = \"m\"\nmodel = \"x\"",
                "unknown field `model`",
            ),
            (
                "[[backend]]\nname = \"b\"\ndialect = \"tgi\"\nreplicas = []\nserved_model = \"m\"",
                "unknown variant `tgi`",
            ),
            (
                "[[route]]\nhost = \"a\"\naction = \"pass\"\nports = [70000]",
                "expected u16",
            ),
            ("[proxy]\nmax_connections = -1", "expected u32"),
        ] {
            match parse(text) {
                Ok(raw) => panic!("{text:?} parsed as {raw:?}"),
                Err(message) => assert!(message.contains(needle), "{text:?}: {message}"),
            }
        }
    }
}
