//! The journal's replay: a lost or torn tail is restored, lines present
//! are left alone (replaying twice changes nothing), frames of another
//! file or beyond a log's end are skipped, a symlinked session directory
//! is never written through, and a torn journal tail ends its segment.

use std::path::Path;

use super::*;
use crate::frame::encode;
use crate::journal::{JOURNAL_DIR, segment_path};

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

/// Writes a journal segment holding the frames of A, B, C at their
/// offsets, for the log `key`, then `tail`.
fn journal(state: &Path, key: FileKey, tail: &[u8]) {
    let dir = state.join(JOURNAL_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    let s = "s-1".parse().unwrap();
    let mut bytes = Vec::new();
    let mut at = 0;
    for line in [A, B, C] {
        bytes.extend(encode(&s, key, at, line));
        at += line.len() as u64;
    }
    bytes.extend_from_slice(tail);
    std::fs::write(segment_path(&dir, 0), bytes).unwrap();
}

#[test]
fn lost_and_torn_tails_are_restored_once() {
    let whole = [A, B, C].concat();
    // Cut anywhere: nothing, inside A, after A, inside C, complete.
    for cut in [0, 3, A.len(), A.len() + B.len() + 4, whole.len()] {
        let (state, key) = state_with_log(&whole[..cut]);
        journal(state.path(), key, b"");
        let done = recover(state.path()).unwrap();
        assert_eq!(log_of(state.path()), whole, "cut at {cut}");
        assert_eq!(done.frames, 3);
        assert_eq!(done.restored + done.present, 3);
        assert!(
            segments(&state.path().join(JOURNAL_DIR))
                .unwrap()
                .is_empty()
        );
        // Replaying the same journal again changes nothing.
        journal(state.path(), key, b"");
        let again = recover(state.path()).unwrap();
        assert_eq!((again.restored, again.present), (0, 3));
        assert_eq!(log_of(state.path()), whole);
    }
}

#[test]
fn garbage_where_a_line_was_is_replaced() {
    let (state, key) = state_with_log(&[A, b"\0\0\0\0\0\0\0\0\0", C].concat());
    journal(state.path(), key, b"");
    recover(state.path()).unwrap();
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
    let done = recover(state.path()).unwrap();
    assert_eq!((done.skipped, done.restored), (3, 0));
    assert_eq!(log_of(state.path()), b"");
    // A log whose journal starts past its end: nothing can be put back.
    let (state, key) = state_with_log(b"");
    let dir = state.path().join(JOURNAL_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    let s = "s-1".parse().unwrap();
    std::fs::write(segment_path(&dir, 0), encode(&s, key, 100, A)).unwrap();
    let done = recover(state.path()).unwrap();
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
    let done = recover(state.path()).unwrap();
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
    let done = recover(state.path()).unwrap();
    assert_eq!((done.restored, done.torn), (3, 1));
    assert_eq!(log_of(state.path()), [A, B, C].concat());
}

#[test]
fn no_journal_no_replay() {
    let (state, _) = state_with_log(A);
    assert_eq!(recover(state.path()).unwrap(), Replayed::default());
    assert_eq!(log_of(state.path()), A);
}
