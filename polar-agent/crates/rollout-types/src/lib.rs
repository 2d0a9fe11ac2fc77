//! The rollout API's wire types (JSON, version [`API_VERSION`]): what a
//! trainer submits ([`TaskRequest`]), what it reads back ([`TaskView`],
//! [`SampleView`], [`SessionState`]), and what the server and the gateways
//! exchange ([`NodeRegistration`], [`Heartbeat`], [`SessionAssignment`],
//! [`SessionResult`], in `nodes.rs`; the event stream's [`Event`] in
//! `events.rs`). docs/ROLLOUT-API.md documents
//! every field.
//!
//! Requests deny unknown fields, so a typo is a 400 naming it; replies may
//! grow fields within a version.
//!
//! Pure: above `polar-spec` and `polar-trajectory` (the builder a task
//! names) only. Tests: `polar-rollout-api`'s validation tests and the
//! rollout server's API tests.
#![forbid(unsafe_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use polar_trajectory::Builder;

mod events;
mod failures;
mod nodes;

pub use events::{Event, Numbered};
pub use failures::{FailureGroup, failure_groups};
pub use nodes::*;
pub use polar_spec::{AgentSpec, EvaluatorSpec};

/// The version of the API, in every request and reply body that has a
/// `version` field and in the `/v1/` prefix of every path.
pub const API_VERSION: u32 = 1;

fn api_version() -> u32 {
    API_VERSION
}

/// A task: run `num_samples` sessions of one instruction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    /// API version of the body; only [`API_VERSION`] is accepted.
    #[serde(default = "api_version")]
    pub version: u32,
    /// The caller's id for the task, unique on the server.
    pub task_id: String,
    /// What the harness is asked to do.
    pub instruction: String,
    /// How many sessions (samples) to run.
    pub num_samples: u32,
    /// Each session's budget in seconds, from its dispatch (INIT) to its
    /// result.
    pub timeout_secs: u64,
    /// The runtime (sandbox, image, files...), opaque to the server and
    /// passed to the gateway as given.
    #[serde(default)]
    pub runtime: Map<String, Value>,
    /// Which harness runs the session, with its options.
    pub agent: AgentSpec,
    /// Which trajectory builder turns the session into traces.
    #[serde(default)]
    pub builder: Builder,
    /// How a session is scored.
    #[serde(default)]
    pub evaluator: EvaluatorSpec,
    /// Where the results are POSTed once the task finishes.
    #[serde(default)]
    pub callback_url: Option<String>,
    /// Group, policy version and anything else the trainer wants back.
    #[serde(default)]
    pub metadata: TaskMetadata,
    /// Higher runs first; ties go in submission order.
    #[serde(default)]
    pub priority: i32,
    /// Cancel the remaining sessions once this many samples are usable.
    #[serde(default)]
    pub early_stop_after: Option<u32>,
}

impl TaskRequest {
    /// How many usable samples the task asks for: `early_stop_after` when
    /// set (at most `num_samples`), else `num_samples`.
    pub fn requested(&self) -> u32 {
        self.early_stop_after
            .map_or(self.num_samples, |n| n.min(self.num_samples))
    }
}

/// What the trainer attaches to the task and gets back with every sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskMetadata {
    /// The GRPO group of the samples; the task id when absent.
    #[serde(default)]
    pub group_id: Option<String>,
    /// The policy weight version the samples are for.
    #[serde(default)]
    pub policy_version: Option<String>,
    /// Anything else, passed to gateways and returned as given.
    #[serde(default)]
    pub extra: Map<String, Value>,
}

/// A task's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// No session dispatched yet.
    Queued,
    /// Some session dispatched, not all finished.
    Running,
    /// Every session finished and as many samples are usable as the task
    /// asks for ([`TaskView::requested`]).
    Completed,
    /// Every session finished, some samples usable but fewer than the task
    /// asks for: the others failed (see [`TaskView::failures`]).
    Partial,
    /// Cancelled by a caller.
    Cancelled,
    /// Every session finished and none is usable (each failed, timed out
    /// or was cancelled by a node).
    Failed,
}

impl TaskStatus {
    /// Every status, in display order.
    pub const ALL: [Self; 6] = [
        Self::Queued,
        Self::Running,
        Self::Completed,
        Self::Partial,
        Self::Cancelled,
        Self::Failed,
    ];

    /// The status as written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Partial => "partial",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
        }
    }

    /// Whether the task is over.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Partial | Self::Cancelled | Self::Failed
        )
    }
}

impl std::str::FromStr for TaskStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown task status {s:?}"))
    }
}

/// How a session ended, as its gateway reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleStatus {
    /// The harness finished and the session was evaluated.
    Completed,
    /// The session's budget ran out.
    Timeout,
    /// The session failed.
    Error,
    /// The gateway cancelled the session (it was told to).
    Cancelled,
}

impl SampleStatus {
    /// Whether the sample is usable for training: it counts toward
    /// `early_stop_after` and `usable`, and only such a sample has a
    /// reward.
    pub fn is_usable(self) -> bool {
        self == Self::Completed
    }

    /// The status as written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Timeout => "timeout",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Token counts of a session (all calls together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenUsage {
    /// Prompt tokens over all calls.
    #[serde(default)]
    pub prompt: u64,
    /// Generated tokens over all calls.
    #[serde(default)]
    pub response: u64,
    /// Model calls.
    #[serde(default)]
    pub calls: u64,
}

/// What a finished session produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleResult {
    /// How it ended.
    pub status: SampleStatus,
    /// The evaluator's reward; `null` unless the status is `completed`
    /// (a sample the node, the backend or the budget ended is no evidence
    /// about the policy and is scored by nobody).
    #[serde(default)]
    pub reward: Option<f64>,
    /// Where the trajectory was written.
    #[serde(default)]
    pub trajectory_uri: Option<String>,
    /// Token counts.
    #[serde(default)]
    pub tokens: TokenUsage,
    /// What went wrong, for `timeout` and `error`.
    #[serde(default)]
    pub error: Option<String>,
    /// Gateway statistics (stage timings...), kept as given.
    #[serde(default)]
    pub stats: Option<Value>,
}

/// Where one session (sample) is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SessionState {
    /// Waiting for a node.
    Pending,
    /// Sent to `node`, not yet reported running.
    Dispatched {
        /// The gateway node.
        node: String,
        /// The dispatch number (1 for the first).
        attempt: u32,
        /// The session's deadline (unix milliseconds).
        deadline_unix_ms: u64,
    },
    /// The gateway reported it running.
    Running {
        /// The gateway node.
        node: String,
        /// The dispatch number.
        attempt: u32,
        /// The session's deadline (unix milliseconds).
        deadline_unix_ms: u64,
        /// The gateway stage (`init`, `ready`, `running`, `postrun`).
        #[serde(default)]
        stage: Option<String>,
    },
    /// The gateway reported a result.
    Done {
        /// The gateway node.
        node: String,
        /// The dispatch that produced it.
        attempt: u32,
        /// The result.
        result: SampleResult,
    },
    /// The control plane could not get the session run.
    Failed {
        /// Why.
        error: String,
    },
    /// Cancelled before a result (task cancelled, early stop).
    Cancelled {
        /// Why.
        reason: String,
    },
}

impl SessionState {
    /// The state's name as written in JSON.
    pub fn kind(&self) -> SessionKind {
        match self {
            Self::Pending => SessionKind::Pending,
            Self::Dispatched { .. } => SessionKind::Dispatched,
            Self::Running { .. } => SessionKind::Running,
            Self::Done { .. } => SessionKind::Done,
            Self::Failed { .. } => SessionKind::Failed,
            Self::Cancelled { .. } => SessionKind::Cancelled,
        }
    }

    /// The node and attempt of a session on a node.
    pub fn assignment(&self) -> Option<(&str, u32)> {
        match self {
            Self::Dispatched { node, attempt, .. } | Self::Running { node, attempt, .. } => {
                Some((node, *attempt))
            }
            _ => None,
        }
    }

    /// Whether the session is over.
    pub fn is_terminal(&self) -> bool {
        self.kind().is_terminal()
    }
}

/// The name of a [`SessionState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    /// See [`SessionState::Pending`].
    Pending,
    /// See [`SessionState::Dispatched`].
    Dispatched,
    /// See [`SessionState::Running`].
    Running,
    /// See [`SessionState::Done`].
    Done,
    /// See [`SessionState::Failed`].
    Failed,
    /// See [`SessionState::Cancelled`].
    Cancelled,
}

impl SessionKind {
    /// Every kind, in display order.
    pub const ALL: [Self; 6] = [
        Self::Pending,
        Self::Dispatched,
        Self::Running,
        Self::Done,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The name as written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Dispatched => "dispatched",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether a session in this state is over.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Done | Self::Failed | Self::Cancelled)
    }
}

/// Sessions of a task by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCounts {
    /// Waiting for a node.
    pub pending: u32,
    /// Sent to a node.
    pub dispatched: u32,
    /// Reported running.
    pub running: u32,
    /// With a result.
    pub done: u32,
    /// Given up.
    pub failed: u32,
    /// Cancelled.
    pub cancelled: u32,
    /// Done with a usable status (`completed`).
    pub usable: u32,
}

impl SessionCounts {
    /// Adds (`+1`) or removes (`-1`) a session in `state`.
    pub fn apply(&mut self, state: &SessionState, delta: i32) {
        let slot = match state.kind() {
            SessionKind::Pending => &mut self.pending,
            SessionKind::Dispatched => &mut self.dispatched,
            SessionKind::Running => &mut self.running,
            SessionKind::Done => &mut self.done,
            SessionKind::Failed => &mut self.failed,
            SessionKind::Cancelled => &mut self.cancelled,
        };
        *slot = slot.saturating_add_signed(delta);
        if let SessionState::Done { result, .. } = state
            && result.status.is_usable()
        {
            self.usable = self.usable.saturating_add_signed(delta);
        }
    }

    /// Sessions not over yet.
    pub fn open(&self) -> u32 {
        self.pending + self.dispatched + self.running
    }
}

/// One sample of a task, as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleView {
    /// Position in the task (0-based).
    pub sample_index: u32,
    /// The session's id (`{task_id}-s{index}`).
    pub session_id: String,
    /// Dispatches so far.
    pub attempts: u32,
    /// Of those, dispatches again after a node was lost or an attempt
    /// failed in a retryable way (an infrastructure fault included).
    #[serde(default)]
    pub retries: u32,
    /// Where it is, with its result once done.
    #[serde(flatten)]
    pub state: SessionState,
    /// The dispatches that ended without an accepted result, oldest first
    /// (the last [`MAX_ENDED_ATTEMPTS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ended_attempts: Vec<AttemptEnd>,
    /// While it runs, the calls its dispatch reported so far (the first
    /// [`MAX_LIVE_CALLS`]), as the result's `stats.calls` lists them; in
    /// `GET /v1/tasks/{id}/samples/{i}` only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live_calls: Vec<serde_json::Value>,
    /// How many calls it reported (more than `live_calls` holds past the
    /// bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_calls_total: Option<usize>,
}

/// Ended attempts kept per session.
pub const MAX_ENDED_ATTEMPTS: usize = 16;

/// Why one dispatch of a session ended without its result being accepted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptEnd {
    /// The dispatch number.
    pub attempt: u32,
    /// The node it went to.
    pub node: String,
    /// Why it ended (node lost, the node failed it, push refused, no
    /// result by the deadline).
    pub reason: String,
}

/// Delivery of a task's results to its callback URL.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackView {
    /// `none` (no URL), `waiting` (task not finished), `pending`,
    /// `delivered` or `failed`.
    pub state: CallbackState,
    /// POSTs tried.
    pub attempts: u32,
    /// The last failure.
    #[serde(default)]
    pub last_error: Option<String>,
}

/// See [`CallbackView::state`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallbackState {
    /// The task has no callback URL.
    #[default]
    None,
    /// The task is not finished.
    Waiting,
    /// Being delivered.
    Pending,
    /// The callback answered 2xx.
    Delivered,
    /// Every attempt failed.
    Failed,
}

impl CallbackState {
    /// The state as written in JSON (and in the database).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Waiting => "waiting",
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }
}

/// A task's status and results (`GET /v1/tasks/{id}`, and the callback
/// body).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskView {
    /// API version.
    pub version: u32,
    /// The task.
    pub task_id: String,
    /// Its state.
    pub status: TaskStatus,
    /// The GRPO group (the task id unless the request named one).
    pub group_id: String,
    /// From the request's metadata.
    #[serde(default)]
    pub policy_version: Option<String>,
    /// From the request's metadata.
    #[serde(default)]
    pub extra: Map<String, Value>,
    /// From the request.
    pub priority: i32,
    /// From the request.
    pub num_samples: u32,
    /// From the request.
    #[serde(default)]
    pub early_stop_after: Option<u32>,
    /// Submission time (unix milliseconds).
    pub submitted_unix_ms: u64,
    /// When the task finished (unix milliseconds).
    #[serde(default)]
    pub finished_unix_ms: Option<u64>,
    /// Why the task was cancelled or stopped early.
    #[serde(default)]
    pub reason: Option<String>,
    /// Sessions by state.
    pub counts: SessionCounts,
    /// Callback delivery.
    pub callback: CallbackView,
    /// How many usable samples the task asks for: `early_stop_after` when
    /// set (at most `num_samples`), else `num_samples`. The task is
    /// `completed` once `counts.usable` reaches it, `partial` when it ends
    /// short of it with some usable, `failed` with none.
    pub requested: u32,
    /// The mean reward of the usable samples (none yet: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_reward: Option<f64>,
    /// The spread (population standard deviation) of the usable samples'
    /// rewards (none yet: absent). 0 with two or more usable samples: the
    /// group gives GRPO no learning signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_std: Option<f64>,
    /// Why the samples that are not usable ended, grouped by message, most
    /// frequent first (none: absent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailureGroup>,
    /// Every sample, by index (omitted in lists).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<SampleView>,
}

/// `POST /v1/tasks` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubmitReply {
    /// API version.
    pub version: u32,
    /// The task.
    pub task_id: String,
    /// Its state.
    pub status: TaskStatus,
    /// The session ids, by sample index.
    pub session_ids: Vec<String>,
}

/// `GET /v1/tasks` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskList {
    /// API version.
    pub version: u32,
    /// Tasks in submission order, without their samples.
    pub tasks: Vec<TaskView>,
}

/// The body of every error reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// See [`ErrorBody`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Machine-readable (`invalid_request`, `duplicate_task`,
    /// `unauthorized`, `not_found`, `stale_attempt`, ...).
    pub code: String,
    /// The request field at fault, for `invalid_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For people (`num_samples: must be between 1 and 1024`).
    pub message: String,
}

/// The session id of a task's sample.
pub fn session_id(task_id: &str, index: u32) -> String {
    format!("{task_id}-s{index}")
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
