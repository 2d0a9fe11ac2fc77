//! The event stream's wire types (`GET /v1/events`): a state change
//! ([`Event`]) and its sequence number ([`Numbered`]).

use serde::{Deserialize, Serialize};

use crate::{NodeHealth, SessionCounts, SessionState, TaskStatus};

/// A state change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A task changed status (or was submitted).
    Task {
        /// The task.
        task_id: String,
        /// Its new status.
        status: TaskStatus,
        /// Its sessions by state.
        counts: SessionCounts,
    },
    /// A session changed state.
    Session {
        /// The session.
        session_id: String,
        /// Its task.
        task_id: String,
        /// Its position in the task.
        sample_index: u32,
        /// The new state.
        #[serde(flatten)]
        state: SessionState,
    },
    /// Model calls of a running session completed (reported by its node
    /// as they end; the result's `stats.calls` supersedes them).
    Calls {
        /// The session.
        session_id: String,
        /// Its task.
        task_id: String,
        /// Its position in the task.
        sample_index: u32,
        /// The dispatch.
        attempt: u32,
        /// The new calls, in order.
        calls: Vec<serde_json::Value>,
    },
    /// A node registered or changed health.
    Node {
        /// The node.
        node_id: String,
        /// Its health.
        health: NodeHealth,
    },
}

impl Event {
    /// The SSE event name (`task`, `session`, `calls`, `node`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Task { .. } => "task",
            Self::Session { .. } => "session",
            Self::Calls { .. } => "calls",
            Self::Node { .. } => "node",
        }
    }
}

/// An event with its sequence number (from 1, per server run).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Numbered {
    /// The SSE `id`.
    pub id: u64,
    /// The event.
    #[serde(flatten)]
    pub event: Event,
}

impl Numbered {
    /// The SSE frame: `id`, `event` and one `data` line.
    pub fn to_sse(&self) -> String {
        let data = serde_json::to_string(self).unwrap_or_else(|_| "{}".into());
        format!(
            "id: {}\nevent: {}\ndata: {data}\n\n",
            self.id,
            self.event.name()
        )
    }
}
