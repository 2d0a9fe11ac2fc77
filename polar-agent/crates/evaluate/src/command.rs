//! The `command` evaluator: runs a command in the sandbox and takes the
//! reward from its exit status or from a reward file it writes. Also the
//! step helpers shared with `test_output` (running a command, its detail).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::options::{RawRun, RunOptions, parse_raw, relative_path, tail};
use super::workspace;
use super::{
    Broken, CHAIN_ROLES, CommandOutput, CommandRunner, EvalError, Evaluation, SessionFacts, broken,
};

/// The reward file when `reward = "file"` names none.
pub const DEFAULT_REWARD_FILE: &str = ".polar/reward";
/// The variable that tells the command where to write the reward.
pub const REWARD_FILE_VAR: &str = "POLAR_REWARD_FILE";
/// The largest reward file read.
const MAX_REWARD_FILE: u64 = 64 * 1024;
/// How much of a command's stdout and stderr goes to the detail.
pub(super) const OUTPUT_TAIL: usize = 2000;

/// `command`'s options, as given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    command: Option<Value>,
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
    #[serde(default)]
    reward: Option<String>,
    #[serde(default)]
    reward_file: Option<String>,
}

/// Where the reward comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RewardSource {
    /// 1.0 when the command exits 0, else 0.0.
    ExitStatus,
    /// A file the command writes (relative to the workspace).
    File(PathBuf),
}

/// Runs a command; the reward from its exit status or a reward file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandEvaluator {
    /// The command, its timeout, sandbox and variables.
    pub run: RunOptions,
    /// Where the reward comes from.
    pub reward: RewardSource,
}

impl CommandEvaluator {
    /// Checks the options.
    pub(super) fn from_options(options: &Map<String, Value>) -> Result<Self, EvalError> {
        let raw: Raw = parse_raw(options)?;
        let reward = match (raw.reward.as_deref(), raw.reward_file) {
            (None | Some("exit_status"), None) => RewardSource::ExitStatus,
            (None | Some("exit_status"), Some(_)) => {
                return Err(EvalError::option(
                    "reward_file",
                    "only used with reward = \"file\"",
                ));
            }
            (Some("file"), file) => RewardSource::File(relative_path(
                "reward_file",
                file.as_deref().unwrap_or(DEFAULT_REWARD_FILE),
            )?),
            (Some(other), _) => {
                return Err(EvalError::option(
                    "reward",
                    format!("unknown reward source {other:?}; one of: exit_status, file"),
                ));
            }
        };
        let run = RunOptions::check(
            RawRun {
                command: raw.command,
                timeout_secs: raw.timeout_secs,
                fresh: raw.fresh,
                env: raw.env,
                tests: raw.tests,
                restore: raw.restore,
            },
            &[REWARD_FILE_VAR],
        )?;
        Ok(Self { run, reward })
    }

    /// Runs the command and scores it.
    pub(super) async fn evaluate(
        &self,
        facts: &SessionFacts,
        runner: &dyn CommandRunner,
    ) -> Evaluation {
        let mut env = self.run.env_for(&facts.workspace).await;
        if let RewardSource::File(path) = &self.reward {
            if let Err((cause, error)) = self.clear_reward_file(path, runner).await {
                let cause = broken::confirmed(&facts.workspace, cause).await;
                return Evaluation::broken(facts, cause, error, json!({"reward_source": "file"}));
            }
            env.push((REWARD_FILE_VAR.to_owned(), path.display().to_string()));
        }
        let output = match runner
            .run(self.run.argv.clone(), env, self.run.timeout)
            .await
        {
            Ok(output) => output,
            Err(e) => {
                return Evaluation::not_run(facts, "running the command", e, json!({})).await;
            }
        };
        let mut detail = output_detail(&output);
        let source = match &self.reward {
            RewardSource::ExitStatus => "exit_status",
            RewardSource::File(_) => "file",
        };
        detail["reward_source"] = json!(source);
        let Some(code) = output.exit else {
            let error = format!(
                "the command timed out after {} s; scored 0.0",
                self.run.timeout.as_secs()
            );
            return Evaluation::scored_with(facts, 0.0, detail, error);
        };
        let path = match &self.reward {
            RewardSource::ExitStatus => {
                let reward = if code == 0 { 1.0 } else { 0.0 };
                return Evaluation::scored(facts, reward, detail);
            }
            RewardSource::File(path) => path.clone(),
        };
        let workspace = facts.workspace.clone();
        let read =
            workspace::blocking(move || workspace::read(&workspace, &path, MAX_REWARD_FILE)).await;
        // Missing or garbled: the task's command did not write it, unless
        // what the sandbox left stopped it: the session's quota is full.
        let full = broken::confirmed(&facts.workspace, Broken::NoSpace).await == Broken::NoSpace;
        let unwritten = |error: String, detail: Value| {
            if full {
                Evaluation::broken(facts, Broken::NoSpace, error, detail)
            } else {
                Evaluation::failed(error, detail)
            }
        };
        let bytes = match read {
            Ok(bytes) => bytes,
            Err((Broken::Unreadable, e)) => {
                return unwritten(
                    format!("reward file {e} (the command exited with {code})"),
                    detail,
                );
            }
            Err((cause, e)) => {
                let cause = broken::confirmed(&facts.workspace, cause).await;
                return Evaluation::broken(
                    facts,
                    cause,
                    format!("reward file {e} (the command exited with {code})"),
                    detail,
                );
            }
        };
        match parse_reward(&bytes) {
            Ok(file) => {
                detail["file"] = Value::Object(file.fields);
                Evaluation {
                    role_rewards: file.roles,
                    ..Evaluation::scored(facts, file.reward, detail)
                }
            }
            Err(e) => unwritten(
                format!("reward file {e} (the command exited with {code})"),
                detail,
            ),
        }
    }

    /// Removes a reward file the harness may have left and creates its
    /// directory, in the sandbox (so symlinks resolve as the sandbox sees
    /// them, never on the host), and checks that the command can write
    /// there. `Err` has the cause: what the sandbox left in the way (a
    /// directory where the file goes, a file where its directory goes, a
    /// directory the command cannot write, a full quota) is the policy's.
    async fn clear_reward_file(
        &self,
        path: &std::path::Path,
        runner: &dyn CommandRunner,
    ) -> Result<(), (Broken, String)> {
        let argv = [
            "sh",
            "-c",
            r#"d=$(dirname -- "$1") && rm -f -- "$1" && mkdir -p -- "$d" || exit 1
[ -d "$d" ] && [ -w "$d" ] && [ -x "$d" ] || { echo "$d: Permission denied (the reward file's directory)" >&2; exit 1; }"#,
            "sh",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([path.display().to_string()])
        .collect();
        let output = runner
            .run(argv, Vec::new(), self.run.timeout)
            .await
            .map_err(|e| {
                let m = format!("clearing the reward file {}: {e}", path.display());
                (e.cause, m)
            })?;
        let cause = match output.exit {
            Some(0) => return Ok(()),
            Some(126 | 127) => Broken::ToolMissing,
            Some(_) => Broken::of_message(&output.stderr).unwrap_or(Broken::NodeIo),
            None => Broken::NodeIo,
        };
        Err((
            cause,
            format!(
                "clearing the reward file {} failed ({}): {}",
                path.display(),
                exit_text(output.exit),
                tail(output.stderr.trim(), OUTPUT_TAIL)
            ),
        ))
    }
}

/// What a reward file says.
#[derive(Debug, PartialEq)]
pub(super) struct RewardFile {
    /// The reward.
    reward: f64,
    /// Its other fields (for the detail).
    fields: Map<String, Value>,
    /// The rewards of the traces of these chain roles.
    roles: BTreeMap<String, f64>,
}

/// A reward file's content: a number, or a JSON object with a numeric
/// `reward` (its other fields returned) and optionally `trace_rewards`, an
/// object giving the traces of some chain roles (`main`, `sub_agent`,
/// `side`) a reward of their own.
pub(super) fn parse_reward(bytes: &[u8]) -> Result<RewardFile, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| "is not UTF-8".to_owned())?
        .trim();
    if text.is_empty() {
        return Err("is empty".to_owned());
    }
    let finite = |x: f64| {
        if x.is_finite() {
            Ok(x)
        } else {
            Err(format!("holds {x}, not a finite number"))
        }
    };
    if let Ok(x) = text.parse::<f64>() {
        return finite(x).map(|reward| RewardFile {
            reward,
            fields: Map::new(),
            roles: BTreeMap::new(),
        });
    }
    let garbled = || {
        format!(
            "holds {:?}: expected a number or a JSON object with a numeric \"reward\"",
            tail(text, 200)
        )
    };
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(mut fields)) => {
            let reward = match fields.remove("reward").as_ref().and_then(Value::as_f64) {
                Some(x) => finite(x)?,
                None => return Err(garbled()),
            };
            let roles = match fields.remove("trace_rewards") {
                None => BTreeMap::new(),
                Some(Value::Object(m)) => m
                    .into_iter()
                    .map(|(role, r)| {
                        if !CHAIN_ROLES.contains(&role.as_str()) {
                            return Err(format!(
                                "names trace role {:?} in trace_rewards: one of {}",
                                tail(&role, 40),
                                CHAIN_ROLES.join(", ")
                            ));
                        }
                        let x = r.as_f64().ok_or_else(|| {
                            format!("holds a trace reward for {role} that is not a number")
                        })?;
                        Ok((role, finite(x)?))
                    })
                    .collect::<Result<_, String>>()?,
                Some(_) => {
                    return Err(
                        "holds trace_rewards that is not an object of role: reward".to_owned()
                    );
                }
            };
            Ok(RewardFile {
                reward,
                fields,
                roles,
            })
        }
        _ => Err(garbled()),
    }
}

/// A command's exit, for messages.
pub(super) fn exit_text(exit: Option<i32>) -> String {
    match exit {
        Some(code) => format!("exit {code}"),
        None => "killed at the timeout".to_owned(),
    }
}

/// A command's exit and the tails of its output, for the detail.
pub(super) fn output_detail(output: &CommandOutput) -> Value {
    json!({
        "exit": output.exit,
        "timed_out": output.exit.is_none(),
        "stdout_tail": tail(&output.stdout, OUTPUT_TAIL),
        "stderr_tail": tail(&output.stderr, OUTPUT_TAIL),
        "stdout_bytes": output.stdout_bytes,
        "stderr_bytes": output.stderr_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_files_hold_a_number_or_an_object() {
        assert_eq!(parse_reward(b" 0.25\n").unwrap().reward, 0.25);
        assert_eq!(parse_reward(b"1").unwrap().reward, 1.0);
        let f = parse_reward(br#"{"reward": 0.5, "passed": 3, "note": "ok"}"#).unwrap();
        assert_eq!(f.reward, 0.5);
        assert_eq!(f.fields.get("passed"), Some(&json!(3)));
        assert!(!f.fields.contains_key("reward"));
        assert!(f.roles.is_empty());
        let f = parse_reward(br#"{"reward": 1, "trace_rewards": {"sub_agent": 0.25, "side": 0}}"#)
            .unwrap();
        assert_eq!(f.reward, 1.0);
        assert!(f.fields.is_empty());
        assert_eq!(
            f.roles,
            BTreeMap::from([("side".to_owned(), 0.0), ("sub_agent".to_owned(), 0.25)])
        );
    }

    #[test]
    fn garbled_reward_files_are_errors() {
        for (bytes, wanted) in [
            (&b""[..], "is empty"),
            (b"  \n", "is empty"),
            (b"NaN", "not a finite number"),
            (b"inf", "not a finite number"),
            (b"1e999", "not a finite number"),
            (b"yes", "expected a number"),
            (br#"{"score": 1}"#, "expected a number"),
            (br#"{"reward": "1"}"#, "expected a number"),
            (
                br#"{"reward": 1, "trace_rewards": {"helper": 1}}"#,
                "trace role \"helper\"",
            ),
            (
                br#"{"reward": 1, "trace_rewards": {"side": "1"}}"#,
                "not a number",
            ),
            (br#"{"reward": 1, "trace_rewards": [1]}"#, "not an object"),
            (b"[1]", "expected a number"),
            (b"\xff\xfe", "not UTF-8"),
        ] {
            let err = parse_reward(bytes).unwrap_err();
            assert!(err.contains(wanted), "{bytes:?}: {err}");
        }
    }
}
