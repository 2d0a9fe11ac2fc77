//! What a finished session amounts to, from how it reached POSTRUN, its
//! steps and its evaluation: the sample status, the error, whether the
//! node is at fault (dispatch again), and the outcome its trajectory
//! records. Pure.

use serde_json::{Map, Value};

use super::work::Ran;
use crate::runtime::plan::{Phase, StepEnd, StepReport};
use polar_evaluate::Evaluation;
use polar_gateway::stages::{InitFault, Interrupt, Reached, Report};
use polar_rollout_api::{SampleStatus, TokenUsage};
use polar_trajectory::SessionOutcome;

/// The report of a session that never got prepared. One the node's policy
/// refused is an error of the task's spec: not retried, no reward, and
/// `stats.refused = "node_policy"` tells it from the node's own failures.
pub(super) fn never_prepared(reached: Reached<Ran>) -> Report {
    let refused = matches!(&reached, Reached::InitFailed(e) if e.fault == InitFault::Policy);
    let (status, error, retry) = match reached {
        Reached::InitFailed(e) => {
            let retry = e.retry();
            (SampleStatus::Error, Some(e.error), retry)
        }
        Reached::Interrupted(Interrupt::Budget) => (
            SampleStatus::Timeout,
            Some("the session budget ran out before it started".into()),
            false,
        ),
        Reached::Interrupted(Interrupt::Cancelled) | Reached::Ran(_) => {
            (SampleStatus::Cancelled, None, false)
        }
    };
    let mut stats = Map::new();
    if refused {
        stats.insert("refused".into(), Value::from("node_policy"));
    }
    Report {
        status,
        reward: None,
        trajectory_uri: None,
        tokens: TokenUsage::default(),
        error,
        stats,
        retry,
    }
}

/// How a prepared session ended, from its steps and how it reached POSTRUN.
#[derive(Debug, Default)]
pub(super) struct Ended {
    pub(super) cancelled: bool,
    pub(super) timed_out: bool,
    pub(super) start_failed: bool,
    pub(super) prepare_failed: Option<String>,
    pub(super) harness: Option<StepEnd>,
}

impl Ended {
    pub(super) fn of(reached: &Reached<Ran>, steps: &[StepReport]) -> Self {
        let harness = match reached {
            Reached::Ran(end) => Some(end.clone()),
            _ => steps
                .iter()
                .find(|r| r.phase == Phase::Main)
                .map(|r| r.end.clone()),
        };
        Self {
            cancelled: matches!(reached, Reached::Interrupted(Interrupt::Cancelled)),
            timed_out: matches!(reached, Reached::Interrupted(Interrupt::Budget))
                || harness == Some(StepEnd::TimedOut),
            start_failed: steps.iter().any(|r| r.phase == Phase::Start && !r.end.ok()),
            prepare_failed: steps
                .iter()
                .find(|r| r.phase == Phase::Prepare && !r.end.ok())
                .map(|r| format!("prepare step {} ({}) ended {:?}", r.index, r.what, r.end)),
            harness,
        }
    }

    pub(super) fn harness_exit(&self) -> Option<i32> {
        match self.harness {
            Some(StepEnd::Exited { code }) => Some(code),
            _ => None,
        }
    }
}

/// What a session's report says, and the outcome its trajectory records
/// (`None`: nothing is exported).
#[derive(Debug, PartialEq)]
pub(super) struct Verdict {
    pub(super) status: SampleStatus,
    pub(super) error: Option<String>,
    pub(super) outcome: Option<SessionOutcome>,
    pub(super) retry: bool,
}

/// The verdict, in order: cancelled; timed out; the runtime did not start
/// (the node's fault: dispatch again); a prepare step failed; the
/// evaluation could not be made; the harness ended (completed, whatever its
/// exit code: the reward says how well); the harness did not end.
pub(super) fn verdict(e: &Ended, evaluation: Option<&Evaluation>) -> Verdict {
    let failed = |m: String, retry: bool| Verdict {
        status: SampleStatus::Error,
        error: Some(m.clone()),
        outcome: Some(SessionOutcome::Error { message: m }),
        retry,
    };
    if e.cancelled {
        return Verdict {
            status: SampleStatus::Cancelled,
            error: None,
            outcome: None,
            retry: false,
        };
    }
    if e.timed_out {
        return Verdict {
            status: SampleStatus::Timeout,
            error: Some("the session's time ran out".into()),
            outcome: Some(SessionOutcome::Timeout),
            retry: false,
        };
    }
    if e.start_failed {
        return failed("the runtime did not start".into(), true);
    }
    if let Some(m) = &e.prepare_failed {
        return failed(m.clone(), false);
    }
    if let Some(ev) = evaluation
        && !ev.usable
        && let Some(why) = &ev.error
    {
        return failed(format!("evaluation failed: {why}"), false);
    }
    if e.harness_exit().is_some() {
        return Verdict {
            status: SampleStatus::Completed,
            error: None,
            outcome: Some(SessionOutcome::Completed),
            retry: false,
        };
    }
    failed(
        format!("the harness did not finish: {:?}", e.harness),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_gateway::stages::InitError;

    fn ev(reward: Option<f64>, usable: bool, error: Option<&str>) -> Evaluation {
        Evaluation {
            reward,
            usable,
            detail: serde_json::Value::Null,
            error: error.map(str::to_owned),
        }
    }

    #[test]
    fn verdicts_in_order_of_precedence() {
        let exited = |code| Ended {
            harness: Some(StepEnd::Exited { code }),
            ..Ended::default()
        };
        let v = verdict(&exited(0), Some(&ev(Some(1.0), true, None)));
        assert_eq!(v.status, SampleStatus::Completed);
        assert_eq!(v.outcome, Some(SessionOutcome::Completed));
        // A harness that failed is still a completed sample: the reward
        // says how well it did.
        let v = verdict(&exited(1), Some(&ev(Some(0.0), true, Some("tests failed"))));
        assert_eq!(v.status, SampleStatus::Completed);
        // An evaluation that could not be made is an error, not retried.
        let v = verdict(&exited(0), Some(&ev(None, false, Some("no reward file"))));
        assert_eq!(v.status, SampleStatus::Error);
        assert!(!v.retry);
        assert!(v.error.unwrap().contains("no reward file"));
        let mut e = exited(0);
        e.prepare_failed = Some("prepare step 0".into());
        assert_eq!(verdict(&e, None).status, SampleStatus::Error);
        e.start_failed = true;
        let v = verdict(&e, None);
        assert!(v.retry && v.status == SampleStatus::Error);
        e.timed_out = true;
        let v = verdict(&e, None);
        assert_eq!(
            (v.status, v.outcome),
            (SampleStatus::Timeout, Some(SessionOutcome::Timeout))
        );
        e.cancelled = true;
        let v = verdict(&e, None);
        assert_eq!((v.status, v.outcome), (SampleStatus::Cancelled, None));
        let stopped = Ended {
            harness: Some(StepEnd::Stopped),
            ..Ended::default()
        };
        assert_eq!(verdict(&stopped, None).status, SampleStatus::Error);
    }

    #[test]
    fn a_session_never_prepared() {
        let r = never_prepared(Reached::InitFailed(InitError::new(
            InitFault::Spec,
            "agent.harness: unknown",
        )));
        assert_eq!((r.status, r.retry), (SampleStatus::Error, false));
        assert!(r.stats.is_empty());
        let r = never_prepared(Reached::InitFailed(InitError::new(
            InitFault::Policy,
            "refused by this node's policy: runtime.network: \"host\" is not allowed",
        )));
        assert_eq!(
            (r.status, r.retry, r.reward),
            (SampleStatus::Error, false, None)
        );
        assert_eq!(r.stats["refused"], "node_policy");
        let r = never_prepared(Reached::Interrupted(Interrupt::Budget));
        assert_eq!(r.status, SampleStatus::Timeout);
    }
}
