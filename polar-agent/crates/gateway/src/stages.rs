//! The session pipeline of a gateway node: INIT -> READY -> RUNNING ->
//! POSTRUN, each stage with its own bounded worker pool, generic over the
//! [`Work`] a stage does (the real harness sessions in `work.rs`, sleeps in
//! the simulated gateway and the benchmark).
//!
//! - INIT (`init` workers) prepares a session (runtime started, prepare
//!   steps run). A session may only start INIT when a *lane* is free: there
//!   are `running + ready_buffer` lanes, held from INIT to the end of
//!   RUNNING, so at most `ready_buffer` prepared sessions wait ahead of the
//!   RUNNING workers and a slow start never holds a RUNNING worker.
//! - READY: prepared sessions wait for a RUNNING worker, and for the
//!   generation gate to be open ([`Stages::pause`] around weight updates).
//! - RUNNING (`running` workers, the inference backends' concurrency) runs
//!   the harness, bounded by the agent timeout and the session budget.
//! - POSTRUN (`postrun` workers) evaluates, builds and exports the
//!   trajectory, tears the sandbox down and produces the result.
//!
//! The session budget counts from INIT; when it runs out the stage in
//! progress is stopped and the session goes to POSTRUN as `timeout`. A
//! cancelled session (told by the server, or the node stopping) also goes
//! through POSTRUN, so its sandbox is torn down and its captures kept.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use polar_rollout_api::{BackendHealth, SampleStatus, SessionAssignment, StageLoad};

/// A stage of the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Waiting for an INIT worker (or a free lane).
    Queued,
    /// Being prepared.
    Init,
    /// Prepared, waiting for a RUNNING worker.
    Ready,
    /// The harness runs.
    Running,
    /// Evaluation, trajectory, tear-down, report.
    Postrun,
}

impl Stage {
    /// Every stage in order.
    pub const ALL: [Self; 5] = [
        Self::Queued,
        Self::Init,
        Self::Ready,
        Self::Running,
        Self::Postrun,
    ];

    /// The stage's name in the protocol and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Init => "init",
            Self::Ready => "ready",
            Self::Running => "running",
            Self::Postrun => "postrun",
        }
    }

    fn from_u8(v: u8) -> Self {
        Self::ALL
            .get(usize::from(v))
            .copied()
            .unwrap_or(Self::Queued)
    }
}

/// The pools' sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageLimits {
    /// INIT workers.
    pub init: usize,
    /// Prepared sessions allowed to wait ahead of the RUNNING workers.
    pub ready_buffer: usize,
    /// RUNNING workers.
    pub running: usize,
    /// POSTRUN workers.
    pub postrun: usize,
}

/// Why a session's RUNNING stage ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    /// The session budget (from INIT) ran out.
    Budget,
    /// The session was cancelled.
    Cancelled,
}

/// Whose fault a failed INIT is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitFault {
    /// The task's spec is wrong (a bad option, an unknown harness): not
    /// retried, any node would refuse it.
    Spec,
    /// The node's policy refuses what the spec asks: not retried, and
    /// reported as a refusal rather than a failure.
    Policy,
    /// The node failed in a way that may pass (a sandbox that could not be
    /// made, a busy disk): dispatched again, elsewhere when possible.
    Node,
    /// This node cannot run the session and would fail the same way again
    /// (a harness neither defined nor installed here, a runtime whose
    /// program it does not have): dispatched to another node only, and
    /// failed at once when no other node can take it.
    Unfit,
}

/// Why INIT failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitError {
    /// Why, as the sample's error.
    pub error: String,
    /// Whose fault it is.
    pub fault: InitFault,
}

impl InitError {
    /// `error`, of `fault`.
    pub fn new(fault: InitFault, error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            fault,
        }
    }

    /// Whether the session is dispatched again elsewhere.
    pub fn retry(&self) -> bool {
        matches!(self.fault, InitFault::Node | InitFault::Unfit)
    }
}

/// How a session reached POSTRUN.
#[derive(Debug)]
pub enum Reached<R> {
    /// INIT failed.
    InitFailed(InitError),
    /// Stopped before or during RUNNING.
    Interrupted(Interrupt),
    /// RUNNING finished with this.
    Ran(R),
}

/// A session in the pipeline.
#[derive(Debug)]
pub struct Job {
    /// What the server sent.
    pub assignment: SessionAssignment,
    /// When the budget runs out.
    pub deadline: Instant,
    /// Fires when the session must stop (server cancel, node stop).
    pub stop: CancellationToken,
    /// Fires when the session's work has ended, POSTRUN's tear-down
    /// included (a newer attempt of the session waits for it).
    pub ended: CancellationToken,
    stage: AtomicU8,
    /// When it arrived.
    pub arrived: Instant,
    timings: Mutex<BTreeMap<&'static str, u64>>,
}

impl Job {
    /// A job for `assignment`, its deadline from the assignment's budget.
    pub fn new(assignment: SessionAssignment) -> Self {
        let now = Instant::now();
        let left = assignment
            .deadline_unix_ms
            .saturating_sub(polar_rollout_api::now_ms());
        let budget = Duration::from_millis(left).min(Duration::from_secs(assignment.timeout_secs));
        Self {
            assignment,
            deadline: now + budget,
            stop: CancellationToken::new(),
            ended: CancellationToken::new(),
            stage: AtomicU8::new(Stage::Queued as u8),
            arrived: now,
            timings: Mutex::new(BTreeMap::new()),
        }
    }

    /// Where it is now.
    pub fn stage(&self) -> Stage {
        Stage::from_u8(self.stage.load(Ordering::Relaxed))
    }

    fn enter(&self, stage: Stage) {
        self.stage.store(stage as u8, Ordering::Relaxed);
    }

    fn time(&self, stage: &'static str, since: Instant) {
        let ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.timings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(stage, ms);
    }

    /// Milliseconds spent in each stage so far (`queued`, `init`, `ready`,
    /// `running`, `postrun`).
    pub fn timings(&self) -> BTreeMap<&'static str, u64> {
        self.timings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What a finished session reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The sample status.
    pub status: SampleStatus,
    /// The reward.
    pub reward: Option<f64>,
    /// Where the trajectory went.
    pub trajectory_uri: Option<String>,
    /// Token counts.
    pub tokens: polar_rollout_api::TokenUsage,
    /// What went wrong.
    pub error: Option<String>,
    /// Anything else (stage timings are added).
    pub stats: serde_json::Map<String, serde_json::Value>,
    /// The failure is the node's: dispatch again.
    pub retry: bool,
    /// The infrastructure (the inference backend, Polar) ended the session,
    /// not the policy: with `retry`, the server runs it again within its
    /// retry limit, and keeps this result at the limit.
    pub infra_fault: bool,
    /// With `retry`: this node would fail the session the same way again
    /// ([`InitFault::Unfit`]): another node only, or it fails at once.
    pub node_unfit: bool,
}

impl Report {
    /// A report of `status` and nothing else: no reward, trajectory,
    /// tokens, error or stats, not to be run again. The fields that differ
    /// are set over it (`Report { reward, ..Report::new(status) }`).
    pub fn new(status: SampleStatus) -> Self {
        Self {
            status,
            reward: None,
            trajectory_uri: None,
            tokens: Default::default(),
            error: None,
            stats: Default::default(),
            retry: false,
            infra_fault: false,
            node_unfit: false,
        }
    }
}

/// What each stage does.
pub trait Work: Send + Sync + 'static {
    /// A prepared session.
    type Prepared: Send + 'static;
    /// What RUNNING produces.
    type Ran: Send + 'static;

    /// INIT: prepare the session; `stop` fires when the budget runs out or
    /// the session is cancelled (finish early, returning what was made so
    /// that POSTRUN tears it down). An error names why and whose fault it
    /// is.
    fn init(
        &self,
        job: &Arc<Job>,
        stop: CancellationToken,
    ) -> impl Future<Output = Result<Self::Prepared, InitError>> + Send;

    /// RUNNING: run the harness; `stop` fires when the budget runs out or
    /// the session is cancelled.
    fn run(
        &self,
        job: &Arc<Job>,
        prepared: &mut Self::Prepared,
        stop: CancellationToken,
    ) -> impl Future<Output = Self::Ran> + Send;

    /// New generations pause (`true`) or resume around a weight update:
    /// calls in flight finish, new ones wait. Nothing by default.
    fn pause(&self, paused: bool) {
        let _ = paused;
    }

    /// The node's inference backends as its health checks see them, by
    /// name (reported at registration and in every heartbeat: the server
    /// sends no session while one has no healthy replica). None by
    /// default.
    fn backends(&self) -> BTreeMap<String, BackendHealth> {
        BTreeMap::new()
    }

    /// A weight update finished: the calls of every session from now on
    /// run under policy `version` (named by `POST /v1/resume`). Nothing by
    /// default.
    fn policy_version(&self, version: &str) {
        let _ = version;
    }

    /// The calls of `job`'s session that ended while it runs, after the
    /// first `from` (the timeline entries the node reports live, at most
    /// `MAX_LIVE_CALLS` per session). None by default.
    fn calls_since(&self, job: &Job, from: usize) -> Vec<serde_json::Value> {
        let _ = (job, from);
        Vec::new()
    }

    /// POSTRUN: evaluate, build, tear down; the report.
    fn postrun(
        &self,
        job: &Arc<Job>,
        prepared: Option<Self::Prepared>,
        reached: Reached<Self::Ran>,
    ) -> impl Future<Output = Report> + Send;
}

/// The pipeline's pools and gate.
pub struct Stages {
    limits: StageLimits,
    lanes: Semaphore,
    init: Semaphore,
    running: Semaphore,
    postrun: Semaphore,
    gate: watch::Sender<bool>,
    waiting_init: AtomicU32,
    waiting_running: AtomicU32,
    waiting_postrun: AtomicU32,
}

impl std::fmt::Debug for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stages")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn count_wait(c: &AtomicU32) -> impl Drop + '_ {
    struct Dec<'a>(&'a AtomicU32);
    impl Drop for Dec<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
    c.fetch_add(1, Ordering::Relaxed);
    Dec(c)
}

impl Stages {
    /// Pools of the given sizes (each at least 1, the buffer may be 0).
    pub fn new(limits: StageLimits) -> Self {
        let limits = StageLimits {
            init: limits.init.max(1),
            running: limits.running.max(1),
            postrun: limits.postrun.max(1),
            ready_buffer: limits.ready_buffer,
        };
        Self {
            lanes: Semaphore::new(limits.running + limits.ready_buffer),
            init: Semaphore::new(limits.init),
            running: Semaphore::new(limits.running),
            postrun: Semaphore::new(limits.postrun),
            gate: watch::channel(false).0,
            waiting_init: AtomicU32::new(0),
            waiting_running: AtomicU32::new(0),
            waiting_postrun: AtomicU32::new(0),
            limits,
        }
    }

    /// The pools' sizes.
    pub fn limits(&self) -> StageLimits {
        self.limits
    }

    /// Holds new sessions in READY (in-flight ones go on) until
    /// [`Stages::resume`].
    pub fn pause(&self) {
        self.gate.send_replace(true);
    }

    /// Lets READY sessions run again.
    pub fn resume(&self) {
        self.gate.send_replace(false);
    }

    /// Whether new generations are paused.
    pub fn paused(&self) -> bool {
        *self.gate.borrow()
    }

    /// Sessions waiting for each stage's workers, and the workers busy.
    pub fn loads(&self) -> BTreeMap<String, StageLoad> {
        let busy = |s: &Semaphore, n: usize| {
            u32::try_from(n.saturating_sub(s.available_permits())).unwrap_or(u32::MAX)
        };
        let w = |a: &AtomicU32| a.load(Ordering::Relaxed);
        [
            (
                Stage::Init,
                w(&self.waiting_init),
                busy(&self.init, self.limits.init),
            ),
            (
                Stage::Running,
                w(&self.waiting_running),
                busy(&self.running, self.limits.running),
            ),
            (
                Stage::Postrun,
                w(&self.waiting_postrun),
                busy(&self.postrun, self.limits.postrun),
            ),
        ]
        .into_iter()
        .map(|(s, queued, active)| (s.as_str().to_owned(), StageLoad { queued, active }))
        .collect()
    }

    /// Runs one session through every stage; `on_stage` is told of each
    /// stage entered. Returns its report, or `None` when it was cancelled
    /// (nothing to report: the server cancelled it or the node stops).
    pub async fn run<W: Work>(
        &self,
        work: &W,
        job: &Arc<Job>,
        on_stage: impl Fn(Stage),
    ) -> Option<Report> {
        let enter = |s: Stage| {
            job.enter(s);
            on_stage(s);
        };
        let t0 = Instant::now();
        let budget = tokio::time::sleep_until(job.deadline);
        tokio::pin!(budget);
        // Wait for a lane and an INIT worker.
        let acquired = {
            let _w = count_wait(&self.waiting_init);
            tokio::select! {
                biased;
                () = job.stop.cancelled() => Err(Interrupt::Cancelled),
                () = &mut budget => Err(Interrupt::Budget),
                p = async {
                    let lane = self.lanes.acquire().await;
                    let init = self.init.acquire().await;
                    (lane, init)
                } => Ok(p),
            }
        };
        job.time("queued", t0);
        let (lane, init) = match acquired {
            Ok((Ok(lane), Ok(init))) => (lane, init),
            Ok(_) => return None,
            Err(i) => {
                return self
                    .finish(work, job, None, Reached::Interrupted(i), &enter)
                    .await;
            }
        };
        enter(Stage::Init);
        let t = Instant::now();
        let stop = job.stop.child_token();
        let (inited, interrupted) =
            Self::stoppable(job, budget.as_mut(), &stop, work.init(job, stop.clone())).await;
        drop(init);
        job.time("init", t);
        let mut prepared = match (inited, interrupted) {
            (Ok(p), None) => p,
            (Ok(p), Some(i)) => {
                drop(lane);
                return self
                    .finish(work, job, Some(p), Reached::Interrupted(i), &enter)
                    .await;
            }
            (Err(e), _) => {
                drop(lane);
                return self
                    .finish(work, job, None, Reached::InitFailed(e), &enter)
                    .await;
            }
        };
        enter(Stage::Ready);
        let t = Instant::now();
        let running = {
            let _w = count_wait(&self.waiting_running);
            let mut gate = self.gate.subscribe();
            tokio::select! {
                biased;
                () = job.stop.cancelled() => Err(Interrupt::Cancelled),
                () = &mut budget => Err(Interrupt::Budget),
                p = async {
                    let _ = gate.wait_for(|paused| !paused).await;
                    self.running.acquire().await
                } => Ok(p),
            }
        };
        job.time("ready", t);
        let permit = match running {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return None,
            Err(i) => {
                drop(lane);
                return self
                    .finish(work, job, Some(prepared), Reached::Interrupted(i), &enter)
                    .await;
            }
        };
        enter(Stage::Running);
        let t = Instant::now();
        let stop = job.stop.child_token();
        let (ran, interrupted) = Self::stoppable(
            job,
            budget.as_mut(),
            &stop,
            work.run(job, &mut prepared, stop.clone()),
        )
        .await;
        drop(permit);
        drop(lane);
        job.time("running", t);
        let reached = match interrupted {
            Some(i) => Reached::Interrupted(i),
            None => Reached::Ran(ran),
        };
        self.finish(work, job, Some(prepared), reached, &enter)
            .await
    }

    /// Awaits `f` to its end; when the budget runs out first, fires `stop`
    /// (a child of the session's token) and still awaits it. Says what
    /// interrupted it.
    async fn stoppable<T>(
        job: &Job,
        mut budget: std::pin::Pin<&mut tokio::time::Sleep>,
        stop: &CancellationToken,
        f: impl Future<Output = T>,
    ) -> (T, Option<Interrupt>) {
        tokio::pin!(f);
        tokio::select! {
            biased;
            r = &mut f => {
                let i = job.stop.is_cancelled().then_some(Interrupt::Cancelled);
                (r, i)
            }
            () = job.stop.cancelled() => (f.await, Some(Interrupt::Cancelled)),
            () = budget.as_mut() => {
                stop.cancel();
                (f.await, Some(Interrupt::Budget))
            }
        }
    }

    async fn finish<W: Work>(
        &self,
        work: &W,
        job: &Arc<Job>,
        prepared: Option<W::Prepared>,
        reached: Reached<W::Ran>,
        enter: &impl Fn(Stage),
    ) -> Option<Report> {
        let cancelled = matches!(reached, Reached::Interrupted(Interrupt::Cancelled));
        let t = Instant::now();
        let permit = {
            let _w = count_wait(&self.waiting_postrun);
            self.postrun.acquire().await
        };
        enter(Stage::Postrun);
        let mut report = work.postrun(job, prepared, reached).await;
        drop(permit);
        job.time("postrun", t);
        if cancelled {
            return None;
        }
        let timings: serde_json::Map<String, serde_json::Value> = job
            .timings()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into()))
            .collect();
        report
            .stats
            .insert("stage_ms".into(), serde_json::Value::Object(timings));
        Some(report)
    }
}
