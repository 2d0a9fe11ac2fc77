//! `polar config check FILE`: [`check_file`] validates a file and returns a
//! short human [`Summary`] of what it configures.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::cidr::Ipv4Cidr;
use super::error::ConfigError;
use super::host::HostPattern;
use super::route::{ActionKind, DefaultAction};
use super::validated::{Config, RouteSource};

/// What a valid config file sets up, for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The file checked.
    pub path: PathBuf,
    /// The file's routes or the built-in ones.
    pub route_source: RouteSource,
    /// Number of `model` routes.
    pub model_routes: usize,
    /// Number of `pass` routes.
    pub pass_routes: usize,
    /// Number of `deny` routes.
    pub deny_routes: usize,
    /// What applies to everything else.
    pub default_action: DefaultAction,
    /// The hosts the CA may sign for.
    pub intercepted_hosts: Vec<HostPattern>,
    /// Base-URL mode listener, if enabled.
    pub base_url_listen: Option<SocketAddr>,
    /// Fake DNS range for model hosts.
    pub fake_range: Ipv4Cidr,
    /// The backends: name, dialect and number of replicas.
    pub backends: Vec<(String, &'static str, usize)>,
    /// The harnesses defined (`[harness.NAME]`): name and API.
    pub harnesses: Vec<(String, String)>,
}

impl Summary {
    /// The summary of `config`, read from `path`.
    pub fn new(path: &Path, config: &Config) -> Self {
        let count = |kind: ActionKind| {
            config
                .rules
                .routes()
                .iter()
                .filter(|route| route.action.kind() == kind)
                .count()
        };
        Self {
            path: path.to_owned(),
            route_source: config.route_source,
            model_routes: count(ActionKind::Model),
            pass_routes: count(ActionKind::Pass),
            deny_routes: count(ActionKind::Deny),
            default_action: config.rules.default_action(),
            intercepted_hosts: config.rules.intercepted_hosts().to_vec(),
            base_url_listen: config.proxy.base_url_listen,
            fake_range: config.dns.fake_range,
            backends: config
                .backends
                .iter()
                .map(|b| (b.name.clone(), b.dialect.as_str(), b.replicas.len()))
                .collect(),
            harnesses: config
                .harnesses
                .values()
                .map(|h| {
                    let api = serde_json::to_value(h.api)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    (h.name.clone(), api)
                })
                .collect(),
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.model_routes + self.pass_routes + self.deny_routes;
        let source = match self.route_source {
            RouteSource::File => "",
            RouteSource::BuiltIn => " (built-in)",
        };
        writeln!(f, "{}: valid", self.path.display())?;
        writeln!(
            f,
            "routes: {total}{source}: {} model, {} pass, {} deny; everything else: {}",
            self.model_routes,
            self.pass_routes,
            self.deny_routes,
            self.default_action.kind()
        )?;
        let hosts: Vec<String> = self
            .intercepted_hosts
            .iter()
            .map(ToString::to_string)
            .collect();
        if hosts.is_empty() {
            writeln!(f, "intercepted hosts: none")?;
        } else {
            writeln!(f, "intercepted hosts: {}", hosts.join(", "))?;
        }
        match self.base_url_listen {
            Some(addr) => writeln!(f, "base-URL listener: {addr}")?,
            None => writeln!(f, "base-URL listener: off")?,
        }
        writeln!(f, "fake DNS range: {}", self.fake_range)?;
        let backends: Vec<String> = self
            .backends
            .iter()
            .map(|(name, dialect, n)| {
                format!(
                    "{name} ({dialect}, {n} replica{})",
                    if *n == 1 { "" } else { "s" }
                )
            })
            .collect();
        if backends.is_empty() {
            write!(f, "backends: none")?;
        } else {
            write!(f, "backends: {}", backends.join(", "))?;
        }
        if !self.harnesses.is_empty() {
            let harnesses: Vec<String> = self
                .harnesses
                .iter()
                .map(|(name, api)| format!("custom:{name} ({api})"))
                .collect();
            write!(f, "\nharnesses: {}", harnesses.join(", "))?;
        }
        Ok(())
    }
}

/// Reads and validates the config file at `path` and summarizes it.
pub fn check_file(path: impl AsRef<Path>) -> Result<Summary, ConfigError> {
    let path = path.as_ref();
    let config = Config::load(path)?;
    Ok(Summary::new(path, &config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarizes_the_example_file() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../config/polar.example.toml");
        let summary = match check_file(&path) {
            Ok(summary) => summary,
            Err(error) => panic!("{error}"),
        };
        assert_eq!(summary.model_routes, 5);
        assert_eq!(summary.pass_routes + summary.deny_routes, 0);
        assert_eq!(summary.base_url_listen, None);
        let text = summary.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("polar.example.toml: valid"), "{text}");
        assert_eq!(
            lines[1],
            "routes: 5: 5 model, 0 pass, 0 deny; everything else: deny"
        );
        assert!(lines[2].starts_with("intercepted hosts: api.anthropic.com, api.openai.com, "));
        assert_eq!(lines[3], "base-URL listener: off");
        assert_eq!(lines[4], "fake DNS range: 127.100.0.0/16");
        assert_eq!(lines[5], "backends: local (vllm, 1 replica)");
    }

    #[test]
    fn summarizes_builtins_and_listener() {
        let config = match Config::from_toml_str(
            "default_action = \"pass\"\n[proxy]\nbase_url_listen = \"127.0.0.1:8787\"\n",
        ) {
            Ok(config) => config,
            Err(error) => panic!("{error}"),
        };
        let text = Summary::new(Path::new("p.toml"), &config).to_string();
        assert!(
            text.contains("routes: 5 (built-in): 5 model, 0 pass, 0 deny; everything else: pass"),
            "{text}"
        );
        assert!(text.contains("base-URL listener: 127.0.0.1:8787"), "{text}");
        assert!(!text.contains("harnesses:"), "{text}");
        let config =
            match Config::from_toml_str("[harness.mine]\ncommand = [\"mine\"]\napi = \"gemini\"\n")
            {
                Ok(config) => config,
                Err(error) => panic!("{error}"),
            };
        let text = Summary::new(Path::new("p.toml"), &config).to_string();
        assert!(
            text.ends_with("\nharnesses: custom:mine (gemini)"),
            "{text}"
        );
    }

    #[test]
    fn reports_errors_with_the_file() {
        let Err(error) = check_file("/nonexistent/polar.toml") else {
            panic!("must fail");
        };
        assert!(
            error
                .to_string()
                .starts_with("cannot read /nonexistent/polar.toml: ")
        );
    }
}
