//! The trajectory data model: a [`Trajectory`] is what one session turns
//! into, made of [`Trace`]s (one training sample each). Serialized as JSON by
//! export; the layout is versioned by [`SCHEMA_VERSION`].
//!
//! Layout of a trace: `prompt_ids` is the first merged call's prompt, exactly
//! as the server tokenized it. `response_ids` is everything after it: each
//! merged call's generated tokens (loss 1) and, between them, the tokens the
//! harness and template added (tool results, template glue; loss 0). The
//! [`CallSpan`]s say where each call's tokens sit.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use polar_chat::{FinishReason, Message, Tool};

use super::options::Builder;
use super::stats::ReconstructionStats;

/// Version of the [`Trajectory`] layout, stored in every trajectory.
/// Bumped whenever a field changes meaning or a required field is added.
pub const SCHEMA_VERSION: u32 = 1;

/// A chain: one conversation (the main agent, a sub-agent, a side request, a
/// fork), possibly cut into several segments by breaks in its prefix.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct ChainId(pub u32);

/// One training sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// The first merged call's prompt, as the server tokenized it.
    pub prompt_ids: Vec<u32>,
    /// Everything after the prompt: generated tokens and the glue between.
    pub response_ids: Vec<u32>,
    /// 1 for tokens the model generated (trained on), 0 for glue; same length
    /// as `response_ids`.
    pub loss_mask: Vec<u8>,
    /// The backend's log-probability of each token of `response_ids`, 0.0 at
    /// loss-0 positions (glue was not sampled). Absent when a merged call has
    /// no logprobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_logprobs: Option<Vec<f32>>,
    /// The first merged call's request messages.
    pub prompt_messages: Vec<Message>,
    /// The messages after `prompt_messages`: those the last merged call's
    /// request added, then its reply.
    pub response_messages: Vec<Message>,
    /// The tools offered to the first merged call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// Why the last merged call stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// The reward, once assigned (see `trajectory::rewards`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// The calls merged into this trace, in order.
    pub call_ids: Vec<String>,
    /// Where each call of `call_ids` sits in `response_ids` (same order).
    pub spans: Vec<CallSpan>,
    /// The chain this trace belongs to.
    pub chain: ChainId,
    /// What the chain is: the main agent, a sub-agent, or a side request
    /// (see [`ChainRole`]).
    #[serde(default)]
    pub role: ChainRole,
    /// Position of this trace among its chain's traces (0, 1, ...), in the
    /// order of their first calls.
    pub segment: u32,
    /// How this trace relates to the rest of its chain.
    pub segment_kind: SegmentKind,
    /// The trace this one continues (after a break) or branches from (a fork,
    /// a superseded retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<SegmentLink>,
    /// Labels, sorted, without repeats.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<Label>,
    /// Further facts about the trace.
    #[serde(default)]
    pub metadata: TraceMetadata,
}

impl Trace {
    /// Whether the trace carries `label`.
    pub fn has_label(&self, label: Label) -> bool {
        self.labels.contains(&label)
    }

    /// Adds `label`, keeping the labels sorted and unique.
    pub fn add_label(&mut self, label: Label) {
        if let Err(at) = self.labels.binary_search(&label) {
            self.labels.insert(at, label);
        }
    }

    /// The number of tokens with loss 1.
    pub fn loss_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m == 1).count()
    }
}

/// Where one merged call's tokens sit in [`Trace::response_ids`]. The glue
/// before its response runs from the end of the previous span (0 for the
/// first) to `response_start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSpan {
    /// Offset of the call's generated tokens in `response_ids`.
    pub response_start: usize,
    /// Number of generated tokens.
    pub response_len: usize,
    /// How the call joined the trace.
    pub join: Join,
    /// The call stopped at its token limit (finish reason `length`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The policy version the call ran under: its record's
    /// `policy_version` (the task's or session's, updated by a resume that
    /// named a new one), else the backend's weight version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<String>,
    /// The backend's own weight version for the call, when it reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// Tokens of the trace before this call's response (`prompt_ids` and
    /// `response_ids[..response_start]`) that differ from the prompt the
    /// backend saw for the call: 0 when the trace's context is that prompt
    /// exactly; after a [`Join::Splice`], the earlier turn as generated
    /// where the call saw the template's re-rendering of it (between where
    /// the two leave each other and where they meet again, the longer of
    /// the trace's stretch and the prompt's), carried on to every later
    /// call of the trace.
    /// The call's loss-1 tokens were generated in a context this far from
    /// the trace's (off-policy by that much). 0 in files written before it
    /// existed.
    #[serde(default)]
    pub off_policy_context_tokens: usize,
    /// How the call's prompt reached the backend, as its record says
    /// (`backend.serving`): rendered by Polar and sent as token ids
    /// (`token_in`, with how the ids were built: extending an earlier
    /// call's, or rendered whole and why), or rendered by the backend's
    /// chat endpoint (`chat_endpoint`). Absent when the record does not
    /// say (records older than token-faithful serving).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<polar_record::Serving>,
}

/// How a call joined its trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Join {
    /// The trace's first call: its prompt is the trace's `prompt_ids`.
    First,
    /// Its prompt extends the previous call's prompt + response; the rest of
    /// its prompt is the glue (loss 0).
    Extend,
    /// Template splice: its prompt equals the previous call's prompt +
    /// response up to `diverged_at` (the previous assistant turn was
    /// re-rendered by the template); the glue is its prompt from
    /// `resumed_from` on (just after the re-rendered turn's end-of-turn
    /// token, or at it when the previous response has none).
    Splice {
        /// Where the prompt stops matching the previous prompt + response.
        diverged_at: usize,
        /// Index in this call's prompt where the glue starts.
        resumed_from: usize,
        /// Which template mismatch was spliced (absent in files written
        /// before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shape: Option<SpliceShape>,
    },
}

/// The template mismatch a [`Join::Splice`] bridged: how the template's
/// re-rendering of the previous assistant turn left what the model saw and
/// generated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpliceShape {
    /// The generation prompt carried a think block (e.g.
    /// `<think>\n\n</think>\n\n` with thinking off) that the history
    /// rendering of the turn leaves out: the new prompt leaves the previous
    /// one at a think token of its generation prompt.
    GenerationGlue,
    /// The history rendering dropped or rewrote the reasoning the model
    /// generated: the new prompt leaves the previous sequence inside the
    /// previous response, before a think token of it.
    StrippedReasoning,
    /// Whitespace the harness echoed back (vLLM's `hermes` tool parser
    /// returns the `"\n\n"` before `<tool_call>` as content) merged with
    /// the template's own newline into one BPE token: the new prompt leaves
    /// the previous sequence at most one token before the previous response
    /// began, at a whitespace token on both sides.
    WhitespaceMerge,
}

impl SpliceShape {
    /// The snake_case name (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GenerationGlue => "generation_glue",
            Self::StrippedReasoning => "stripped_reasoning",
            Self::WhitespaceMerge => "whitespace_merge",
        }
    }
}

/// What a chain is, decided by what its calls are (not by their order):
/// see the `roles` module.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ChainRole {
    /// The main agent's conversation: the one carrying the session's task.
    #[default]
    Main,
    /// An agent the main one started (it is offered tools and works on its
    /// own conversation).
    SubAgent,
    /// A call the harness makes for itself outside the conversation:
    /// titles, routers, summaries, classifiers (no tools offered where
    /// the session offers them, or a structured-output request).
    Side,
}

/// How a trace relates to the rest of its chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SegmentKind {
    /// The first segment of a chain.
    Start,
    /// A segment that continues its chain after the prefix broke; `previous`
    /// links the segment it continues.
    AfterBreak {
        /// Why the prefix broke.
        reason: BreakReason,
    },
    /// A single call whose sibling (same prompt, or a prompt extending the
    /// same call) was kept in the chain instead; `previous` links the trace
    /// holding the kept sibling's predecessor.
    SupersededRetry,
    /// The summary call of a compaction (the harness's own, or the one
    /// Polar made for a server-side compaction request): the call's own
    /// segment, never merged into the conversation it summarizes; `previous`
    /// links the trace it branched from. The segment after the compaction
    /// is `AfterBreak { Compaction }` linked to this one.
    CompactionSummary,
}

/// Why a chain's prefix broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakReason {
    /// The harness compacted its context: the segment goes on from a
    /// summary call (the harness's own summary request, or the one Polar
    /// made for a server-side compaction).
    Compaction,
    /// The harness dropped or edited earlier messages of the same
    /// conversation, with no summary call.
    RewrittenHistory,
    /// The request kept the earlier call's messages, but the template
    /// rendered them into different tokens than the model saw or generated
    /// (stripped reasoning, generation-only glue, a re-serialized tool call,
    /// merged whitespace) and the turn could not be spliced.
    TemplateMismatch,
}

/// A link from a trace to a related one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentLink {
    /// The related trace's chain.
    pub chain: ChainId,
    /// The related trace's segment.
    pub segment: u32,
    /// Length of the longest common prefix of this trace's first prompt and
    /// the related call's prompt + response.
    pub common_prefix_len: usize,
}

/// A label on a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Label {
    /// The trace's chain is a sub-agent's ([`ChainRole::SubAgent`]).
    SubAgent,
    /// The trace's chain is a side request ([`ChainRole::Side`]).
    Side,
    /// The chain started from a call that extended another chain's call which
    /// that chain also continued (a sub-agent forked with its parent's
    /// context).
    Forked,
    /// A call that was retried: see [`SegmentKind::SupersededRetry`].
    SupersededRetry,
    /// A compaction's summary call: see [`SegmentKind::CompactionSummary`].
    CompactionSummary,
    /// A merged call stopped at its token limit (finish reason `length`); its
    /// tokens keep loss 1.
    Truncated,
    /// At least one call joined by a template splice ([`Join::Splice`]).
    TemplateSpliced,
    /// The session did not complete (timeout or error): the trace is kept
    /// but should be weighed accordingly.
    SessionFailed,
    /// The session was ended by the infrastructure (the inference backend
    /// or Polar itself, see [`EndedBy`]), not by the policy: the reward
    /// says nothing about the policy. Always with `session_failed`.
    InfraFault,
    /// The evaluator could not score the session ([`EndedBy::Evaluator`]):
    /// there is no reward to train on. Always with `session_failed`.
    EvaluatorFault,
}

/// Further facts about a trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceMetadata {
    /// Distinct policy versions of the merged calls ([`CallSpan::policy_version`]),
    /// in call order (more than one means the trace spans a weight update:
    /// each span says which version its tokens came from).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_versions: Vec<String>,
    /// Distinct weight versions the backend reported for the merged calls,
    /// in call order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weight_versions: Vec<String>,
    /// The sum of the spans' [`CallSpan::off_policy_context_tokens`]: 0
    /// when every merged call's loss-1 tokens follow exactly the context
    /// the backend saw (0 in files written before it existed).
    #[serde(default)]
    pub off_policy_context_tokens: usize,
    /// Anything else a later stage attaches.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

/// How the session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrajectoryStatus {
    /// The harness finished.
    Completed,
    /// The session ran out of time.
    Timeout,
    /// The session failed.
    Error,
}

/// What the caller knows about the session besides its records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionMeta {
    /// The session.
    pub session_id: String,
    /// The task, when the session belongs to one.
    #[serde(default)]
    pub task_id: Option<String>,
    /// The GRPO group (sessions sampled for the same task); defaults to the
    /// task id.
    #[serde(default)]
    pub group_id: Option<String>,
    /// Which attempt of the session this is (1, 2, ...: `session.json`'s
    /// `metadata.attempt`, stamped by the gateway); `None` for a session
    /// recorded outside the rollout path (`polar harness run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Earlier attempts of the session set apart on the node that recorded
    /// this one (`session.json`'s `superseded_attempts`, counted by the
    /// gateway): counted, never merged into this trajectory.
    #[serde(default)]
    pub superseded_attempts: usize,
    /// How the session ended.
    pub outcome: SessionOutcome,
    /// Who ended it, when the runner attributed it (`None` in sessions
    /// recorded before attribution existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<EndedBy>,
    /// The evaluator's result, kept as given.
    #[serde(default)]
    pub evaluation: Option<Value>,
    /// The policy version the session was started under (`session.json`'s
    /// `metadata.policy_version`): used when no record names one.
    #[serde(default)]
    pub policy_version: Option<String>,
    /// The task's instruction (`session.json`'s `metadata.instruction`):
    /// the main chain is the one carrying it.
    #[serde(default)]
    pub instruction: Option<String>,
}

/// Who ended a session: the party whose doing its outcome is. Only
/// [`EndedBy::Policy`] sessions (and [`EndedBy::Budget`] ones, whose
/// timeout the policy may have earned) say something about the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    /// The harness ended on its own (whatever its exit code), its last
    /// model call answered: the policy's doing, good or bad.
    Policy,
    /// The evaluator could not score the session.
    Evaluator,
    /// The inference backend: the session's last model call failed on the
    /// backend's side (an error status, a cut stream, a timeout, an
    /// `abort` finish) and the harness stopped after it.
    Backend,
    /// Polar itself: the runtime did not start, a prepare step failed, the
    /// harness could not be run, or the agent failed a model call.
    Polar,
    /// The session's time budget ran out.
    Budget,
}

impl EndedBy {
    /// Whether the infrastructure (the backend or Polar) ended the session:
    /// such a sample is no evidence about the policy.
    pub fn is_infra(self) -> bool {
        matches!(self, Self::Backend | Self::Polar)
    }

    /// The snake_case name (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::Evaluator => "evaluator",
            Self::Backend => "backend",
            Self::Polar => "polar",
            Self::Budget => "budget",
        }
    }
}

/// How a session ended, as the runner saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SessionOutcome {
    /// The harness exited normally.
    Completed,
    /// The time budget ran out.
    Timeout,
    /// The session failed.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// Session-level metadata of a trajectory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryMetadata {
    /// The builder (with its options) that made the traces.
    pub builder: Builder,
    /// The session.
    pub session_id: String,
    /// The task.
    #[serde(default)]
    pub task_id: Option<String>,
    /// The GRPO group.
    #[serde(default)]
    pub group_id: Option<String>,
    /// Which attempt of the session this trajectory is
    /// ([`SessionMeta::attempt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The policy version, when every call agrees: each call's
    /// [`CallSpan::policy_version`] (the task's or session's version, else
    /// the backend's weight version); the session's own when no call names
    /// one.
    #[serde(default)]
    pub policy_version: Option<String>,
    /// Every distinct policy version of the calls, in call order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_versions: Vec<String>,
    /// The backend's own weight version, when every call that reported one
    /// agrees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<String>,
    /// Every distinct weight version the backend reported, in call order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weight_versions: Vec<String>,
    /// The evaluator's result.
    #[serde(default)]
    pub evaluation: Option<Value>,
    /// The outcome reward, once assigned.
    #[serde(default)]
    pub reward: Option<f64>,
    /// Who ended the session ([`SessionMeta::ended_by`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<EndedBy>,
}

/// Everything one session produced for training.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// Layout version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// How the session ended.
    pub status: TrajectoryStatus,
    /// Why it did not complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The training samples, ordered by chain and segment.
    pub traces: Vec<Trace>,
    /// Session-level metadata.
    pub metadata: TrajectoryMetadata,
    /// How the traces were reconstructed.
    pub stats: ReconstructionStats,
}
