//! A simulated gateway node for tests and benchmarks: the real node
//! ([`Node`]: HTTP on loopback, registration, heartbeats, assignments,
//! cancellations, progress, results, the stage pipeline) whose work
//! "prepares" for `init_time`, "runs" each session by sleeping for a
//! configurable time and reports a reward and token counts chosen by a
//! function of the assignment. [`SimGateway::kill`] makes it vanish at
//! once (no more heartbeats, no results, its port closed), to test
//! re-dispatch.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

#[cfg(any(test, feature = "test-hooks"))]
use crate::node::Received;
use crate::node::{Node, NodeError, NodeOptions, Progress};
use crate::stages::{InitError, Interrupt, Job, Reached, Report, StageLimits, Stages, Work};
use polar_rollout_api::{SampleStatus, SessionAssignment, TokenUsage};

/// What a simulated session ends with.
#[derive(Clone, Debug, PartialEq)]
pub struct SimOutcome {
    /// Reported status.
    pub status: SampleStatus,
    /// Reported reward.
    pub reward: Option<f64>,
    /// Reported token counts.
    pub tokens: TokenUsage,
    /// How long the session "runs" (the gateway's default when `None`).
    pub run_for: Option<Duration>,
    /// Ask the server to dispatch the session again.
    pub retry: bool,
    /// Report that this node cannot run the session (with `retry`: another
    /// node may).
    pub node_unfit: bool,
    /// The reported `trajectory_uri` (`sim://{node}/{session}.json` when
    /// `None`).
    pub trajectory_uri: Option<String>,
    /// Reported `stats` besides `simulated_ms` (and the stages' own).
    pub stats: serde_json::Map<String, serde_json::Value>,
}

/// Chooses a session's outcome.
pub type OutcomeFn = Arc<dyn Fn(&SessionAssignment) -> SimOutcome + Send + Sync>;

/// The default outcome: completed, reward `1 / (1 + sample_index)`, token
/// counts that depend on the index.
pub fn default_outcome(a: &SessionAssignment) -> SimOutcome {
    SimOutcome {
        status: SampleStatus::Completed,
        reward: Some(1.0 / f64::from(1 + a.sample_index)),
        tokens: TokenUsage {
            prompt: 100 + u64::from(a.sample_index),
            response: 50 + u64::from(a.sample_index),
            calls: 3,
        },
        run_for: None,
        retry: false,
        node_unfit: false,
        trajectory_uri: None,
        stats: serde_json::Map::new(),
    }
}

/// An assignment of sample `index` of task `task_id` with a budget of
/// `budget_secs` from now, as a server would send it (for tests and
/// benchmarks that drive the stages directly).
pub fn sample_assignment(task_id: &str, index: u32, budget_secs: u64) -> SessionAssignment {
    SessionAssignment {
        version: polar_rollout_api::API_VERSION,
        session_id: format!("{task_id}-s{index}"),
        attempt: 1,
        task_id: task_id.to_owned(),
        sample_index: index,
        instruction: String::new(),
        runtime: serde_json::Map::new(),
        agent: polar_rollout_api::AgentSpec {
            harness: "shell".into(),
            options: serde_json::Map::new(),
        },
        builder: polar_trajectory::Builder::default(),
        evaluator: polar_rollout_api::EvaluatorSpec::default(),
        metadata: polar_rollout_api::TaskMetadata::default(),
        timeout_secs: budget_secs,
        deadline_unix_ms: polar_rollout_api::now_ms() + budget_secs * 1000,
    }
}

/// Settings of a simulated gateway.
#[derive(Clone)]
pub struct SimGatewayConfig {
    /// The node id.
    pub node_id: String,
    /// The rollout server's base URL.
    pub server_url: String,
    /// The token presented to the server (a node token).
    pub token: String,
    /// The token the server must present (its gateway token).
    pub accept_token: String,
    /// Sessions held at once.
    pub max_sessions: u32,
    /// How long a session "prepares" (INIT).
    pub init_time: Duration,
    /// How long a session "runs".
    pub session_time: Duration,
    /// Spread of the run time: each session runs `session_time` times a
    /// random factor in `[1 - jitter, 1 + jitter]` (0 for exactly).
    pub jitter: f64,
    /// Heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Which stages are reported before the result (the start of RUNNING
    /// by default).
    pub progress: Progress,
    /// The outcome of each session.
    pub outcome: OutcomeFn,
    /// HTTPS and the CA the server is verified against (`None`: plain HTTP
    /// on loopback).
    pub tls: Option<polar_rollout_api::tls::TlsConfigs>,
}

impl std::fmt::Debug for SimGatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGatewayConfig")
            .field("node_id", &self.node_id)
            .field("server_url", &self.server_url)
            .field("max_sessions", &self.max_sessions)
            .field("session_time", &self.session_time)
            .finish_non_exhaustive()
    }
}

impl SimGatewayConfig {
    /// Defaults: 16 sessions of 50 ms, no INIT time, heartbeat every
    /// 50 ms, the same token both ways, [`default_outcome`].
    pub fn new(node_id: &str, server_url: &str, token: &str) -> Self {
        Self {
            node_id: node_id.to_owned(),
            server_url: server_url.to_owned(),
            token: token.to_owned(),
            accept_token: token.to_owned(),
            max_sessions: 16,
            init_time: Duration::ZERO,
            session_time: Duration::from_millis(50),
            jitter: 0.0,
            heartbeat_interval: Duration::from_millis(50),
            progress: Progress::Running,
            outcome: Arc::new(default_outcome),
            tls: None,
        }
    }
}

/// The simulated work.
pub struct SimWork {
    node_id: String,
    init_time: Duration,
    session_time: Duration,
    jitter: f64,
    outcome: OutcomeFn,
}

impl SimWork {
    /// Work of node `node_id` that prepares for `init_time` and runs for
    /// `session_time` (with `jitter`), ending as `outcome` says.
    pub fn new(
        node_id: &str,
        init_time: Duration,
        session_time: Duration,
        jitter: f64,
        outcome: OutcomeFn,
    ) -> Self {
        Self {
            node_id: node_id.to_owned(),
            init_time,
            session_time,
            jitter,
            outcome,
        }
    }
}

async fn sleep_or_stop(d: Duration, stop: &CancellationToken) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(d) => {}
    }
}

impl Work for SimWork {
    type Prepared = (SimOutcome, Duration);
    type Ran = ();

    async fn init(
        &self,
        job: &Arc<Job>,
        stop: CancellationToken,
    ) -> Result<Self::Prepared, InitError> {
        sleep_or_stop(self.init_time, &stop).await;
        let outcome = (self.outcome)(&job.assignment);
        let run_for = outcome.run_for.unwrap_or_else(|| {
            let j = self.jitter.clamp(0.0, 1.0);
            self.session_time
                .mul_f64(1.0 - j + 2.0 * j * rand::random::<f64>())
        });
        Ok((outcome, run_for))
    }

    async fn run(&self, _job: &Arc<Job>, p: &mut Self::Prepared, stop: CancellationToken) {
        sleep_or_stop(p.1, &stop).await;
    }

    async fn postrun(
        &self,
        job: &Arc<Job>,
        p: Option<Self::Prepared>,
        reached: Reached<()>,
    ) -> Report {
        let (outcome, run_for) =
            p.unwrap_or_else(|| (default_outcome(&job.assignment), Duration::ZERO));
        let status = match reached {
            Reached::Ran(()) => outcome.status,
            Reached::Interrupted(Interrupt::Budget) => SampleStatus::Timeout,
            Reached::Interrupted(Interrupt::Cancelled) => SampleStatus::Cancelled,
            Reached::InitFailed(_) => SampleStatus::Error,
        };
        let mut stats = outcome.stats.clone();
        stats.insert(
            "simulated_ms".into(),
            json!(u64::try_from(run_for.as_millis()).unwrap_or(u64::MAX)),
        );
        Report {
            status,
            reward: outcome.reward,
            trajectory_uri: Some(outcome.trajectory_uri.clone().unwrap_or_else(|| {
                format!("sim://{}/{}.json", self.node_id, job.assignment.session_id)
            })),
            tokens: outcome.tokens,
            error: (status != SampleStatus::Completed)
                .then(|| format!("simulated {}", status.as_str())),
            stats,
            retry: outcome.retry,
            infra_fault: false,
            node_unfit: outcome.node_unfit,
        }
    }
}

/// A running simulated gateway.
#[derive(Debug)]
pub struct SimGateway {
    node: Node<SimWork>,
}

impl SimGateway {
    /// Binds 127.0.0.1 on a free port, registers with the server and starts
    /// heartbeating. Every stage's pool holds `max_sessions`, so sessions
    /// never wait for a worker.
    pub async fn start(cfg: SimGatewayConfig) -> Result<Self, NodeError> {
        let n = cfg.max_sessions as usize;
        let stages = Stages::new(StageLimits {
            init: n,
            ready_buffer: 0,
            running: n,
            postrun: n,
        });
        let mut labels = serde_json::Map::new();
        labels.insert("simulated".into(), json!(true));
        let opts = NodeOptions {
            node_id: cfg.node_id.clone(),
            server_url: cfg.server_url.clone(),
            token: cfg.token.clone(),
            accept_tokens: vec![cfg.accept_token.clone()],
            advertise: None,
            max_sessions: cfg.max_sessions,
            heartbeat_interval: cfg.heartbeat_interval,
            progress: cfg.progress,
            labels,
            limits: polar_rollout_api::serve::ServeLimits::default(),
            tls: cfg.tls.clone(),
        };
        let work = SimWork::new(
            &cfg.node_id,
            cfg.init_time,
            cfg.session_time,
            cfg.jitter,
            cfg.outcome,
        );
        let node = Node::start(
            opts,
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            stages,
            work,
        )
        .await?;
        Ok(Self { node })
    }

    /// The node id.
    pub fn node_id(&self) -> &str {
        self.node.node_id()
    }

    /// Its base URL.
    pub fn address(&self) -> &str {
        self.node.address()
    }

    /// Every assignment taken, in arrival order; a session taken again
    /// counts again (tests only).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn received(&self) -> Vec<Received> {
        self.node.received()
    }

    /// Sessions it was told to cancel (tests only).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn cancelled(&self) -> Vec<String> {
        self.node.cancelled()
    }

    /// Results the server accepted from it.
    pub fn reported(&self) -> u64 {
        self.node.reported()
    }

    /// Sessions held now.
    pub fn holding(&self) -> usize {
        self.node.holding()
    }

    /// Sessions it keeps anything of ([`Node::remembered`]).
    pub fn remembered(&self) -> u64 {
        self.node.remembered()
    }

    /// Vanishes at once: no more heartbeats or results, the port closes,
    /// held sessions are dropped unreported.
    pub fn kill(&self) {
        self.node.kill();
    }

    /// Kills it and waits for its tasks to end.
    pub async fn stop(self) {
        self.node.stop().await;
    }
}
