//! The start-up replay of the capture journals ([`super::journal`]) that
//! agents gone left behind (`owners`: not a live agent's, sharing the state
//! directory): after a crash or a power loss, every line such a journal
//! holds that its session's log lacks is written back to the log, at the
//! offset it was first written at, before anything reads the logs
//! (`recover`, run by [`super::store::CaptureStore::open`]); then the logs
//! are synced and the journals removed.
//!
//! Each frame names its session, the log file (inode and birth time) and
//! the line's offset, so replaying is idempotent and puts each line in
//! once: a line whose bytes are already at its offset is left alone; a log
//! shorter than the line's end, or holding other bytes there (a torn or
//! lost tail), is cut at the offset and the line written again (the
//! journal holds every later line of the log too, replayed after it). A
//! frame whose log is gone (the session's directory removed or moved
//! away), is another file (a later attempt's log at the same path), or
//! starts beyond the log's end (its earlier lines left the journal: the
//! log was synced past them, so this cannot follow a power loss) is
//! skipped. Logs are reached beneath the state directory with
//! `polar_io::beneath` (`openat2`, no symlink followed, no mount
//! crossed); the journal's bytes are read as hostile ([`super::frame`]):
//! a torn or garbled tail ends a segment's replay, never the agent.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader};
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::dir::sync_dir;
use super::frame::{FileKey, Frame, FrameEnd, FrameReader};
use super::journal::segments;
use super::owners::RootLock;
use polar_capture_log::{CALLS_FILE, LogError, SESSIONS_DIR};
use polar_ids::SessionId;
use polar_io::beneath::{Dir, STRICT, open_how};

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Segments read.
    pub segments: usize,
    /// Frames read.
    pub frames: u64,
    /// Lines written back to their logs.
    pub restored: u64,
    /// Lines already in their logs.
    pub present: u64,
    /// Frames skipped: log gone, another file, or beyond its end.
    pub skipped: u64,
    /// Segments whose tail was torn or garbled (the rest of each ignored).
    pub torn: usize,
}

/// A session log being replayed into.
struct Target {
    file: File,
    key: FileKey,
    len: u64,
    changed: bool,
}

/// Replays the journals left under `state_dir` (found under `root`, the
/// journals' root, locked) into the session logs, syncs the logs it
/// changed, and removes the journals. Blocking.
pub(crate) fn recover(state_dir: &Path, root: &RootLock) -> Result<Replayed, LogError> {
    let mut left = Vec::new();
    for journal in root.left()? {
        let dir = &journal.dir;
        let found = segments(dir).map_err(|e| LogError::io("listing", dir, e))?;
        left.push((journal, found));
    }
    let mut done = Replayed::default();
    let sessions_path = state_dir.join(SESSIONS_DIR);
    let sessions = match Dir::open_root(&sessions_path) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(LogError::io("opening", &sessions_path, e)),
    };
    let mut targets: HashMap<SessionId, Option<Target>> = HashMap::new();
    for (_, path) in left.iter().flat_map(|(_, found)| found) {
        let file = File::open(path).map_err(|e| LogError::io("opening", path, e))?;
        let mut frames = FrameReader::new(BufReader::with_capacity(1 << 20, file));
        for frame in frames.by_ref() {
            done.frames += 1;
            let target = targets
                .entry(frame.session.clone())
                .or_insert_with(|| open_target(sessions.as_ref(), &frame.session));
            match target {
                Some(t) => apply(t, &frame, &mut done).map_err(|e| {
                    LogError::io("restoring a line to", &log_path(state_dir, &frame), e)
                })?,
                None => done.skipped += 1,
            }
        }
        done.segments += 1;
        if let Some(FrameEnd::Bad { offset, why }) = frames.end() {
            done.torn += 1;
            tracing::warn!(segment = %path.display(), offset, why, "capture journal: torn or garbled tail ignored");
        }
    }
    for (session, target) in &targets {
        if let Some(t) = target
            && t.changed
        {
            t.file.sync_all().map_err(|e| {
                LogError::io(
                    "syncing",
                    &sessions_path.join(session.as_str()).join(CALLS_FILE),
                    e,
                )
            })?;
        }
    }
    for (journal, found) in left {
        for (_, path) in &found {
            std::fs::remove_file(path).map_err(|e| LogError::io("removing", path, e))?;
        }
        if !found.is_empty() {
            sync_dir(&journal.dir)?;
        }
        root.remove(journal)?;
    }
    if done.segments == 0 {
        return Ok(done);
    }
    tracing::info!(
        segments = done.segments,
        frames = done.frames,
        restored = done.restored,
        present = done.present,
        skipped = done.skipped,
        "capture journal replayed"
    );
    Ok(done)
}

fn log_path(state_dir: &Path, frame: &Frame) -> std::path::PathBuf {
    state_dir
        .join(SESSIONS_DIR)
        .join(frame.session.as_str())
        .join(CALLS_FILE)
}

/// Opens `session`'s log for replaying, beneath the sessions directory;
/// `None` when there is none (or it is not a regular file reached without
/// a symlink).
fn open_target(sessions: Option<&Dir>, session: &SessionId) -> Option<Target> {
    let dir = sessions?.open_dir(Path::new(session.as_str())).ok()?;
    let how = open_how(
        OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
        Mode::empty(),
        STRICT,
    );
    let file = match dir.open_with(Path::new(CALLS_FILE), how) {
        Ok(fd) => File::from(fd),
        Err(Errno::ENOENT) => return None,
        Err(e) => {
            tracing::warn!(session = %session, error = %e, "capture journal: the session's log cannot be opened; its lines are skipped");
            return None;
        }
    };
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        tracing::warn!(session = %session, "capture journal: the session's log is not a regular file; its lines are skipped");
        return None;
    }
    let key = FileKey::of(&file).ok()?;
    Some(Target {
        file,
        key,
        len: meta.len(),
        changed: false,
    })
}

/// Puts `frame`'s line in its log unless it is there.
fn apply(t: &mut Target, frame: &Frame, done: &mut Replayed) -> io::Result<()> {
    if frame.key != t.key || frame.offset > t.len {
        done.skipped += 1;
        return Ok(());
    }
    let end = frame.offset + frame.line.len() as u64;
    if end <= t.len {
        let mut there = vec![0; frame.line.len()];
        t.file.read_exact_at(&mut there, frame.offset)?;
        if there == frame.line {
            done.present += 1;
            return Ok(());
        }
    }
    t.file.set_len(frame.offset)?;
    t.file.write_all_at(&frame.line, frame.offset)?;
    t.len = end;
    t.changed = true;
    done.restored += 1;
    Ok(())
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
