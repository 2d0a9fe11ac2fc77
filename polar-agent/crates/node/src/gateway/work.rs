//! The real work of each stage on a gateway node: a session assigned by the
//! rollout server is a harness session of `crate::harness::run`.
//!
//! - INIT: the assignment's harness, runtime spec, agent options and
//!   evaluator are checked (a bad one fails the session at once, naming
//!   the field), then held to the node's policy (`[gateway.policy]`: its
//!   host paths canonicalised and under the allowed roots, its network,
//!   limits and budgets within bounds; one outside fails the session with
//!   "refused by this node's policy: <field>: ...", not retried, no
//!   reward), the harness's installation is found, and the session is
//!   prepared (an earlier attempt's directories and capture log on this
//!   node moved apart to `<state>/attempts/<session>/<n>/`, then fresh
//!   directories, sandbox, runtime started, prepare steps), the
//!   evaluator's `restore` paths of the workspace kept out of the
//!   sandbox's reach ([`polar_sandbox::runtime::restore`]; put back before
//!   the evaluation's first command), and, for an evaluator with an
//!   `llm_judge`, the workspace's commit recorded as the judge's diff base
//!   ([`polar_evaluate::base`]).
//! - RUNNING: the harness, limited by the agent timeout.
//! - POSTRUN: the runtime spec's post-run steps, the evaluator (in the
//!   session's sandbox, or a fresh one on the same workspace; an
//!   `llm_judge` with the node's judge clients, `super::judge`), the
//!   sandbox's tear-down, the outcome and who ended the session (from the
//!   harness's exit and the capture log's last call, `verdict`) and the
//!   number of earlier attempts kept apart on this node recorded in the
//!   session's `session.json` (beside the attempt number INIT put in its
//!   `metadata`), the trajectory rebuilt from the
//!   capture log with the task's builder, rewarded, checked and exported;
//!   then the session's directories are removed (exported and not
//!   failed) or kept for a while with their disk quota ended
//!   (`retention`); the report.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::judge::{JudgeClients, transcript};
use super::live::LiveCalls;
use super::retention::{Live, Retention};
use super::verdict::{Ended, never_prepared, verdict};
use crate::agent::AgentParts;
use crate::harness::run::{HarnessRun, Prepared, prepare};
use polar_capture::{CallHook, LogProblem, SessionInfo};
use polar_evaluate::{
    Broken, CommandOutput, CommandRunner, DiffBase, Evaluation, Evaluator, JudgeInputs, RunError,
    SessionFacts,
};
use polar_export::Exporter;
use polar_export::calls::{CallsHeader, encode_calls};
use polar_export::source::SessionLog;
use polar_gateway::stages::{InitError, InitFault, Job, Reached, Report, Work};
use polar_harness::{Harness, Install, search_dirs};
use polar_ids::SessionId;
use polar_io::chain;
use polar_record::CompletionRecord;
use polar_redirect::Redirect;
use polar_rollout_api::session_spec::SessionSpec;
use polar_rollout_api::{BackendHealth, SampleStatus, TokenUsage};
use polar_sandbox::runtime::eval::EvalDirs;
use polar_sandbox::runtime::plan::{Phase, Plan, StepEnd};
use polar_sandbox::runtime::restore::Kept;
use polar_spec::policy::Policy;
use polar_trajectory::{EndedBy, Rewards, SessionOutcome};

/// A session between INIT and POSTRUN.
pub struct Session {
    prepared: Prepared,
    /// The session's claim on its directories until POSTRUN settles them.
    live: Live,
    evaluator: Evaluator,
    agent_timeout: Duration,
    /// The workspace's commit before the harness ran, which the judge's
    /// diff is taken against (kept here, out of the sandbox's reach).
    base: DiffBase,
    /// The evaluator's `restore` paths as the harness found them.
    kept: Option<Kept>,
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
    policy: Arc<Policy>,
    installs: Mutex<HashMap<String, Option<Install>>>,
    retention: Retention,
    judges: Arc<JudgeClients>,
    /// The running sessions' calls as they end (the live timeline).
    live_calls: Arc<LiveCalls>,
    /// Whether each session's calls file is exported before its
    /// trajectories (`[gateway] export_calls`).
    export_calls: bool,
}

impl HarnessWork {
    /// The work on the agent's parts and redirect, exporting with
    /// `exporter`, holding every assignment to `policy`, keeping sessions'
    /// directories as `retention` says.
    pub fn new(
        parts: Arc<AgentParts>,
        redirect: Arc<Redirect>,
        exporter: Exporter,
        agent_timeout: Duration,
        node_id: String,
        policy: Policy,
        retention: Retention,
    ) -> Self {
        let live_calls = Arc::new(LiveCalls::default());
        if let Some(c) = &parts.capture {
            let l = Arc::clone(&live_calls);
            let hook = CallHook::new(move |session, record| l.ended(session, record));
            if c.store().set_call_hook(hook).is_err() {
                tracing::warn!("the capture store has a call hook already: no live timeline");
            }
        }
        Self {
            live_calls,
            judges: Arc::new(JudgeClients::new(&parts.config.backends)),
            parts,
            redirect,
            exporter,
            agent_timeout,
            node_id,
            policy: Arc::new(policy),
            installs: Mutex::new(HashMap::new()),
            retention,
            export_calls: true,
        }
    }

    /// Whether each session's calls file is exported (default: yes); off,
    /// a session's directory still goes once its trajectories are durable.
    #[must_use]
    pub fn with_calls_export(mut self, on: bool) -> Self {
        self.export_calls = on;
        self
    }

    /// The exporter (its counters).
    pub fn exporter(&self) -> &Exporter {
        &self.exporter
    }

    /// The spec held to the node's policy, its host paths canonical (off
    /// the async workers: it reads the file system). A spec outside is a
    /// failed session that is not retried (another node would refuse it
    /// too, or the task asks for what it may not).
    async fn hold_to_policy(
        &self,
        mut spec: SessionSpec,
        session_secs: u64,
    ) -> Result<SessionSpec, InitError> {
        let policy = Arc::clone(&self.policy);
        let (spec, checked) = tokio::task::spawn_blocking(move || {
            let r = spec.resolve_policy(&policy, session_secs);
            (spec, r)
        })
        .await
        .map_err(|e| InitError::new(InitFault::Node, format!("checking the node's policy: {e}")))?;
        match checked {
            Ok(()) => Ok(spec),
            Err(v) => Err(InitError::new(
                InitFault::Policy,
                format!("refused by this node's policy: {v}"),
            )),
        }
    }

    /// The harness's installation, looked up once per harness.
    async fn install(&self, harness: &Harness) -> Result<Option<Install>, String> {
        let name = harness.to_string();
        if let Some(i) = self
            .installs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name)
        {
            return Ok(i.clone());
        }
        let h = harness.clone();
        let found = tokio::task::spawn_blocking(move || {
            h.check_installed(&search_dirs(), Duration::from_secs(30))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        self.installs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, found.clone());
        Ok(found)
    }
}

impl Work for HarnessWork {
    type Prepared = Session;
    type Ran = Ran;

    async fn init(&self, job: &Arc<Job>, stop: CancellationToken) -> Result<Session, InitError> {
        let a = &job.assignment;
        let fail = |m: String| InitError::new(InitFault::Spec, m);
        let spec = SessionSpec::parse(&a.instruction, &a.agent, &a.runtime, &a.evaluator)
            .map_err(|e| fail(e.to_string()))?;
        let spec = self.hold_to_policy(spec, a.timeout_secs).await?;
        // A custom name this node does not define is the node's problem,
        // as a harness not installed here: another node may define it;
        // this one would fail it again.
        let harness = Harness::resolve(&spec.harness, &self.parts.config)
            .map_err(|e| InitError::new(InitFault::Unfit, e.to_string()))?;
        let session: SessionId = a
            .session_id
            .parse()
            .map_err(|e: polar_ids::InvalidSessionId| fail(format!("session_id: {e}")))?;
        // Not installed here is the node's problem: another node may have
        // it; this one would fail it again.
        let install = self
            .install(&harness)
            .await
            .map_err(|e| InitError::new(InitFault::Unfit, e))?;
        let mut metadata = Map::new();
        metadata.insert("sample_index".into(), a.sample_index.into());
        metadata.insert("attempt".into(), a.attempt.into());
        metadata.insert("harness".into(), harness.to_string().into());
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
        let mode = spec.mode.unwrap_or_else(|| harness.default_mode());
        let run = HarnessRun {
            harness,
            instruction: a.instruction.clone(),
            command: spec.command,
            mode,
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
        // No sweep touches the session's directories from here on.
        let live = self.retention.enter(&run.session).await;
        // What an earlier attempt of this session left on this node is
        // moved apart: this attempt starts on fresh directories and a
        // capture log of its own.
        let state_dir = self.parts.config.agent.state_dir.clone();
        let sid = run.session.clone();
        let apart =
            tokio::task::spawn_blocking(move || super::attempts::set_apart(&state_dir, &sid))
                .await
                .map_err(|e| {
                    InitError::new(
                        InitFault::Node,
                        format!("setting an earlier attempt apart: {e}"),
                    )
                })?
                .map_err(|e| {
                    InitError::new(
                        InitFault::Node,
                        format!("setting an earlier attempt's directories apart: {e}"),
                    )
                })?;
        if let Some(dir) = apart {
            tracing::info!(session = %run.session, attempt = a.attempt, kept = %dir.display(), "an earlier attempt's directories were set apart");
        }
        let prepared = prepare(&self.parts, &self.redirect, run, &stop)
            .await
            .map_err(|e| {
                // A runtime whose program this node lacks fails every time.
                let fault = if matches!(
                    &e,
                    polar_harness::HarnessError::Runtime(r)
                        if matches!(**r, polar_sandbox::runtime::RuntimeError::Unavailable { .. })
                ) {
                    InitFault::Unfit
                } else {
                    InitFault::Node
                };
                InitError::new(fault, chain(&e))
            })?;
        let kept = match keep_restore_paths(&prepared, &spec.evaluator).await {
            Ok(kept) => kept,
            Err(e) => {
                if let Err(f) = prepared
                    .finish(&self.parts, &CancellationToken::new())
                    .await
                {
                    tracing::warn!(session = %a.session_id, error = %chain(&f), "closing the sandbox of a session that did not start");
                }
                return Err(e);
            }
        };
        let base = if spec.evaluator.needs_judge() && prepared.ready() {
            record_base(&prepared, &stop).await
        } else {
            DiffBase::Head
        };
        Ok(Session {
            prepared,
            live,
            evaluator: spec.evaluator,
            agent_timeout: spec.timeout.unwrap_or(self.agent_timeout),
            base,
            kept,
        })
    }

    async fn run(&self, _job: &Arc<Job>, s: &mut Session, stop: CancellationToken) -> Ran {
        self.live_calls.start(s.prepared.session());
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

    fn policy_version(&self, version: &str) {
        self.parts.registry.set_policy_version(version);
    }

    fn backends(&self) -> BTreeMap<String, BackendHealth> {
        let Some(c) = &self.parts.capture else {
            return BTreeMap::new();
        };
        c.backends()
            .map(|b| {
                let stats = b.pool().stats();
                let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
                (
                    stats.backend.clone(),
                    BackendHealth {
                        replicas: count(stats.replicas.len()),
                        healthy: count(stats.replicas.iter().filter(|r| r.healthy).count()),
                    },
                )
            })
            .collect()
    }

    fn calls_since(&self, job: &Job, from: usize) -> Vec<Value> {
        match job.assignment.session_id.parse::<SessionId>() {
            Ok(sid) => self.live_calls.since(&sid, from),
            Err(_) => Vec::new(),
        }
    }

    async fn postrun(&self, job: &Arc<Job>, s: Option<Session>, reached: Reached<Ran>) -> Report {
        let Some(mut s) = s else {
            return never_prepared(reached);
        };
        // The result lists the calls from here on.
        self.live_calls.forget(s.prepared.session());
        let never = CancellationToken::new();
        let mut ended = Ended::of(&reached, s.prepared.steps());
        if !ended.cancelled {
            s.prepared.post(&never).await;
        }
        let state_dir = &self.parts.config.agent.state_dir;
        let session_id = s.prepared.session().clone();
        let log = read_calls(
            crate::harness::run::capture_log(state_dir, &session_id),
            s.evaluator.needs_judge(),
        )
        .await;
        ended.fault = log.fault;
        let (calls, failed_calls) = (log.calls, log.failed);
        let judge = self.judges.for_session(
            session_id.to_string(),
            polar_capture::session_dir(state_dir, &session_id),
        );
        let inputs = JudgeInputs {
            judge: &judge,
            instruction: &job.assignment.instruction,
            transcript: &log.transcript,
        };
        let (timeline, calls_total) = log.timeline;
        let facts = SessionFacts {
            harness_exit: ended.harness_exit(),
            timed_out: ended.timed_out,
            calls,
            failed_calls,
            workspace: s.prepared.workspace().to_owned(),
            base: s.base.clone(),
        };
        let evaluate = !ended.cancelled && !ended.timed_out && s.prepared.ready();
        let fresh = evaluate && s.evaluator.needs_fresh_sandbox();
        // Evaluated while the sandbox is open, or after in a fresh one.
        let mut evaluation = None;
        if evaluate && !fresh {
            let runner = SandboxRunner::evaluation(&s.prepared, s.kept.as_ref(), &job.stop);
            evaluation = Some(
                s.evaluator
                    .evaluate_with(&facts, &runner, Some(&inputs))
                    .await,
            );
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
                self.evaluate_fresh(
                    job,
                    fresh_run,
                    &s.evaluator,
                    s.kept.as_ref(),
                    &facts,
                    &inputs,
                )
                .await,
            );
        }
        let torn_down = finished.is_ok();
        let v = verdict(&ended, evaluation.as_ref());
        // Only a usable sample is scored: one the infrastructure, the
        // evaluator or the budget ended keeps its evaluation's detail but
        // no reward, in the report and in its trajectory.
        let scored = v.status.is_usable();
        let mut report = Report {
            status: v.status,
            reward: evaluation
                .as_ref()
                .and_then(|e| e.reward)
                .filter(|_| scored),
            trajectory_uri: None,
            tokens: TokenUsage::default(),
            error: v.error,
            stats: Map::new(),
            retry: v.retry,
            infra_fault: v.ended_by.is_some_and(EndedBy::is_infra),
            node_unfit: false,
        };
        report.stats.insert("steps".into(), Value::Array(steps));
        report.stats.insert("calls".into(), Value::Array(timeline));
        report
            .stats
            .insert("calls_total".into(), calls_total.into());
        if let Some(who) = v.ended_by {
            report.stats.insert("ended_by".into(), who.as_str().into());
        }
        if let Some(e) = &evaluation {
            report.stats.insert("evaluation".into(), e.detail.clone());
        }
        if let Err(e) = finished {
            let m = format!("tearing the sandbox down: {}", chain(&e));
            tracing::warn!(session = %session_id, error = %m);
            report.error.get_or_insert(m);
        }
        let Some(outcome) = v.outcome else {
            self.retention.settle(s.live, true).await;
            return report;
        };
        let mut exported = false;
        match self
            .export(
                job,
                &session_id,
                (outcome, v.ended_by),
                (evaluation.as_ref(), scored),
                log.log,
            )
            .await
        {
            Ok((uri, calls_uri, tokens)) => {
                report.trajectory_uri = uri;
                if let Some(c) = calls_uri {
                    report.stats.insert("calls_uri".into(), c.into());
                }
                report.tokens = tokens;
                exported = true;
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
        // Everything captured is durable in the export (the calls file
        // first, then the trajectories): the directories go, unless
        // something failed.
        let fine = matches!(
            report.status,
            SampleStatus::Completed | SampleStatus::Timeout
        );
        self.retention
            .settle(s.live, !(exported && torn_down && fine))
            .await;
        report
    }
}

/// A session's capture log as read: its records and the problems met
/// reading it.
type ReadLog = (Vec<CompletionRecord>, Vec<LogProblem>);

/// What POSTRUN needs of a session's capture log, read once.
#[derive(Debug, Default)]
struct CallsRead {
    /// Model calls.
    calls: u64,
    /// How many of them failed.
    failed: u64,
    /// The infrastructure fault of the last call.
    fault: Option<polar_trajectory::Fault>,
    /// The transcript for a judge (when asked for).
    transcript: String,
    /// The calls as the dashboard's timeline shows them, and how many
    /// there were (`timeline`).
    timeline: (Vec<Value>, usize),
    /// The log itself, for the export: `None` when the session has none,
    /// an error when it could not be read.
    log: Option<Result<ReadLog, String>>,
}

/// Reads the capture log at `path` once (off the async workers), with the
/// transcript when `with_transcript`; nothing when there is none.
async fn read_calls(path: PathBuf, with_transcript: bool) -> CallsRead {
    let read = tokio::task::spawn_blocking(move || {
        if !path.is_file() {
            return None;
        }
        Some(polar_capture::read_log(&path).map(|(records, problems)| {
            let t = if with_transcript {
                transcript(&records)
            } else {
                String::new()
            };
            let timeline = super::timeline::calls(&records);
            (records, problems, t, timeline)
        }))
    })
    .await;
    match read {
        Ok(Some(Ok((records, problems, transcript, timeline)))) => CallsRead {
            transcript,
            timeline,
            calls: records.len() as u64,
            failed: records
                .iter()
                .filter(|r| matches!(r.status, polar_record::CallStatus::Failed { .. }))
                .count() as u64,
            fault: polar_trajectory::ending_fault(&records),
            log: Some(Ok((records, problems))),
        },
        Ok(Some(Err(e))) => CallsRead {
            log: Some(Err(e.to_string())),
            ..CallsRead::default()
        },
        Ok(None) => CallsRead::default(),
        Err(e) => CallsRead {
            log: Some(Err(format!("reading the capture log: {e}"))),
            ..CallsRead::default()
        },
    }
}

impl HarnessWork {
    /// Records the outcome in `session.json`, exports the session's calls
    /// file (unless turned off), then rebuilds the trajectory from the
    /// capture log (`calls`, as POSTRUN read it), with the evaluation's
    /// rewards when the sample is `scored` (usable), and exports it: a
    /// trajectory file never exists without its durable calls file.
    /// Returns where they went and the token counts.
    async fn export(
        &self,
        job: &Job,
        session: &SessionId,
        (outcome, ended_by): (SessionOutcome, Option<EndedBy>),
        (evaluation, scored): (Option<&Evaluation>, bool),
        calls: Option<Result<ReadLog, String>>,
    ) -> Result<(Option<String>, Option<String>, TokenUsage), String> {
        let a = &job.assignment;
        let dir = polar_capture::session_dir(&self.parts.config.agent.state_dir, session);
        let mut fields = Map::new();
        fields.insert(
            "outcome".into(),
            serde_json::to_value(&outcome).map_err(|e| e.to_string())?,
        );
        if let Some(who) = ended_by {
            fields.insert("ended_by".into(), who.as_str().into());
        }
        let scoring = evaluation.filter(|_| scored);
        if let Some(r) = scoring.and_then(|e| e.reward) {
            fields.insert("reward".into(), r.into());
        }
        if let Some(rewards) = scoring
            .and_then(rewards_of)
            .filter(|r| matches!(r, Rewards::ByRole { .. }))
        {
            // `polar export` of the session applies them as the node did.
            fields.insert(
                "rewards".into(),
                serde_json::to_value(rewards).map_err(|e| e.to_string())?,
            );
        }
        if let Some(e) = evaluation {
            fields.insert("evaluation".into(), e.detail.clone());
        }
        fields.insert("task_id".into(), a.task_id.clone().into());
        if let Some(g) = &a.metadata.group_id {
            fields.insert("group_id".into(), g.clone().into());
        }
        // The earlier attempts set apart on this node: counted in the
        // export's stats, never merged into it.
        let state_dir = self.parts.config.agent.state_dir.clone();
        let sid = session.clone();
        let superseded =
            tokio::task::spawn_blocking(move || super::attempts::superseded(&state_dir, &sid))
                .await
                .map_err(|e| e.to_string())?;
        match superseded {
            Ok(n) => {
                fields.insert("superseded_attempts".into(), n.into());
            }
            Err(e) => {
                tracing::warn!(session = %session, error = %e, "counting the earlier attempts set apart; not recorded");
            }
        }
        polar_capture::record_session_fields(&dir, session, fields).map_err(|e| e.to_string())?;
        let Some(calls) = calls else {
            return Ok((None, None, TokenUsage::default()));
        };
        let (records, problems) = calls?;
        let log = polar_export::source::session_with_records(&dir, records, problems)
            .map_err(|e| e.to_string())?;
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
        let (log, calls_uri) = if self.export_calls {
            let (log, uri) = self.export_calls(log).await?;
            (log, Some(uri))
        } else {
            (log, None)
        };
        let rewards = scoring.and_then(rewards_of);
        let traj = polar_export::rebuild(&a.builder, &log.records, &log.meta, rewards.as_ref())
            .map_err(|e| e.to_string())?;
        let files = self
            .exporter
            .write_session(&traj)
            .await
            .map_err(|e| e.to_string())?;
        Ok((files.first().map(|f| f.location.clone()), calls_uri, tokens))
    }

    /// Encodes the session's calls file (off the async workers) and
    /// publishes it; returns the log back and the file's location.
    async fn export_calls(&self, log: SessionLog) -> Result<(SessionLog, String), String> {
        let (log, bytes) = tokio::task::spawn_blocking(move || {
            let header = CallsHeader::new(
                &log.meta.session_id,
                log.meta.task_id.as_deref(),
                log.session_json.as_ref(),
                &log.records,
            );
            let bytes = encode_calls(&header, &log.records);
            (log, bytes)
        })
        .await
        .map_err(|e| e.to_string())?;
        let bytes = bytes.map_err(|e| e.to_string())?;
        let uri = self
            .exporter
            .write_calls(log.meta.task_id.as_deref(), &log.meta.session_id, bytes)
            .await
            .map_err(|e| format!("exporting the calls: {e}"))?;
        Ok((log, uri))
    }
}

/// The rewards an evaluation gives the trajectory: its outcome reward,
/// with the rewards of the chain roles it scored apart (roles the
/// evaluator checked are the export's `chain_role` names).
fn rewards_of(e: &Evaluation) -> Option<Rewards> {
    let outcome = e.reward?;
    if e.role_rewards.is_empty() {
        return Some(Rewards::Outcome(outcome));
    }
    let roles = e
        .role_rewards
        .iter()
        .filter_map(|(role, r)| {
            Some((serde_json::from_value(Value::from(role.as_str())).ok()?, *r))
        })
        .collect();
    Some(Rewards::ByRole { outcome, roles })
}

/// How long recording the diff's base may take.
const RECORD_BASE_TIMEOUT: Duration = Duration::from_secs(60);

/// The workspace's `HEAD` commit after the prepare steps, before the
/// harness runs, read in the sandbox like an evaluator command
/// ([`polar_evaluate::base`]), with the pack of its snapshot kept out of
/// the sandbox's reach for the judge's diff
/// ([`polar_sandbox::runtime::eval::keep_base`]). Where the commit cannot
/// be read (the node's fault: the policy has not run yet) the judge diffs
/// against `HEAD`; where the pack cannot be kept, against the workspace's
/// objects; the node says why.
async fn record_base(prepared: &Prepared, stop: &CancellationToken) -> DiffBase {
    let runner = SandboxRunner::record(prepared, stop);
    let argv = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        polar_evaluate::base::RECORD_SCRIPT.to_owned(),
    ];
    let why = match runner.run(argv, Vec::new(), RECORD_BASE_TIMEOUT).await {
        Ok(out) if out.exit == Some(0) => match DiffBase::of_record(&out.stdout) {
            Some(base) => {
                if let (DiffBase::Commit(_), Some(record)) = (&base, runner.eval_dirs()) {
                    let (dirs, record) = (prepared.dirs().clone(), record.clone());
                    let kept = tokio::task::spawn_blocking(move || {
                        polar_sandbox::runtime::eval::keep_base(&dirs, &record)
                            .map_err(|e| chain(&e))
                    })
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
                    if let Err(e) = kept {
                        let said = tail_of(&out.stderr).trim();
                        tracing::warn!(session = %prepared.session(), error = %e, record = %said, "the judge's diff base was not packed: its diff reads the workspace's objects");
                    }
                }
                return base;
            }
            None => format!("unreadable answer {:?}", tail_of(&out.stdout)),
        },
        Ok(out) => format!("exit {:?}: {}", out.exit, tail_of(&out.stderr)),
        Err(e) => e.message,
    };
    tracing::warn!(session = %prepared.session(), error = %why, "the judge's diff base was not recorded: it diffs against HEAD");
    DiffBase::Head
}

/// Keeps the evaluator's `restore` paths of the prepared workspace, before
/// the harness runs ([`polar_sandbox::runtime::restore::keep`]); none for
/// an evaluator without them or a session whose prepare steps failed (it
/// is not evaluated). Paths that do not fit in the session's disk quota
/// beside the workspace, or that lead through a symlink, are the task's
/// error; anything else the node's.
async fn keep_restore_paths(
    prepared: &Prepared,
    evaluator: &Evaluator,
) -> Result<Option<Kept>, InitError> {
    let paths = evaluator.restore_paths();
    if paths.is_empty() || !prepared.ready() {
        return Ok(None);
    }
    let dirs = prepared.dirs().clone();
    let kept =
        tokio::task::spawn_blocking(move || polar_sandbox::runtime::restore::keep(&dirs, &paths))
            .await
            .map_err(|e| {
                InitError::new(
                    InitFault::Node,
                    format!("keeping the evaluator's `restore` paths: {e}"),
                )
            })?;
    kept.map(Some).map_err(|e| {
        let (fault, hint) = match errno_of(&e) {
            Some(nix::errno::Errno::ENOSPC | nix::errno::Errno::EDQUOT) => (
                InitFault::Spec,
                " (the session's disk quota holds the workspace and a copy of these paths: raise `limits.disk_bytes`)",
            ),
            Some(nix::errno::Errno::ELOOP) => (
                InitFault::Spec,
                " (a path leads through a symlink: name it by its real path)",
            ),
            _ => (InitFault::Node, ""),
        };
        InitError::new(
            fault,
            format!("evaluator.options.restore: keeping the workspace's paths: {}{hint}", chain(&e)),
        )
    })
}

/// The last 200 bytes of `s`, for a log line.
fn tail_of(s: &str) -> &str {
    let mut start = s.len().saturating_sub(200);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

impl HarnessWork {
    /// Evaluates in a fresh sandbox on the session's workspace (the
    /// session's own is closed: nothing the harness started is left).
    async fn evaluate_fresh(
        &self,
        job: &Job,
        run: HarnessRun,
        evaluator: &Evaluator,
        kept: Option<&Kept>,
        facts: &SessionFacts,
        inputs: &JudgeInputs<'_>,
    ) -> Evaluation {
        let failed = |error: String| Evaluation::failed(error, Value::Null);
        let fresh = match prepare(&self.parts, &self.redirect, run, &job.stop).await {
            Ok(p) => p,
            Err(e) => return failed(format!("the fresh sandbox did not open: {}", chain(&e))),
        };
        let evaluation = if fresh.ready() {
            evaluator
                .evaluate_with(
                    facts,
                    &SandboxRunner::evaluation(&fresh, kept, &job.stop),
                    Some(inputs),
                )
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

/// Runs evaluator commands in a prepared session's sandbox, each with the
/// evaluation's own HOME and tmp (made at its first command,
/// [`polar_sandbox::runtime::eval`]) and the evaluator's variables; for an
/// evaluation, after the workspace's repository configurations were made
/// safe ([`polar_evaluate::isolation::CLEAN_GIT_SCRIPT`]).
struct SandboxRunner<'a> {
    prepared: &'a Prepared,
    stop: &'a CancellationToken,
    /// Whether the workspace is made the evaluation's first (its `restore`
    /// paths put back, its git configurations cleaned): for an evaluation,
    /// never for the record before the harness (the workspace is the
    /// task's then, and the harness's to use).
    evaluation: bool,
    /// The evaluator's `restore` paths, kept before the harness ran.
    kept: Option<&'a Kept>,
    count: std::sync::atomic::AtomicUsize,
    isolated: tokio::sync::OnceCell<Result<Isolated, RunError>>,
}

/// The layout, the added variables and the directories of the
/// evaluation's commands.
type Isolated = (
    polar_sandbox::runtime::Layout,
    Vec<(String, String)>,
    EvalDirs,
);

/// How long cleaning the workspace's git configurations may take.
const CLEAN_GIT_TIMEOUT: Duration = Duration::from_secs(60);

impl<'a> SandboxRunner<'a> {
    /// A runner for an evaluation's commands.
    fn evaluation(
        prepared: &'a Prepared,
        kept: Option<&'a Kept>,
        stop: &'a CancellationToken,
    ) -> Self {
        Self::new(prepared, stop, true, kept)
    }

    /// A runner for the record before the harness.
    fn record(prepared: &'a Prepared, stop: &'a CancellationToken) -> Self {
        Self::new(prepared, stop, false, None)
    }

    fn new(
        prepared: &'a Prepared,
        stop: &'a CancellationToken,
        evaluation: bool,
        kept: Option<&'a Kept>,
    ) -> Self {
        Self {
            prepared,
            stop,
            evaluation,
            kept,
            count: std::sync::atomic::AtomicUsize::new(0),
            isolated: tokio::sync::OnceCell::new(),
        }
    }

    /// The evaluation's directories, once its first command made them.
    fn eval_dirs(&self) -> Option<&EvalDirs> {
        match self.isolated.get() {
            Some(Ok((_, _, dirs))) => Some(dirs),
            _ => None,
        }
    }

    /// Makes the evaluation's directories (off the async workers). A quota
    /// the sandbox filled is the policy's doing; anything else the node's.
    async fn isolate(&self) -> Result<Isolated, RunError> {
        let (dirs, user) = (self.prepared.dirs().clone(), self.prepared.user());
        let made = tokio::task::spawn_blocking(move || EvalDirs::make(&dirs, user)).await;
        let eval = on_host(made, "making the evaluation's HOME and tmp")?;
        if let (true, Some(kept)) = (self.evaluation, self.kept) {
            let (dirs, user, kept) = (
                self.prepared.dirs().clone(),
                self.prepared.user(),
                kept.clone(),
            );
            let put = tokio::task::spawn_blocking(move || {
                polar_sandbox::runtime::restore::restore(&dirs, &kept, user)
            })
            .await;
            // What the sandbox put in the way is logged by `restore`.
            on_host(put, "putting the workspace's `restore` paths back")?;
        }
        let (layout, env) = self.prepared.isolate(&eval);
        if self.evaluation {
            let argv = polar_evaluate::isolation::clean_git_argv();
            let out = self.exec(&layout, &env, &argv, CLEAN_GIT_TIMEOUT).await?;
            if out.exit != Some(0) {
                // What the sandbox left in the way is the policy's doing.
                let cause = Broken::of_message(&out.stderr)
                    .filter(|c| c.side() == polar_evaluate::Side::Policy)
                    .unwrap_or(Broken::Runner);
                return Err(RunError {
                    message: format!(
                        "making the workspace's git configuration safe: exit {:?}: {}",
                        out.exit,
                        tail_of(&out.stderr).trim()
                    ),
                    cause,
                });
            }
        }
        Ok((layout, env, eval))
    }

    /// Runs `argv` in the sandbox on `layout` with `env`, within `timeout`.
    async fn exec(
        &self,
        layout: &polar_sandbox::runtime::Layout,
        env: &[(String, String)],
        argv: &[String],
        timeout: Duration,
    ) -> Result<CommandOutput, RunError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let index = self
            .count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let plan = Plan {
            layout,
            ..self.prepared.plan(deadline)
        };
        let report = plan
            .run_command(Phase::Eval, index, argv, env, self.stop)
            .await;
        let exit = match report.end {
            StepEnd::Exited { code } => Some(code),
            StepEnd::TimedOut | StepEnd::Stopped => None,
            StepEnd::Failed { error } => {
                return Err(RunError {
                    cause: not_run_cause(&error, report.logs.is_some()),
                    message: error,
                });
            }
            StepEnd::NotStarted { error } => {
                return Err(RunError {
                    cause: not_started_cause(&error),
                    message: error,
                });
            }
            StepEnd::Skipped => return Err(RunError::runner("not run")),
        };
        let logs = report.logs.clone();
        let read = tokio::task::spawn_blocking(move || read_logs(exit, logs.as_ref())).await;
        match read {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(e)) => Err(RunError {
                message: format!("reading the command's output: {e}"),
                cause: Broken::NodeIo,
            }),
            Err(e) => Err(RunError {
                message: format!("reading the command's output: {e}"),
                cause: Broken::Bug,
            }),
        }
    }
}

/// The output of a command that ended with `exit`, from its stdout and
/// stderr log files (root's, in the session's `logs/`), as the
/// evaluators read it ([`CommandOutput::read`]); none without logs.
/// Blocks.
fn read_logs(
    exit: Option<i32>,
    logs: Option<&(PathBuf, PathBuf)>,
) -> std::io::Result<CommandOutput> {
    let Some((out, err)) = logs else {
        return Ok(CommandOutput::of_bytes(exit, b"", b""));
    };
    let open = |path: &PathBuf| -> std::io::Result<(std::fs::File, u64)> {
        let f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        Ok((f, len))
    };
    CommandOutput::read(exit, open(out)?, open(err)?)
}

/// The result of host-side work on the session's directories for an
/// evaluation (`doing` names it): a quota the sandbox filled is the
/// policy's doing; any other error the node's.
fn on_host<T>(
    done: Result<Result<T, polar_sandbox::runtime::RuntimeError>, tokio::task::JoinError>,
    doing: &str,
) -> Result<T, RunError> {
    match done {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => {
            let cause = match errno_of(&e).and_then(Broken::of_errno) {
                Some(Broken::NoSpace) => Broken::NoSpace,
                _ => Broken::NodeIo,
            };
            Err(RunError {
                message: format!("{doing}: {}", chain(&e)),
                cause,
            })
        }
        Err(e) => Err(RunError {
            message: format!("{doing}: {e}"),
            cause: Broken::Bug,
        }),
    }
}

/// The system error under a runtime's I/O error.
fn errno_of(e: &polar_sandbox::runtime::RuntimeError) -> Option<nix::errno::Errno> {
    match e {
        polar_sandbox::runtime::RuntimeError::Io { source, .. } => {
            source.raw_os_error().map(nix::errno::Errno::from_raw)
        }
        _ => None,
    }
}

/// The cause of a command the runtime could not run: a quota the sandbox
/// filled (the command's log files could not be made) is the policy's
/// doing; the rest is the runtime's.
fn not_run_cause(error: &str, logs_made: bool) -> Broken {
    match Broken::of_message(error) {
        Some(Broken::NoSpace) if !logs_made => Broken::NoSpace,
        _ => Broken::Runner,
    }
}

/// The cause of an evaluation command whose sandbox did not start: one
/// that could not enter its working directory (the workspace, which the
/// policy made unreadable or replaced) is the policy's doing; any other
/// start failure is the node's.
fn not_started_cause(error: &str) -> Broken {
    if error.contains("Can't chdir to") {
        Broken::of_message(error).unwrap_or(Broken::Runner)
    } else {
        Broken::Runner
    }
}

impl CommandRunner for SandboxRunner<'_> {
    fn run<'b>(
        &'b self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<CommandOutput, RunError>> + Send + 'b>> {
        Box::pin(async move {
            let (layout, isolation, _) = self
                .isolated
                .get_or_init(|| self.isolate())
                .await
                .as_ref()
                .map_err(Clone::clone)?;
            let mut all = isolation.clone();
            all.extend(env);
            self.exec(layout, &all, &argv, timeout).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_not_run_is_the_policys_only_when_its_full_quota_kept_its_logs_from_being_made() {
        let full = "create /s/logs/eval-0.out: No space left on device (os error 28)";
        assert_eq!(not_run_cause(full, false), Broken::NoSpace);
        // Once the logs were made, a failure is the runtime's.
        assert_eq!(not_run_cause(full, true), Broken::Runner);
        for other in [
            "create /s/logs/eval-0.out: Permission denied (os error 13)",
            "bwrap: execvp sh: No such file or directory",
            "spawning bwrap: Resource temporarily unavailable (os error 11)",
        ] {
            assert_eq!(not_run_cause(other, false), Broken::Runner, "{other}");
        }
    }

    #[test]
    fn a_sandbox_kept_out_of_its_workspace_is_the_policys_any_other_start_failure_the_nodes() {
        let chdir = "bwrap: Can't chdir to /workspace: Permission denied";
        assert_eq!(not_started_cause(chdir), Broken::Unwritable);
        assert_eq!(
            not_started_cause("bwrap: Can't chdir to /workspace: Not a directory"),
            Broken::NotADirectory
        );
        for other in [
            "bwrap: Can't bind mount /oldroot/state/x on /newroot/tools: No such file or directory",
            "bwrap: Permission denied while setting up the mount namespace",
        ] {
            assert_eq!(not_started_cause(other), Broken::Runner, "{other}");
        }
    }
}
