use std::fs;
use std::os::unix::fs::symlink;
use std::time::{Duration, SystemTime};

use super::*;

const DAY: Duration = Duration::from_secs(86_400);

/// A session's three trees as a hostile sandbox and a capture leave them:
/// a workspace with links pointing out of it (to `victim`), a capture
/// log, an earlier attempt set apart.
fn leave(state: &Path, s: &str, victim: &Path, bytes: usize) {
    let ws = state.join("sandboxes").join(s).join("workspace");
    fs::create_dir_all(ws.join("deep/er")).unwrap();
    fs::write(ws.join("deep/er/data"), vec![7u8; bytes]).unwrap();
    symlink(victim, ws.join("out")).unwrap();
    symlink("../../../../../victim", ws.join("deep/up")).unwrap();
    fs::hard_link(victim.join("precious"), ws.join("linked")).unwrap();
    let cap = state.join("sessions").join(s);
    fs::create_dir_all(&cap).unwrap();
    fs::write(cap.join("calls.jsonl"), "{}\n").unwrap();
    let earlier = state.join("attempts").join(s).join("1/sandbox");
    fs::create_dir_all(&earlier).unwrap();
    symlink(victim, earlier.join("out")).unwrap();
}

/// Sets the change time of a session's top directories.
fn age(state: &Path, s: &str, at: SystemTime) {
    for tree in TREES {
        let d = state.join(tree).join(s);
        if d.exists() {
            fs::File::open(&d).unwrap().set_modified(at).unwrap();
        }
    }
}

fn trees_of(state: &Path, s: &str) -> Vec<&'static str> {
    TREES
        .into_iter()
        .filter(|t| state.join(t).join(s).exists())
        .collect()
}

fn victim(dir: &Path) -> PathBuf {
    let v = dir.join("victim");
    fs::create_dir_all(&v).unwrap();
    fs::write(v.join("precious"), "keep me").unwrap();
    v
}

fn intact(v: &Path) {
    assert_eq!(fs::read_to_string(v.join("precious")).unwrap(), "keep me");
}

fn keep(failed_for: Duration, max_bytes: u64) -> Keep {
    Keep {
        failed_for,
        max_bytes,
    }
}

#[tokio::test]
async fn an_exported_session_s_directories_go_and_nothing_outside_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let v = victim(dir.path());
    leave(&state, "t-s0", &v, 4096);
    let r = Retention::new(&state, keep(DAY, u64::MAX));
    let live = r.enter(&"t-s0".parse().unwrap()).await;
    assert!(r.settle(live, false).await);
    // The sandbox and capture trees are gone; the earlier attempt, not
    // exported, is kept; the links' targets are untouched.
    assert_eq!(trees_of(&state, "t-s0"), ["attempts"]);
    intact(&v);
    assert_eq!(fs::read_dir(&v).unwrap().count(), 1);
    // Nothing there at all is fine too.
    let live = r.enter(&"t-none".parse().unwrap()).await;
    assert!(r.settle(live, false).await);
}

#[tokio::test]
async fn a_failed_session_is_kept_for_its_time_then_swept() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let v = victim(dir.path());
    leave(&state, "t-s1", &v, 4096);
    let r = Retention::new(&state, keep(Duration::from_secs(3600), u64::MAX));
    let live = r.enter(&"t-s1".parse().unwrap()).await;
    assert!(!r.settle(live, true).await);
    assert_eq!(trees_of(&state, "t-s1"), TREES);
    let now = SystemTime::now();
    let s = r.sweep(now);
    assert_eq!((s.removed.len(), s.kept), (0, 1), "{s:?}");
    assert!(s.kept_bytes >= 4096, "{s:?}");
    let s = r.sweep(now + Duration::from_secs(3601));
    assert_eq!(s.removed, [("t-s1".to_owned(), Removed::Expired)], "{s:?}");
    assert!(s.failed.is_empty(), "{s:?}");
    assert!(trees_of(&state, "t-s1").is_empty());
    intact(&v);
}

#[tokio::test]
async fn over_the_ceiling_the_oldest_kept_sessions_go_first() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let v = victim(dir.path());
    let t0 = SystemTime::now() - Duration::from_secs(600);
    for (i, s) in ["t-b", "t-a", "t-c"].into_iter().enumerate() {
        leave(&state, s, &v, 64 << 10);
        age(&state, s, t0 + Duration::from_secs(60 * i as u64));
    }
    // Not a session's: left alone.
    fs::create_dir_all(state.join("sandboxes/.t-b.persist")).unwrap();
    let all = Retention::new(&state, keep(DAY, u64::MAX)).sweep(SystemTime::now());
    assert_eq!((all.kept, all.removed.len()), (3, 0), "{all:?}");
    let r = Retention::new(&state, keep(DAY, all.kept_bytes - 1));
    let s = r.sweep(SystemTime::now());
    assert_eq!(
        s.removed,
        [("t-b".to_owned(), Removed::OverCeiling)],
        "{s:?}"
    );
    assert_eq!(s.kept, 2);
    assert!(trees_of(&state, "t-b").is_empty());
    assert_eq!(trees_of(&state, "t-a"), TREES);
    assert!(state.join("sandboxes/.t-b.persist").is_dir());
    // A ceiling of nothing keeps nothing.
    let s = Retention::new(&state, keep(DAY, 0)).sweep(SystemTime::now());
    assert_eq!(s.removed.len(), 2, "{s:?}");
    intact(&v);
}

#[tokio::test]
async fn a_session_in_progress_is_never_swept() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let v = victim(dir.path());
    leave(&state, "t-s2", &v, 4096);
    let r = Retention::new(&state, keep(Duration::ZERO, 0));
    let live = r.enter(&"t-s2".parse().unwrap()).await;
    let s = r.sweep(SystemTime::now() + DAY);
    assert_eq!((s.removed.len(), s.kept), (0, 0), "{s:?}");
    assert_eq!(trees_of(&state, "t-s2"), TREES);
    drop(live);
    let s = r.sweep(SystemTime::now());
    assert_eq!(s.removed, [("t-s2".to_owned(), Removed::Expired)], "{s:?}");
}
