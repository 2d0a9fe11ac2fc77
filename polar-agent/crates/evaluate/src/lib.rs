//! Evaluators: how a rollout session is scored. The gateway builds an
//! [`Evaluator`] from the task's `evaluator` spec ([`Evaluator::from_spec`],
//! when the session is assigned: a bad spec fails the session at once with
//! an error naming the option), and calls [`Evaluator::evaluate`] in its
//! POSTRUN stage, after the harness ran, with the [`SessionFacts`] it knows
//! and a [`CommandRunner`] for the session's sandbox (or, when
//! [`Evaluator::needs_fresh_sandbox`], a fresh sandbox on the same
//! workspace). The result is an [`Evaluation`]: reward, usability, a detail
//! object for the trainer, and why it could not be evaluated.
//!
//! - this file: the interface and the dispatch over kinds;
//! - `options`: raw option parsing (unknown options rejected) and the checks
//!   shared by the command evaluators (argv, env, timeout, paths);
//! - `session`: `session_completed`; `command`: `command`;
//!   `test_output`: `test_output`; [`judge`]: `llm_judge`; [`composite`]:
//!   `composite`;
//! - [`parse`]: the test-output parsers (pure);
//! - [`output`]: a command's output as the evaluators read it (whole, or
//!   its start and end);
//! - `workspace`: reading and writing files of the workspace from the host
//!   without ever leaving it (openat2 `RESOLVE_BENEATH`);
//! - [`base`]: the commit the judge's diff is taken against, recorded
//!   before the harness runs;
//! - [`broken`]: why an evaluation could not be made and whose doing that
//!   is (the policy's: scored 0.0; the node's: no reward);
//! - [`isolation`]: the environment every evaluator command gets and the
//!   evaluators' `git`, which never reads the workspace's configuration.
//!
//! # Kinds and options
//!
//! Every option is checked by [`Evaluator::from_spec`]; an unknown option is
//! an error.
//!
//! `session_completed` (the default): reward `reward_success` when the
//! harness exited 0, did not time out, made at least `min_calls` model calls
//! and at most `max_failed_calls` failed ones; `reward_failure` otherwise.
//! - `min_calls` (integer, default 1);
//! - `max_failed_calls` (integer, default: no limit);
//! - `reward_success` (number, default 1.0), `reward_failure` (number,
//!   default 0.0).
//!
//! `command`: runs a command in the sandbox, with the workspace as its
//! working directory.
//! - `command` (required): a string (run with `sh -c`) or an array of
//!   strings (the argv);
//! - `timeout_secs` (integer 1 to 86400, default 300);
//! - `fresh` (bool, default false): run in a fresh sandbox on the same
//!   workspace instead of the session's;
//! - `env` (object of strings): extra variables;
//! - `tests`: the directory of the task's uploaded tests, which pytest is
//!   pinned to ([`isolation::pytest_addopts`]);
//! - `restore` (array of paths relative to the workspace, at most 64, none
//!   inside another or overlapping `tests`): put back before the
//!   evaluation's first command as they were before the harness ran (a
//!   path absent then is removed), by the gateway
//!   ([`Evaluator::restore_paths`]);
//! - `reward`: `"exit_status"` (default: 1.0 when the command exits 0, else
//!   0.0) or `"file"`: read from `reward_file` after the command ran;
//! - `reward_file` (only with `"file"`, default `.polar/reward`): a path
//!   relative to the workspace, without `..`. It is removed (in the sandbox)
//!   before the command runs, so a file the harness left is never read as
//!   the reward; the command sees its path in `POLAR_REWARD_FILE`. Its
//!   content is a number, or a JSON object `{"reward": x, ...}` whose other
//!   fields go to the detail's `file`. It is read from the host through
//!   `RESOLVE_BENEATH`: a symlink leading outside the workspace is refused.
//!
//! `test_output` (SWE-bench style): applies a test patch, runs the tests,
//! parses per-test outcomes and scores 1.0 iff every `fail_to_pass` and
//! `pass_to_pass` test passed ("resolved"), else 0.0.
//! - `test_patch` (a unified diff) or `test_patch_file` (a path relative to
//!   the workspace; the harness can see and change it, so prefer
//!   `test_patch`); optional: without either nothing is applied;
//! - `command` (required), `timeout_secs` (each step), `fresh`, `env`,
//!   `tests`, `restore`: as for `command`;
//! - `parser` (required): `pytest` (`pytest -rA` summary lines and `-v`
//!   progress lines), `unittest` (`python -m unittest -v`, Django's runner)
//!   or `regex` with `pass_regex` (required) and `fail_regex` (optional),
//!   each with a named group `name`, matched against every output line;
//! - `fail_to_pass`, `pass_to_pass` (arrays of test names, default empty):
//!   pytest node ids; for `unittest` any of `module.Class.test`,
//!   `test (module.Class)` or `test (module.Class.test)`. When both are
//!   empty the reward is 1.0 iff some test passed and none failed.
//!
//! A test counts as passed when it `PASSED` or `XFAIL`ed (as in SWE-bench);
//! a test listed but absent from the output counts as failed.
//!
//! `llm_judge`: a rubric scored by a judge model on one of the node's
//! backends, over the instruction, the workspace diff and the transcript
//! (see [`judge`]); the reward is the weighted mean of the criteria's
//! scores over 10, each criterion's score in the detail's `criteria`.
//! - `rubric` (required): an array of `{"name", "description", "weight"}`
//!   (weight above 0, default 1; names unique, 1 to 64 of letters, digits,
//!   `_`, `-`);
//! - `backend` (the node's `[[backend]]` by name; default its first),
//!   `model` (default the backend's served model), `seed` (default 0),
//!   `max_tokens` (16 to 32768, default 1024), `instructions` (more text
//!   for the judge);
//! - `diff_command` (string or argv, default [`judge::DEFAULT_DIFF_SCRIPT`]),
//!   `timeout_secs` (the diff command's), `max_diff_bytes` and
//!   `max_transcript_bytes` (256 to 1048576, default 32768: the diff's
//!   head, the transcript's tail).
//!
//! `composite`: `evaluators`, an array of `{"kind", "options", "weight"}`;
//! the reward is the weighted mean of the parts' (see [`composite`]).
//!
//! # What an evaluator command sees
//!
//! The runner gives every evaluation a HOME and a `/tmp` of its own, made
//! fresh for it (never the sandbox's, also with `fresh = true`), and an
//! environment built from an allowlist: the runtime's `PATH`, locale and
//! trust variables, the task's declared environment (the runtime spec's
//! and the evaluator's `env`), and [`isolation::env`] (no user site for
//! Python, its bytecode cache apart, `git` without system or global
//! configuration, hooks or fsmonitor). Nothing of the harness's
//! environment (`PYTHONSTARTUP`, `PYTHONPATH`, `NODE_OPTIONS`,
//! `LD_PRELOAD`, `BASH_ENV`, `GIT_*`...) reaches it. The evaluators' own
//! `git` (applying a test patch, the judge's diff) runs on a git directory
//! of the evaluator's own ([`isolation::GIT_PRELUDE`]).
//!
//! # Usable samples
//!
//! A sample is usable (counts as completed) when the harness ran to its end
//! (exit code known, no timeout) and the evaluator produced a reward. The
//! reward of a session that did not run to its end is still computed and
//! reported. Outcomes that are the model's doing are scored, not errors: a
//! failing command or test scores 0.0; an evaluation command that times out
//! scores 0.0 (with `error` saying so: the model's code hung); a test patch
//! that does not apply scores 0.0 (the model's changes conflict with it);
//! test output without a single recognized test scores 0.0 (the model broke
//! the test run); an evaluation that what the sandbox left made impossible
//! scores 0.0, with the cause in `error` and in the detail's `broken`
//! ([`broken::Broken`]: a results directory the evaluator cannot write, a
//! quota with no bytes or inodes left, a file where a directory is
//! expected, a test patch file gone or unreadable, a path leading out of
//! the workspace). Outcomes that are the node's give no reward and an
//! unusable sample: the runner could not run a command, a tool is missing
//! in the sandbox (exit 126/127), the reward file the task's command should
//! have written is missing or garbled.
//!
//! Layering: above `polar-spec` (the evaluator spec it checks); no Polar
//! crate with sandboxes or the proxy: commands run through the
//! [`CommandRunner`] the caller gives. Tests: `tests/` (each kind, option
//! validation, host commands) and `parse_tests`.
#![forbid(unsafe_code)]

pub mod base;
pub mod broken;
mod command;
pub mod composite;
pub mod isolation;
pub mod judge;
mod options;
pub mod output;
mod parse;
mod session;
mod test_output;
mod workspace;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

pub use base::DiffBase;
pub use broken::{Broken, Side};
pub use command::{CommandEvaluator, RewardSource};
pub use composite::Composite;
pub use judge::{Judge, JudgeCall, JudgeFuture, JudgeInputs, JudgeReply, LlmJudge};
pub use parse::{Parser, TestOutcomes, TestStatus};
pub use session::SessionCompleted;
pub use test_output::TestOutput;
pub use workspace::WorkspaceError;

use polar_spec::EvaluatorSpec;

/// What the gateway knows about the session when it evaluates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionFacts {
    /// The harness's exit code; `None` if it did not run or was killed.
    pub harness_exit: Option<i32>,
    /// The session's budget or the agent's timeout ran out.
    pub timed_out: bool,
    /// Model calls captured.
    pub calls: u64,
    /// Captured calls that failed (backend error).
    pub failed_calls: u64,
    /// The workspace directory on the host.
    pub workspace: PathBuf,
    /// What the judge's diff compares the workspace with, recorded before
    /// the harness ran ([`base`]).
    pub base: DiffBase,
}

impl SessionFacts {
    /// Whether the harness ran to its end: its exit code is known and the
    /// session did not time out.
    pub fn ran_to_end(&self) -> bool {
        self.harness_exit.is_some() && !self.timed_out
    }
}

/// What a command run by a [`CommandRunner`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandOutput {
    /// The exit code; `None` when the command did not exit by itself (killed
    /// at the timeout).
    pub exit: Option<i32>,
    /// Standard output (lossy UTF-8): whole, or its start and end when it
    /// was over [`output::MAX_STREAM_BYTES`] ([`CommandOutput::read`]).
    pub stdout: String,
    /// Standard error, likewise.
    pub stderr: String,
    /// How long standard output was, in bytes.
    pub stdout_bytes: u64,
    /// How long standard error was, in bytes.
    pub stderr_bytes: u64,
}

/// Why a [`CommandRunner`] could not run a command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RunError {
    /// What went wrong.
    pub message: String,
    /// Its cause, which decides whose doing it is ([`Broken::Runner`] when
    /// nothing the sandbox left explains it).
    pub cause: Broken,
}

impl RunError {
    /// The runtime could not run the command: the node's.
    pub fn runner(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            cause: Broken::Runner,
        }
    }
}

/// The future a [`CommandRunner`] returns.
pub type RunFuture<'a> = Pin<Box<dyn Future<Output = Result<CommandOutput, RunError>> + Send + 'a>>;

/// Runs a command in a sandbox (the session's own, or a fresh one on the
/// same workspace), with the workspace as its working directory, HOME and
/// `/tmp` of the evaluation's own, an environment built from an allowlist
/// with the given variables added (see "What an evaluator command sees" in
/// the crate doc), and stdin empty. The command and all it started are
/// killed at `timeout` (then `exit` is `None`). `Err` means the command
/// could not be run at all, and says why and whose doing that is.
pub trait CommandRunner: Send + Sync {
    /// Runs `argv` (`argv[0]` looked up in `PATH`).
    fn run<'a>(
        &'a self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        timeout: Duration,
    ) -> RunFuture<'a>;
}

/// The outcome of an evaluation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evaluation {
    /// The reward; `None` when the session could not be evaluated.
    pub reward: Option<f64>,
    /// Whether the sample counts as completed (see the module doc).
    pub usable: bool,
    /// Evaluator-specific, returned to the trainer (per-test results...).
    pub detail: Value,
    /// Why the session could not be evaluated, or why it scored as it did
    /// without evidence (a timeout, a patch that does not apply).
    pub error: Option<String>,
    /// The rewards of the traces of some chain roles (`main`, `sub_agent`,
    /// `side`), when the evaluator scored them apart (a reward file's
    /// `trace_rewards`); the traces of the other roles get `reward`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub role_rewards: BTreeMap<String, f64>,
}

/// The chain roles a trace reward may name (the export's `chain_role`).
pub const CHAIN_ROLES: [&str; 3] = ["main", "sub_agent", "side"];

impl Evaluation {
    /// A reward; usable when the harness ran to its end.
    fn scored(facts: &SessionFacts, reward: f64, detail: Value) -> Self {
        Self {
            reward: Some(reward),
            usable: facts.ran_to_end(),
            detail,
            error: None,
            role_rewards: BTreeMap::new(),
        }
    }

    /// A reward given without the evidence asked for (a timeout, a patch
    /// that does not apply), with why.
    fn scored_with(facts: &SessionFacts, reward: f64, detail: Value, error: String) -> Self {
        Self {
            error: Some(error),
            ..Self::scored(facts, reward, detail)
        }
    }

    /// An evaluation `cause` made impossible: scored 0.0 when the sandbox's
    /// leftovers explain it (usable when the harness ran to its end), else
    /// no reward; the cause in the detail's `broken` either way.
    pub fn broken(facts: &SessionFacts, cause: Broken, error: String, detail: Value) -> Self {
        let mut detail = match detail {
            Value::Object(m) => m,
            Value::Null => serde_json::Map::new(),
            other => serde_json::Map::from_iter([("detail".to_owned(), other)]),
        };
        detail.insert(
            "broken".to_owned(),
            serde_json::json!({"cause": cause, "side": cause.side(), "error": error}),
        );
        match cause.side() {
            Side::Policy => Self::scored_with(
                facts,
                0.0,
                Value::Object(detail),
                format!(
                    "{error}; scored 0.0: what the sandbox left made the evaluation impossible ({})",
                    cause.as_str()
                ),
            ),
            Side::Node => Self::failed(error, Value::Object(detail)),
        }
    }

    /// A command the runner could not run: [`Evaluation::broken`] with its
    /// cause ([`broken::confirmed`]), the error prefixed with `what`.
    pub async fn not_run(facts: &SessionFacts, what: &str, e: RunError, detail: Value) -> Self {
        let cause = broken::confirmed(&facts.workspace, e.cause).await;
        Self::broken(facts, cause, format!("{what}: {}", e.message), detail)
    }

    /// No reward: the session could not be evaluated.
    pub fn failed(error: String, detail: Value) -> Self {
        Self {
            reward: None,
            usable: false,
            detail,
            error: Some(error),
            role_rewards: BTreeMap::new(),
        }
    }
}

/// Why an evaluator spec is not acceptable. The message names the field
/// (`evaluator.kind`, `evaluator.options.command`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// No evaluator of that kind.
    #[error(
        "evaluator.kind: unknown evaluator {0:?}; one of: session_completed, command, \
         test_output, llm_judge, composite"
    )]
    UnknownKind(String),
    /// An option is missing, unknown or invalid.
    #[error("evaluator.options.{option}: {reason}")]
    Option {
        /// The option (`command`, `env.FOO`, `options` for the object).
        option: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl EvalError {
    /// The request field at fault, as in the rollout API's error bodies.
    pub fn field(&self) -> String {
        match self {
            Self::UnknownKind(_) => "evaluator.kind".to_owned(),
            Self::Option { option, .. } => format!("evaluator.options.{option}"),
        }
    }

    /// What is wrong, without the field ([`EvalError::field`]) the
    /// message starts with: for callers that name the field themselves.
    pub fn reason(&self) -> String {
        let text = self.to_string();
        let prefix = format!("{}: ", self.field());
        text.strip_prefix(&prefix)
            .map_or_else(|| text.clone(), str::to_owned)
    }

    fn option(option: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Option {
            option: option.into(),
            reason: reason.into(),
        }
    }
}

/// A validated evaluator.
#[derive(Clone, Debug)]
pub enum Evaluator {
    /// `session_completed`.
    SessionCompleted(SessionCompleted),
    /// `command`.
    Command(CommandEvaluator),
    /// `test_output`.
    TestOutput(TestOutput),
    /// `llm_judge`.
    LlmJudge(LlmJudge),
    /// `composite`.
    Composite(Composite),
}

impl Evaluator {
    /// Parses and checks a spec from the rollout API.
    pub fn from_spec(spec: &EvaluatorSpec) -> Result<Self, EvalError> {
        match spec.kind.as_str() {
            "session_completed" => {
                SessionCompleted::from_options(&spec.options).map(Self::SessionCompleted)
            }
            "command" => CommandEvaluator::from_options(&spec.options).map(Self::Command),
            "test_output" => TestOutput::from_options(&spec.options).map(Self::TestOutput),
            "llm_judge" => LlmJudge::from_options(&spec.options).map(Self::LlmJudge),
            "composite" => Composite::from_options(&spec.options).map(Self::Composite),
            other => Err(EvalError::UnknownKind(other.to_owned())),
        }
    }

    /// The kind, as in the spec.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::SessionCompleted(_) => "session_completed",
            Self::Command(_) => "command",
            Self::TestOutput(_) => "test_output",
            Self::LlmJudge(_) => "llm_judge",
            Self::Composite(_) => "composite",
        }
    }

    /// Whether the commands must run in a fresh sandbox on the session's
    /// workspace rather than in the session's own.
    pub fn needs_fresh_sandbox(&self) -> bool {
        match self {
            Self::SessionCompleted(_) => false,
            Self::Command(c) => c.run.fresh,
            Self::TestOutput(t) => t.run.fresh,
            Self::LlmJudge(_) => false,
            Self::Composite(c) => c.fresh(),
        }
    }

    /// Whether evaluating runs commands at all (`session_completed` does
    /// not: the gateway need not keep a sandbox for it).
    pub fn runs_commands(&self) -> bool {
        match self {
            Self::SessionCompleted(_) => false,
            Self::Composite(c) => c.runs_commands(),
            _ => true,
        }
    }

    /// The workspace paths its commands want put back, before the
    /// evaluation's first command, as they were before the harness ran
    /// (`restore`; a composite's parts' together): sorted, none inside
    /// another. The gateway keeps them before the harness and puts them
    /// back (`polar_sandbox::runtime::restore`).
    pub fn restore_paths(&self) -> Vec<std::path::PathBuf> {
        let mut paths = match self {
            Self::SessionCompleted(_) | Self::LlmJudge(_) => Vec::new(),
            Self::Command(c) => c.run.restore.clone(),
            Self::TestOutput(t) => t.run.restore.clone(),
            Self::Composite(c) => c
                .parts
                .iter()
                .flat_map(|(e, _)| e.restore_paths())
                .collect(),
        };
        paths.sort();
        // Parts may list the same path, or one inside another's.
        paths.dedup_by(|later, earlier| later.starts_with(&*earlier));
        paths
    }

    /// Whether it calls a judge model ([`Evaluator::evaluate_with`] needs
    /// [`JudgeInputs`]).
    pub fn needs_judge(&self) -> bool {
        match self {
            Self::LlmJudge(_) => true,
            Self::Composite(c) => c.parts.iter().any(|(e, _)| e.needs_judge()),
            _ => false,
        }
    }

    /// Scores the session. Never fails: what went wrong is in
    /// [`Evaluation::error`].
    pub async fn evaluate(&self, facts: &SessionFacts, runner: &dyn CommandRunner) -> Evaluation {
        self.evaluate_with(facts, runner, None).await
    }

    /// [`Evaluator::evaluate`] with a judge model and what it reads (an
    /// `llm_judge` without them gives no reward).
    ///
    /// The evaluators read what the policy left (test output, reward
    /// files, a judge's answer its work may steer): a panic one of them
    /// hits (a bug) ends this evaluation as failed, with no reward and an
    /// unusable sample, rather than unwinding through the caller, whose
    /// session still has a sandbox to tear down and a result to report.
    pub async fn evaluate_with(
        &self,
        facts: &SessionFacts,
        runner: &dyn CommandRunner,
        judge: Option<&JudgeInputs<'_>>,
    ) -> Evaluation {
        let scored = async {
            match self {
                Self::SessionCompleted(s) => s.evaluate(facts),
                Self::Command(c) => c.evaluate(facts, runner).await,
                Self::TestOutput(t) => t.evaluate(facts, runner).await,
                Self::LlmJudge(j) => j.evaluate(facts, runner, judge).await,
                Self::Composite(c) => c.evaluate(facts, runner, judge).await,
            }
        };
        match polar_io::tasks::caught(scored).await {
            Ok(evaluation) => evaluation,
            Err(why) => Evaluation::broken(
                facts,
                Broken::Bug,
                format!("{}: the evaluator panicked (a bug): {why}", self.kind()),
                Value::Object(serde_json::Map::new()),
            ),
        }
    }
}
