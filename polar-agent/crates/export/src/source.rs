//! Reading captured sessions back for `polar export`: the session
//! directories under `<state_dir>/sessions/`, each with `calls.jsonl` (one
//! `CompletionRecord` per call, in one line or two) and `session.json`
//! (task, group, attempt, outcome, evaluation, reward; every field
//! optional; an attempt number or count that is not a `u32` is left out
//! with a warning). The call log is read with the capture log's own
//! streaming reader ([`polar_capture_log::read_log`]), which joins a call's two
//! lines: a torn last line (no newline: a crash mid-write) is skipped with
//! a warning; a malformed complete line, or a call's request part never
//! completed, is reported with its line number and skipped; nothing
//! panics.

use std::path::{Path, PathBuf};

use serde_json::Value;

use polar_capture_log::{LogError, LogProblem, read_log};
use polar_record::CompletionRecord;
use polar_trajectory::{EndedBy, Rewards, SessionMeta, SessionOutcome};

/// The capture layout: the sessions directory under a state directory, a
/// session's call log and its metadata file.
pub use polar_capture_log::CALLS_FILE;
pub use polar_capture_log::{SESSION_FILE, SESSIONS_DIR};

/// Why a session could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A file or directory could not be read.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The call log could not be read.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The directory given as a state directory has no `sessions/`.
    #[error(
        "{} is not a state directory: it has no sessions/ (expected a node's \
         agent.state_dir, holding sessions/<session>/calls.jsonl){}",
        dir.display(),
        if *export_root { "; it holds task=*/ directories like an export root: use --from" } else { "" }
    )]
    NotStateDir {
        /// The directory.
        dir: PathBuf,
        /// Whether it looks like an export root instead.
        export_root: bool,
    },
    /// `session.json` is not JSON, or a field has the wrong shape.
    #[error("{}: {why}", path.display())]
    SessionFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

fn io(path: &Path, source: std::io::Error) -> SourceError {
    SourceError::Io {
        path: path.to_owned(),
        source,
    }
}

/// One session read back.
#[derive(Clone, Debug)]
pub struct SessionLog {
    /// Its directory.
    pub dir: PathBuf,
    /// What the builders need to know besides the records.
    pub meta: SessionMeta,
    /// The recorded rewards, if any.
    pub rewards: Option<Rewards>,
    /// Whether the session's outcome was recorded (otherwise it is taken as
    /// completed, or as an error of the infrastructure when the last call
    /// failed on the backend's or the agent's side).
    pub outcome_recorded: bool,
    /// The records, in file order.
    pub records: Vec<CompletionRecord>,
    /// Problems found in `calls.jsonl`.
    pub problems: Vec<LogProblem>,
    /// `session.json` as read (exported beside the calls).
    pub session_json: Option<Value>,
}

/// The session directories under `state_dir` (those holding a call log),
/// sorted by name.
pub fn list_sessions(state_dir: &Path) -> Result<Vec<PathBuf>, SourceError> {
    let root = state_dir.join(SESSIONS_DIR);
    if !root.is_dir() {
        return Err(SourceError::NotStateDir {
            dir: state_dir.to_owned(),
            export_root: has_partitions(state_dir),
        });
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&root).map_err(|e| io(&root, e))? {
        let path = entry.map_err(|e| io(&root, e))?.path();
        if path.join(CALLS_FILE).is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Whether `dir` holds a `task=*` directory, as an export root does.
pub(crate) fn has_partitions(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("task=") && e.path().is_dir())
    })
}

/// Reads the session in `dir`; problems in the log are logged as warnings
/// and returned.
pub fn read_session(dir: &Path) -> Result<SessionLog, SourceError> {
    let (records, problems) = read_log(&dir.join(CALLS_FILE))?;
    session_with_records(dir, records, problems)
}

/// The session in `dir` whose log was read already (`records`, and the
/// `problems` met reading it): its `session.json` read now.
pub fn session_with_records(
    dir: &Path,
    records: Vec<CompletionRecord>,
    problems: Vec<LogProblem>,
) -> Result<SessionLog, SourceError> {
    let session_file = dir.join(SESSION_FILE);
    let json =
        match std::fs::read(&session_file) {
            Ok(bytes) => Some(serde_json::from_slice::<Value>(&bytes).map_err(|e| {
                SourceError::SessionFile {
                    path: session_file.clone(),
                    why: e.to_string(),
                }
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&session_file, e)),
        };
    session_log(dir.to_owned(), json, records, problems).map_err(|e| match e {
        SourceError::SessionFile { why, .. } => SourceError::SessionFile {
            path: session_file,
            why,
        },
        other => other,
    })
}

/// A session read back from its parts: its directory (or exported file),
/// its `session.json`, its records and the problems met reading them.
pub fn session_log(
    dir: PathBuf,
    json: Option<Value>,
    records: Vec<CompletionRecord>,
    problems: Vec<LogProblem>,
) -> Result<SessionLog, SourceError> {
    let fallback_id = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let info = session_info(json.as_ref(), &fallback_id, &records).map_err(|why| {
        SourceError::SessionFile {
            path: dir.clone(),
            why,
        }
    })?;
    Ok(SessionLog {
        dir,
        meta: info.meta,
        rewards: info.rewards,
        outcome_recorded: info.outcome_recorded,
        records,
        problems,
        session_json: json,
    })
}

/// What `session.json` says, with defaults.
struct SessionInfo {
    meta: SessionMeta,
    rewards: Option<Rewards>,
    outcome_recorded: bool,
}

/// A field of `session.json`, at the top level or under `metadata`.
fn field<'v>(json: Option<&'v Value>, key: &str) -> Option<&'v Value> {
    let json = json?;
    json.get(key)
        .or_else(|| json.get("metadata").and_then(|m| m.get(key)))
        .filter(|v| !v.is_null())
}

fn string(json: Option<&Value>, key: &str) -> Result<Option<String>, String> {
    match field(json, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(format!("{key} is not a string: {v}")),
    }
}

/// A count the gateway recorded (`attempt`, `superseded_attempts`): an
/// integer in `0..=u32::MAX`. Anything else is left out with a warning
/// naming the session, so that one bad value does not lose the session's
/// export.
fn count(json: Option<&Value>, key: &str, session: &str) -> Option<u32> {
    let v = field(json, key)?;
    let n = v.as_u64().and_then(|n| u32::try_from(n).ok());
    if n.is_none() {
        tracing::warn!(session, value = %v, "session.json: {key} is not an integer in 0..={}: left out", u32::MAX);
    }
    n
}

/// Reads the outcome: `{"kind": ...}` as the trajectory layer writes it, or
/// a plain `"completed" | "timeout" | "error"` (with `error` beside it).
fn outcome(json: Option<&Value>) -> Result<Option<SessionOutcome>, String> {
    let Some(v) = field(json, "outcome") else {
        return Ok(None);
    };
    if let Value::String(s) = v {
        return match s.as_str() {
            "completed" => Ok(Some(SessionOutcome::Completed)),
            "timeout" => Ok(Some(SessionOutcome::Timeout)),
            "error" => Ok(Some(SessionOutcome::Error {
                message: string(json, "error")?.unwrap_or_else(|| "the session failed".into()),
            })),
            other => Err(format!("unknown outcome {other:?}")),
        };
    }
    serde_json::from_value(v.clone())
        .map(Some)
        .map_err(|e| format!("outcome: {e}"))
}

/// Reads who ended the session (`ended_by`: `policy`, `backend`, ...).
fn ended_by(json: Option<&Value>) -> Result<Option<EndedBy>, String> {
    field(json, "ended_by")
        .map(|v| serde_json::from_value(v.clone()).map_err(|e| format!("ended_by: {e}")))
        .transpose()
}

fn session_info(
    json: Option<&Value>,
    fallback_id: &str,
    records: &[CompletionRecord],
) -> Result<SessionInfo, String> {
    let session_id = string(json, "session_id")?
        .or_else(|| records.first().map(|r| r.session_id.clone()))
        .unwrap_or_else(|| fallback_id.to_owned());
    let attempt = count(json, "attempt", &session_id);
    let superseded_attempts =
        count(json, "superseded_attempts", &session_id).map_or(0, |n| n as usize);
    let recorded = outcome(json)?;
    // No outcome recorded (a session not run by a gateway): completed,
    // unless the log's last call shows the infrastructure ended it.
    let (outcome, ended_by) = match (&recorded, polar_trajectory::ending_fault(records)) {
        (Some(o), _) => (o.clone(), ended_by(json)?),
        (None, Some(f)) => (
            SessionOutcome::Error {
                message: format!(
                    "the session's last model call (seq {}) failed: {}",
                    f.seq, f.error
                ),
            },
            Some(f.ended_by),
        ),
        (None, None) => (SessionOutcome::Completed, ended_by(json)?),
    };
    let rewards = match (field(json, "rewards"), field(json, "reward")) {
        (Some(r), _) => {
            Some(serde_json::from_value(r.clone()).map_err(|e| format!("rewards: {e}"))?)
        }
        (None, Some(Value::Number(n))) => n.as_f64().map(Rewards::Outcome),
        (None, Some(v)) => return Err(format!("reward is not a number: {v}")),
        (None, None) => None,
    };
    Ok(SessionInfo {
        meta: SessionMeta {
            session_id,
            task_id: string(json, "task_id")?,
            group_id: string(json, "group_id")?,
            attempt,
            superseded_attempts,
            outcome,
            ended_by,
            evaluation: field(json, "evaluation").cloned(),
            policy_version: string(json, "policy_version")?,
            instruction: string(json, "instruction")?,
        },
        rewards,
        outcome_recorded: recorded.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info(v: Value) -> SessionInfo {
        session_info(Some(&v), "dir", &[]).unwrap()
    }

    #[test]
    fn an_unrecorded_outcome_is_the_infrastructures_when_the_last_call_failed_on_its_side() {
        let mut records = crate::sample::session(&crate::sample::SampleSpec::small(), 0).records;
        let last = records.len() - 1;
        let finished = records
            .iter()
            .map(|r| r.timings.finished_ms)
            .max()
            .unwrap_or(0);
        records[last].timings.finished_ms = finished + 1;
        records[last].status = polar_record::CallStatus::Failed {
            side: "backend".into(),
            error: "backend b (r): reply cut after 11 event(s)".into(),
        };
        let i = session_info(None, "d", &records).unwrap();
        assert_eq!(i.meta.ended_by, Some(EndedBy::Backend));
        assert!(
            matches!(&i.meta.outcome, SessionOutcome::Error { message } if message.contains("reply cut")),
            "{:?}",
            i.meta.outcome
        );
        assert!(!i.outcome_recorded);
        // A recorded outcome is taken as recorded.
        let i = session_info(Some(&json!({"outcome": "completed"})), "d", &records).unwrap();
        assert_eq!(
            (i.meta.outcome, i.meta.ended_by),
            (SessionOutcome::Completed, None)
        );
    }

    #[test]
    fn torn_tail_and_malformed_lines_are_reported() {
        let text = b"\n{not json}\n\n{\"torn\":";
        let (records, problems) = polar_capture_log::parse_calls(&text[..]).unwrap();
        assert!(records.is_empty());
        assert_eq!(problems.len(), 2);
        assert!(matches!(
            &problems[0],
            LogProblem::Malformed { line: 2, .. }
        ));
        assert_eq!(
            problems[1],
            LogProblem::TornTail {
                line: 4,
                offset: 13,
                len: 8
            }
        );
    }

    #[test]
    fn session_file_fields_are_read_tolerantly() {
        let i = info(json!({
            "task_id": "t",
            "metadata": {"group_id": "g", "harness": "codex", "policy_version": "w-42"},
            "outcome": {"kind": "error", "message": "boom"},
            "ended_by": "backend",
            "reward": 0.5,
            "unknown": [1, 2]
        }));
        assert_eq!(i.meta.session_id, "dir");
        assert_eq!(i.meta.task_id.as_deref(), Some("t"));
        assert_eq!(i.meta.group_id.as_deref(), Some("g"));
        assert_eq!(i.meta.policy_version.as_deref(), Some("w-42"));
        assert_eq!((i.meta.attempt, i.meta.superseded_attempts), (None, 0));
        assert_eq!(
            i.meta.outcome,
            SessionOutcome::Error {
                message: "boom".into()
            }
        );
        assert_eq!(i.meta.ended_by, Some(EndedBy::Backend));
        assert_eq!(i.rewards, Some(Rewards::Outcome(0.5)));
        assert!(i.outcome_recorded);

        let i =
            info(json!({"outcome": "timeout", "rewards": {"kind": "per_trace", "value": [1.0]}}));
        assert_eq!(i.meta.outcome, SessionOutcome::Timeout);
        assert_eq!(i.rewards, Some(Rewards::PerTrace(vec![1.0])));

        let i = info(json!({}));
        assert_eq!(i.meta.outcome, SessionOutcome::Completed);
        assert!(!i.outcome_recorded);

        assert_eq!(i.meta.ended_by, None);
        assert!(session_info(Some(&json!({"outcome": "meh"})), "d", &[]).is_err());
        assert!(session_info(Some(&json!({"ended_by": "gremlins"})), "d", &[]).is_err());
        assert!(session_info(Some(&json!({"task_id": 3})), "d", &[]).is_err());
    }

    #[test]
    fn the_attempt_and_the_earlier_attempts_are_read_and_a_bad_one_is_left_out() {
        let i = info(json!({"superseded_attempts": 1, "metadata": {"attempt": 2}}));
        assert_eq!((i.meta.attempt, i.meta.superseded_attempts), (Some(2), 1));
        for bad in [json!("2"), json!(-1), json!(1.5), json!(4_294_967_296_u64)] {
            let i = info(json!({"superseded_attempts": bad, "metadata": {"attempt": bad}}));
            assert_eq!(
                (i.meta.attempt, i.meta.superseded_attempts),
                (None, 0),
                "{bad}"
            );
        }
    }
}
