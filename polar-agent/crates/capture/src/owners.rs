//! Which agent owns which capture journal. Several agents may share a
//! state directory (one `polar sandbox run` per task, side by side), so
//! each store in [`super::Durability::Power`] writes a journal of its own:
//! a directory `<state_dir>/capture-journal/<pid>-<start time>/` holding
//! its segments and a `lock` file the store keeps under an exclusive
//! `flock` for its whole life. The kernel lets go of the lock when the
//! process ends, however it ends, so a journal whose lock can be taken is
//! one its agent left (a crash, a power loss, a kill): the next agent to
//! start replays it ([`super::replay`]) and removes it. A journal still
//! locked is a live agent's, and is left alone.
//!
//! The set of journal directories changes only under the exclusive
//! `flock` of `capture-journal/lock`, held while an agent replays the
//! journals it found and makes its own, and while an agent removes its own
//! at a clean close: no agent replays a journal another is making, or
//! removes one another is reading.
//!
//! Segments left directly in `capture-journal/` (the layout before
//! journals had owners) are replayed as one more left journal.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::dir::sync_dir;
use polar_capture_log::LogError;

/// The name of the lock files: the directory set's, in the journals'
/// root, and each journal's own.
pub const LOCK_FILE: &str = "lock";

/// The exclusive lock of the journals' root: while held, no journal
/// directory is made or removed by another agent.
pub(crate) struct RootLock {
    root: PathBuf,
    _lock: Flock<File>,
}

/// A journal directory left by an agent that is gone: its lock, held
/// while it is replayed (`None`: the agent died before making it).
pub(crate) struct Left {
    pub(crate) dir: PathBuf,
    _lock: Option<Flock<File>>,
}

/// This store's journal directory, locked.
#[derive(Debug)]
pub(crate) struct OwnJournal {
    dir: PathBuf,
    root: PathBuf,
    lock: Option<Flock<File>>,
}

/// Opens `path` (made if missing when `create`) for an exclusive lock
/// taken with `arg`.
fn flock(path: &Path, create: bool, arg: FlockArg) -> io::Result<Flock<File>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(path)?;
    Flock::lock(file, arg).map_err(|(_, e)| io::Error::from(e))
}

/// Opens `path` (made if missing) and locks it exclusively, waiting while
/// another holds it. Blocking.
fn lock_file(path: &Path) -> Result<Flock<File>, LogError> {
    flock(path, true, FlockArg::LockExclusive).map_err(|e| LogError::io("locking", path, e))
}

/// Locks the existing `path` exclusively if no one holds it: `Ok(None)`
/// if another does.
fn try_lock_file(path: &Path) -> io::Result<Option<Flock<File>>> {
    match flock(path, false, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err(e) if e.raw_os_error() == Some(Errno::EWOULDBLOCK as i32) => Ok(None),
        Err(e) => Err(e),
    }
}

impl RootLock {
    /// Locks the journals' root `root`, made first if missing. Waits while
    /// another agent holds it. Blocking.
    pub(crate) fn take(root: &Path) -> Result<Self, LogError> {
        std::fs::create_dir_all(root).map_err(|e| LogError::io("creating", root, e))?;
        Ok(Self {
            root: root.to_owned(),
            _lock: lock_file(&root.join(LOCK_FILE))?,
        })
    }

    /// [`RootLock::take`], but `None` when there is no root (no journal to
    /// replay or remove).
    pub(crate) fn take_existing(root: &Path) -> Result<Option<Self>, LogError> {
        if root.is_dir() {
            Self::take(root).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The journals left by agents that are gone, oldest name first: every
    /// directory of the root whose lock is free (taken, and held by each
    /// [`Left`]), and the root itself when segments lie in it.
    pub(crate) fn left(&self) -> Result<Vec<Left>, LogError> {
        let root = &self.root;
        let entries = std::fs::read_dir(root).map_err(|e| LogError::io("listing", root, e))?;
        let mut dirs = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| LogError::io("listing", root, e))?;
            let file_type = entry
                .file_type()
                .map_err(|e| LogError::io("listing", root, e))?;
            if file_type.is_dir() {
                dirs.push(entry.path());
            }
        }
        dirs.sort();
        let mut left = vec![Left {
            dir: root.clone(),
            _lock: None,
        }];
        for dir in dirs {
            let path = dir.join(LOCK_FILE);
            match try_lock_file(&path) {
                Ok(Some(lock)) => left.push(Left {
                    dir,
                    _lock: Some(lock),
                }),
                // A live agent's.
                Ok(None) => {}
                // Its agent died between making it and locking it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    left.push(Left { dir, _lock: None });
                }
                Err(e) => return Err(LogError::io("locking", &path, e)),
            }
        }
        Ok(left)
    }

    /// Removes a left journal whose segments are replayed and removed (the
    /// root's own segments leave the root in place).
    pub(crate) fn remove(&self, left: Left) -> Result<(), LogError> {
        if left.dir != self.root {
            remove_dir(&left.dir)?;
        }
        Ok(())
    }

    /// Makes this agent's journal directory and locks it.
    pub(crate) fn make_own(&self) -> Result<OwnJournal, LogError> {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let name = format!("{}-{started:x}", std::process::id());
        let dir = self.root.join(name);
        std::fs::create_dir(&dir).map_err(|e| LogError::io("creating", &dir, e))?;
        // Made under the root's lock: no other agent can hold it.
        let lock = lock_file(&dir.join(LOCK_FILE))?;
        sync_dir(&dir)?;
        sync_dir(&self.root)?;
        Ok(OwnJournal {
            dir,
            root: self.root.clone(),
            lock: Some(lock),
        })
    }
}

/// Removes a journal directory: its lock file, then the directory (which
/// must be empty of segments).
fn remove_dir(dir: &Path) -> Result<(), LogError> {
    let lock = dir.join(LOCK_FILE);
    match std::fs::remove_file(&lock) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(LogError::io("removing", &lock, e)),
    }
    std::fs::remove_dir(dir).map_err(|e| LogError::io("removing", dir, e))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

impl OwnJournal {
    /// The directory of the segments.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Lets go of the lock, as the end of the process would: the journal
    /// is left for the next agent to replay (tests: a crash).
    #[cfg(test)]
    pub(crate) fn abandon(&mut self) {
        self.lock = None;
    }

    /// Removes the directory, its segments all removed: a clean close.
    /// Blocking (waits for the root's lock).
    pub(crate) fn remove(mut self) -> Result<(), LogError> {
        let Some(root) = RootLock::take_existing(&self.root)? else {
            return Ok(());
        };
        remove_dir(&self.dir)?;
        self.lock = None;
        drop(root);
        Ok(())
    }
}
