//! Session-level facts applied to a built trajectory: status and error from
//! the session's outcome (traces of a failed session are kept but labelled
//! `session_failed`, and `infra_fault` or `evaluator_fault` when the
//! backend, Polar or the evaluator ended it), the GRPO group, the policy
//! versions the records ran under and the weight versions the backend
//! reported, and rewards (one outcome reward copied to every trace, one
//! reward per trace, or an outcome reward with rewards for the traces of
//! some chain roles, as an evaluator that scores a sub-agent's or a side
//! call's work apart gives them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use polar_record::CompletionRecord;

use super::trace_buf::{call_policy_version, push_distinct};
use super::types::{
    ChainRole, EndedBy, Label, SessionMeta, SessionOutcome, Trajectory, TrajectoryStatus,
};

/// Rewards to apply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Rewards {
    /// One reward for the whole session, copied to every trace and stored as
    /// the trajectory's reward.
    Outcome(f64),
    /// One reward per trace, in the order of `Trajectory::traces`.
    PerTrace(Vec<f64>),
    /// The session's outcome reward (the trajectory's, and every trace's
    /// whose role `roles` does not name) and the reward of every trace of
    /// each role named.
    ByRole {
        /// The outcome reward.
        outcome: f64,
        /// The rewards of the traces of these roles.
        roles: BTreeMap<ChainRole, f64>,
    },
}

/// Why rewards could not be applied.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RewardError {
    /// A reward is NaN or infinite.
    #[error("reward {value} (trace {index:?}) is not a finite number")]
    NotFinite {
        /// The trace it was meant for (`None` for an outcome reward).
        index: Option<usize>,
        /// The value.
        value: f64,
    },
    /// Per-trace rewards do not match the traces in number.
    #[error("{rewards} per-trace rewards for {traces} traces")]
    CountMismatch {
        /// Traces in the trajectory.
        traces: usize,
        /// Rewards given.
        rewards: usize,
    },
}

/// Applies `rewards`; on error nothing is changed.
pub fn apply_rewards(traj: &mut Trajectory, rewards: &Rewards) -> Result<(), RewardError> {
    match rewards {
        Rewards::Outcome(r) => {
            if !r.is_finite() {
                return Err(RewardError::NotFinite {
                    index: None,
                    value: *r,
                });
            }
            traj.metadata.reward = Some(*r);
            for t in &mut traj.traces {
                t.reward = Some(*r);
            }
        }
        Rewards::PerTrace(rs) => {
            if rs.len() != traj.traces.len() {
                return Err(RewardError::CountMismatch {
                    traces: traj.traces.len(),
                    rewards: rs.len(),
                });
            }
            if let Some((index, &value)) = rs.iter().enumerate().find(|(_, r)| !r.is_finite()) {
                return Err(RewardError::NotFinite {
                    index: Some(index),
                    value,
                });
            }
            for (t, r) in traj.traces.iter_mut().zip(rs) {
                t.reward = Some(*r);
            }
        }
        Rewards::ByRole { outcome, roles } => {
            if let Some(value) = std::iter::once(outcome)
                .chain(roles.values())
                .find(|r| !r.is_finite())
            {
                return Err(RewardError::NotFinite {
                    index: None,
                    value: *value,
                });
            }
            traj.metadata.reward = Some(*outcome);
            for t in &mut traj.traces {
                t.reward = Some(roles.get(&t.role).copied().unwrap_or(*outcome));
            }
        }
    }
    Ok(())
}

/// The trajectory status and error message of a session outcome.
pub fn status_of(outcome: &SessionOutcome) -> (TrajectoryStatus, Option<String>) {
    match outcome {
        SessionOutcome::Completed => (TrajectoryStatus::Completed, None),
        SessionOutcome::Timeout => (
            TrajectoryStatus::Timeout,
            Some("the session ran out of time".to_owned()),
        ),
        SessionOutcome::Error { message } => (TrajectoryStatus::Error, Some(message.clone())),
    }
}

/// Distinct policy versions of the records (each one's session version,
/// else its backend's weight version), in call order.
pub fn policy_versions(records: &[CompletionRecord]) -> Vec<String> {
    distinct_in_order(records, call_policy_version)
}

/// Distinct weight versions the backend reported, in call order.
pub fn weight_versions(records: &[CompletionRecord]) -> Vec<String> {
    distinct_in_order(records, |r| r.backend.weight_version.as_ref())
}

fn distinct_in_order(
    records: &[CompletionRecord],
    version: impl Fn(&CompletionRecord) -> Option<&String>,
) -> Vec<String> {
    let mut order: Vec<&CompletionRecord> = records.iter().collect();
    order.sort_by_key(|r| r.seq);
    let mut out: Vec<String> = Vec::new();
    for r in order {
        push_distinct(&mut out, version(r));
    }
    out
}

/// The one element of `list`, if it has exactly one.
fn only(list: &[String]) -> Option<String> {
    match list {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// Sets status, error, session ids, group, attempt and policy versions
/// from `meta` and `records`, and the count of superseded attempts in the
/// stats, and labels every trace of a session that did not complete.
pub(crate) fn apply_session(
    traj: &mut Trajectory,
    meta: &SessionMeta,
    records: &[CompletionRecord],
) {
    let (status, error) = status_of(&meta.outcome);
    traj.status = status;
    traj.error = error;
    let md = &mut traj.metadata;
    md.session_id = meta.session_id.clone();
    md.task_id = meta
        .task_id
        .clone()
        .or_else(|| records.iter().find_map(|r| r.task_id.clone()));
    md.group_id = meta.group_id.clone().or_else(|| md.task_id.clone());
    md.attempt = meta.attempt;
    md.evaluation = meta.evaluation.clone();
    md.policy_versions = policy_versions(records);
    if md.policy_versions.is_empty()
        && let Some(v) = &meta.policy_version
    {
        md.policy_versions.push(v.clone());
    }
    md.policy_version = only(&md.policy_versions);
    md.weight_versions = weight_versions(records);
    md.weight_version = only(&md.weight_versions);
    md.ended_by = meta.ended_by;
    traj.stats.superseded_attempts = meta.superseded_attempts;
    let extra = match meta.ended_by {
        Some(e) if e.is_infra() => Some(Label::InfraFault),
        Some(EndedBy::Evaluator) => Some(Label::EvaluatorFault),
        _ => None,
    };
    if status != TrajectoryStatus::Completed || extra.is_some() {
        for t in &mut traj.traces {
            t.add_label(Label::SessionFailed);
            if let Some(l) = extra {
                t.add_label(l);
            }
        }
    }
}
