//! The `composite` evaluator: several evaluators, each with a weight, run
//! one after the other on the same session; the reward is the weighted
//! mean of their rewards. The sample is usable only when every part gave a
//! reward and was usable: a part that could not score (a judge without an
//! answer, a missing reward file) leaves the whole without a reward rather
//! than a mean of what happened to work. Each part's reward, weight,
//! detail and error are in the detail's `parts`.
//!
//! Options: `evaluators`, an array of `{"kind": K, "options": {...},
//! "weight": W}` (weight above 0, default 1; at least one part; no
//! `composite` inside). The parts run in one sandbox: a fresh one when any
//! part asks for `fresh`, else the session's.

use std::future::Future;
use std::pin::Pin;

use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::judge::JudgeInputs;
use super::options::parse_raw;
use super::{CommandRunner, EvalError, Evaluation, Evaluator, SessionFacts};
use polar_spec::EvaluatorSpec;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPart {
    kind: String,
    #[serde(default)]
    options: Map<String, Value>,
    #[serde(default)]
    weight: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    evaluators: Vec<RawPart>,
}

/// A checked `composite` spec.
#[derive(Clone, Debug)]
pub struct Composite {
    /// The parts and their weights.
    pub parts: Vec<(Evaluator, f64)>,
}

impl Composite {
    /// Checks the options (each part's with its own kind's checks; errors
    /// name `evaluators[i].options.X`).
    pub(super) fn from_options(options: &Map<String, Value>) -> Result<Self, EvalError> {
        let raw: Raw = parse_raw(options)?;
        if raw.evaluators.is_empty() {
            return Err(EvalError::option("evaluators", "at least one evaluator"));
        }
        let mut parts = Vec::new();
        for (i, p) in raw.evaluators.into_iter().enumerate() {
            let at = format!("evaluators[{i}]");
            if p.kind == "composite" {
                return Err(EvalError::option(
                    format!("{at}.kind"),
                    "a composite inside a composite: list its parts here",
                ));
            }
            let weight = p.weight.unwrap_or(1.0);
            if !(weight.is_finite() && weight > 0.0) {
                return Err(EvalError::option(
                    format!("{at}.weight"),
                    "a number above 0",
                ));
            }
            let spec = EvaluatorSpec {
                kind: p.kind,
                options: p.options,
            };
            let e = Evaluator::from_spec(&spec).map_err(|e| match e {
                EvalError::UnknownKind(k) => {
                    EvalError::option(format!("{at}.kind"), format!("unknown evaluator {k:?}"))
                }
                EvalError::Option { option, reason } => {
                    EvalError::option(format!("{at}.options.{option}"), reason)
                }
            })?;
            parts.push((e, weight));
        }
        Ok(Self { parts })
    }

    /// Whether any part runs in a fresh sandbox.
    pub(super) fn fresh(&self) -> bool {
        self.parts.iter().any(|(e, _)| e.needs_fresh_sandbox())
    }

    /// Whether any part runs commands.
    pub(super) fn runs_commands(&self) -> bool {
        self.parts.iter().any(|(e, _)| e.runs_commands())
    }

    /// Runs every part, in order.
    pub(super) async fn evaluate(
        &self,
        facts: &SessionFacts,
        runner: &dyn CommandRunner,
        judge: Option<&JudgeInputs<'_>>,
    ) -> Evaluation {
        let mut details = Vec::new();
        let mut sum = 0.0;
        let mut total = 0.0;
        let mut usable = true;
        let mut missing = Vec::new();
        let mut parts = Vec::new();
        for (i, (e, w)) in self.parts.iter().enumerate() {
            let r = part(e, facts, runner, judge).await;
            match r.reward {
                Some(x) => {
                    sum += w * x;
                    parts.push((*w, x, r.role_rewards.clone()));
                }
                None => missing.push(format!(
                    "evaluators[{i}] ({}): {}",
                    e.kind(),
                    r.error.clone().unwrap_or_default()
                )),
            }
            total += w;
            usable &= r.usable;
            details.push(json!({
                "kind": e.kind(),
                "weight": w,
                "reward": r.reward,
                "usable": r.usable,
                "detail": r.detail,
                "error": r.error,
            }));
        }
        let detail = json!({"parts": details});
        if !missing.is_empty() {
            return Evaluation::failed(
                format!("composite: no reward from {}", missing.join("; ")),
                detail,
            );
        }
        Evaluation {
            reward: Some(sum / total),
            usable: usable && facts.ran_to_end(),
            detail,
            error: None,
            role_rewards: role_rewards(&parts, total),
        }
    }
}

/// The weighted rewards of the roles any part scored apart: each part
/// counts with its reward for the role, else its outcome reward.
fn role_rewards(parts: &[(f64, f64, BTreeMap<String, f64>)], total: f64) -> BTreeMap<String, f64> {
    let roles: BTreeSet<&String> = parts.iter().flat_map(|(_, _, r)| r.keys()).collect();
    roles
        .into_iter()
        .map(|role| {
            let sum: f64 = parts
                .iter()
                .map(|(w, outcome, r)| w * r.get(role).copied().unwrap_or(*outcome))
                .sum();
            (role.clone(), sum / total)
        })
        .collect()
}

/// One part's evaluation, boxed: a composite's future holds its parts'.
fn part<'a>(
    e: &'a Evaluator,
    facts: &'a SessionFacts,
    runner: &'a dyn CommandRunner,
    judge: Option<&'a JudgeInputs<'a>>,
) -> Pin<Box<dyn Future<Output = Evaluation> + Send + 'a>> {
    Box::pin(e.evaluate_with(facts, runner, judge))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part that scored a role apart counts with that reward for it; the
    /// others with their outcome.
    #[test]
    fn role_rewards_are_weighted_like_the_outcome() {
        let parts = [
            (3.0, 1.0, BTreeMap::from([("main".to_owned(), 0.5)])),
            (1.0, 0.0, BTreeMap::new()),
        ];
        assert_eq!(
            role_rewards(&parts, 4.0),
            BTreeMap::from([("main".to_owned(), 1.5 / 4.0)])
        );
        assert!(role_rewards(&parts[1..], 1.0).is_empty());
    }
}
