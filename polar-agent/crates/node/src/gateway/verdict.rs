//! What a finished session amounts to, from how it reached POSTRUN, its
//! steps, its capture log's last call and its evaluation: the sample
//! status, the error, who ended it ([`EndedBy`]: the policy, the
//! evaluator, the backend, Polar, the budget), whether to run it again (the
//! node or the infrastructure is at fault), and the outcome its trajectory
//! records. Pure.

use serde_json::{Map, Value};

use super::work::Ran;
use polar_evaluate::Evaluation;
use polar_gateway::stages::{InitFault, Interrupt, Reached, Report};
use polar_rollout_api::{SampleStatus, TokenUsage};
use polar_sandbox::runtime::plan::{Phase, StepEnd, StepReport};
use polar_trajectory::{EndedBy, Fault, SessionOutcome};

/// The report of a session that never got prepared. One the node's policy
/// refused is an error of the task's spec: not retried, no reward, and
/// `stats.refused = "node_policy"` tells it from the node's own failures.
pub(super) fn never_prepared(reached: Reached<Ran>) -> Report {
    let refused = matches!(&reached, Reached::InitFailed(e) if e.fault == InitFault::Policy);
    let unfit = matches!(&reached, Reached::InitFailed(e) if e.fault == InitFault::Unfit);
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
        infra_fault: false,
        node_unfit: unfit,
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
    /// The infrastructure fault of the session's last model call, from its
    /// capture log ([`polar_trajectory::ending_fault`]).
    pub(super) fault: Option<Fault>,
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
            // A runtime that did not start, or a sandbox bubblewrap could
            // not build around a command: the node's fault.
            start_failed: steps.iter().any(|r| {
                (r.phase == Phase::Start && !r.end.ok())
                    || matches!(r.end, StepEnd::NotStarted { .. })
            }) || matches!(harness, Some(StepEnd::NotStarted { .. })),
            prepare_failed: steps
                .iter()
                .find(|r| r.phase == Phase::Prepare && !r.end.ok())
                .map(|r| format!("prepare step {} ({}) ended {:?}", r.index, r.what, r.end)),
            harness,
            fault: None,
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
    /// Who ended the session (`None`: cancelled).
    pub(super) ended_by: Option<EndedBy>,
    /// Run the session again (within the rollout server's retry limit):
    /// the node or the infrastructure is at fault, not the sample.
    pub(super) retry: bool,
}

/// The message of a session its last model call's fault ended.
fn fault_message(f: &Fault) -> String {
    let who = match f.ended_by {
        EndedBy::Polar => "Polar",
        _ => "the inference backend",
    };
    format!(
        "{who} ended the session: its last model call (seq {}) failed: {}",
        f.seq, f.error
    )
}

/// The verdict, in order: cancelled; timed out (the budget's, or the
/// infrastructure's when the last model call failed on its side: run
/// again); the runtime did not start (the node's fault: run again); a
/// prepare step failed (Polar's side, not the policy's; not run again: the
/// task's own steps would fail again); the last model call failed on the
/// backend's or Polar's side (the harness stopped because of it, whatever
/// its exit code: an error of the infrastructure, run again); the
/// evaluation could not be made; the harness ended (completed, whatever its
/// exit code: the reward says how well); the harness did not end (Polar
/// could not run it).
pub(super) fn verdict(e: &Ended, evaluation: Option<&Evaluation>) -> Verdict {
    let failed = |m: String, ended_by: EndedBy, retry: bool| Verdict {
        status: SampleStatus::Error,
        error: Some(m.clone()),
        outcome: Some(SessionOutcome::Error { message: m }),
        ended_by: Some(ended_by),
        retry,
    };
    if e.cancelled {
        return Verdict {
            status: SampleStatus::Cancelled,
            error: None,
            outcome: None,
            ended_by: None,
            retry: false,
        };
    }
    if e.timed_out {
        let (error, ended_by) = match &e.fault {
            Some(f) => (
                format!("the session's time ran out; {}", fault_message(f)),
                f.ended_by,
            ),
            None => ("the session's time ran out".into(), EndedBy::Budget),
        };
        return Verdict {
            status: SampleStatus::Timeout,
            error: Some(error),
            outcome: Some(SessionOutcome::Timeout),
            ended_by: Some(ended_by),
            retry: ended_by.is_infra(),
        };
    }
    if e.start_failed {
        return failed("the runtime did not start".into(), EndedBy::Polar, true);
    }
    if let Some(m) = &e.prepare_failed {
        return failed(m.clone(), EndedBy::Polar, false);
    }
    if e.harness_exit().is_some()
        && let Some(f) = &e.fault
    {
        return failed(fault_message(f), f.ended_by, true);
    }
    if let Some(ev) = evaluation
        && !ev.usable
        && let Some(why) = &ev.error
    {
        return failed(
            format!("evaluation failed: {why}"),
            EndedBy::Evaluator,
            false,
        );
    }
    if e.harness_exit().is_some() {
        return Verdict {
            status: SampleStatus::Completed,
            error: None,
            outcome: Some(SessionOutcome::Completed),
            ended_by: Some(EndedBy::Policy),
            retry: false,
        };
    }
    failed(
        format!("the harness did not finish: {:?}", e.harness),
        EndedBy::Polar,
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
            role_rewards: Default::default(),
        }
    }

    fn fault(ended_by: EndedBy) -> Option<Fault> {
        Some(Fault {
            ended_by,
            call_id: "call_1".into(),
            seq: 4,
            error: "backend b (r) answered HTTP 503: ".into(),
        })
    }

    fn exited(code: i32) -> Ended {
        Ended {
            harness: Some(StepEnd::Exited { code }),
            ..Ended::default()
        }
    }

    /// (status, who ended it, run again) of a verdict.
    fn summary(v: &Verdict) -> (SampleStatus, Option<EndedBy>, bool) {
        (v.status, v.ended_by, v.retry)
    }

    #[test]
    fn the_policy_ends_a_session_whose_harness_exited_on_its_own() {
        let v = verdict(&exited(0), Some(&ev(Some(1.0), true, None)));
        assert_eq!(
            summary(&v),
            (SampleStatus::Completed, Some(EndedBy::Policy), false)
        );
        assert_eq!(v.outcome, Some(SessionOutcome::Completed));
        // A harness that failed is still a completed sample: the reward
        // says how well it did.
        let v = verdict(&exited(1), Some(&ev(Some(0.0), true, Some("tests failed"))));
        assert_eq!(
            summary(&v),
            (SampleStatus::Completed, Some(EndedBy::Policy), false)
        );
    }

    #[test]
    fn an_infrastructure_fault_on_the_last_call_is_no_policy_failure() {
        // The harness exits 1 (Claude Code, Qwen Code, opencode, pi after a
        // cut) or 0 (Gemini CLI prints what it had): the backend ended it.
        for code in [0, 1] {
            let e = Ended {
                fault: fault(EndedBy::Backend),
                ..exited(code)
            };
            let v = verdict(&e, Some(&ev(Some(0.0), true, None)));
            assert_eq!(
                summary(&v),
                (SampleStatus::Error, Some(EndedBy::Backend), true)
            );
            let m = v.error.unwrap_or_default();
            assert!(
                m.starts_with("the inference backend ended the session"),
                "{m}"
            );
            assert!(m.contains("seq 4") && m.contains("HTTP 503"), "{m}");
            assert!(matches!(v.outcome, Some(SessionOutcome::Error { .. })));
        }
        // The agent failed the call: Polar's fault.
        let e = Ended {
            fault: fault(EndedBy::Polar),
            ..exited(1)
        };
        let v = verdict(&e, None);
        assert_eq!(
            summary(&v),
            (SampleStatus::Error, Some(EndedBy::Polar), true)
        );
        assert!(v.error.unwrap_or_default().starts_with("Polar ended"));
        // Before an evaluation that failed: the cause is the backend.
        let e = Ended {
            fault: fault(EndedBy::Backend),
            ..exited(1)
        };
        let v = verdict(&e, Some(&ev(None, false, Some("no reward file"))));
        assert_eq!(
            summary(&v),
            (SampleStatus::Error, Some(EndedBy::Backend), true)
        );
    }

    #[test]
    fn the_evaluator_ends_a_session_it_could_not_score() {
        let v = verdict(&exited(0), Some(&ev(None, false, Some("no reward file"))));
        assert_eq!(
            summary(&v),
            (SampleStatus::Error, Some(EndedBy::Evaluator), false)
        );
        assert!(v.error.unwrap_or_default().contains("no reward file"));
    }

    #[test]
    fn what_the_sandbox_left_in_the_evaluations_way_is_the_policys_failure() {
        use polar_evaluate::{Broken, SessionFacts, Side};
        let facts = SessionFacts {
            harness_exit: Some(0),
            timed_out: false,
            calls: 1,
            failed_calls: 0,
            workspace: "/w".into(),
            base: polar_evaluate::DiffBase::Head,
        };
        for cause in [
            Broken::NoSpace,
            Broken::Unwritable,
            Broken::NotADirectory,
            Broken::Unreadable,
            Broken::Escapes,
            Broken::Runner,
            Broken::ToolMissing,
            Broken::NodeIo,
            Broken::Bug,
        ] {
            let e = Evaluation::broken(&facts, cause, "why".into(), serde_json::Value::Null);
            let v = verdict(&exited(0), Some(&e));
            match cause.side() {
                // Scored 0.0 and completed: the sample counts.
                Side::Policy => {
                    assert_eq!(e.reward, Some(0.0), "{cause:?}");
                    assert_eq!(
                        summary(&v),
                        (SampleStatus::Completed, Some(EndedBy::Policy), false),
                        "{cause:?}"
                    );
                    assert_eq!(e.detail["broken"]["cause"], cause.as_str());
                }
                // No reward: an error of the evaluation, as any fault of
                // the node's.
                Side::Node => {
                    assert_eq!(e.reward, None, "{cause:?}");
                    assert_eq!(
                        summary(&v),
                        (SampleStatus::Error, Some(EndedBy::Evaluator), false),
                        "{cause:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_budget_ends_a_session_that_ran_out_of_time() {
        let e = Ended {
            timed_out: true,
            harness: Some(StepEnd::TimedOut),
            ..Ended::default()
        };
        let v = verdict(&e, None);
        assert_eq!(
            summary(&v),
            (SampleStatus::Timeout, Some(EndedBy::Budget), false)
        );
        assert_eq!(v.outcome, Some(SessionOutcome::Timeout));
        // The harness was retrying a backend that stayed down: the time ran
        // out because of the backend.
        let e = Ended {
            fault: fault(EndedBy::Backend),
            ..e
        };
        let v = verdict(&e, None);
        assert_eq!(
            summary(&v),
            (SampleStatus::Timeout, Some(EndedBy::Backend), true)
        );
        assert!(v.error.unwrap_or_default().contains("HTTP 503"));
    }

    #[test]
    fn polar_ends_a_session_it_could_not_start_or_run() {
        let mut e = exited(0);
        e.prepare_failed = Some("prepare step 0".into());
        assert_eq!(
            summary(&verdict(&e, None)),
            (SampleStatus::Error, Some(EndedBy::Polar), false)
        );
        e.start_failed = true;
        assert_eq!(
            summary(&verdict(&e, None)),
            (SampleStatus::Error, Some(EndedBy::Polar), true)
        );
        for end in [
            StepEnd::Stopped,
            StepEnd::Failed {
                error: "not started".into(),
            },
        ] {
            let e = Ended {
                harness: Some(end),
                ..Ended::default()
            };
            assert_eq!(
                summary(&verdict(&e, None)),
                (SampleStatus::Error, Some(EndedBy::Polar), false)
            );
        }
    }

    #[test]
    fn a_sandbox_that_did_not_start_is_the_nodes_fault_and_runs_again() {
        let not_started = StepEnd::NotStarted {
            error: "the sandbox did not start (1): bwrap: Can't bind mount".into(),
        };
        let step = |phase, end| StepReport {
            phase,
            index: 0,
            what: "x".into(),
            end,
            elapsed_ms: 0,
            logs: None,
        };
        // The harness's own sandbox, or a prepare step's.
        for (phase, reached) in [
            (Phase::Main, Reached::Ran(not_started.clone())),
            (Phase::Prepare, Reached::Interrupted(Interrupt::Budget)),
        ] {
            let steps = [step(phase, not_started.clone())];
            let mut e = Ended::of(&reached, &steps);
            e.timed_out = false;
            assert!(e.start_failed, "{phase:?}");
            assert_eq!(
                summary(&verdict(&e, Some(&ev(Some(0.0), true, None)))),
                (SampleStatus::Error, Some(EndedBy::Polar), true)
            );
        }
        // A command that exited 1 on its own stays the policy's.
        let steps = [step(Phase::Main, StepEnd::Exited { code: 1 })];
        let e = Ended::of(&Reached::Ran(StepEnd::Exited { code: 1 }), &steps);
        assert!(!e.start_failed);
        assert_eq!(
            summary(&verdict(&e, Some(&ev(Some(0.0), true, None)))),
            (SampleStatus::Completed, Some(EndedBy::Policy), false)
        );
    }

    #[test]
    fn verdicts_in_order_of_precedence() {
        let mut e = Ended {
            fault: fault(EndedBy::Backend),
            prepare_failed: Some("prepare step 0".into()),
            ..exited(0)
        };
        // A prepare step that failed comes before the last call's fault.
        assert_eq!(verdict(&e, None).ended_by, Some(EndedBy::Polar));
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
        assert_eq!(
            (v.status, v.outcome, v.ended_by),
            (SampleStatus::Cancelled, None, None)
        );
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
