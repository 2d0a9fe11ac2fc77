//! One exported row: a [`Trace`] with its trajectory's columns repeated,
//! borrowed from the trajectory when writing ([`rows`]) and owned when
//! read back. [`trajectories`] regroups rows into the trajectories they
//! came from, losslessly. The enum-valued columns are plain strings
//! (snake_case names) so any reader can filter on them.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use polar_chat::{FinishReason, Message, Tool};
use polar_trajectory::{
    BreakReason, Builder, CallSpan, ChainId, ChainRole, Label, ReconstructionStats, SCHEMA_VERSION,
    SegmentKind, SegmentLink, Trace, TraceMetadata, Trajectory, TrajectoryMetadata,
    TrajectoryStatus,
};

use super::error::ExportError;
use super::schema::EXPORT_SCHEMA_VERSION;

/// One row of the export (see `docs/EXPORT-SCHEMA.md` for each column).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row<'a> {
    /// [`EXPORT_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `<session_id>/<trace_index>`: unique across an export.
    pub trace_id: String,
    /// The session.
    pub session_id: Cow<'a, str>,
    /// The task.
    pub task_id: Option<Cow<'a, str>>,
    /// The GRPO group.
    pub group_id: Option<Cow<'a, str>>,
    /// Which attempt of the session the row came from (null outside the
    /// rollout path).
    #[serde(default)]
    pub attempt: Option<u32>,
    /// The policy version, when every call of the session ran under the
    /// same one (the task's or session's, else the backend's).
    pub policy_version: Option<Cow<'a, str>>,
    /// The backend's own weight version, when every call that reported one
    /// agrees.
    #[serde(default)]
    pub weight_version: Option<Cow<'a, str>>,
    /// How the session ended.
    pub status: TrajectoryStatus,
    /// Why it did not complete.
    pub error: Option<Cow<'a, str>>,
    /// `per_request` or `prefix_merging` (options in `trajectory_metadata`).
    pub builder: Cow<'a, str>,
    /// Position of the trace in its trajectory.
    pub trace_index: u32,
    /// The trace's chain.
    pub chain: u32,
    /// What the chain is: `main`, `sub_agent` or `side`.
    #[serde(default)]
    pub chain_role: ChainRole,
    /// The trace's segment in its chain.
    pub segment: u32,
    /// `start`, `after_break`, `superseded_retry` or `compaction_summary`.
    pub segment_kind: Cow<'a, str>,
    /// Why the prefix broke (`after_break` only).
    pub break_reason: Option<BreakReason>,
    /// Labels.
    pub labels: Cow<'a, [Label]>,
    /// Why the last merged call stopped (`stop`, `length`, `tool_calls`,
    /// `content_filter`, `abort`, or the backend's own word).
    pub finish_reason: Option<Cow<'a, str>>,
    /// The trace's reward.
    pub reward: Option<f64>,
    /// Prompt token ids.
    pub prompt_ids: Cow<'a, [u32]>,
    /// Response token ids.
    pub response_ids: Cow<'a, [u32]>,
    /// Loss mask over `response_ids`.
    pub loss_mask: Cow<'a, [u8]>,
    /// Logprobs over `response_ids`.
    pub response_logprobs: Option<Cow<'a, [f32]>>,
    /// The first merged call's request messages.
    pub prompt_messages: Cow<'a, [Message]>,
    /// The messages after them.
    pub response_messages: Cow<'a, [Message]>,
    /// Tools offered.
    pub tools: Cow<'a, [Tool]>,
    /// The merged calls.
    pub call_ids: Cow<'a, [String]>,
    /// Spans, link to the previous segment, per-trace policy versions, extra.
    pub trace_metadata: TraceExtras<'a>,
    /// The trajectory's metadata (builder with options, evaluation, outcome
    /// reward, ...).
    pub trajectory_metadata: Cow<'a, TrajectoryMetadata>,
    /// The trajectory's reconstruction statistics.
    pub stats: Cow<'a, ReconstructionStats>,
    /// Tokens of the trace's context that differ from the prompts its calls
    /// saw, summed over its calls (`trace_metadata.off_policy_context_tokens`;
    /// null in files written before the column existed).
    #[serde(default)]
    pub off_policy_context_tokens: Option<u32>,
}

/// The `trace_metadata` column: what a trace carries beyond the flat
/// columns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceExtras<'a> {
    /// Where each merged call sits in `response_ids`.
    pub spans: Cow<'a, [CallSpan]>,
    /// The trace this one continues or branches from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<SegmentLink>,
    /// Distinct policy versions of the merged calls.
    #[serde(default, skip_serializing_if = "<[String]>::is_empty")]
    pub policy_versions: Cow<'a, [String]>,
    /// Distinct weight versions the backend reported for them.
    #[serde(default, skip_serializing_if = "<[String]>::is_empty")]
    pub weight_versions: Cow<'a, [String]>,
    /// The spans' off-policy context tokens, summed.
    #[serde(default)]
    pub off_policy_context_tokens: usize,
    /// Anything else attached to the trace.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Cow<'a, Map<String, Value>>,
}

/// The rows of `traj`, borrowing from it.
pub fn rows(traj: &Trajectory) -> impl Iterator<Item = Row<'_>> {
    let md = &traj.metadata;
    traj.traces.iter().enumerate().map(move |(i, t)| {
        let (segment_kind, break_reason) = segment_kind_name(t.segment_kind);
        Row {
            schema_version: EXPORT_SCHEMA_VERSION,
            trace_id: format!("{}/{i}", md.session_id),
            session_id: Cow::Borrowed(&md.session_id),
            task_id: md.task_id.as_deref().map(Cow::Borrowed),
            group_id: md.group_id.as_deref().map(Cow::Borrowed),
            attempt: md.attempt,
            policy_version: md.policy_version.as_deref().map(Cow::Borrowed),
            weight_version: md.weight_version.as_deref().map(Cow::Borrowed),
            status: traj.status,
            error: traj.error.as_deref().map(Cow::Borrowed),
            builder: Cow::Borrowed(builder_name(&md.builder)),
            trace_index: u32::try_from(i).unwrap_or(u32::MAX),
            chain: t.chain.0,
            chain_role: t.role,
            segment: t.segment,
            segment_kind: Cow::Borrowed(segment_kind),
            break_reason,
            labels: Cow::Borrowed(&t.labels),
            finish_reason: t.finish_reason.as_ref().map(finish_reason_name),
            reward: t.reward,
            prompt_ids: Cow::Borrowed(&t.prompt_ids),
            response_ids: Cow::Borrowed(&t.response_ids),
            loss_mask: Cow::Borrowed(&t.loss_mask),
            response_logprobs: t.response_logprobs.as_deref().map(Cow::Borrowed),
            prompt_messages: Cow::Borrowed(&t.prompt_messages),
            response_messages: Cow::Borrowed(&t.response_messages),
            tools: Cow::Borrowed(&t.tools),
            call_ids: Cow::Borrowed(&t.call_ids),
            trace_metadata: TraceExtras {
                spans: Cow::Borrowed(&t.spans),
                previous: t.previous,
                policy_versions: Cow::Borrowed(&t.metadata.policy_versions),
                weight_versions: Cow::Borrowed(&t.metadata.weight_versions),
                off_policy_context_tokens: t.metadata.off_policy_context_tokens,
                extra: Cow::Borrowed(&t.metadata.extra),
            },
            trajectory_metadata: Cow::Borrowed(md),
            stats: Cow::Borrowed(&traj.stats),
            off_policy_context_tokens: Some(
                u32::try_from(t.metadata.off_policy_context_tokens).unwrap_or(u32::MAX),
            ),
        }
    })
}

/// The `builder` column value.
pub fn builder_name(b: &Builder) -> &'static str {
    match b {
        Builder::PerRequest => "per_request",
        Builder::PrefixMerging(_) => "prefix_merging",
    }
}

/// The `status` column value.
pub fn status_name(s: TrajectoryStatus) -> &'static str {
    match s {
        TrajectoryStatus::Completed => "completed",
        TrajectoryStatus::Timeout => "timeout",
        TrajectoryStatus::Error => "error",
    }
}

/// The `labels` column values.
pub fn label_name(l: Label) -> &'static str {
    match l {
        Label::SubAgent => "sub_agent",
        Label::Side => "side",
        Label::Forked => "forked",
        Label::SupersededRetry => "superseded_retry",
        Label::CompactionSummary => "compaction_summary",
        Label::Truncated => "truncated",
        Label::TemplateSpliced => "template_spliced",
        Label::SessionFailed => "session_failed",
        Label::InfraFault => "infra_fault",
        Label::EvaluatorFault => "evaluator_fault",
    }
}

/// The `chain_role` column value.
pub fn chain_role_name(r: ChainRole) -> &'static str {
    match r {
        ChainRole::Main => "main",
        ChainRole::SubAgent => "sub_agent",
        ChainRole::Side => "side",
    }
}

/// The `break_reason` column value.
pub fn break_reason_name(r: BreakReason) -> &'static str {
    match r {
        BreakReason::Compaction => "compaction",
        BreakReason::RewrittenHistory => "rewritten_history",
        BreakReason::TemplateMismatch => "template_mismatch",
    }
}

/// The `segment_kind` and `break_reason` column values.
pub fn segment_kind_name(k: SegmentKind) -> (&'static str, Option<BreakReason>) {
    match k {
        SegmentKind::Start => ("start", None),
        SegmentKind::AfterBreak { reason } => ("after_break", Some(reason)),
        SegmentKind::SupersededRetry => ("superseded_retry", None),
        SegmentKind::CompactionSummary => ("compaction_summary", None),
    }
}

/// The `finish_reason` column value: the snake_case name, or the backend's
/// own word for [`FinishReason::Other`].
pub fn finish_reason_name(f: &FinishReason) -> Cow<'_, str> {
    Cow::Borrowed(match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Abort => "abort",
        FinishReason::Other(s) => s,
    })
}

/// Parses a `finish_reason` column value (an unknown word is
/// [`FinishReason::Other`]).
pub fn parse_finish_reason(s: &str) -> FinishReason {
    match s {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "tool_calls" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        "abort" => FinishReason::Abort,
        other => FinishReason::Other(other.to_owned()),
    }
}

/// Parses a snake_case enum name (`status`, `labels`, `break_reason`).
pub fn parse_name<T: serde::de::DeserializeOwned>(column: &str, s: &str) -> Result<T, ExportError> {
    serde_json::from_value(Value::String(s.to_owned())).map_err(|e| ExportError::Schema {
        version: EXPORT_SCHEMA_VERSION,
        detail: format!("column {column}: {s:?}: {e}"),
    })
}

fn schema_error(detail: String) -> ExportError {
    ExportError::Schema {
        version: EXPORT_SCHEMA_VERSION,
        detail,
    }
}

impl Row<'_> {
    /// The trace this row holds.
    pub fn to_trace(&self) -> Result<Trace, ExportError> {
        let segment_kind = match (&*self.segment_kind, self.break_reason) {
            ("start", None) => SegmentKind::Start,
            ("after_break", Some(reason)) => SegmentKind::AfterBreak { reason },
            ("superseded_retry", None) => SegmentKind::SupersededRetry,
            ("compaction_summary", None) => SegmentKind::CompactionSummary,
            (k, r) => {
                return Err(schema_error(format!(
                    "trace {}: segment_kind {k:?} with break_reason {r:?}",
                    self.trace_id
                )));
            }
        };
        Ok(Trace {
            prompt_ids: self.prompt_ids.to_vec(),
            response_ids: self.response_ids.to_vec(),
            loss_mask: self.loss_mask.to_vec(),
            response_logprobs: self.response_logprobs.as_ref().map(|l| l.to_vec()),
            prompt_messages: self.prompt_messages.to_vec(),
            response_messages: self.response_messages.to_vec(),
            tools: self.tools.to_vec(),
            finish_reason: self.finish_reason.as_deref().map(parse_finish_reason),
            reward: self.reward,
            call_ids: self.call_ids.to_vec(),
            spans: self.trace_metadata.spans.to_vec(),
            chain: ChainId(self.chain),
            role: self.chain_role,
            segment: self.segment,
            segment_kind,
            previous: self.trace_metadata.previous,
            labels: self.labels.to_vec(),
            metadata: TraceMetadata {
                policy_versions: self.trace_metadata.policy_versions.to_vec(),
                weight_versions: self.trace_metadata.weight_versions.to_vec(),
                off_policy_context_tokens: self.trace_metadata.off_policy_context_tokens,
                extra: self.trace_metadata.extra.clone().into_owned(),
            },
        })
    }
}

/// Regroups rows (in file order: a trajectory's rows are consecutive, by
/// `trace_index`) into the trajectories they were written from.
pub fn trajectories<'a>(
    rows: impl IntoIterator<Item = Row<'a>>,
) -> Result<Vec<Trajectory>, ExportError> {
    let mut out: Vec<Trajectory> = Vec::new();
    for row in rows {
        if row.schema_version != EXPORT_SCHEMA_VERSION {
            return Err(schema_error(format!(
                "row {} has schema version {}",
                row.trace_id, row.schema_version
            )));
        }
        let trace = row.to_trace()?;
        let continues = out.last().is_some_and(|t: &Trajectory| {
            t.metadata.session_id == row.session_id && t.traces.len() == row.trace_index as usize
        });
        if continues {
            if let Some(t) = out.last_mut() {
                t.traces.push(trace);
            }
            continue;
        }
        if row.trace_index != 0 {
            return Err(schema_error(format!(
                "trace {}: rows of a session are not consecutive",
                row.trace_id
            )));
        }
        out.push(Trajectory {
            schema_version: SCHEMA_VERSION,
            status: row.status,
            error: row.error.map(Cow::into_owned),
            traces: vec![trace],
            metadata: row.trajectory_metadata.into_owned(),
            stats: row.stats.into_owned(),
        });
    }
    Ok(out)
}
