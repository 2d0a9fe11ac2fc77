//! The journals' replay: a lost or torn tail is restored, lines present
//! are left alone (replaying twice changes nothing), frames of another
//! file or beyond a log's end are skipped, a symlinked session directory
//! is never written through, and a torn journal tail ends its segment (the
//! zeros written ahead of the frames do, untorn).
//! Only the journals of agents gone are replayed and removed: a live
//! agent's (its lock held) is left alone; a journal without its lock file
//! and one in the layout before owners (segments in the root) are
//! replayed.

use std::path::{Path, PathBuf};

use super::*;
use crate::frame::encode;
use crate::journal::{JOURNAL_DIR, segment_path};
use crate::owners::{LOCK_FILE, RootLock};

const A: &[u8] = b"{\"a\":1}\n";
const B: &[u8] = b"{\"b\":22}\n";
const C: &[u8] = b"{\"c\":333}\n";

/// A state directory with session `s-1`'s log holding `bytes`; the log's
/// key.
fn state_with_log(bytes: &[u8]) -> (tempfile::TempDir, FileKey) {
    let dir = tempfile::tempdir().unwrap();
    let sdir = dir.path().join(SESSIONS_DIR).join("s-1");
    std::fs::create_dir_all(&sdir).unwrap();
    std::fs::write(sdir.join(CALLS_FILE), bytes).unwrap();
    let key = FileKey::of(&File::open(sdir.join(CALLS_FILE)).unwrap()).unwrap();
    (dir, key)
}

fn log_of(state: &Path) -> Vec<u8> {
    std::fs::read(state.join(SESSIONS_DIR).join("s-1").join(CALLS_FILE)).unwrap()
}

/// The directory of a journal its agent left, with its (free) lock file.
fn left_journal(state: &Path) -> PathBuf {
    let dir = state.join(JOURNAL_DIR).join("4242-1");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(LOCK_FILE), b"").unwrap();
    dir
}

/// Replays what the journals under `state` hold, as a store's open does.
fn replay(state: &Path) -> Replayed {
    let root = RootLock::take(&state.join(JOURNAL_DIR)).unwrap();
    recover(state, &root).unwrap()
}

/// Writes, in a journal its agent left, a segment holding the frames of
/// A, B, C at their offsets, for the log `key`, then `tail`; returns the
/// journal's directory.
fn journal(state: &Path, key: FileKey, tail: &[u8]) -> PathBuf {
    let dir = left_journal(state);
    write_segment(&dir, key, tail);
    dir
}

fn write_segment(dir: &Path, key: FileKey, tail: &[u8]) {
    let s = "s-1".parse().unwrap();
    let mut bytes = Vec::new();
    let mut at = 0;
    for line in [A, B, C] {
        bytes.extend(encode(&s, key, at, line));
        at += line.len() as u64;
    }
    bytes.extend_from_slice(tail);
    std::fs::write(segment_path(dir, 0), bytes).unwrap();
}

#[test]
fn lost_and_torn_tails_are_restored_once() {
    let whole = [A, B, C].concat();
    // Cut anywhere: nothing, inside A, after A, inside C, complete.
    for cut in [0, 3, A.len(), A.len() + B.len() + 4, whole.len()] {
        let (state, key) = state_with_log(&whole[..cut]);
        let dir = journal(state.path(), key, b"");
        let done = replay(state.path());
        assert_eq!(log_of(state.path()), whole, "cut at {cut}");
        assert_eq!(done.frames, 3);
        assert_eq!(done.restored + done.present, 3);
        assert!(!dir.exists(), "the journal replayed is removed");
        // Replaying the same journal again changes nothing.
        journal(state.path(), key, b"");
        let again = replay(state.path());
        assert_eq!((again.restored, again.present), (0, 3));
        assert_eq!(log_of(state.path()), whole);
    }
}

#[test]
fn garbage_where_a_line_was_is_replaced() {
    let (state, key) = state_with_log(&[A, b"\0\0\0\0\0\0\0\0\0", C].concat());
    journal(state.path(), key, b"");
    replay(state.path());
    assert_eq!(log_of(state.path()), [A, B, C].concat());
}

#[test]
fn frames_of_another_file_or_beyond_the_end_are_skipped() {
    // A later attempt's log at the same path: another file.
    let (state, key) = state_with_log(b"");
    let other = FileKey {
        ino: key.ino ^ 1,
        birth: key.birth,
    };
    journal(state.path(), other, b"");
    let done = replay(state.path());
    assert_eq!((done.skipped, done.restored), (3, 0));
    assert_eq!(log_of(state.path()), b"");
    // A log whose journal starts past its end: nothing can be put back.
    let (state, key) = state_with_log(b"");
    let dir = left_journal(state.path());
    let s = "s-1".parse().unwrap();
    std::fs::write(segment_path(&dir, 0), encode(&s, key, 100, A)).unwrap();
    let done = replay(state.path());
    assert_eq!((done.skipped, done.restored), (1, 0));
    assert_eq!(log_of(state.path()), b"");
}

#[test]
fn a_symlinked_session_directory_is_not_written_through() {
    let (state, key) = state_with_log(b"");
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join(CALLS_FILE), b"").unwrap();
    let sdir = state.path().join(SESSIONS_DIR).join("s-1");
    std::fs::remove_dir_all(&sdir).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), &sdir).unwrap();
    // Even with the key of the file behind the link.
    let behind = FileKey::of(&File::open(elsewhere.path().join(CALLS_FILE)).unwrap()).unwrap();
    let _ = key;
    journal(state.path(), behind, b"");
    let done = replay(state.path());
    assert_eq!((done.skipped, done.restored), (3, 0));
    assert_eq!(
        std::fs::read(elsewhere.path().join(CALLS_FILE)).unwrap(),
        b""
    );
}

#[test]
fn a_torn_journal_tail_ends_its_segment() {
    let (state, key) = state_with_log(b"");
    let s = "s-1".parse().unwrap();
    let torn = encode(&s, key, 100, b"{\"d\":4}\n");
    journal(state.path(), key, &torn[..torn.len() - 3]);
    let done = replay(state.path());
    assert_eq!((done.restored, done.torn), (3, 1));
    assert_eq!(log_of(state.path()), [A, B, C].concat());
}

#[test]
fn the_zeros_written_ahead_of_a_segment_s_frames_are_not_a_torn_tail() {
    let (state, key) = state_with_log(b"");
    journal(state.path(), key, &[0; 5000]);
    let done = replay(state.path());
    assert_eq!((done.restored, done.torn), (3, 0));
    assert_eq!(log_of(state.path()), [A, B, C].concat());
    // A frame cut short by them is torn.
    let (state, key) = state_with_log(b"");
    let s = "s-1".parse().unwrap();
    let mut torn = encode(&s, key, 100, b"{\"d\":4}\n");
    let n = torn.len();
    torn[n - 3..].fill(0);
    torn.extend_from_slice(&[0; 100]);
    journal(state.path(), key, &torn);
    let done = replay(state.path());
    assert_eq!((done.restored, done.torn), (3, 1));
}

#[test]
fn no_journal_no_replay() {
    let (state, _) = state_with_log(A);
    assert_eq!(replay(state.path()), Replayed::default());
    assert_eq!(log_of(state.path()), A);
}

#[test]
fn a_live_agents_journal_is_left_alone_until_its_lock_goes() {
    let (state, key) = state_with_log(b"");
    let dir = journal(state.path(), key, b"");
    // Its agent holds the lock (another open file, as another process).
    let held = RootLock::take(&state.path().join(JOURNAL_DIR))
        .unwrap()
        .make_own()
        .unwrap();
    let own = held.dir().to_owned();
    write_segment(&own, key, b"");
    let done = replay(state.path());
    assert_eq!((done.segments, done.restored), (1, 3));
    assert!(!dir.exists());
    assert_eq!(segments(&own).unwrap().len(), 1, "the live journal is kept");
    assert_eq!(log_of(state.path()), [A, B, C].concat());
    // Its agent gone (the lock let go with the process), it is replayed.
    drop(held);
    let done = replay(state.path());
    assert_eq!((done.segments, done.present), (1, 3));
    assert!(!own.exists());
}

#[test]
fn a_journal_without_its_lock_file_and_the_old_layout_are_replayed() {
    // Its agent died before it made the lock file.
    let (state, key) = state_with_log(b"");
    let dir = journal(state.path(), key, b"");
    std::fs::remove_file(dir.join(LOCK_FILE)).unwrap();
    assert_eq!(replay(state.path()).restored, 3);
    assert!(!dir.exists());
    assert_eq!(log_of(state.path()), [A, B, C].concat());
    // Segments in the journals' root, as agents before owners wrote them.
    let (state, key) = state_with_log(A);
    let root = state.path().join(JOURNAL_DIR);
    std::fs::create_dir_all(&root).unwrap();
    write_segment(&root, key, b"");
    let done = replay(state.path());
    assert_eq!((done.present, done.restored), (1, 2));
    assert!(segments(&root).unwrap().is_empty());
    assert_eq!(log_of(state.path()), [A, B, C].concat());
}
