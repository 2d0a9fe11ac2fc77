//! The agent and evaluator parts of a task, as the rollout API carries
//! them: names and options, checked by the node that runs them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The harness and its options, opaque to the server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Harness name (`claude-code`, `codex`, `shell`, ...).
    pub harness: String,
    /// Harness options, passed as given.
    #[serde(default)]
    pub options: Map<String, Value>,
}

/// The evaluator and its options, opaque to the server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluatorSpec {
    /// Evaluator name (`session_completed`, `command`, `test_output`, ...).
    pub kind: String,
    /// Evaluator options, passed as given.
    #[serde(default)]
    pub options: Map<String, Value>,
}

impl Default for EvaluatorSpec {
    fn default() -> Self {
        Self {
            kind: "session_completed".into(),
            options: Map::new(),
        }
    }
}
