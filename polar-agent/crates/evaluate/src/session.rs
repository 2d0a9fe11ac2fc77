//! The `session_completed` evaluator: scores the session from what the
//! gateway saw (harness exit, timeout, model calls), without running
//! anything.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::options::parse_raw;
use super::{EvalError, Evaluation, SessionFacts};

/// `session_completed`'s options, as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    min_calls: Option<u64>,
    #[serde(default)]
    max_failed_calls: Option<u64>,
    #[serde(default)]
    reward_success: Option<f64>,
    #[serde(default)]
    reward_failure: Option<f64>,
}

/// Reward `reward_success` when the harness exited 0, did not time out,
/// made at least `min_calls` model calls and at most `max_failed_calls`
/// failed ones; `reward_failure` otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionCompleted {
    /// Fewest model calls for a success.
    pub min_calls: u64,
    /// Most failed calls for a success (`None`: no limit).
    pub max_failed_calls: Option<u64>,
    /// The reward of a success.
    pub reward_success: f64,
    /// The reward of a failure.
    pub reward_failure: f64,
}

impl Default for SessionCompleted {
    fn default() -> Self {
        Self {
            min_calls: 1,
            max_failed_calls: None,
            reward_success: 1.0,
            reward_failure: 0.0,
        }
    }
}

impl SessionCompleted {
    /// Checks the options.
    pub(super) fn from_options(options: &Map<String, Value>) -> Result<Self, EvalError> {
        let raw: Raw = parse_raw(options)?;
        let defaults = Self::default();
        let finite = |name: &str, v: Option<f64>, default: f64| match v {
            Some(x) if !x.is_finite() => Err(EvalError::option(name, "must be a finite number")),
            Some(x) => Ok(x),
            None => Ok(default),
        };
        Ok(Self {
            min_calls: raw.min_calls.unwrap_or(defaults.min_calls),
            max_failed_calls: raw.max_failed_calls,
            reward_success: finite(
                "reward_success",
                raw.reward_success,
                defaults.reward_success,
            )?,
            reward_failure: finite(
                "reward_failure",
                raw.reward_failure,
                defaults.reward_failure,
            )?,
        })
    }

    /// Scores the session; usable when the harness ran to its end.
    pub(super) fn evaluate(&self, facts: &SessionFacts) -> Evaluation {
        let failure = match facts.harness_exit {
            _ if facts.timed_out => Some("the session timed out".to_owned()),
            None => Some("the harness did not exit by itself".to_owned()),
            Some(code) if code != 0 => Some(format!("the harness exited with {code}")),
            Some(_) if facts.calls < self.min_calls => Some(format!(
                "{} model calls, fewer than min_calls = {}",
                facts.calls, self.min_calls
            )),
            Some(_) => match self.max_failed_calls {
                Some(max) if facts.failed_calls > max => Some(format!(
                    "{} failed model calls, more than max_failed_calls = {max}",
                    facts.failed_calls
                )),
                _ => None,
            },
        };
        let reward = if failure.is_some() {
            self.reward_failure
        } else {
            self.reward_success
        };
        let detail = json!({
            "harness_exit": facts.harness_exit,
            "timed_out": facts.timed_out,
            "calls": facts.calls,
            "failed_calls": facts.failed_calls,
            "success": failure.is_none(),
            "reason": failure,
        });
        Evaluation::scored(facts, reward, detail)
    }
}
