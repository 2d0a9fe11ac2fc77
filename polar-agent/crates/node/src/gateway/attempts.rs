//! One attempt, one set of directories: before a session's attempt starts
//! on this node, what an earlier attempt of it left here (its sandbox
//! directories — workspace, HOME, tmp, logs — and its capture log with
//! `session.json`) is moved apart to `<state>/attempts/<session>/<n>/`
//! (`sandbox/`, `capture/`; `n` is the earlier attempt's number from its
//! `session.json`, else the lowest free one). The new attempt then starts
//! on fresh directories, its capture log starts at `seq` 0, and the
//! exported trajectory holds its calls only. The earlier attempt was torn
//! down first (the node starts a newer attempt only after the older one's
//! POSTRUN), so nothing holds these directories; a directory that is still
//! a mount point cannot be moved, and the attempt fails on this node (the
//! server dispatches it again). When the attempt is exported, the number
//! of earlier attempts kept here ([`superseded`]) goes with it, into its
//! `session.json` and the export's `stats.superseded_attempts`: counted,
//! never merged.

use std::path::{Path, PathBuf};

use polar_ids::SessionId;

/// Where the earlier attempts of sessions are kept, under a state directory.
pub const ATTEMPTS_DIR: &str = "attempts";

/// Moves an earlier attempt's directories of `session` apart; returns
/// where they went (`None`: nothing was there). Blocking: call off the
/// async workers.
pub fn set_apart(state_dir: &Path, session: &SessionId) -> std::io::Result<Option<PathBuf>> {
    let sandbox = polar_sandbox::runtime::steps::SandboxDirs::of(state_dir, session).root;
    let capture = polar_capture::session_dir(state_dir, session);
    if !sandbox.exists() && !capture.exists() {
        return Ok(None);
    }
    let kept = state_dir.join(ATTEMPTS_DIR).join(session.as_str());
    std::fs::create_dir_all(&kept)?;
    let dest = kept.join(earlier_attempt(&capture, &kept).to_string());
    std::fs::create_dir(&dest)?;
    if sandbox.exists() {
        std::fs::rename(&sandbox, dest.join("sandbox"))?;
    }
    if capture.exists() {
        std::fs::rename(&capture, dest.join("capture"))?;
    }
    Ok(Some(dest))
}

/// How many earlier attempts of `session` are kept apart under
/// `state_dir` (the directories under `attempts/<session>/`; none when
/// there is no such directory). Blocking: call off the async workers.
pub fn superseded(state_dir: &Path, session: &SessionId) -> std::io::Result<usize> {
    let kept = state_dir.join(ATTEMPTS_DIR).join(session.as_str());
    let entries = match std::fs::read_dir(&kept) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut n = 0;
    for entry in entries {
        if entry?.file_type()?.is_dir() {
            n += 1;
        }
    }
    Ok(n)
}

/// The earlier attempt's number: its `session.json`'s `metadata.attempt`
/// when that is free under `kept`, else the lowest free number.
fn earlier_attempt(capture: &Path, kept: &Path) -> u64 {
    let recorded = std::fs::read(capture.join(polar_capture::SESSION_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["metadata"]["attempt"].as_u64());
    if let Some(n) = recorded
        && !kept.join(n.to_string()).exists()
    {
        return n;
    }
    (1..)
        .find(|n: &u64| !kept.join(n.to_string()).exists())
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_attempt_s_files_are_moved_apart_and_numbered() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let s: SessionId = "t-s0".parse().unwrap();
        assert_eq!(set_apart(state, &s).unwrap(), None);
        assert_eq!(superseded(state, &s).unwrap(), 0);
        let ws = state.join("sandboxes/t-s0/workspace");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("from-attempt-1.txt"), "x").unwrap();
        let cap = polar_capture::session_dir(state, &s);
        std::fs::create_dir_all(&cap).unwrap();
        std::fs::write(cap.join("calls.jsonl"), "{}\n").unwrap();
        std::fs::write(
            cap.join("session.json"),
            r#"{"session_id": "t-s0", "metadata": {"attempt": 3}}"#,
        )
        .unwrap();
        let kept = set_apart(state, &s).unwrap().unwrap();
        assert_eq!(kept, state.join("attempts/t-s0/3"));
        assert!(kept.join("sandbox/workspace/from-attempt-1.txt").is_file());
        assert!(kept.join("capture/calls.jsonl").is_file());
        assert!(!state.join("sandboxes/t-s0").exists());
        assert!(!cap.exists());
        assert_eq!(superseded(state, &s).unwrap(), 1);
        // A second leftover without session.json takes the lowest free
        // number.
        std::fs::create_dir_all(state.join("sandboxes/t-s0/home")).unwrap();
        let kept = set_apart(state, &s).unwrap().unwrap();
        assert_eq!(kept, state.join("attempts/t-s0/1"));
        assert!(kept.join("sandbox/home").is_dir());
        assert_eq!(superseded(state, &s).unwrap(), 2);
        // Only this session's attempts count.
        let other: SessionId = "t-s1".parse().unwrap();
        assert_eq!(superseded(state, &other).unwrap(), 0);
    }
}
