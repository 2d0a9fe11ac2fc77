//! Training trajectories rebuilt from a session's captured calls: pure data
//! in, data out (no I/O). [`build`] turns the session's
//! [`CompletionRecord`]s into a [`Trajectory`] with the chosen [`Builder`]
//! (`per_request` or `prefix_merging`), [`rewards`] applies the evaluator's
//! result, and [`check`] verifies the invariants before export.
//!
//! Layout: `types` (the serialized model), `stats`, `options`, `template`
//! (special token ids), `attribution` (the infrastructure fault that
//! ended a session, from its records), `calls` (usable records),
//! `trace_buf` (assembly of one trace), `off_policy` (how far a spliced
//! trace's context is from what the model saw), the two builders, `roles` (main,
//! sub-agent or side chain), `rewards`, `check`.
//!
//! Pure: above `polar-record`, `polar-chat` and `polar-json` only, never an
//! I/O crate (checked by `cargo xtask layers`). Tests: `tests/` (exact
//! scenarios, property tests on a simulated renderer), and the real path in
//! the agent's `trajectory_{capture,scenarios,retries}.rs`.
#![forbid(unsafe_code)]

mod attribution;
mod calls;
pub mod check;
mod off_policy;
mod options;
mod per_request;
mod prefix_merging;
mod rewards;
mod roles;
mod stats;
mod template;
mod trace_buf;
mod types;

#[cfg(test)]
mod tests;

pub use attribution::{Fault, ending_fault};
pub use check::{InvariantViolation, check};
pub use options::{Builder, PrefixMergingOptions, RetryPolicy};
pub use rewards::{RewardError, Rewards, apply_rewards};
pub use stats::{DropReason, DroppedCall, ReconstructionStats, SpliceCounts};
pub use template::{TemplateError, TemplateInfo, TemplateTokens};
pub use types::{
    BreakReason, CallSpan, ChainId, ChainRole, EndedBy, Join, Label, SCHEMA_VERSION, SegmentKind,
    SegmentLink, SessionMeta, SessionOutcome, SpliceShape, Trace, TraceMetadata, Trajectory,
    TrajectoryMetadata, TrajectoryStatus,
};

use polar_record::CompletionRecord;

/// Builds the trajectory of one session from its records (any order; they
/// are taken in `seq` order) with `builder`. Status, ids, group and policy
/// versions come from `meta` and the records; rewards are applied afterwards
/// with [`apply_rewards`].
pub fn build(builder: &Builder, records: &[CompletionRecord], meta: &SessionMeta) -> Trajectory {
    let (mut traces, stats) = match builder {
        Builder::PerRequest => per_request::build(records),
        Builder::PrefixMerging(opts) => prefix_merging::build(records, opts),
    };
    let grouping = match builder {
        Builder::PerRequest => roles::Grouping::Opening,
        Builder::PrefixMerging(_) => roles::Grouping::Chain,
    };
    roles::assign(&mut traces, records, meta.instruction.as_deref(), grouping);
    let mut traj = Trajectory {
        schema_version: SCHEMA_VERSION,
        status: TrajectoryStatus::Completed,
        error: None,
        traces,
        metadata: TrajectoryMetadata {
            builder: builder.clone(),
            session_id: String::new(),
            task_id: None,
            group_id: None,
            attempt: None,
            policy_version: None,
            policy_versions: Vec::new(),
            weight_version: None,
            weight_versions: Vec::new(),
            evaluation: None,
            reward: None,
            ended_by: None,
        },
        stats,
    };
    rewards::apply_session(&mut traj, meta, records);
    traj
}
