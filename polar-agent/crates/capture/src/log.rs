//! The durable per-session capture log,
//! `<state_dir>/sessions/<session>/calls.jsonl`: JSON lines holding one
//! [`CompletionRecord`] per call, written whole or in two parts.
//!
//! Lines ([`super::encode`] writes them, [`super::lines`] reads them):
//!
//! - a **whole record**: the [`CompletionRecord`] as one line (no `part`
//!   field). Calls whose reply came whole from the backend, calls that
//!   failed before the backend's first event, and every fallback.
//! - a **request part** (`{"part":"request",...}`): the call's big fields
//!   (`native_request`, `request`, and `prompt_token_ids` when known),
//!   appended while the backend generates, off the reply's path.
//! - a **completion** (`{"part":"completion",...}`): the record's other
//!   fields, appended when the call ends. Its big fields are in the request
//!   part with the same `call_id`, earlier in the file; a
//!   `prompt_token_ids` of its own (an array, or `null` for none) replaces
//!   the part's.
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
//! Reading ([`read_log`], [`parse_calls`], [`parse_log`]), streaming, for
//! the agent and `polar export` alike: never panics; one record per whole
//! line or completion, in file order, a completion joined with its request
//! part. A last line without its newline is torn (a crash mid-write):
//! everything before it is returned with a [`LogProblem::TornTail`]
//! warning. A line that is not a record, or a completion without its
//! request part, is reported with its line number and byte offset and
//! skipped; so is a request part whose call never ended
//! ([`LogProblem::Unfinished`]). A whole record supersedes a request part
//! of the same call (the fallback after a part whose sync failed). Opening
//! a log for appending cuts a torn tail off first, so the next line starts
//! on a line of its own.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use super::frame::{self, FileKey};
use super::lines::{Joiner, LogLine, parse_line};
use super::sync::{GroupCommit, SyncResult};
use polar_ids::SessionId;
use polar_record::CompletionRecord;

/// Name of the record file inside a session directory.
pub const CALLS_FILE: &str = "calls.jsonl";

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

/// Errors of the capture log and store.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A file or directory operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A record could not be serialized (a bug).
    #[error("serializing a record: {0}")]
    Serialize(#[from] serde_json::Error),
    /// A blocking task was cancelled or panicked.
    #[error("the log writer task failed: {0}")]
    Task(String),
}

impl LogError {
    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}

/// Something wrong found while reading a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogProblem {
    /// The last line has no newline: a line torn by a crash mid-write.
    /// It is not returned.
    TornTail {
        /// Its line number (from 1).
        line: usize,
        /// Byte offset of its start.
        offset: u64,
        /// Its length in bytes.
        len: usize,
    },
    /// A complete line that is not a record, or a completion whose request
    /// part is not before it (skipped).
    Malformed {
        /// Its line number (from 1).
        line: usize,
        /// Byte offset of its start.
        offset: u64,
        /// Why it is not a record.
        reason: String,
    },
    /// A call's request part with no completion after it: the call never
    /// ended (the agent stopped mid-call, or the harness of a call answered
    /// whole left before its reply). It is not a record.
    Unfinished {
        /// The request part's line number (from 1).
        line: usize,
        /// Byte offset of its start.
        offset: u64,
        /// The call.
        call_id: String,
    },
}

impl LogProblem {
    /// The line it is about.
    pub fn line(&self) -> usize {
        match self {
            Self::TornTail { line, .. }
            | Self::Malformed { line, .. }
            | Self::Unfinished { line, .. } => *line,
        }
    }
}

impl std::fmt::Display for LogProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TornTail { line, offset, len } => write!(
                f,
                "line {line} (byte {offset}): torn last line ({len} bytes, no newline), ignored"
            ),
            Self::Malformed {
                line,
                offset,
                reason,
            } => write!(f, "line {line} (byte {offset}): not a record: {reason}"),
            Self::Unfinished {
                line,
                offset,
                call_id,
            } => write!(
                f,
                "line {line} (byte {offset}): the request of call {call_id}, which never ended, ignored"
            ),
        }
    }
}

/// Reads a log line by line from `reader`: the records in the order of
/// their whole lines and completions, and the problems found, in line
/// order. Only one line is held at a time besides the records and the
/// request parts still waiting for their completion (`polar export` reads
/// logs of hundreds of megabytes this way).
pub fn parse_calls(
    mut reader: impl BufRead,
) -> std::io::Result<(Vec<CompletionRecord>, Vec<LogProblem>)> {
    let mut records = Vec::new();
    let mut problems = Vec::new();
    let mut join = Joiner::default();
    let mut buf = Vec::new();
    let mut offset = 0u64;
    let mut line = 0usize;
    loop {
        buf.clear();
        let len = reader.read_until(b'\n', &mut buf)?;
        if len == 0 {
            break;
        }
        line += 1;
        if buf.last() != Some(&b'\n') {
            problems.push(LogProblem::TornTail { line, offset, len });
            break;
        }
        if !buf.iter().all(u8::is_ascii_whitespace) {
            let malformed = |reason: String| LogProblem::Malformed {
                line,
                offset,
                reason,
            };
            match parse_line(&buf) {
                Ok(LogLine::Whole(r)) => {
                    join.superseded(&r.call_id);
                    records.push(*r);
                }
                Ok(LogLine::Request(part)) => {
                    if let Some(p) = join.request(*part, line, offset) {
                        problems.push(p);
                    }
                }
                Ok(LogLine::Completion(c)) => match join.complete(*c) {
                    Ok(r) => records.push(r),
                    Err(reason) => problems.push(malformed(reason)),
                },
                Err(e) => problems.push(malformed(e.to_string())),
            }
        }
        offset += len as u64;
    }
    problems.extend(join.unfinished());
    problems.sort_by_key(LogProblem::line);
    Ok((records, problems))
}

/// Parses a log's bytes (see [`parse_calls`]).
pub fn parse_log(bytes: &[u8]) -> (Vec<CompletionRecord>, Vec<LogProblem>) {
    // Reading from a slice cannot fail.
    parse_calls(bytes).unwrap_or_default()
}

/// Reads the log at `path` (see [`parse_calls`]); problems are also logged
/// as warnings.
pub fn read_log(path: &Path) -> Result<(Vec<CompletionRecord>, Vec<LogProblem>), LogError> {
    let file = File::open(path).map_err(|e| LogError::io("opening", path, e))?;
    let (records, problems) = parse_calls(BufReader::with_capacity(1 << 20, file))
        .map_err(|e| LogError::io("reading", path, e))?;
    for p in &problems {
        tracing::warn!(log = %path.display(), problem = %p, "capture log");
    }
    Ok((records, problems))
}

/// One record as its whole log line (JSON and a newline); see
/// [`super::encode`] for lines with parts serialized ahead and for the two
/// parts.
pub fn encode_line(record: &CompletionRecord) -> Result<Vec<u8>, LogError> {
    let mut line = serde_json::to_vec(record)?;
    line.push(b'\n');
    Ok(line)
}

/// A line written to a [`LogFile`], to wait on with [`LogFile::durable`]:
/// the journal's position after its frame (0 without a journal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a written line is not durable until `LogFile::durable` says so"]
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
    /// durable before [`LogFile::durable`] says so. After a write that
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

    /// Waits, without holding a thread, until `written` is as durable as
    /// the log's [`Durability`] promises: covered by a sync of the journal
    /// that returned, or written at all.
    pub async fn durable(&self, written: Written) -> Result<(), LogError> {
        match self.register(written) {
            None => Ok(()),
            Some(rx) => sync_answer(&self.path, rx.await),
        }
    }

    /// [`LogFile::durable`] for a blocking thread.
    pub fn durable_blocking(&self, written: Written) -> Result<(), LogError> {
        match self.register(written) {
            None => Ok(()),
            Some(rx) => sync_answer(&self.path, rx.blocking_recv()),
        }
    }

    pub(crate) fn register(&self, written: Written) -> Option<oneshot::Receiver<SyncResult>> {
        self.journal.as_ref()?.commit.register(written.0)
    }

    /// Calls `answer` once `written` is as durable as [`LogFile::durable`]
    /// waits for: at once, or on the syncing thread (quick work only).
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
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Makes a directory entry durable (after creating or renaming in it).
pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LogError::io("syncing directory", dir, e))
}

#[cfg(test)]
#[path = "log_tests.rs"]
pub(crate) mod tests;
