//! What a session's assignment asks of a gateway, checked: the harness
//! (a preset, or `custom:NAME`: one the node's configuration defines, whose
//! existence only the node can check), the agent options the gateway understands, the runtime spec and
//! the evaluator. The rollout server runs the same check when a task is
//! submitted (a bad task is a 400 naming the field), and the gateway again
//! when a session arrives (a node may run a newer or older version).
//!
//! [`SessionSpec::check_policy`] checks it against a node-side policy
//! ([`Policy`]): lexically at the server (`[rollout.policy]`), after
//! [`SessionSpec::resolve_policy`] canonicalised its host paths on the node.
//!
//! Agent options: `command` (the `shell` preset's command: a string run by
//! `sh -c`, or an argv array), `timeout_secs` (the RUNNING limit, overriding
//! `gateway.agent_timeout_secs`), `mode` (`transparent` or `base_url`).

use std::time::Duration;

use serde_json::{Map, Value};

use crate::validate::ValidationError;
use crate::{AgentSpec, EvaluatorSpec};
use polar_evaluate::Evaluator;
use polar_spec::KeyError;
use polar_spec::KeyPath;
use polar_spec::harness::{BadHarness, HarnessChoice, ModeKind};
use polar_spec::policy::Policy;
use polar_spec::runtime::{RuntimeSpec, SpecError, Step};

/// A checked session spec.
#[derive(Debug)]
pub struct SessionSpec {
    /// The harness.
    pub harness: HarnessChoice,
    /// The shell preset's command (empty: the instruction through `sh -c`).
    pub command: Vec<String>,
    /// The RUNNING limit, when the task sets one.
    pub timeout: Option<Duration>,
    /// The mode, when the task sets one.
    pub mode: Option<ModeKind>,
    /// The runtime.
    pub runtime: RuntimeSpec,
    /// The evaluator.
    pub evaluator: Evaluator,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> ValidationError {
    ValidationError {
        field: field.into(),
        reason: reason.into(),
    }
}

impl SessionSpec {
    /// Checks the parts of a task or an assignment.
    pub fn parse(
        instruction: &str,
        agent: &AgentSpec,
        runtime: &Map<String, Value>,
        evaluator: &EvaluatorSpec,
    ) -> Result<Self, ValidationError> {
        let harness: HarnessChoice = agent
            .harness
            .parse()
            .map_err(|e: BadHarness| bad("agent.harness", e.to_string()))?;
        if !harness.is_shell() && instruction.trim().is_empty() {
            return Err(bad(
                "instruction",
                format!("the harness {harness} needs one"),
            ));
        }
        let mut spec = Self {
            harness,
            command: Vec::new(),
            timeout: None,
            mode: None,
            runtime: RuntimeSpec::default(),
            evaluator: Evaluator::from_spec(evaluator).map_err(|e| bad(e.field(), e.reason()))?,
        };
        for (k, v) in &agent.options {
            let field = format!("agent.options.{k}");
            match (k.as_str(), v) {
                ("command", Value::String(s)) if !s.trim().is_empty() => {
                    spec.command = vec!["sh".into(), "-c".into(), s.clone()];
                }
                ("command", Value::Array(a)) if !a.is_empty() => {
                    spec.command = a
                        .iter()
                        .map(|x| x.as_str().map(str::to_owned))
                        .collect::<Option<_>>()
                        .ok_or_else(|| bad(&field, "an array of strings"))?;
                }
                ("command", _) => {
                    return Err(bad(field, "a non-empty string or array of strings"));
                }
                ("timeout_secs", v) => {
                    let n = v
                        .as_u64()
                        .filter(|n| (1..=7 * 86_400).contains(n))
                        .ok_or_else(|| bad(&field, "an integer between 1 and 604800"))?;
                    spec.timeout = Some(Duration::from_secs(n));
                }
                ("mode", Value::String(m)) if m == "transparent" => {
                    spec.mode = Some(ModeKind::Transparent);
                }
                ("mode", Value::String(m)) if m == "base_url" => {
                    spec.mode = Some(ModeKind::BaseUrl);
                }
                ("mode", _) => return Err(bad(field, "transparent or base_url")),
                _ => {
                    return Err(bad(field, "unknown option (command, timeout_secs, mode)"));
                }
            }
        }
        // A task never brings a command line of its own but to the shell
        // preset: a custom harness's is the operator's.
        if !spec.command.is_empty() && !spec.harness.is_shell() {
            return Err(bad(
                "agent.options.command",
                format!(
                    "only the shell preset takes a command, not {}",
                    spec.harness
                ),
            ));
        }
        if !runtime.is_empty() {
            let text = serde_json::to_string(runtime).map_err(|e| bad("runtime", e.to_string()))?;
            // The field names the context: the parser's own message only,
            // not its `runtime spec FILE:` prefix.
            spec.runtime = RuntimeSpec::parse(&text, true, "runtime").map_err(|e| match e {
                SpecError::Invalid { path, message } => bad(format!("runtime.{path}"), message),
                SpecError::Parse { message, .. } => bad("runtime", message),
                other @ SpecError::Read { .. } => bad("runtime", other.to_string()),
            })?;
        }
        spec.check_restore_against_uploads()?;
        Ok(spec)
    }

    /// The evaluator's `restore` paths are put back after the `[[post]]`
    /// steps: one that a post-run upload writes into (or that holds it)
    /// would undo the upload.
    fn check_restore_against_uploads(&self) -> Result<(), ValidationError> {
        let restore = self.evaluator.restore_paths();
        for (i, step) in self.runtime.post.iter().enumerate() {
            let Step::Upload { to, .. } = step else {
                continue;
            };
            // `.` is the workspace's top: it holds every path.
            let to: std::path::PathBuf = to
                .components()
                .filter(|c| matches!(c, std::path::Component::Normal(_)))
                .collect();
            if let Some(path) = restore
                .iter()
                .find(|p| p.starts_with(&to) || to.starts_with(p))
            {
                return Err(bad(
                    "evaluator.options.restore",
                    format!(
                        "{} overlaps runtime.post[{i}]'s upload to {:?}: it is put back after the post-run steps and would undo the upload",
                        path.display(),
                        if to.as_os_str().is_empty() {
                            ".".into()
                        } else {
                            to.display().to_string()
                        },
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks the spec against `policy` lexically (the rollout server);
    /// `session_secs` is the task's `timeout_secs`.
    pub fn check_policy(&self, policy: &Policy, session_secs: u64) -> Result<(), KeyError> {
        policy.check_runtime(&self.runtime, &KeyPath::root().key("runtime"))?;
        policy.check_budgets(session_secs, self.timeout.map(|t| t.as_secs()))
    }

    /// On the node: canonicalises the runtime spec's host paths and checks
    /// them and the budgets against `policy`, keeping the canonical paths
    /// and filling in the limits' ceilings ([`Policy::resolve`]). Blocking
    /// file work.
    pub fn resolve_policy(&mut self, policy: &Policy, session_secs: u64) -> Result<(), KeyError> {
        policy.resolve(&mut self.runtime, &KeyPath::root().key("runtime"))?;
        policy.check_budgets(session_secs, self.timeout.map(|t| t.as_secs()))
    }
}

impl From<KeyError> for ValidationError {
    fn from(v: KeyError) -> Self {
        bad(v.key.to_string(), v.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(agent: Value, runtime: Value, evaluator: Value) -> Result<SessionSpec, String> {
        SessionSpec::parse(
            "do it",
            &serde_json::from_value(agent).unwrap(),
            runtime.as_object().unwrap(),
            &serde_json::from_value(evaluator).unwrap(),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_good_spec_and_errors_naming_the_field() {
        let s = parse(
            json!({"harness": "shell", "options": {"command": "python3 a.py", "timeout_secs": 60}}),
            json!({"prepare": [{"run": "true"}]}),
            json!({"kind": "command", "options": {"command": "test -f x"}}),
        )
        .unwrap();
        assert_eq!(s.command, vec!["sh", "-c", "python3 a.py"]);
        assert_eq!(s.timeout, Some(Duration::from_secs(60)));
        assert_eq!(s.runtime.prepare.len(), 1);
        for (agent, runtime, evaluator, field) in [
            (
                json!({"harness": "cursor"}),
                json!({}),
                json!({"kind": "session_completed"}),
                "agent.harness",
            ),
            (
                json!({"harness": "custom:Bad Name"}),
                json!({}),
                json!({"kind": "session_completed"}),
                "agent.harness",
            ),
            (
                json!({"harness": "custom:mine", "options": {"command": "x"}}),
                json!({}),
                json!({"kind": "session_completed"}),
                "agent.options.command",
            ),
            (
                json!({"harness": "shell", "options": {"script": "x"}}),
                json!({}),
                json!({"kind": "session_completed"}),
                "agent.options.script",
            ),
            (
                json!({"harness": "shell", "options": {"timeout_secs": 0}}),
                json!({}),
                json!({"kind": "session_completed"}),
                "agent.options.timeout_secs",
            ),
            (
                json!({"harness": "codex", "options": {"command": "x"}}),
                json!({}),
                json!({"kind": "session_completed"}),
                "agent.options.command",
            ),
            (
                json!({"harness": "shell"}),
                json!({"kind": "bwrap"}),
                json!({"kind": "session_completed"}),
                "runtime",
            ),
            (
                json!({"harness": "shell"}),
                json!({}),
                json!({"kind": "vibes"}),
                "evaluator.kind",
            ),
            (
                json!({"harness": "shell"}),
                json!({}),
                json!({"kind": "command"}),
                "evaluator.options.command",
            ),
        ] {
            let e = parse(agent, runtime, evaluator).unwrap_err();
            assert!(e.starts_with(field), "{field}: {e}");
            // An evaluator's field is named once.
            if field.starts_with("evaluator") {
                assert_eq!(e.matches(field).count(), 1, "{e}");
            }
        }
        assert_eq!(
            parse(
                json!({"harness": "shell"}),
                json!({}),
                json!({"kind": "vibes"})
            )
            .unwrap_err(),
            "evaluator.kind: unknown evaluator \"vibes\"; one of: session_completed, command, test_output, llm_judge, composite"
        );
    }

    #[test]
    fn restore_paths_must_not_undo_a_post_run_upload() {
        let agent = json!({"harness": "shell", "options": {"command": "true"}});
        let evaluator = |restore: Value| json!({"kind": "command", "options": {"command": "true", "restore": restore}});
        let post =
            |to: &str| json!({"post": [{"run": "true"}, {"upload": {"from": "/srv/t", "to": to}}]});
        for (to, restore) in [
            ("node_modules/checker", json!(["node_modules"])),
            ("tests", json!(["tests/conf.py"])),
            (".", json!(["package.json"])),
            ("./vendor", json!(["vendor"])),
        ] {
            let e = parse(agent.clone(), post(to), evaluator(restore.clone())).unwrap_err();
            assert!(
                e.starts_with("evaluator.options.restore: ") && e.contains("runtime.post[1]"),
                "{to} {restore}: {e}"
            );
        }
        for (to, restore) in [
            ("tests", json!(["node_modules", "tests.cfg"])),
            ("node_modules2", json!(["node_modules"])),
        ] {
            parse(agent.clone(), post(to), evaluator(restore.clone()))
                .unwrap_or_else(|e| panic!("{to} {restore}: {e}"));
        }
    }

    #[test]
    fn a_runtime_error_names_its_context_once() {
        let shell = || json!({"harness": "shell"});
        let done = || json!({"kind": "session_completed"});
        let e = parse(shell(), json!({"kind": "bwrap"}), done()).unwrap_err();
        assert!(e.starts_with("runtime: unknown variant `bwrap`"), "{e}");
        assert_eq!(e.matches("runtime").count(), 1, "{e}");
        let e = parse(shell(), json!({"colour": 1}), done()).unwrap_err();
        assert!(e.starts_with("runtime: unknown field `colour`"), "{e}");
        assert!(!e.contains("runtime spec"), "{e}");
        let e = parse(shell(), json!({"workdir": "rel"}), done()).unwrap_err();
        assert_eq!(e, "runtime.workdir: \"rel\" is not an absolute path");
    }
}
