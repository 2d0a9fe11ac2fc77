//! The real work of each stage on a gateway node: a session assigned by the
//! rollout server is a harness session of `crate::harness::run`.
//!
//! - INIT: the assignment's harness, runtime spec, agent options and
//!   evaluator are checked (a bad one fails the session at once, naming
//!   the field), the harness's installation is found, and the session is
//!   prepared (directories, sandbox, runtime started, prepare steps).
//! - RUNNING: the harness, limited by the agent timeout.
//! - POSTRUN: the runtime spec's post-run steps, the evaluator (in the
//!   session's sandbox, or a fresh one on the same workspace), the
//!   sandbox's tear-down, the outcome recorded in the session's
//!   `session.json`, the trajectory rebuilt from the capture log with the
//!   task's builder, rewarded, checked and exported; the report.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::spec::SessionSpec;
use super::stages::{Interrupt, Job, Reached, Report, Work};
use crate::agent::AgentParts;
use crate::capture::SessionInfo;
use crate::evaluate::{CommandOutput, CommandRunner, Evaluation, Evaluator, SessionFacts};
use crate::export::Exporter;
use crate::harness::run::{HarnessRun, Prepared, prepare};
use crate::harness::{HarnessName, Install, check_installed, search_dirs};
use crate::ids::SessionId;
use crate::redirect::Redirect;
use crate::rollout::{SampleStatus, TokenUsage};
use crate::runtime::plan::{Phase, StepEnd};
use crate::trajectory::{Rewards, SessionOutcome};

/// A session between INIT and POSTRUN.
pub struct Session {
    prepared: Prepared,
    evaluator: Evaluator,
    agent_timeout: Duration,
}

/// What RUNNING ended with: the harness's step.
pub type Ran = StepEnd;

/// The gateway's work: harness sessions on this node's agent.
pub struct HarnessWork {
    parts: Arc<AgentParts>,
    redirect: Arc<Redirect>,
    exporter: Exporter,
    agent_timeout: Duration,
    node_id: String,
    installs: Mutex<HashMap<&'static str, Option<Install>>>,
}

impl HarnessWork {
    /// The work on the agent's parts and redirect, exporting with
    /// `exporter`.
    pub fn new(
        parts: Arc<AgentParts>,
        redirect: Arc<Redirect>,
        exporter: Exporter,
        agent_timeout: Duration,
        node_id: String,
    ) -> Self {
        Self {
            parts,
            redirect,
            exporter,
            agent_timeout,
            node_id,
            installs: Mutex::new(HashMap::new()),
        }
    }

    /// The exporter (its counters).
    pub fn exporter(&self) -> &Exporter {
        &self.exporter
    }

    /// The harness's installation, looked up once per harness.
    async fn install(&self, harness: HarnessName) -> Result<Option<Install>, String> {
        if let Some(i) = self
            .installs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(harness.as_str())
        {
            return Ok(i.clone());
        }
        let found = tokio::task::spawn_blocking(move || {
            check_installed(harness, &search_dirs(), Duration::from_secs(30))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        self.installs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(harness.as_str(), found.clone());
        Ok(found)
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    crate::cli::chain(e)
}

impl Work for HarnessWork {
    type Prepared = Session;
    type Ran = Ran;

    async fn init(
        &self,
        job: &Arc<Job>,
        stop: CancellationToken,
    ) -> Result<Session, (String, bool)> {
        let a = &job.assignment;
        let fail = |m: String| (m, false);
        let spec = SessionSpec::parse(&a.instruction, &a.agent, &a.runtime, &a.evaluator)
            .map_err(|e| fail(e.to_string()))?;
        let harness = spec.harness;
        let session: SessionId = a
            .session_id
            .parse()
            .map_err(|e: crate::ids::InvalidSessionId| fail(format!("session_id: {e}")))?;
        // Not installed here is the node's problem: another node may have it.
        let install = self.install(harness).await.map_err(|e| (e, true))?;
        let mut metadata = Map::new();
        metadata.insert("sample_index".into(), a.sample_index.into());
        metadata.insert("attempt".into(), a.attempt.into());
        metadata.insert("harness".into(), harness.as_str().into());
        metadata.insert("node_id".into(), self.node_id.clone().into());
        if let Some(g) = &a.metadata.group_id {
            metadata.insert("group_id".into(), g.clone().into());
        }
        if let Some(p) = &a.metadata.policy_version {
            metadata.insert("policy_version".into(), p.clone().into());
        }
        if !a.metadata.extra.is_empty() {
            metadata.insert("extra".into(), Value::Object(a.metadata.extra.clone()));
        }
        let run = HarnessRun {
            harness,
            instruction: a.instruction.clone(),
            command: spec.command,
            mode: spec.mode.unwrap_or_else(|| harness.default_mode()),
            spec: spec.runtime,
            budget: job
                .deadline
                .saturating_duration_since(tokio::time::Instant::now()),
            session,
            install,
            info: SessionInfo {
                task_id: Some(a.task_id.clone()),
                metadata,
            },
        };
        let prepared = prepare(&self.parts, &self.redirect, run, &stop)
            .await
            .map_err(|e| (chain(&e), true))?;
        Ok(Session {
            prepared,
            evaluator: spec.evaluator,
            agent_timeout: spec.timeout.unwrap_or(self.agent_timeout),
        })
    }

    async fn run(&self, _job: &Arc<Job>, s: &mut Session, stop: CancellationToken) -> Ran {
        let timeout = s.agent_timeout;
        s.prepared.run_main(Some(timeout), &stop).await.end.clone()
    }

    fn pause(&self, paused: bool) {
        if let Some(c) = &self.parts.capture {
            for b in c.backends() {
                if paused {
                    b.pool().pause();
                } else {
                    b.pool().resume();
                }
            }
        }
    }

    async fn postrun(&self, job: &Arc<Job>, s: Option<Session>, reached: Reached<Ran>) -> Report {
        let Some(mut s) = s else {
            return never_prepared(reached);
        };
        let never = CancellationToken::new();
        let ended = Ended::of(&reached, s.prepared.steps());
        if !ended.cancelled {
            s.prepared.post(&never).await;
        }
        let state_dir = &self.parts.config.agent.state_dir;
        let session_id = s.prepared.session().clone();
        let (calls, failed_calls) =
            count_calls(&crate::harness::run::capture_log(state_dir, &session_id));
        let facts = SessionFacts {
            harness_exit: ended.harness_exit(),
            timed_out: ended.timed_out,
            calls,
            failed_calls,
            workspace: s.prepared.workspace().to_owned(),
        };
        let evaluate = !ended.cancelled && !ended.timed_out && s.prepared.ready();
        let fresh = evaluate && s.evaluator.needs_fresh_sandbox();
        // Evaluated while the sandbox is open, or after in a fresh one.
        let mut evaluation = None;
        if evaluate && !fresh {
            let runner = SandboxRunner::new(&s.prepared, &job.stop);
            evaluation = Some(s.evaluator.evaluate(&facts, &runner).await);
        }
        let steps: Vec<Value> = s
            .prepared
            .steps()
            .iter()
            .map(|r| json!({"phase": r.phase, "index": r.index, "end": r.end, "elapsed_ms": r.elapsed_ms}))
            .collect();
        let fresh_run = s.prepared.fresh_run();
        let finished = s.prepared.finish(&self.parts, &never).await;
        if fresh {
            evaluation = Some(
                self.evaluate_fresh(job, fresh_run, &s.evaluator, &facts)
                    .await,
            );
        }
        let v = verdict(&ended, evaluation.as_ref());
        let mut report = Report {
            status: v.status,
            reward: evaluation.as_ref().and_then(|e| e.reward),
            trajectory_uri: None,
            tokens: TokenUsage::default(),
            error: v.error,
            stats: Map::new(),
            retry: v.retry,
        };
        report.stats.insert("steps".into(), Value::Array(steps));
        if let Some(e) = &evaluation {
            report.stats.insert("evaluation".into(), e.detail.clone());
        }
        if let Err(e) = finished {
            let m = format!("tearing the sandbox down: {}", chain(&e));
            tracing::warn!(session = %session_id, error = %m);
            report.error.get_or_insert(m);
        }
        let Some(outcome) = v.outcome else {
            return report;
        };
        match self
            .export(job, &session_id, outcome, evaluation.as_ref())
            .await
        {
            Ok((uri, tokens)) => {
                report.trajectory_uri = uri;
                report.tokens = tokens;
            }
            Err(e) => {
                tracing::error!(session = %session_id, error = %e, "trajectory not exported");
                report.stats.insert("export_error".into(), e.clone().into());
                if report.status == SampleStatus::Completed {
                    report.status = SampleStatus::Error;
                    report.error = Some(format!("exporting the trajectory: {e}"));
                }
            }
        }
        report
    }
}

/// The report of a session that never got prepared.
fn never_prepared(reached: Reached<Ran>) -> Report {
    let (status, error, retry) = match reached {
        Reached::InitFailed { error, retry } => (SampleStatus::Error, Some(error), retry),
        Reached::Interrupted(Interrupt::Budget) => (
            SampleStatus::Timeout,
            Some("the session budget ran out before it started".into()),
            false,
        ),
        Reached::Interrupted(Interrupt::Cancelled) | Reached::Ran(_) => {
            (SampleStatus::Cancelled, None, false)
        }
    };
    Report {
        status,
        reward: None,
        trajectory_uri: None,
        tokens: TokenUsage::default(),
        error,
        stats: Map::new(),
        retry,
    }
}

/// How a prepared session ended, from its steps and how it reached POSTRUN.
#[derive(Debug, Default)]
struct Ended {
    cancelled: bool,
    timed_out: bool,
    start_failed: bool,
    prepare_failed: Option<String>,
    harness: Option<StepEnd>,
}

impl Ended {
    fn of(reached: &Reached<Ran>, steps: &[crate::runtime::plan::StepReport]) -> Self {
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

    fn harness_exit(&self) -> Option<i32> {
        match self.harness {
            Some(StepEnd::Exited { code }) => Some(code),
            _ => None,
        }
    }
}

/// What a session's report says, and the outcome its trajectory records
/// (`None`: nothing is exported).
#[derive(Debug, PartialEq)]
struct Verdict {
    status: SampleStatus,
    error: Option<String>,
    outcome: Option<SessionOutcome>,
    retry: bool,
}

/// The verdict, in order: cancelled; timed out; the runtime did not start
/// (the node's fault: dispatch again); a prepare step failed; the
/// evaluation could not be made; the harness ended (completed, whatever its
/// exit code: the reward says how well); the harness did not end.
fn verdict(e: &Ended, evaluation: Option<&Evaluation>) -> Verdict {
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

/// Model calls in a capture log, and how many of them failed.
fn count_calls(path: &std::path::Path) -> (u64, u64) {
    match crate::capture::log::read_log(path) {
        Ok((records, _)) => {
            let failed = records
                .iter()
                .filter(|r| matches!(r.status, crate::capture::record::CallStatus::Failed { .. }))
                .count() as u64;
            (records.len() as u64, failed)
        }
        Err(_) => (0, 0),
    }
}

impl HarnessWork {
    /// Records the outcome in `session.json`, rebuilds the trajectory from
    /// the capture log and exports it. Returns where it went and the token
    /// counts.
    async fn export(
        &self,
        job: &Job,
        session: &SessionId,
        outcome: SessionOutcome,
        evaluation: Option<&Evaluation>,
    ) -> Result<(Option<String>, TokenUsage), String> {
        let a = &job.assignment;
        let dir = self
            .parts
            .config
            .agent
            .state_dir
            .join("sessions")
            .join(session.as_str());
        let mut fields = Map::new();
        fields.insert(
            "outcome".into(),
            serde_json::to_value(&outcome).map_err(|e| e.to_string())?,
        );
        if let Some(r) = evaluation.and_then(|e| e.reward) {
            fields.insert("reward".into(), r.into());
        }
        if let Some(e) = evaluation {
            fields.insert("evaluation".into(), e.detail.clone());
        }
        fields.insert("task_id".into(), a.task_id.clone().into());
        if let Some(g) = &a.metadata.group_id {
            fields.insert("group_id".into(), g.clone().into());
        }
        crate::capture::store::record_session_fields(&dir, session, fields)
            .map_err(|e| e.to_string())?;
        let log = if dir.join(crate::capture::log::CALLS_FILE).is_file() {
            crate::export::source::read_session(&dir).map_err(|e| e.to_string())?
        } else {
            return Ok((None, TokenUsage::default()));
        };
        let tokens = TokenUsage {
            prompt: log
                .records
                .iter()
                .map(|r| r.prompt_token_ids.as_ref().map_or(0, |t| t.len() as u64))
                .sum(),
            response: log
                .records
                .iter()
                .map(|r| r.response_token_ids.as_ref().map_or(0, |t| t.len() as u64))
                .sum(),
            calls: log.records.len() as u64,
        };
        let rewards = evaluation.and_then(|e| e.reward).map(Rewards::Outcome);
        let traj = crate::export::rebuild(&a.builder, &log.records, &log.meta, rewards.as_ref())
            .map_err(|e| e.to_string())?;
        let files = self
            .exporter
            .write_session(&traj)
            .await
            .map_err(|e| e.to_string())?;
        Ok((files.first().map(|f| f.location.clone()), tokens))
    }
}

impl HarnessWork {
    /// Evaluates in a fresh sandbox on the session's workspace (the
    /// session's own is closed: nothing the harness started is left).
    async fn evaluate_fresh(
        &self,
        job: &Job,
        run: HarnessRun,
        evaluator: &Evaluator,
        facts: &SessionFacts,
    ) -> Evaluation {
        let failed = |error: String| Evaluation {
            reward: None,
            usable: false,
            detail: Value::Null,
            error: Some(error),
        };
        let fresh = match prepare(&self.parts, &self.redirect, run, &job.stop).await {
            Ok(p) => p,
            Err(e) => return failed(format!("the fresh sandbox did not open: {}", chain(&e))),
        };
        let evaluation = if fresh.ready() {
            evaluator
                .evaluate(facts, &SandboxRunner::new(&fresh, &job.stop))
                .await
        } else {
            failed("the fresh sandbox's runtime did not start".into())
        };
        if let Err(e) = fresh.finish(&self.parts, &CancellationToken::new()).await {
            tracing::warn!(session = %job.assignment.session_id, error = %chain(&e), "closing the evaluation sandbox");
        }
        evaluation
    }
}

/// Runs evaluator commands in a prepared session's sandbox.
struct SandboxRunner<'a> {
    prepared: &'a Prepared,
    stop: &'a CancellationToken,
    count: std::sync::atomic::AtomicUsize,
}

impl<'a> SandboxRunner<'a> {
    fn new(prepared: &'a Prepared, stop: &'a CancellationToken) -> Self {
        Self {
            prepared,
            stop,
            count: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

/// The first `limit` bytes of a log file, lossily.
fn read_capped(path: Option<&PathBuf>, limit: u64) -> String {
    use std::io::Read as _;
    let Some(path) = path else {
        return String::new();
    };
    let mut buf = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(limit).read_to_end(&mut buf);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

impl CommandRunner for SandboxRunner<'_> {
    fn run<'b>(
        &'b self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<CommandOutput, String>> + Send + 'b>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let index = self
                .count
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let report = self
                .prepared
                .plan(deadline)
                .run_command(Phase::Eval, index, &argv, &env, self.stop)
                .await;
            let (out, err) = match &report.logs {
                Some((o, e)) => (Some(o), Some(e)),
                None => (None, None),
            };
            let output = CommandOutput {
                exit: match report.end {
                    StepEnd::Exited { code } => Some(code),
                    StepEnd::TimedOut | StepEnd::Stopped => None,
                    StepEnd::Failed { error } => return Err(error),
                    StepEnd::Skipped => return Err("not run".into()),
                },
                stdout: read_capped(out, 4 << 20),
                stderr: read_capped(err, 1 << 20),
            };
            Ok(output)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(reward: Option<f64>, usable: bool, error: Option<&str>) -> Evaluation {
        Evaluation {
            reward,
            usable,
            detail: Value::Null,
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
        let r = never_prepared(Reached::InitFailed {
            error: "agent.harness: unknown".into(),
            retry: false,
        });
        assert_eq!((r.status, r.retry), (SampleStatus::Error, false));
        let r = never_prepared(Reached::Interrupted(Interrupt::Budget));
        assert_eq!(r.status, SampleStatus::Timeout);
    }
}
