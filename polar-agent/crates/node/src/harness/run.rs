//! One harness session end to end, in three phases that the gateway runs in
//! separate stages and `polar sandbox run --harness` runs back to back:
//! [`prepare`] (the session's directories on their disk quota and the
//! harness's HOME files, written beneath HOME, the
//! runtime, the sandbox session — network, cgroups, limits — serving the
//! proxy and base-URL mode when asked, the runtime's start, the prepare
//! steps), [`Prepared::run_main`] (the harness), and [`Prepared::finish`]
//! (the post-run steps, the runtime's stop, the session's end); then
//! [`release_dirs`] ends the disk quota once nothing reads the directories
//! through a sandbox (their files stay). Where the
//! session's model calls were captured:
//! `<state_dir>/sessions/<session>/calls.jsonl`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::base_url::{DEFAULT_ADDR, WithBaseUrl, session_key};
use crate::agent::AgentParts;
use polar_capture::SessionInfo;
use polar_harness::presets::setup;
use polar_harness::{Harness, HarnessError, HarnessName, Install, Mode, ModeKind};
use polar_ids::SessionId;
use polar_redirect::Redirect;
use polar_sandbox::NetworkMode;
use polar_sandbox::limits::Enforced;
use polar_sandbox::runtime::plan::{MainCommand, Phase, Plan, StepEnd, StepReport};
use polar_sandbox::runtime::steps::SandboxDirs;
use polar_sandbox::runtime::{Layout, Runtime};
use polar_sandbox::session::{SandboxSession, SessionOptions};
use polar_sandbox::uids::UidLease;
use polar_spec::runtime::{NetworkKind, RuntimeSpec};

/// A harness session to run.
#[derive(Clone, Debug)]
pub struct HarnessRun {
    /// The harness: a preset or one of the configuration's.
    pub harness: Harness,
    /// The task's instruction.
    pub instruction: String,
    /// The shell preset's command (empty: `sh -c INSTRUCTION`).
    pub command: Vec<String>,
    /// Transparent or base-URL mode.
    pub mode: ModeKind,
    /// The runtime spec.
    pub spec: RuntimeSpec,
    /// The session's time budget, from the start of the run.
    pub budget: Duration,
    /// The session id.
    pub session: SessionId,
    /// The harness's installation (from [`polar_harness::check_installed`]).
    pub install: Option<Install>,
    /// Stamped on the session's captured calls (task, group, ...).
    pub info: SessionInfo,
}

/// How a harness session went.
#[derive(Debug, serde::Serialize)]
pub struct HarnessOutcome {
    /// The session.
    pub session: String,
    /// The harness.
    pub harness: String,
    /// The harness's version.
    pub version: Option<String>,
    /// The workspace on the host.
    pub workspace: PathBuf,
    /// The session's directory on the host (logs, HOME).
    pub sandbox_dir: PathBuf,
    /// Where its model calls were captured.
    pub capture_log: PathBuf,
    /// What limits were enforced where.
    pub enforced: Enforced,
    /// Every step.
    pub steps: Vec<StepReport>,
}

impl HarnessOutcome {
    /// The harness's own step.
    pub fn main(&self) -> Option<&StepReport> {
        self.steps.iter().find(|s| s.phase == Phase::Main)
    }

    /// Whether the harness exited with 0.
    pub fn succeeded(&self) -> bool {
        self.main().is_some_and(|s| s.end.ok())
    }
}

/// The capture log of `session` under `state_dir` (the capture stage's
/// layout).
pub fn capture_log(state_dir: &std::path::Path, session: &SessionId) -> PathBuf {
    polar_capture::session_dir(state_dir, session).join(polar_capture::CALLS_FILE)
}

/// Stops accepting the session's calls and closes its capture log.
fn end_capture(parts: &AgentParts, session: &SessionId) {
    parts.sessions.unregister(session);
    if let Some(c) = &parts.capture {
        c.end_session(session);
    }
    parts.registry.unregister(session);
}

/// A session whose sandbox is open, runtime started and prepare steps run:
/// ready for its harness. Dropping it without [`Prepared::finish`] still
/// tears the sandbox down (the sandbox session's own drop), but leaves the
/// runtime's stop command unrun and the capture log open: always finish.
pub struct Prepared {
    run: HarnessRun,
    runtime: Runtime,
    dirs: SandboxDirs,
    layout: Layout,
    /// The session's uid, leased until the session is dropped.
    _uid: UidLease,
    pre_binds: Vec<(PathBuf, PathBuf)>,
    path: Vec<PathBuf>,
    session: SandboxSession,
    main: MainCommand,
    deadline: Instant,
    ready: bool,
    posted: bool,
    steps: Vec<StepReport>,
}

/// Runs one harness session on a started redirect with the agent's parts.
/// Nothing of the sandbox is left running when it returns.
pub async fn run(
    parts: &AgentParts,
    redirect: &Redirect,
    run: HarnessRun,
    stop: &CancellationToken,
) -> Result<HarnessOutcome, HarnessError> {
    let dirs = SandboxDirs::of(&parts.config.agent.state_dir, &run.session);
    let mut prepared = prepare(parts, redirect, run, stop).await?;
    prepared.run_main(None, stop).await;
    let outcome = prepared.finish(parts, stop).await;
    release_dirs(dirs).await;
    outcome
}

/// The first phase: everything up to the harness. A runtime that does not
/// start or a failed prepare step is not an error here: the session is
/// returned not [`Prepared::ready`], with the failed step in its reports.
pub async fn prepare(
    parts: &AgentParts,
    redirect: &Redirect,
    run: HarnessRun,
    stop: &CancellationToken,
) -> Result<Prepared, HarnessError> {
    let deadline = Instant::now() + run.budget;
    let state = &parts.config.agent.state_dir;
    let disk = run
        .spec
        .limits
        .disk_quota(parts.config.sandbox.disk_bytes)
        .map_err(polar_sandbox::runtime::RuntimeError::from)?;
    let (runtime, uid) = {
        let (spec, session) = (run.spec.clone(), run.session.clone());
        let node = polar_sandbox::runtime::Node::of(&parts.config);
        // `docker info`, `bwrap --version`, the uid's lease (a scan of
        // `/proc`): off the async workers.
        tokio::task::spawn_blocking(move || {
            let uid = node.uids.lease(&session)?;
            Ok::<_, polar_sandbox::runtime::RuntimeError>((
                Runtime::for_spec(&spec, &session, &node)?,
                uid,
            ))
        })
        .await
        .map_err(|e| polar_sandbox::runtime::RuntimeError::Io {
            op: "check",
            path: PathBuf::from("the session's runtime"),
            source: std::io::Error::other(e),
        })??
    };
    let user = uid.user();
    let dirs = SandboxDirs::of(state, &run.session);
    let mode = session_mode(parts, &run);
    let harness = setup(&run.harness, &run.instruction, &mode, &run.command);
    make_dirs(&dirs, user, disk, harness.files.clone()).await?;
    match prepare_on(
        parts,
        redirect,
        run,
        stop,
        deadline,
        runtime,
        dirs.clone(),
        uid,
        mode,
        harness,
    )
    .await
    {
        Ok(p) => Ok(p),
        Err(e) => {
            release_dirs(dirs).await;
            Err(e)
        }
    }
}

/// The session's directories on their disk quota of `disk` bytes, and the
/// harness's HOME files in them, as root beneath directories an earlier
/// attempt may have filled: on a blocking thread.
async fn make_dirs(
    dirs: &SandboxDirs,
    user: (u32, u32),
    disk: u64,
    files: Vec<(PathBuf, String)>,
) -> Result<(), HarnessError> {
    let dirs = dirs.clone();
    tokio::task::spawn_blocking(move || {
        dirs.create(user, Some(disk))?;
        for (rel, contents) in &files {
            dirs.write_home_file(rel, contents, user)?;
        }
        Ok::<_, polar_sandbox::runtime::RuntimeError>(())
    })
    .await
    .map_err(|e| polar_sandbox::runtime::RuntimeError::Io {
        op: "prepare",
        path: PathBuf::from("the session's directories"),
        source: std::io::Error::other(e),
    })??;
    Ok(())
}

/// Ends the disk quota of a session's directories (their contents stay on
/// disk at the same paths: [`SandboxDirs::release`]), on a blocking
/// thread; a failure is logged (the tmpfs then stays until the next
/// agent's start-up releases it).
pub async fn release_dirs(dirs: SandboxDirs) {
    let session = dirs.session.clone();
    let done = tokio::task::spawn_blocking(move || dirs.release()).await;
    let error = match done {
        Ok(Ok(())) => return,
        Ok(Err(e)) => polar_io::chain(&e),
        Err(e) => e.to_string(),
    };
    tracing::warn!(session = %session, error = %error, "releasing the sandbox's disk quota");
}

/// The rest of [`prepare`], once the directories are made.
#[expect(
    clippy::too_many_arguments,
    reason = "the parts of prepare, split off once"
)]
async fn prepare_on(
    parts: &AgentParts,
    redirect: &Redirect,
    run: HarnessRun,
    stop: &CancellationToken,
    deadline: Instant,
    runtime: Runtime,
    dirs: SandboxDirs,
    uid: UidLease,
    mode: Mode,
    harness: polar_harness::presets::Setup,
) -> Result<Prepared, HarnessError> {
    let user = uid.user();
    let bundle_targets = polar_sandbox::runtime::bundle_targets(&runtime, &run.spec);
    let staged = stage_read_only(&runtime, &run, &dirs, user)?;
    let layout = Layout {
        workspace: dirs.workspace.clone(),
        home: dirs.home.clone(),
        tmp: dirs.tmp.clone(),
        workdir: run.spec.workdir.clone(),
        trust: Some(parts.trust.clone()),
        bundle_targets,
        mounts: run.spec.mounts.clone(),
        read_only: staged.reachable.clone(),
        staged: staged.staged.clone(),
        // The image's own for apptainer (which runs as the caller).
        identity: matches!(runtime, Runtime::Native { .. } | Runtime::Docker(_))
            .then(|| dirs.identity.clone()),
        user,
    };
    begin_capture(parts, &run, &mode);
    let handler = proxy_handler(parts, &mode);
    let session = open_sandbox(parts, redirect, &run, &handler)?;
    let path: Vec<PathBuf> = run.install.iter().map(|i| i.bin_dir.clone()).collect();
    // The installation's own variables after the harness's.
    let mut env = harness.env.clone();
    env.extend(run.install.iter().flat_map(|i| i.env.iter().cloned()));
    let mut prepared = Prepared {
        main: MainCommand {
            argv: harness.argv.clone(),
            env,
        },
        pre_binds: staged.binds,
        run,
        runtime,
        dirs,
        layout,
        _uid: uid,
        path,
        session,
        deadline,
        ready: false,
        posted: false,
        steps: Vec::new(),
    };
    if prepared.start(parts, &handler, stop).await {
        let (reports, ok) = prepared.plan(deadline).prepare(stop).await;
        prepared.steps.extend(reports);
        prepared.ready = ok;
    }
    Ok(prepared)
}

/// The session's mode: base-URL mode points the harness at the agent's
/// base-URL listener with the session's key.
fn session_mode(parts: &AgentParts, run: &HarnessRun) -> Mode {
    match run.mode {
        ModeKind::Transparent => Mode::Transparent,
        ModeKind::BaseUrl => {
            let addr = parts
                .config
                .proxy
                .base_url_listen
                .map_or_else(|| DEFAULT_ADDR.to_owned(), |a| a.to_string());
            Mode::BaseUrl {
                url: format!("http://{addr}"),
                key: session_key(&run.session),
            }
        }
    }
}

/// The installation's read-only directories: for a native runtime, those
/// the sandbox user cannot reach are staged under the session's directory
/// ([`polar_sandbox::runtime::steps::stage`]); otherwise all are bound directly.
fn stage_read_only(
    runtime: &Runtime,
    run: &HarnessRun,
    dirs: &SandboxDirs,
    user: (u32, u32),
) -> Result<polar_sandbox::runtime::steps::StagedDirs, HarnessError> {
    let wanted: Vec<PathBuf> = run
        .install
        .as_ref()
        .map(|i| i.read_only.clone())
        .unwrap_or_default();
    Ok(if matches!(runtime, Runtime::Native { .. }) {
        polar_sandbox::runtime::steps::stage(&wanted, &dirs.root, user)?
    } else {
        polar_sandbox::runtime::steps::StagedDirs {
            reachable: wanted,
            ..Default::default()
        }
    })
}

/// Starts accepting the session's calls (under its base-URL key in that
/// mode); undone by [`end_capture`].
fn begin_capture(parts: &AgentParts, run: &HarnessRun, mode: &Mode) {
    let base_key = match mode {
        Mode::BaseUrl { key, .. } => Some(key.clone()),
        Mode::Transparent => None,
    };
    parts.sessions.register(&run.session, base_key.as_deref());
    // The capture stage stamps the session's records with its info, and
    // `session.json` keeps the instruction: the trajectory's main chain is
    // the one carrying it.
    let mut info = run.info.clone();
    if !run.instruction.is_empty() {
        info.metadata
            .entry(polar_capture::INSTRUCTION_KEY)
            .or_insert_with(|| run.instruction.clone().into());
    }
    // A configured harness's API and shell tool, as the operator declared
    // them: what a consumer needs to read its calls' tool use.
    if let Harness::Custom(c) = &run.harness {
        if let Ok(api) = serde_json::to_value(c.api) {
            info.metadata.entry("harness_api").or_insert(api);
        }
        if let Some(tool) = &c.shell_tool {
            info.metadata
                .entry("shell_tool")
                .or_insert_with(|| tool.clone().into());
        }
    }
    parts.registry.register(&run.session, info);
}

/// The handler of the session's connections: the proxy, plus base-URL mode
/// on the mode's address.
fn proxy_handler(parts: &AgentParts, mode: &Mode) -> Arc<WithBaseUrl> {
    Arc::new(WithBaseUrl {
        proxy: Arc::clone(&parts.proxy),
        addr: match mode {
            Mode::BaseUrl { url, .. } => url
                .trim_start_matches("http://")
                .parse()
                .unwrap_or_else(|_| std::net::SocketAddr::from(([127, 0, 0, 1], 8787))),
            Mode::Transparent => std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
        },
        sessions: Arc::clone(&parts.sessions),
        rules: parts.rules.clone(),
    })
}

/// Opens the session's sandbox (network, cgroups, limits) serving
/// `handler`; on failure, ends the capture [`begin_capture`] began.
fn open_sandbox(
    parts: &AgentParts,
    redirect: &Redirect,
    run: &HarnessRun,
    handler: &Arc<WithBaseUrl>,
) -> Result<SandboxSession, HarnessError> {
    let opts = SessionOptions {
        id: run.session.clone(),
        network: match run.spec.network {
            NetworkKind::Isolated => NetworkMode::Isolated,
            NetworkKind::Host => NetworkMode::Host,
        },
        limits: run.spec.limits.or(parts.config.sandbox.default_limits()),
        drain_grace: Duration::from_secs(5),
    };
    SandboxSession::open(redirect, &opts, handler, &parts.resolver).map_err(|e| {
        end_capture(parts, &run.session);
        e.into()
    })
}

/// Moves the session's listener and DNS into the container's network
/// namespace (it has only loopback); the failed step if that fails.
async fn join_container_netns(
    d: &polar_sandbox::runtime::docker::Docker,
    session: &mut SandboxSession,
    handler: &Arc<WithBaseUrl>,
    parts: &AgentParts,
) -> Option<StepReport> {
    let adopted = match d.init_pid().await {
        Ok(pid) => session
            .adopt_netns(
                std::path::Path::new(&format!("/proc/{pid}/ns/net")),
                handler,
                &parts.resolver,
            )
            .await
            .map_err(|e| polar_io::chain(&e)),
        Err(e) => Err(e),
    };
    let error = adopted.err()?;
    Some(StepReport {
        phase: Phase::Start,
        index: 1,
        what: "join the container's network namespace".into(),
        end: StepEnd::Failed { error },
        elapsed_ms: 0,
        logs: None,
    })
}

impl Prepared {
    /// The session.
    pub fn session(&self) -> &SessionId {
        &self.run.session
    }

    /// Whether the runtime started and every prepare step succeeded.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// When the session's budget runs out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The steps so far.
    pub fn steps(&self) -> &[StepReport] {
        &self.steps
    }

    /// The workspace on the host.
    pub fn workspace(&self) -> &std::path::Path {
        &self.dirs.workspace
    }

    /// The session's directories on the host.
    pub fn dirs(&self) -> &SandboxDirs {
        &self.dirs
    }

    /// The layout and the added variables an evaluator command runs with
    /// in this session's sandbox, on the evaluation's own directories
    /// ([`polar_sandbox::runtime::eval`]).
    pub fn isolate(
        &self,
        eval: &polar_sandbox::runtime::eval::EvalDirs,
    ) -> (Layout, Vec<(String, String)>) {
        let (layout, mut env) = eval.isolate(&self.layout, &self.runtime);
        polar_sandbox::runtime::eval::keep_spec_pythonpath(&mut env, &self.run.spec);
        (layout, env)
    }

    /// The sandbox user.
    pub fn user(&self) -> (u32, u32) {
        self.layout.user
    }

    /// The same session again with nothing to run: a fresh sandbox on the
    /// same workspace and HOME (for an evaluator that wants one), with the
    /// runtime spec's prepare and post-run steps left out.
    pub fn fresh_run(&self) -> HarnessRun {
        let mut run = self.run.clone();
        run.harness = HarnessName::Shell.into();
        run.command = vec!["true".into()];
        run.spec.prepare.clear();
        run.spec.post.clear();
        run.budget = Duration::from_secs(3600);
        run.install = None;
        run
    }

    /// Starts the runtime and, for a container, moves the session's
    /// network into it, reporting both in the steps. Whether both went
    /// well.
    async fn start(
        &mut self,
        parts: &AgentParts,
        handler: &Arc<WithBaseUrl>,
        stop: &CancellationToken,
    ) -> bool {
        let started = start_runtime(&self.plan(self.deadline), &self.session, stop).await;
        let start_ok = started.as_ref().is_none_or(|r| r.end.ok());
        self.steps.extend(started);
        if start_ok
            && let Runtime::Docker(d) = &self.runtime
            && let Some(failed) = join_container_netns(d, &mut self.session, handler, parts).await
        {
            self.steps.push(failed);
            return false;
        }
        start_ok
    }

    /// The plan of the session's commands, with `deadline`.
    pub fn plan(&self, deadline: Instant) -> Plan<'_> {
        Plan {
            session: &self.session,
            runtime: &self.runtime,
            spec: &self.run.spec,
            layout: &self.layout,
            dirs: &self.dirs,
            path: self.path.clone(),
            deadline,
            pre_binds: self.pre_binds.clone(),
        }
    }

    /// The second phase: the harness (skipped when not ready), killed when
    /// the session's budget or `timeout` from now runs out, whichever is
    /// first. Returns its report.
    pub async fn run_main(
        &mut self,
        timeout: Option<Duration>,
        stop: &CancellationToken,
    ) -> &StepReport {
        let deadline = timeout.map_or(self.deadline, |t| self.deadline.min(Instant::now() + t));
        let report = self.plan(deadline).main(&self.main, self.ready, stop).await;
        self.steps.push(report);
        let last = self.steps.len() - 1;
        &self.steps[last]
    }

    /// The post-run steps of the runtime spec (once; [`Prepared::finish`]
    /// runs them when this was not called).
    pub async fn post(&mut self, stop: &CancellationToken) {
        if !self.posted {
            self.posted = true;
            let post = self.run_post(stop).await;
            self.steps.extend(post);
        }
    }

    /// The post-run steps, their commands on an evaluation's own HOME, tmp
    /// and variables ([`polar_sandbox::runtime::eval`]), made only when there is a
    /// command to run: what the harness left in its HOME, `/tmp` or
    /// environment does not reach them.
    async fn run_post(&self, stop: &CancellationToken) -> Vec<StepReport> {
        let plan = self.plan(self.deadline);
        if !self
            .run
            .spec
            .post
            .iter()
            .any(|s| matches!(s, polar_spec::runtime::Step::Run { .. }))
        {
            return plan.post(&Ok(Vec::new()), stop).await;
        }
        let (dirs, user) = (self.dirs.clone(), self.user());
        let made = tokio::task::spawn_blocking(move || {
            polar_sandbox::runtime::eval::EvalDirs::make(&dirs, user)
        })
        .await;
        match made {
            Ok(Ok(eval)) => {
                let (layout, env) = self.isolate(&eval);
                let plan = Plan {
                    layout: &layout,
                    ..plan
                };
                // The workspace's repository configurations made safe
                // first (`polar_evaluate::isolation::CLEAN_GIT_SCRIPT`),
                // its output in the logs as the step after the spec's last;
                // reported only through the steps it keeps from running.
                let argv = polar_evaluate::isolation::clean_git_argv();
                let index = self.run.spec.post.len();
                let clean = plan
                    .run_command(Phase::Post, index, &argv, &env, stop)
                    .await;
                let isolation = match clean.end {
                    StepEnd::Exited { code: 0 } => Ok(env),
                    end => Err(format!(
                        "making the workspace's git configuration safe failed ({end:?}; \
                         logs/post-{index}.err)"
                    )),
                };
                plan.post(&isolation, stop).await
            }
            Ok(Err(e)) => plan.post(&Err(polar_io::chain(&e)), stop).await,
            Err(e) => plan.post(&Err(e.to_string()), stop).await,
        }
    }

    /// The last phase: the post-run steps (unless run already), the
    /// runtime's stop, the sandbox closed and the capture log with it.
    pub async fn finish(
        mut self,
        parts: &AgentParts,
        stop: &CancellationToken,
    ) -> Result<HarnessOutcome, HarnessError> {
        self.post(stop).await;
        let stopped = stop_runtime(&self.plan(self.deadline), stop).await;
        self.steps.extend(stopped);
        let enforced = self.session.enforced();
        let closed = self.session.close().await;
        end_capture(parts, &self.run.session);
        closed?;
        Ok(HarnessOutcome {
            session: self.run.session.to_string(),
            harness: self.run.harness.to_string(),
            version: self.run.install.map(|i| i.version),
            workspace: self.dirs.workspace.clone(),
            sandbox_dir: self.dirs.root.clone(),
            capture_log: capture_log(&parts.config.agent.state_dir, &self.run.session),
            enforced,
            steps: self.steps,
        })
    }
}

async fn start_runtime(
    plan: &Plan<'_>,
    session: &SandboxSession,
    stop: &CancellationToken,
) -> Option<StepReport> {
    match plan.runtime {
        Runtime::Native { .. } => None,
        Runtime::Docker(d) => {
            let Some(parent) = container_cgroup(session) else {
                let e = polar_sandbox::runtime::RuntimeError::Command {
                    what: "docker run".into(),
                    detail: "the session has no cgroup v2 directory to place the container in"
                        .into(),
                };
                return Some(plan.refused(Phase::Start, &e));
            };
            let parent = format!("/{}", parent.display());
            let (d2, layout) = (d.clone(), plan.layout.clone());
            let checked = tokio::task::spawn_blocking(move || d2.check_binds(&layout)).await;
            let argv = match checked {
                Ok(Ok(())) => d.run_argv(plan.layout, &parent),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(polar_sandbox::runtime::RuntimeError::Command {
                    what: "checking the container's mounts".into(),
                    detail: e.to_string(),
                }),
            };
            let argv = match argv {
                Ok(a) => a,
                Err(e) => return Some(plan.refused(Phase::Start, &e)),
            };
            Some(
                plan.run_runtime_command(Phase::Start, argv, false, false, stop)
                    .await,
            )
        }
        Runtime::Apptainer(a) => {
            let overlay = plan.dirs.root.join("overlay");
            if let Err(e) = std::fs::create_dir_all(&overlay).and_then(|()| {
                std::os::unix::fs::chown(
                    &overlay,
                    Some(plan.layout.user.0),
                    Some(plan.layout.user.1),
                )
            }) {
                tracing::warn!(error = %e, "cannot make the overlay directory");
            }
            let argv = match a.start_argv(plan.layout, &overlay) {
                Ok(a) => a,
                Err(e) => return Some(plan.refused(Phase::Start, &e)),
            };
            Some(
                plan.run_runtime_command(Phase::Start, argv, true, true, stop)
                    .await,
            )
        }
    }
}

/// The session's cgroup v2 directory relative to the cgroup mount: the
/// container's `--cgroup-parent` (the cgroupfs driver's form).
fn container_cgroup(session: &SandboxSession) -> Option<PathBuf> {
    let dir = session.cgroup_dir()?;
    dir.strip_prefix(&session.redirect().mount().mount_point)
        .ok()
        .map(Path::to_path_buf)
}

async fn stop_runtime(plan: &Plan<'_>, stop: &CancellationToken) -> Option<StepReport> {
    // The stop commands run even after `stop` fired: a fresh token.
    let _ = stop;
    let never = CancellationToken::new();
    match plan.runtime {
        Runtime::Native { .. } => None,
        Runtime::Docker(d) => {
            let report = plan
                .run_runtime_command(Phase::Stop, d.rm_argv(), false, false, &never)
                .await;
            // The cgroup v1 groups runc made at the container's parent
            // path (hybrid hosts), which the engine leaves behind.
            if let Some(rel) = container_cgroup(plan.session) {
                let removed = tokio::task::spawn_blocking(move || {
                    polar_redirect::cgroup::remove_v1_mirrors(&rel, Duration::from_secs(5));
                })
                .await;
                if let Err(e) = removed {
                    tracing::warn!(error = %e, "removing the container's cgroup v1 groups");
                }
            }
            Some(report)
        }
        Runtime::Apptainer(a) => Some(
            plan.run_runtime_command(Phase::Stop, a.stop_argv(), false, true, &never)
                .await,
        ),
    }
}
