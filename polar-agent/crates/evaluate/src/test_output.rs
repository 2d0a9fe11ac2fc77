//! The `test_output` evaluator (SWE-bench style): applies the test patch in
//! the sandbox, runs the test command, parses per-test outcomes and scores
//! 1.0 iff every `fail_to_pass` and `pass_to_pass` test passed.
//!
//! The patch is written by the host as a new file at the top of the
//! workspace (created exclusively, never through a symlink), applied in the
//! sandbox (`git apply -v` when the workspace has a `.git`, on a git
//! directory of the evaluator's own so that nothing the workspace's git
//! configuration or attributes name runs: [`crate::isolation`]; else
//! `patch --batch --forward -p1`; through `sh` so that a missing tool is
//! exit 127 on every runtime) so the patched files get the sandbox's owner,
//! and removed again. A patch that cannot be written or read because of
//! what the sandbox left (a full quota, a test patch file gone) is the
//! policy's ([`crate::broken`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::command::{OUTPUT_TAIL, exit_text, output_detail};
use super::options::{RawRun, RunOptions, parse_raw, relative_path, tail};
use super::parse::{Parser, TestOutcomes, TestStatus};
use super::workspace;
use super::{Broken, CommandRunner, EvalError, Evaluation, SessionFacts, broken};

/// The largest test patch file read.
const MAX_PATCH_FILE: u64 = 16 << 20;
/// The most per-test outcomes listed in the detail's `tests`.
const MAX_LISTED_TESTS: usize = 1000;
/// The compiled size limit of `pass_regex` / `fail_regex`.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// `test_output`'s options, as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    test_patch: Option<String>,
    #[serde(default)]
    test_patch_file: Option<String>,
    #[serde(default)]
    command: Option<Value>,
    #[serde(default)]
    parser: Option<String>,
    #[serde(default)]
    pass_regex: Option<String>,
    #[serde(default)]
    fail_regex: Option<String>,
    #[serde(default)]
    fail_to_pass: Vec<String>,
    #[serde(default)]
    pass_to_pass: Vec<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
    #[serde(default)]
    fresh: Option<bool>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    tests: Option<String>,
    #[serde(default)]
    restore: Option<Vec<String>>,
}

/// Where the test patch comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatchSource {
    /// Given in the options.
    Inline(String),
    /// A file of the workspace.
    File(PathBuf),
}

/// A test name as given, and as the parser names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestName {
    /// As in the options (the detail's key).
    pub given: String,
    /// As the parser reports it.
    pub canonical: String,
}

/// Applies a test patch, runs tests, scores "resolved".
#[derive(Clone, Debug)]
pub struct TestOutput {
    /// The test command, its timeout (each step), sandbox and variables.
    pub run: RunOptions,
    /// The test patch, if any.
    pub patch: Option<PatchSource>,
    /// How the output is read.
    pub parser: Parser,
    /// Tests that must pass (failing before the change).
    pub fail_to_pass: Vec<TestName>,
    /// Tests that must still pass.
    pub pass_to_pass: Vec<TestName>,
}

/// How applying the patch went.
enum Applied {
    /// Applied with this tool.
    Yes(&'static str),
    /// The tool ran and refused the patch.
    Conflict {
        tool: &'static str,
        detail: Value,
        message: String,
    },
}

impl TestOutput {
    /// Checks the options.
    pub(super) fn from_options(options: &Map<String, Value>) -> Result<Self, EvalError> {
        let raw: Raw = parse_raw(options)?;
        let patch = match (raw.test_patch, raw.test_patch_file) {
            (Some(_), Some(_)) => {
                return Err(EvalError::option(
                    "test_patch_file",
                    "give test_patch or test_patch_file, not both",
                ));
            }
            (Some(diff), None) => Some(PatchSource::Inline(check_diff(diff)?)),
            (None, Some(file)) => Some(PatchSource::File(relative_path("test_patch_file", &file)?)),
            (None, None) => None,
        };
        let parser = parser(raw.parser.as_deref(), raw.pass_regex, raw.fail_regex)?;
        let names = |option: &str, given: Vec<String>| {
            given
                .into_iter()
                .enumerate()
                .map(|(i, name)| {
                    if name.trim().is_empty() {
                        return Err(EvalError::option(
                            format!("{option}[{i}]"),
                            "empty test name",
                        ));
                    }
                    let canonical = parser.canonical_name(&name);
                    Ok(TestName {
                        given: name,
                        canonical,
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let fail_to_pass = names("fail_to_pass", raw.fail_to_pass)?;
        let pass_to_pass = names("pass_to_pass", raw.pass_to_pass)?;
        let run = RunOptions::check(
            RawRun {
                command: raw.command,
                timeout_secs: raw.timeout_secs,
                fresh: raw.fresh,
                env: raw.env,
                tests: raw.tests,
                restore: raw.restore,
            },
            &[],
        )?;
        Ok(Self {
            run,
            patch,
            parser,
            fail_to_pass,
            pass_to_pass,
        })
    }

    /// Applies the patch, runs the tests, scores them.
    pub(super) async fn evaluate(
        &self,
        facts: &SessionFacts,
        runner: &dyn CommandRunner,
    ) -> Evaluation {
        let mut detail = json!({"parser": self.parser.name()});
        if let Some(source) = &self.patch {
            match self.apply(facts, runner, source).await {
                Ok(Applied::Yes(tool)) => detail["patch"] = json!({"tool": tool, "applied": true}),
                Ok(Applied::Conflict {
                    tool,
                    detail: d,
                    message,
                }) => {
                    detail["patch"] = d;
                    let error = format!("the test patch does not apply ({tool}): {message}");
                    return Evaluation::scored_with(facts, 0.0, detail, error);
                }
                Err((cause, error)) => {
                    let cause = broken::confirmed(&facts.workspace, cause).await;
                    return Evaluation::broken(facts, cause, error, detail);
                }
            }
        }
        let output = match runner
            .run(
                self.run.argv.clone(),
                self.run.env_for(&facts.workspace).await,
                self.run.timeout,
            )
            .await
        {
            Ok(output) => output,
            Err(e) => {
                return Evaluation::not_run(facts, "running the test command", e, detail).await;
            }
        };
        detail["command"] = output_detail(&output);
        if output.cut() {
            let error = format!(
                "the test command's output ({} bytes of stdout, {} of stderr) is over the {} bytes a stream the evaluator reads: verdicts may be in what was left out",
                output.stdout_bytes,
                output.stderr_bytes,
                crate::output::MAX_STREAM_BYTES
            );
            return Evaluation::broken(facts, Broken::TooMuchOutput, error, detail);
        }
        let outcomes = self
            .parser
            .parse(&format!("{}\n{}", output.stdout, output.stderr));
        let resolved = self.resolve(&outcomes, &mut detail);
        if output.exit.is_none() {
            let error = format!(
                "the test command timed out after {} s; scored 0.0",
                self.run.timeout.as_secs()
            );
            return Evaluation::scored_with(facts, 0.0, detail, error);
        }
        if outcomes.is_empty() {
            let error = format!(
                "no test results found in the test command's output ({} parser, {}); scored 0.0",
                self.parser.name(),
                exit_text(output.exit)
            );
            return Evaluation::scored_with(facts, 0.0, detail, error);
        }
        Evaluation::scored(facts, if resolved { 1.0 } else { 0.0 }, detail)
    }

    /// Writes the patch into the workspace, applies it in the sandbox,
    /// removes it. `Err` is a failure to apply it at all, with its cause.
    async fn apply(
        &self,
        facts: &SessionFacts,
        runner: &dyn CommandRunner,
        source: &PatchSource,
    ) -> Result<Applied, (Broken, String)> {
        let name = format!(".polar-test-patch-{:016x}.diff", rand::random::<u64>());
        let ws = facts.workspace.clone();
        let (file, source) = (name.clone(), source.clone());
        let is_git = workspace::blocking(move || {
            let bytes = match source {
                PatchSource::Inline(diff) => diff.into_bytes(),
                PatchSource::File(path) => workspace::read(&ws, &path, MAX_PATCH_FILE)?,
            };
            workspace::create(&ws, &file, &bytes)?;
            Ok(std::fs::symlink_metadata(ws.join(".git")).is_ok())
        })
        .await
        .map_err(|(cause, e)| (cause, format!("preparing the test patch: {e}")))?;
        let (tool, program) = if is_git {
            ("git apply", "git")
        } else {
            ("patch", "patch")
        };
        let argv = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            APPLY_SCRIPT.to_owned(),
            "sh".to_owned(),
            name.clone(),
            program.to_owned(),
        ];
        let result = runner
            .run(argv, self.run.env.clone(), self.run.timeout)
            .await;
        let ws = facts.workspace.clone();
        if let Err((_, e)) = workspace::blocking(move || workspace::remove(&ws, &name)).await {
            tracing::warn!(error = %e, "removing the test patch from the workspace");
        }
        let output = result.map_err(|e| {
            let m = format!("applying the test patch with {tool}: {e}");
            (e.cause, m)
        })?;
        let stderr = output.stderr.trim();
        match output.exit {
            Some(0) => Ok(Applied::Yes(tool)),
            exit @ (Some(125..=127) | None) => {
                let cause = match exit {
                    Some(125) => Broken::of_message(stderr).unwrap_or(Broken::NodeIo),
                    Some(_) => Broken::ToolMissing,
                    None => Broken::NodeIo,
                };
                Err((
                    cause,
                    format!(
                        "applying the test patch: {tool} could not be run ({}): {}",
                        exit_text(exit),
                        tail(stderr, OUTPUT_TAIL)
                    ),
                ))
            }
            Some(_) => {
                let text = if stderr.is_empty() {
                    output.stdout.trim()
                } else {
                    stderr
                };
                let message = text
                    .lines()
                    .find(|l| {
                        l.starts_with("error:") || l.contains("FAILED") || l.contains("failed")
                    })
                    .or_else(|| text.lines().next())
                    .unwrap_or("no output")
                    .to_owned();
                let mut detail = output_detail(&output);
                detail["tool"] = json!(tool);
                detail["applied"] = json!(false);
                Ok(Applied::Conflict {
                    tool,
                    detail,
                    message,
                })
            }
        }
    }

    /// Fills the detail with per-test results and counts; whether the
    /// change is resolved.
    fn resolve(&self, outcomes: &TestOutcomes, detail: &mut Value) -> bool {
        let mut missing = Vec::new();
        let mut list = |tests: &[TestName]| {
            let mut statuses = Map::new();
            let mut passed = 0usize;
            for t in tests {
                let status = match outcomes.get(&t.canonical) {
                    Some(s) => {
                        passed += usize::from(s.is_success());
                        s.as_str()
                    }
                    None => {
                        missing.push(t.given.clone());
                        "missing"
                    }
                };
                statuses.insert(t.given.clone(), json!(status));
            }
            (statuses, passed, passed == tests.len())
        };
        let (f2p, f2p_passed, f2p_ok) = list(&self.fail_to_pass);
        let (p2p, p2p_passed, p2p_ok) = list(&self.pass_to_pass);
        let resolved = if self.fail_to_pass.is_empty() && self.pass_to_pass.is_empty() {
            outcomes.values().any(|s| s.is_success()) && !outcomes.values().any(|s| s.is_failure())
        } else {
            f2p_ok && p2p_ok
        };
        let mut counts = Map::new();
        for status in TestStatus::ALL {
            let n = outcomes.values().filter(|s| **s == status).count();
            counts.insert(status.as_str().to_owned(), json!(n));
        }
        counts.insert("total".to_owned(), json!(outcomes.len()));
        counts.insert(
            "fail_to_pass".to_owned(),
            json!({"passed": f2p_passed, "total": self.fail_to_pass.len()}),
        );
        counts.insert(
            "pass_to_pass".to_owned(),
            json!({"passed": p2p_passed, "total": self.pass_to_pass.len()}),
        );
        let tests: Map<String, Value> = outcomes
            .iter()
            .take(MAX_LISTED_TESTS)
            .map(|(name, s)| (name.clone(), json!(s.as_str())))
            .collect();
        detail["resolved"] = json!(resolved);
        detail["fail_to_pass"] = Value::Object(f2p);
        detail["pass_to_pass"] = Value::Object(p2p);
        detail["missing"] = json!(missing);
        detail["counts"] = Value::Object(counts);
        detail["tests"] = Value::Object(tests);
        detail["tests_truncated"] = json!(outcomes.len() > MAX_LISTED_TESTS);
        resolved
    }
}

/// Applies the patch `$1` with `$2` (`git` or `patch`). A missing tool is
/// exit 127 whatever the runtime does with a failed exec (bwrap exits 1,
/// like a conflict); an evaluator's git directory that cannot be made (its
/// tmp full) is exit 125.
const APPLY_SCRIPT: &str = concat!(
    crate::isolation::git_prelude!(),
    r#"command -v "$2" >/dev/null 2>&1 || { echo "$2: not found in the sandbox" >&2; exit 127; }
if [ "$2" = git ]; then
  polar_git_setup
  [ $? -le 1 ] || { echo "making the evaluator's git directory in ${TMPDIR:-/tmp} failed" >&2; exit 125; }
  exec git -c core.hooksPath=/dev/null -c core.fsmonitor=false --no-pager apply -v "$1"
fi
exec patch --batch --forward -p1 -i "$1""#
);

/// A test patch must look like a unified diff.
fn check_diff(diff: String) -> Result<String, EvalError> {
    if diff.trim().is_empty() {
        return Err(EvalError::option("test_patch", "must not be empty"));
    }
    if !diff
        .lines()
        .any(|l| l.starts_with("+++ ") || l.starts_with("diff --git "))
    {
        return Err(EvalError::option(
            "test_patch",
            "not a unified diff (no `+++ ` or `diff --git` line)",
        ));
    }
    Ok(diff)
}

fn parser(
    name: Option<&str>,
    pass_regex: Option<String>,
    fail_regex: Option<String>,
) -> Result<Parser, EvalError> {
    let name =
        name.ok_or_else(|| EvalError::option("parser", "required: pytest, unittest or regex"))?;
    if name != "regex" {
        for (option, given) in [("pass_regex", &pass_regex), ("fail_regex", &fail_regex)] {
            if given.is_some() {
                return Err(EvalError::option(
                    option,
                    "only used with parser = \"regex\"",
                ));
            }
        }
    }
    match name {
        "pytest" => Ok(Parser::Pytest),
        "unittest" => Ok(Parser::Unittest),
        "regex" => {
            let pass = pass_regex.ok_or_else(|| {
                EvalError::option("pass_regex", "required with parser = \"regex\"")
            })?;
            Ok(Parser::Regex {
                pass: compile("pass_regex", &pass)?,
                fail: fail_regex.map(|f| compile("fail_regex", &f)).transpose()?,
            })
        }
        other => Err(EvalError::option(
            "parser",
            format!("unknown parser {other:?}; one of: pytest, unittest, regex"),
        )),
    }
}

fn compile(option: &str, pattern: &str) -> Result<Regex, EvalError> {
    let re = RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| EvalError::option(option, format!("invalid regex: {e}")))?;
    if !re.capture_names().any(|n| n == Some("name")) {
        return Err(EvalError::option(
            option,
            "needs a named group `name`, as in (?P<name>\\S+)",
        ));
    }
    Ok(re)
}
