//! A whole session on a runtime: start the runtime (container runtimes),
//! the prepare steps, the main command (the harness), the post-run steps,
//! stop the runtime. Every command gets the remaining time budget in its
//! environment (`POLAR_DEADLINE`, `POLAR_TIMEOUT_SECS`) and is killed, with
//! everything it started, when the budget runs out. A failed prepare step
//! skips the main command; post-run steps run whatever happened before (as
//! long as budget is left), their commands isolated like an evaluator's
//! (the caller's layout and variables: [`super::eval`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant as StdInstant;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::steps::{SandboxDirs, upload};
use super::{Layout, Runtime, RuntimeError, base_env};
use crate::session::{Exec, ExecEnd, SandboxSession};
use polar_spec::runtime::{RuntimeSpec, Step};

/// Which part of the session a step belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Starting the runtime.
    Start,
    /// Before the main command.
    Prepare,
    /// The main command.
    Main,
    /// After it.
    Post,
    /// The evaluator's commands.
    Eval,
    /// Stopping the runtime.
    Stop,
}

/// How a step ended.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum StepEnd {
    /// It exited with this code (128+N after signal N).
    Exited {
        /// The code.
        code: i32,
    },
    /// The budget ran out: it was killed with everything it started.
    TimedOut,
    /// The session was stopped.
    Stopped,
    /// It could not run (upload failed, command not started).
    Failed {
        /// Why.
        error: String,
    },
    /// The sandbox could not be built around it (bubblewrap failed before
    /// it exec'd the command): the node's fault, never the command's.
    NotStarted {
        /// bubblewrap's message.
        error: String,
    },
    /// Not run (an earlier step failed, or no budget was left).
    Skipped,
}

impl StepEnd {
    /// Exited with 0.
    pub fn ok(&self) -> bool {
        matches!(self, Self::Exited { code: 0 })
    }
}

/// One step's report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepReport {
    /// Its phase.
    pub phase: Phase,
    /// Its index within the phase.
    pub index: usize,
    /// What it was (a command line or an upload).
    pub what: String,
    /// How it ended.
    pub end: StepEnd,
    /// How long it took, in milliseconds.
    pub elapsed_ms: u64,
    /// Its stdout and stderr files, for commands.
    pub logs: Option<(PathBuf, PathBuf)>,
}

/// The main command of a session.
#[derive(Clone, Debug, Default)]
pub struct MainCommand {
    /// Argv inside the sandbox.
    pub argv: Vec<String>,
    /// Environment added to the session's.
    pub env: Vec<(String, String)>,
}

/// Everything needed to run a session's commands.
pub struct Plan<'a> {
    /// The session.
    pub session: &'a SandboxSession,
    /// The runtime.
    pub runtime: &'a Runtime,
    /// The spec (steps, environment).
    pub spec: &'a RuntimeSpec,
    /// The layout.
    pub layout: &'a Layout,
    /// The session's directories.
    pub dirs: &'a SandboxDirs,
    /// Directories put first on `PATH`.
    pub path: Vec<PathBuf>,
    /// When the budget runs out.
    pub deadline: Instant,
    /// Read-only binds the agent's child makes in its private mount
    /// namespace before exec (staged directories, native only).
    pub pre_binds: Vec<(PathBuf, PathBuf)>,
}

fn exit_code(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code()
        .or_else(|| s.signal().map(|sig| 128 + sig))
        .unwrap_or(1)
}

/// A command ready to run in the sandbox ([`Plan::exec_for`]).
#[derive(Debug)]
pub struct SandboxedExec {
    /// What the agent execs.
    pub exec: Exec,
    /// Its stdout and stderr files.
    pub logs: (PathBuf, PathBuf),
    /// The read end of bubblewrap's status pipe (native): keep it open
    /// until the command ended (bwrap would die of `SIGPIPE` writing to
    /// it), then [`super::native::started`] says whether it ran.
    pub status: Option<File>,
}

/// How a command run through bubblewrap ended, from its exit status and
/// bwrap's status pipe: exited, or never started (bwrap's message, from
/// the end of `stderr`, which then only bwrap wrote). A command bwrap
/// could not find or exec (`execvp`) exited 127, as a shell's would: the
/// sandbox was built, the command line is at fault.
async fn exited_in_bwrap(s: std::process::ExitStatus, pipe: &mut File, stderr: &Path) -> StepEnd {
    if super::native::started(&super::native::read_status(pipe)) {
        return StepEnd::Exited { code: exit_code(s) };
    }
    let message = tail(stderr, 4096).await;
    if message.lines().any(|l| l.starts_with("bwrap: execvp ")) {
        return StepEnd::Exited { code: 127 };
    }
    StepEnd::NotStarted {
        error: format!(
            "the sandbox did not start ({}): {}",
            exit_code(s),
            message.trim()
        ),
    }
}

/// The last `max` bytes of `path`, lossily decoded ("" when unreadable).
async fn tail(path: &Path, max: u64) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
    let Ok(mut f) = tokio::fs::File::open(path).await else {
        return String::new();
    };
    let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
    if f.seek(std::io::SeekFrom::Start(len.saturating_sub(max)))
        .await
        .is_err()
    {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

impl Plan<'_> {
    fn log_files(&self, name: &str) -> Result<(PathBuf, PathBuf, File, File), RuntimeError> {
        let out = self.dirs.logs.join(format!("{name}.out"));
        let err = self.dirs.logs.join(format!("{name}.err"));
        let open = |p: &Path| {
            File::create(p).map_err(|source| RuntimeError::Io {
                op: "create",
                path: p.to_owned(),
                source,
            })
        };
        let (o, e) = (open(&out)?, open(&err)?);
        Ok((out, err, o, e))
    }

    /// The [`Exec`] for `argv` in the sandbox (stdout and stderr to
    /// `logs/<name>.out|.err`).
    pub fn exec_for(
        &self,
        argv: &[String],
        extra_env: &[(String, String)],
        name: &str,
    ) -> Result<SandboxedExec, RuntimeError> {
        let mut env = base_env(
            self.session.id(),
            self.spec,
            &self.path,
            Some(self.deadline),
        );
        for (k, v) in extra_env {
            super::set_env(&mut env, k, v.clone());
        }
        let cmd = self.runtime.command(self.layout, argv, &env)?;
        let (out, err, o, e) = self.log_files(name)?;
        let mut exec = Exec::new(cmd.argv);
        exec.keep_fds = cmd.keep_fds;
        exec.no_new_privs = self.runtime.no_new_privs();
        exec.env = if self.runtime.passes_env() {
            env
        } else {
            self.runtime.client_env(self.layout)
        };
        exec.clear_env = true;
        exec.user = self.runtime.drops_user().then_some(self.layout.user);
        exec.cwd = Some(PathBuf::from("/"));
        exec.deadline = Some(self.deadline);
        exec.stdin = Stdio::null();
        exec.stdout = Stdio::from(o);
        exec.stderr = Stdio::from(e);
        if matches!(self.runtime, Runtime::Native { .. }) {
            exec.binds.clone_from(&self.pre_binds);
        }
        Ok(SandboxedExec {
            exec,
            logs: (out, err),
            status: cmd.status,
        })
    }

    /// Runs one command of `phase` in the sandbox (a step, the harness, an
    /// evaluator's command), with the plan's deadline; its output goes to
    /// `logs/<phase>-<index>.out|.err`.
    pub async fn run_command(
        &self,
        phase: Phase,
        index: usize,
        argv: &[String],
        env: &[(String, String)],
        stop: &CancellationToken,
    ) -> StepReport {
        let started = StdInstant::now();
        let name = format!("{phase:?}-{index}").to_lowercase();
        let what = argv.join(" ");
        let (end, logs) = match self.exec_for(argv, env, &name) {
            Err(e) => (
                StepEnd::Failed {
                    error: e.to_string(),
                },
                None,
            ),
            Ok(SandboxedExec { exec, logs, status }) => match self.session.exec(exec, stop).await {
                Ok(ExecEnd::Exited(s)) => {
                    let end = match status {
                        Some(mut pipe) => exited_in_bwrap(s, &mut pipe, &logs.1).await,
                        None => StepEnd::Exited { code: exit_code(s) },
                    };
                    (end, Some(logs))
                }
                Ok(ExecEnd::TimedOut) => (StepEnd::TimedOut, Some(logs)),
                Ok(ExecEnd::Stopped) => (StepEnd::Stopped, Some(logs)),
                Err(e) => (
                    StepEnd::Failed {
                        error: polar_io::chain(&e),
                    },
                    Some(logs),
                ),
            },
        };
        if let Runtime::Docker(d) = self.runtime {
            self.reap_leftovers(d).await;
        }
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(session = %self.session.id(), ?phase, index, ?end, elapsed_ms, "step finished");
        StepReport {
            phase,
            index,
            what,
            end,
            elapsed_ms,
            logs,
        }
    }

    /// Kills what the command that just ended left running in the
    /// container ([`super::leftovers`]), as the native runtime's per-command
    /// cgroup does; logged, never failing the step (a container that is
    /// gone has nothing left).
    async fn reap_leftovers(&self, d: &super::docker::Docker) {
        let session = self.session.id();
        let init = match d.init_pid().await {
            Ok(pid) => pid,
            Err(e) => {
                tracing::debug!(%session, error = %e, "no container to reap");
                return;
            }
        };
        match tokio::task::spawn_blocking(move || super::leftovers::reap(init)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => {
                tracing::info!(%session, killed = n, "killed what a command left running in its container");
            }
            Ok(Err(e)) => {
                tracing::warn!(%session, error = %e, "killing what a command left running in its container");
            }
            Err(e) => tracing::warn!(%session, error = %e, "the reaping task failed"),
        }
    }

    async fn run_step(
        &self,
        phase: Phase,
        index: usize,
        step: &Step,
        stop: &CancellationToken,
    ) -> StepReport {
        match step {
            Step::Run { argv } => self.run_command(phase, index, argv, &[], stop).await,
            Step::Upload { from, to, replace } => {
                let started = StdInstant::now();
                let end = if super::remaining(self.deadline).is_zero() {
                    StepEnd::TimedOut
                } else {
                    // As root, beneath the workspace the sandbox had: off
                    // the async workers.
                    let (from, to, replace) = (from.clone(), to.clone(), *replace);
                    let workspace = self.layout.workspace.clone();
                    let (user, session) = (self.layout.user, self.session.id().clone());
                    let done = tokio::task::spawn_blocking(move || {
                        upload(&from, &workspace, &to, replace, user, &session)
                    })
                    .await;
                    match done {
                        Ok(Ok(_)) => StepEnd::Exited { code: 0 },
                        Ok(Err(e)) => StepEnd::Failed {
                            error: e.to_string(),
                        },
                        Err(e) => StepEnd::Failed {
                            error: format!("the upload task failed: {e}"),
                        },
                    }
                };
                StepReport {
                    phase,
                    index,
                    what: format!("upload {} -> {}", from.display(), to.display()),
                    end,
                    elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(0),
                    logs: None,
                }
            }
        }
    }

    /// The report of a runtime command that was not run because its
    /// command line could not be built (`error`).
    pub fn refused(&self, phase: Phase, error: &dyn std::error::Error) -> StepReport {
        StepReport {
            phase,
            index: 0,
            what: format!("{phase:?}").to_lowercase(),
            end: StepEnd::Failed {
                error: polar_io::chain(error),
            },
            elapsed_ms: 0,
            logs: None,
        }
    }

    /// Runs a runtime's own command (`docker run`, `apptainer instance
    /// start`, their stop) in the session, not wrapped: the container
    /// runtimes' start and stop. `keep_running` leaves what it started
    /// running until the session ends; `as_user` drops to the sandbox user
    /// (rootless apptainer).
    pub async fn run_runtime_command(
        &self,
        phase: Phase,
        argv: Vec<std::ffi::OsString>,
        keep_running: bool,
        as_user: bool,
        stop: &CancellationToken,
    ) -> StepReport {
        let started = StdInstant::now();
        let what = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let name = format!("{phase:?}").to_lowercase();
        let result = match self.log_files(&name) {
            Err(e) => Err(e.to_string()),
            Ok((out, err, o, e)) => {
                let mut exec = Exec::new(argv);
                exec.env = self.runtime.client_env(self.layout);
                exec.clear_env = true;
                exec.user = as_user.then_some(self.layout.user);
                exec.cwd = Some(PathBuf::from("/"));
                exec.deadline = Some(self.deadline);
                exec.stdin = Stdio::null();
                exec.stdout = Stdio::from(o);
                exec.stderr = Stdio::from(e);
                exec.keep_running = keep_running;
                self.session
                    .exec(exec, stop)
                    .await
                    .map(|end| (end, (out, err)))
                    .map_err(|e| polar_io::chain(&e))
            }
        };
        let (end, logs) = match result {
            Ok((ExecEnd::Exited(s), logs)) => (StepEnd::Exited { code: exit_code(s) }, Some(logs)),
            Ok((ExecEnd::TimedOut, logs)) => (StepEnd::TimedOut, Some(logs)),
            Ok((ExecEnd::Stopped, logs)) => (StepEnd::Stopped, Some(logs)),
            Err(error) => (StepEnd::Failed { error }, None),
        };
        StepReport {
            phase,
            index: 0,
            what,
            end,
            elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(0),
            logs,
        }
    }

    fn skipped(phase: Phase, index: usize, what: String) -> StepReport {
        StepReport {
            phase,
            index,
            what,
            end: StepEnd::Skipped,
            elapsed_ms: 0,
            logs: None,
        }
    }

    /// The prepare steps, in order; a failed one skips the rest. Returns
    /// their reports and whether all succeeded.
    pub async fn prepare(&self, stop: &CancellationToken) -> (Vec<StepReport>, bool) {
        let mut reports = Vec::new();
        let mut ok = true;
        for (i, step) in self.spec.prepare.iter().enumerate() {
            if !ok || stop.is_cancelled() {
                reports.push(Self::skipped(Phase::Prepare, i, format!("{step:?}")));
                continue;
            }
            let r = self.run_step(Phase::Prepare, i, step, stop).await;
            ok &= r.end.ok();
            reports.push(r);
        }
        (reports, ok && !stop.is_cancelled())
    }

    /// The main command (skipped when `ready` is false).
    pub async fn main(
        &self,
        main: &MainCommand,
        ready: bool,
        stop: &CancellationToken,
    ) -> StepReport {
        if ready && !stop.is_cancelled() {
            self.run_command(Phase::Main, 0, &main.argv, &main.env, stop)
                .await
        } else {
            Self::skipped(Phase::Main, 0, main.argv.join(" "))
        }
    }

    /// The post-run steps, each whatever happened before. Their commands
    /// run isolated like an evaluator's: on this plan's layout (the
    /// evaluation's own HOME and tmp, [`super::eval`]) with `isolation`
    /// added to their variables; when the isolation could not be made
    /// (`Err`: why), they fail unrun.
    pub async fn post(
        &self,
        isolation: &Result<Vec<(String, String)>, String>,
        stop: &CancellationToken,
    ) -> Vec<StepReport> {
        let mut reports = Vec::new();
        for (i, step) in self.spec.post.iter().enumerate() {
            if stop.is_cancelled() {
                reports.push(Self::skipped(Phase::Post, i, format!("{step:?}")));
                continue;
            }
            let report = match (step, isolation) {
                (Step::Run { argv }, Ok(env)) => {
                    self.run_command(Phase::Post, i, argv, env, stop).await
                }
                (Step::Run { argv }, Err(error)) => StepReport {
                    phase: Phase::Post,
                    index: i,
                    what: argv.join(" "),
                    end: StepEnd::Failed {
                        error: format!("the step's isolation: {error}"),
                    },
                    elapsed_ms: 0,
                    logs: None,
                },
                (Step::Upload { .. }, _) => self.run_step(Phase::Post, i, step, stop).await,
            };
            reports.push(report);
        }
        reports
    }
}
