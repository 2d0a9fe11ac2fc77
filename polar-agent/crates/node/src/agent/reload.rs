//! Reloading the routing rules of a running agent (SIGHUP in the daemon):
//! the new configuration is validated by the caller, checked here against
//! what cannot change while running (the CA's name constraints, the
//! backends), and its rules are put in force for the proxy, the base-URL
//! listener and the DNS responder at once. A refused reload keeps the old
//! rules. Connections and requests in flight keep the decision they had.

use std::fmt;

use polar_config::{Config, DefaultAction};

use super::{AgentError, AgentParts, check_covers, constraints_for};

/// What a reload changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Routes before the reload.
    pub routes_before: usize,
    /// Routes now in force.
    pub routes_after: usize,
    /// The default action now in force.
    pub default_action: DefaultAction,
    /// Sections that differ from the running configuration but are only
    /// read at start (`agent`, `proxy`, `ca`, `dns`): not applied.
    pub not_applied: Vec<&'static str>,
}

impl fmt::Display for ReloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "routing rules reloaded: {} routes (was {}), default {:?}",
            self.routes_after, self.routes_before, self.default_action
        )?;
        if !self.not_applied.is_empty() {
            write!(
                f,
                "; changed but applied only at restart: [{}]",
                self.not_applied.join("], [")
            )?;
        }
        Ok(())
    }
}

impl AgentParts {
    /// Puts the routing rules of `new` (a validated configuration) in force.
    /// Refused, keeping the old rules, when the CA does not cover a host the
    /// new rules intercept ([`AgentError::CaTooNarrow`]) or when the
    /// backends differ ([`AgentError::BackendsChanged`]).
    pub fn reload(&self, new: Config) -> Result<ReloadSummary, AgentError> {
        let running = &self.config;
        if new.backends != running.backends {
            return Err(AgentError::BackendsChanged);
        }
        check_covers(&self.ca, &constraints_for(&new), &running.agent.state_dir)?;
        let mut not_applied = Vec::new();
        for (name, changed) in [
            ("agent", new.agent != running.agent),
            ("proxy", new.proxy != running.proxy),
            ("ca", new.ca != running.ca),
            ("dns", new.dns != running.dns),
        ] {
            if changed {
                not_applied.push(name);
            }
        }
        let routes_after = new.rules.routes().len();
        let default_action = new.rules.default_action();
        let old = self.rules.replace(new.rules);
        let summary = ReloadSummary {
            routes_before: old.routes().len(),
            routes_after,
            default_action,
            not_applied,
        };
        tracing::info!(%summary, "configuration reloaded");
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_config::RouteAction;
    use polar_proxy::pipeline::ModelPipeline;
    use std::sync::Arc;

    fn config(dir: &std::path::Path, routes: &str) -> Config {
        Config::from_toml_str(&format!(
            "backend = []\n[agent]\nstate_dir = \"{}\"\n{routes}",
            dir.display()
        ))
        .unwrap()
    }

    const TWO: &str = r#"
[[route]]
host = "api.anthropic.com"
action = "model"
upstream = "http://127.0.0.1:9"
[[route]]
host = "*.anthropic.com"
action = "model"
upstream = "http://127.0.0.1:9"
"#;

    fn parts(dir: &std::path::Path) -> AgentParts {
        let pipeline: Arc<dyn ModelPipeline> = Arc::new(
            polar_proxy::forward::Forward::new(std::time::Duration::from_secs(5)).unwrap(),
        );
        AgentParts::with_pipeline(config(dir, TWO), pipeline).unwrap()
    }

    #[tokio::test]
    async fn a_reload_changes_the_routes_everywhere_and_an_uncovered_host_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let parts = parts(dir.path());
        let snapshot = parts.proxy.rules();
        let model = |r: &polar_config::Rules, host: &str| {
            matches!(
                r.route(Some(host), None, 443).action,
                RouteAction::Model { .. }
            )
        };
        assert!(model(&parts.proxy.rules(), "console.anthropic.com"));

        // Narrower rules: the wildcard goes, a pass route comes.
        let narrower = config(
            dir.path(),
            r#"
[[route]]
host = "api.anthropic.com"
action = "model"
upstream = "http://127.0.0.1:9"
[[route]]
host = "localhost"
action = "pass"
"#,
        );
        let summary = parts.reload(narrower).unwrap();
        assert_eq!((summary.routes_before, summary.routes_after), (2, 2));
        assert!(summary.not_applied.is_empty(), "{summary}");
        let now = parts.proxy.rules();
        assert!(model(&now, "api.anthropic.com"));
        assert!(!model(&now, "console.anthropic.com"));
        // The DNS responder and the base-URL listener share the same rules.
        assert!(Arc::ptr_eq(&now, &parts.rules.current()));
        assert_eq!(
            polar_redirect::dns::DnsPolicy::decide(
                &super::super::RulesDns(parts.rules.clone()),
                "localhost"
            ),
            polar_redirect::dns::Resolution::Host
        );
        // A connection that took its snapshot before keeps its decision.
        assert!(model(&snapshot, "console.anthropic.com"));

        // A host outside the CA's constraints: refused, old rules kept.
        let uncovered = config(
            dir.path(),
            r#"
[[route]]
host = "api.openai.com"
action = "model"
upstream = "http://127.0.0.1:9"
"#,
        );
        let e = parts.reload(uncovered).unwrap_err();
        assert!(
            matches!(&e, AgentError::CaTooNarrow { missing, .. } if missing == "api.openai.com"),
            "{e}"
        );
        assert!(Arc::ptr_eq(&now, &parts.proxy.rules()));
    }

    #[tokio::test]
    async fn changed_backends_are_refused_and_start_only_sections_reported() {
        let dir = tempfile::tempdir().unwrap();
        let parts = parts(dir.path());
        let with_backend = Config::from_toml_str(&format!(
            "[agent]\nstate_dir = \"{}\"\n{TWO}\n[[backend]]\nname = \"b\"\ndialect = \"vllm\"\n\
             replicas = [\"http://127.0.0.1:9\"]\nserved_model = \"m\"\n",
            dir.path().display()
        ))
        .unwrap();
        let e = parts.reload(with_backend).unwrap_err();
        assert!(matches!(e, AgentError::BackendsChanged), "{e}");
        assert!(e.to_string().contains("restart"), "{e}");

        let mut other = config(dir.path(), TWO);
        other.proxy.max_connections = 7;
        let summary = parts.reload(other).unwrap();
        assert_eq!(summary.not_applied, vec!["proxy"]);
        assert!(summary.to_string().contains("[proxy]"), "{summary}");
    }
}
