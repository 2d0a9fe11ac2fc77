//! Appending to the durable per-session capture log,
//! `<state_dir>/sessions/<session>/calls.jsonl`: JSON lines holding one
//! record per call, written whole or in two parts (the lines' format and
//! their reader are `polar-capture-log`'s).
//!
//! Writing ([`LogFile`]): the file is opened with `O_APPEND`; each line is
//! written with one `write` call. A call's whole record or completion is
//! then made durable per the store's [`Durability`] before the caller may
//! send the last byte of the reply: with [`Durability::Power`] (the
//! default) the line is also appended, as a frame naming the log and the
//! line's offset, to the agent's journal ([`super::journal`]), and the
//! caller waits for a `fdatasync` of the journal begun after that write
//! (group commit, [`super::sync`]: one sync per round, however many
//! sessions end together); the log itself is synced off the calls' path,
//! and the start-up replay ([`super::replay`]) restores from the journal
//! what a power loss took from it. So a power loss loses at most the calls
//! in flight, whose replies the harness never saw complete. With
//! [`Durability::Process`] the write alone (in the kernel's page cache:
//! the agent's crash or SIGKILL loses nothing the harness saw complete, a
//! power loss may). A request part is only written (and journaled): the
//! sync of its call's completion, later in the journal, covers it.
//!
//! Opening a log for appending cuts a torn tail off first, so the next
//! line starts on a line of its own.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use super::frame::{self, FileKey};
use super::sync::{GroupCommit, SyncResult};
use polar_capture_log::LogError;
use polar_ids::SessionId;

/// What a call's record survives once the harness may see its reply
/// complete (`agent.capture_durability`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// A power loss: the record's line is `fdatasync`ed before the reply's
    /// last bytes are released, syncs shared by the calls that end together
    /// (group commit).
    #[default]
    Power,
    /// The agent's crash or SIGKILL, not a power loss: the line is written
    /// (to the page cache), not synced.
    Process,
}

/// A line written to a [`LogFile`], to wait on with [`LogFile::when_durable`]:
/// the journal's position after its frame (0 without a journal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a written line is not durable until `LogFile::when_durable` says so"]
pub struct Written(pub(crate) u64);

/// Numbers the open logs (the journal's list of logs to sync).
static LOG_IDS: AtomicU64 = AtomicU64::new(1);

/// A log's lines also go to the journal ([`Durability::Power`]).
#[derive(Debug)]
pub struct Journaled {
    /// The syncing thread and its journal.
    pub commit: GroupCommit,
    /// The session whose log it is (the frames name it).
    pub session: SessionId,
}

/// The error, if any, of the syncing thread's `answer` for a line of the
/// log at `path`.
fn sync_answer(
    path: &Path,
    answer: Result<SyncResult, oneshot::error::RecvError>,
) -> Result<(), LogError> {
    match answer {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(LogError::io(
            "syncing the capture journal for",
            path,
            std::io::Error::new(e.kind(), e.to_string()),
        )),
        // The thread drops a round's answers only if it panicked.
        Err(_) => Err(LogError::Task(
            "the capture log's syncing thread ended".into(),
        )),
    }
}

/// What the writer knows of the file, held while writing.
#[derive(Debug)]
struct WriteState {
    /// The file's length: where the next line starts.
    len: u64,
    /// A write failed part way, leaving a line without its newline that
    /// the next write must end first.
    broken: bool,
}

/// An open log, appended to with one write per line; shared by the calls
/// of a session (writes are serialized, syncs shared: [`super::sync`]).
#[derive(Debug)]
pub struct LogFile {
    path: Arc<Path>,
    pub(crate) file: Arc<File>,
    /// The journal; `None`: lines are written, not synced
    /// ([`Durability::Process`]).
    journal: Option<Journaled>,
    /// The file's identity, as the journal's frames name it.
    key: FileKey,
    /// This open log's number.
    id: u64,
    writing: Mutex<WriteState>,
}

impl LogFile {
    /// Opens (creating) the log at `path` for appending, after cutting off a
    /// torn last line; its lines also go to `journal` when there is one.
    /// Returns the file and the bytes it held before, for rebuilding state.
    /// Blocking.
    pub fn open(path: &Path, journal: Option<Journaled>) -> Result<(Self, Vec<u8>), LogError> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(|e| LogError::io("opening", path, e))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| LogError::io("reading", path, e))?;
        if let Some(last) = bytes.last()
            && *last != b'\n'
        {
            let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            tracing::warn!(
                log = %path.display(),
                offset = keep,
                torn_bytes = bytes.len() - keep,
                "cutting a torn last line off the capture log"
            );
            file.set_len(keep as u64)
                .map_err(|e| LogError::io("truncating", path, e))?;
            file.sync_all()
                .map_err(|e| LogError::io("syncing", path, e))?;
            bytes.truncate(keep);
        }
        file.seek(SeekFrom::End(0))
            .map_err(|e| LogError::io("seeking", path, e))?;
        let key = FileKey::of(&file).map_err(|e| LogError::io("inspecting", path, e))?;
        Ok((
            Self {
                path: path.into(),
                file: Arc::new(file),
                journal,
                key,
                id: LOG_IDS.fetch_add(1, Ordering::Relaxed),
                writing: Mutex::new(WriteState {
                    len: bytes.len() as u64,
                    broken: false,
                }),
            },
            bytes,
        ))
    }

    /// Appends one encoded line (ending with its newline) with a single
    /// write, then buffers its frame for the journal (when there is one); it is not
    /// durable before [`LogFile::when_durable`] says so. After a write that
    /// failed part way, the next line starts with a newline, so only the
    /// broken line is lost. Blocking.
    pub fn append_line(&self, line: &[u8]) -> Result<Written, LogError> {
        let mut state = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let mended;
        let bytes = if state.broken {
            mended = [b"\n".as_slice(), line].concat();
            &mended[..]
        } else {
            line
        };
        let offset = state.len;
        if let Err(e) = (&*self.file).write_all(bytes) {
            state.broken = true;
            // Where the next line starts: after what did land.
            state.len = self.file.metadata().map_or(offset, |m| m.len());
            return Err(LogError::io("appending to", &self.path, e));
        }
        state.broken = false;
        state.len = offset + bytes.len() as u64;
        let Some(j) = &self.journal else {
            return Ok(Written(0));
        };
        // Still under the log's lock: the journal's frames of a log follow
        // its order.
        let prefix = frame::encode_prefix(&j.session, self.key, offset, bytes);
        j.commit
            .append(self.id, &self.file, &prefix, bytes)
            .map(Written)
            .map_err(|e| LogError::io("appending to the capture journal for", &self.path, e))
    }

    /// Waits on a blocking thread until `written` is as durable as the
    /// log's [`Durability`] promises: covered by a sync of the journal that
    /// returned, or written at all (the agent waits without a thread:
    /// [`LogFile::when_durable`]).
    #[cfg(feature = "bench")]
    pub fn durable_blocking(&self, written: Written) -> Result<(), LogError> {
        match self.register(written) {
            None => Ok(()),
            Some(rx) => sync_answer(&self.path, rx.blocking_recv()),
        }
    }

    #[cfg(any(test, feature = "bench"))]
    pub(crate) fn register(&self, written: Written) -> Option<oneshot::Receiver<SyncResult>> {
        self.journal.as_ref()?.commit.register(written.0)
    }

    /// Calls `answer` once `written` is as durable as the log's
    /// [`Durability`] promises: at once, or on the syncing thread (quick
    /// work only).
    pub(crate) fn when_durable(
        &self,
        written: Written,
        answer: impl FnOnce(Result<(), LogError>) + Send + 'static,
    ) {
        let Some(j) = &self.journal else {
            return answer(Ok(()));
        };
        let path = Arc::clone(&self.path);
        j.commit.on_durable(
            written.0,
            Box::new(move |result| answer(sync_answer(&path, Ok(result)))),
        );
    }

    /// Asks for the log to be synced off the calls' path (its session
    /// ended): the journal then need not keep its lines.
    pub fn retire(&self) {
        if let Some(j) = &self.journal {
            j.commit.retire(self.id);
        }
    }

    /// The file's path.
    #[cfg(any(test, feature = "bench"))]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
#[path = "log_tests.rs"]
pub(crate) mod tests;
