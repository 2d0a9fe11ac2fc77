//! The gateway side of the wire types: registration, heartbeats, drain,
//! node views, and the session assignment, cancellation, progress and
//! result bodies exchanged with gateways.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    AgentSpec, EvaluatorSpec, SampleResult, SampleStatus, TaskMetadata, TokenUsage, api_version,
};
use polar_trajectory::Builder;

/// A gateway's worker pools (informational; the scheduler uses
/// `max_sessions`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeCapacity {
    /// Sessions the node holds at once (all stages together); the
    /// scheduler never assigns more.
    pub max_sessions: u32,
    /// Worker pool size per stage (`init`, `ready`, `running`, `postrun`).
    #[serde(default)]
    pub stages: BTreeMap<String, u32>,
}

/// `POST /v1/nodes/register`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRegistration {
    /// API version.
    #[serde(default = "api_version")]
    pub version: u32,
    /// The node's stable id.
    pub node_id: String,
    /// The gateway's base URL (`http://10.0.0.5:7071`): the server POSTs
    /// assignments to `{address}/v1/sessions`.
    pub address: String,
    /// A fresh value each time the gateway process starts: a new one tells
    /// the server that sessions held by the previous process are lost.
    pub instance: String,
    /// What the node can hold.
    pub capacity: NodeCapacity,
    /// Anything descriptive (host name, GPU kind...).
    #[serde(default)]
    pub labels: Map<String, Value>,
    /// Its inference backends' replicas as it checked them before
    /// registering, by backend name (none: left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backends: BTreeMap<String, BackendHealth>,
}

/// One inference backend's replicas as a node's health checks see them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendHealth {
    /// Replicas configured.
    pub replicas: u32,
    /// Of those, the ones that answered the last check.
    pub healthy: u32,
}

impl BackendHealth {
    /// Whether a session can reach the backend: some replica is healthy
    /// (a backend without replicas is not reached through a pool).
    pub fn is_up(&self) -> bool {
        self.healthy > 0 || self.replicas == 0
    }
}

/// The first backend of `backends` with no healthy replica.
pub fn backend_down(backends: &BTreeMap<String, BackendHealth>) -> Option<(&str, &BackendHealth)> {
    backends
        .iter()
        .find(|(_, b)| !b.is_up())
        .map(|(name, b)| (name.as_str(), b))
}

/// `POST /v1/nodes/register` reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterReply {
    /// API version.
    pub version: u32,
    /// The node.
    pub node_id: String,
    /// How often to heartbeat.
    pub heartbeat_interval_ms: u64,
    /// After how long without a heartbeat the node is declared lost.
    pub heartbeat_timeout_ms: u64,
    /// Sessions the server re-dispatched because the instance changed.
    pub requeued: u32,
}

/// A stage's load in a heartbeat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageLoad {
    /// Sessions waiting for the stage's workers.
    #[serde(default)]
    pub queued: u32,
    /// Sessions the stage's workers hold.
    #[serde(default)]
    pub active: u32,
}

/// `POST /v1/nodes/{id}/heartbeat`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// The gateway process (as registered); a mismatch is a 409.
    #[serde(default)]
    pub instance: Option<String>,
    /// Sessions the gateway holds.
    #[serde(default)]
    pub active: u32,
    /// Load per stage.
    #[serde(default)]
    pub stages: BTreeMap<String, StageLoad>,
    /// The gateway is draining itself: no new sessions.
    #[serde(default)]
    pub draining: bool,
    /// The ids of the sessions it holds, to reconcile: any the server no
    /// longer assigns to this node come back in `cancel`.
    #[serde(default)]
    pub sessions: Option<Vec<String>>,
    /// New generations are paused on the node (`POST /v1/pause`, around a
    /// weight update). Left out when false, so that a heartbeat of a node
    /// that never paused is what older servers take.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// The policy version the node's last resume named (`POST /v1/resume`
    /// `{"policy_version"}`); left out when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<String>,
    /// Its inference backends' replicas as its health checks see them now,
    /// by backend name (none: left out). A node with a backend none of
    /// whose replicas is healthy takes no session (`backend_down`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backends: BTreeMap<String, BackendHealth>,
}

/// A session the gateway must stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelNotice {
    /// The session.
    pub session_id: String,
    /// Why.
    pub reason: String,
}

/// `POST /v1/nodes/{id}/heartbeat` reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatReply {
    /// API version.
    pub version: u32,
    /// Sessions to stop (see [`Heartbeat::sessions`]).
    pub cancel: Vec<CancelNotice>,
    /// The server drains the node (`POST /v1/nodes/{id}/drain`).
    pub drain: bool,
}

/// `POST /v1/nodes/{id}/drain` body (optional; `{}` drains).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// `false` undoes a drain.
    #[serde(default = "yes")]
    pub draining: bool,
}

/// `POST /v1/nodes/{id}/drain` reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReply {
    /// [`crate::API_VERSION`].
    pub version: u32,
    /// The node.
    pub node_id: String,
    /// Whether it is now drained.
    pub draining: bool,
}

fn yes() -> bool {
    true
}

/// A node as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    /// The node.
    pub node_id: String,
    /// Its base URL.
    pub address: String,
    /// `healthy`, `unhealthy` (heartbeat timed out), `draining` or
    /// `backend_down` (an inference backend has no healthy replica).
    pub health: NodeHealth,
    /// From the registration.
    pub capacity: NodeCapacity,
    /// Sessions the server assigns to it now.
    pub assigned: u32,
    /// `assigned / max_sessions`.
    pub load: f64,
    /// Milliseconds since its last heartbeat.
    pub last_heartbeat_ms_ago: u64,
    /// The last heartbeat's content.
    pub last_heartbeat: Heartbeat,
    /// From the registration.
    #[serde(default)]
    pub labels: Map<String, Value>,
    /// Its inference backends as last reported (the last heartbeat's, else
    /// the registration's; none: left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backends: BTreeMap<String, BackendHealth>,
}

/// A node's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeHealth {
    /// Heartbeating, taking sessions.
    Healthy,
    /// Heartbeating, taking no new sessions.
    Draining,
    /// Heartbeating, but one of its inference backends has no healthy
    /// replica: it takes no session until one answers again.
    BackendDown,
    /// No heartbeat within the timeout.
    Unhealthy,
}

impl NodeHealth {
    /// As written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Draining => "draining",
            Self::BackendDown => "backend_down",
            Self::Unhealthy => "unhealthy",
        }
    }
}

/// `GET /v1/nodes` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    /// API version.
    pub version: u32,
    /// Nodes by id.
    pub nodes: Vec<NodeView>,
}

/// `GET /v1/status` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// API version.
    pub version: u32,
    /// The server's crate version.
    pub server_version: String,
    /// Seconds since the server started.
    pub uptime_secs: u64,
    /// Tasks by status.
    pub tasks: BTreeMap<String, u64>,
    /// Sessions by state.
    pub sessions: BTreeMap<String, u64>,
    /// Nodes.
    pub nodes: Vec<NodeView>,
}

/// What the server POSTs to `{gateway}/v1/sessions`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionAssignment {
    /// API version.
    #[serde(default = "api_version")]
    pub version: u32,
    /// The session (a valid sandbox session id).
    pub session_id: String,
    /// The dispatch number: results must carry it back.
    pub attempt: u32,
    /// The task.
    pub task_id: String,
    /// Position in the task.
    pub sample_index: u32,
    /// From the task.
    pub instruction: String,
    /// From the task.
    pub runtime: Map<String, Value>,
    /// From the task.
    pub agent: AgentSpec,
    /// From the task.
    pub builder: Builder,
    /// From the task.
    pub evaluator: EvaluatorSpec,
    /// From the task, with `group_id` resolved.
    pub metadata: TaskMetadata,
    /// The session's budget in seconds.
    pub timeout_secs: u64,
    /// Budget end (unix milliseconds): the gateway stops the session then
    /// and reports `timeout`.
    pub deadline_unix_ms: u64,
}

/// What the server POSTs to `{gateway}/v1/sessions/{id}/cancel`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelSession {
    /// API version.
    #[serde(default = "api_version")]
    pub version: u32,
    /// The dispatch to stop.
    pub attempt: u32,
    /// Why.
    pub reason: String,
}

/// `POST /v1/sessions/{id}/state`: progress from the gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionProgress {
    /// The reporting node.
    pub node_id: String,
    /// The dispatch.
    pub attempt: u32,
    /// The stage the session entered (`init`, `ready`, `running`,
    /// `postrun`), or is in when it reports calls.
    pub stage: String,
    /// Model calls that completed since the node's last report, as the
    /// result's `stats.calls` lists them (the dashboard's live timeline;
    /// at most [`MAX_LIVE_CALLS`] per report).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<Value>,
}

/// The most calls one progress report carries, and the most a server keeps
/// per running session.
pub const MAX_LIVE_CALLS: usize = 512;

/// `POST /v1/sessions/{id}/result`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionResult {
    /// The reporting node.
    pub node_id: String,
    /// The dispatch that produced it.
    pub attempt: u32,
    /// How it ended.
    pub status: SampleStatus,
    /// The evaluator's reward.
    #[serde(default)]
    pub reward: Option<f64>,
    /// Where the trajectory was written.
    #[serde(default)]
    pub trajectory_uri: Option<String>,
    /// Token counts.
    #[serde(default)]
    pub tokens: TokenUsage,
    /// What went wrong.
    #[serde(default)]
    pub error: Option<String>,
    /// Gateway statistics, kept as given.
    #[serde(default)]
    pub stats: Option<Value>,
    /// The failure is the node's, not the sample's (the runtime did not
    /// start...): dispatch the session again, within the retry limit.
    #[serde(default)]
    pub retry: bool,
    /// The infrastructure (the inference backend, Polar) ended the session,
    /// not the policy (its trajectory is exported labelled `infra_fault`):
    /// with `retry`, the session is run again within the retry limit, and
    /// at the limit this result is kept (`done`, not `failed`).
    #[serde(default)]
    pub infra_fault: bool,
    /// With `retry`: this node cannot run the session and would fail it the
    /// same way again (a harness neither defined nor installed there, a
    /// runtime whose program it lacks). The server dispatches it to another
    /// node only, and fails it at once, with this error, when no other
    /// registered node is left to try. Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_unfit: bool,
}

impl SessionResult {
    /// The stored result. Only a usable sample keeps its reward: whatever a
    /// node reports for a session that errored or timed out, it is stored
    /// without one, so no mean counts it.
    pub fn to_result(&self) -> SampleResult {
        SampleResult {
            status: self.status,
            reward: self.reward.filter(|_| self.status.is_usable()),
            trajectory_uri: self.trajectory_uri.clone(),
            tokens: self.tokens,
            error: self.error.clone(),
            stats: self.stats.clone(),
        }
    }
}
