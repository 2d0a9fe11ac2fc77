//! Why a task's unusable samples ended, grouped by message: what a trainer
//! and an operator read first when a task ends `partial` or `failed`
//! ([`TaskView::failures`](crate::TaskView::failures)). Pure.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::SessionState;

/// Samples of a task that ended unusable for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureGroup {
    /// How they ended: a result's status (`error`, `timeout`) or `failed`
    /// (the server could not get them run).
    pub status: String,
    /// The message they share.
    pub error: String,
    /// How many samples.
    pub count: u32,
    /// Their indexes, ascending.
    pub samples: Vec<u32>,
}

/// How a sample ended unusable (`None`: usable, open, or cancelled).
fn failure_of(state: &SessionState) -> Option<(&'static str, &str)> {
    match state {
        SessionState::Done { result, .. } if result.status.is_usable() => None,
        SessionState::Done { result, .. } => {
            let status = result.status.as_str();
            (status != "cancelled")
                .then(|| (status, result.error.as_deref().unwrap_or("no reason given")))
        }
        SessionState::Failed { error } => Some(("failed", error.as_str())),
        _ => None,
    }
}

/// The failures of `(sample index, state)` pairs, grouped by status and
/// message: the largest group first, ties in order of their first sample.
pub fn failure_groups<'a>(
    samples: impl IntoIterator<Item = (u32, &'a SessionState)>,
) -> Vec<FailureGroup> {
    let mut groups: Vec<FailureGroup> = Vec::new();
    let mut at: HashMap<(&'static str, &'a str), usize> = HashMap::new();
    for (index, state) in samples {
        let Some(key) = failure_of(state) else {
            continue;
        };
        let i = *at.entry(key).or_insert_with(|| {
            groups.push(FailureGroup {
                status: key.0.to_owned(),
                error: key.1.to_owned(),
                count: 0,
                samples: Vec::new(),
            });
            groups.len() - 1
        });
        if let Some(g) = groups.get_mut(i) {
            g.count += 1;
            g.samples.push(index);
        }
    }
    for g in &mut groups {
        g.samples.sort_unstable();
    }
    // Stable: equal counts keep the order of their first sample.
    groups.sort_by_key(|g| std::cmp::Reverse(g.count));
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SampleResult, SampleStatus, TokenUsage};

    fn done(status: SampleStatus, error: Option<&str>) -> SessionState {
        SessionState::Done {
            node: "n".into(),
            attempt: 1,
            result: SampleResult {
                status,
                reward: None,
                trajectory_uri: None,
                tokens: TokenUsage::default(),
                error: error.map(str::to_owned),
                stats: None,
            },
        }
    }

    #[test]
    fn unusable_samples_are_grouped_by_status_and_message() {
        let backend = "the inference backend ended the session";
        let states = [
            done(SampleStatus::Completed, None),
            done(SampleStatus::Error, Some(backend)),
            SessionState::Failed {
                error: "no healthy node for 30000 ms".into(),
            },
            done(SampleStatus::Error, Some(backend)),
            done(SampleStatus::Timeout, Some("the session's time ran out")),
            done(SampleStatus::Cancelled, None),
            SessionState::Cancelled {
                reason: "early stop".into(),
            },
            SessionState::Pending,
            done(SampleStatus::Error, None),
        ];
        let g = failure_groups(states.iter().enumerate().map(|(i, s)| (i as u32, s)));
        let summary: Vec<(&str, &str, u32, Vec<u32>)> = g
            .iter()
            .map(|g| {
                (
                    g.status.as_str(),
                    g.error.as_str(),
                    g.count,
                    g.samples.clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("error", backend, 2, vec![1, 3]),
                ("failed", "no healthy node for 30000 ms", 1, vec![2]),
                ("timeout", "the session's time ran out", 1, vec![4]),
                ("error", "no reason given", 1, vec![8]),
            ]
        );
    }

    #[test]
    fn a_task_without_failures_has_no_group() {
        let ok = done(SampleStatus::Completed, None);
        assert!(failure_groups([(0, &ok), (1, &ok)]).is_empty());
    }
}
