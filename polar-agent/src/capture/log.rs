//! The durable per-session capture log: one JSON line per
//! [`CompletionRecord`] in `<state_dir>/sessions/<session>/calls.jsonl`.
//!
//! Writing ([`LogFile`]): the file is opened with `O_APPEND`; each record is
//! serialized with its newline and written with one `write` call, then
//! `fdatasync`ed (unless [`Durability::NoSync`]), before the caller may send
//! the last byte of the reply. A crash loses at most the record being
//! written, whose reply the harness never saw complete.
//!
//! Reading ([`read_log`], [`parse_calls`], [`parse_log`]), streaming, for
//! the agent and `polar export` alike: never panics. A last line without
//! its newline is a torn record (a crash mid-write): everything before it is
//! returned with a [`LogProblem::TornTail`] warning. A line that is not a
//! record is reported with its line number and byte offset and skipped.
//! Opening a log for appending cuts a torn tail off first, so the next
//! record starts on a line of its own.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::record::CompletionRecord;

/// Name of the record file inside a session directory.
pub const CALLS_FILE: &str = "calls.jsonl";

/// Whether appends wait for the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `fdatasync` after every record (the default: nothing acknowledged is
    /// lost).
    #[default]
    Sync,
    /// Leave flushing to the kernel (benchmarks, tests of other things).
    NoSync,
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
    /// The last line has no newline: a record torn by a crash mid-write.
    /// It is not returned.
    TornTail {
        /// Its line number (from 1).
        line: usize,
        /// Byte offset of its start.
        offset: u64,
        /// Its length in bytes.
        len: usize,
    },
    /// A complete line that is not a record (skipped).
    Malformed {
        /// Its line number (from 1).
        line: usize,
        /// Byte offset of its start.
        offset: u64,
        /// Why it is not a record.
        reason: String,
    },
}

impl std::fmt::Display for LogProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TornTail { line, offset, len } => write!(
                f,
                "line {line} (byte {offset}): torn last record ({len} bytes, no newline), ignored"
            ),
            Self::Malformed {
                line,
                offset,
                reason,
            } => write!(f, "line {line} (byte {offset}): not a record: {reason}"),
        }
    }
}

/// Reads a log line by line from `reader`: the records in file order and
/// the problems found. Only one line is held at a time besides the records
/// (`polar export` reads logs of hundreds of megabytes this way).
pub fn parse_calls(
    mut reader: impl BufRead,
) -> std::io::Result<(Vec<CompletionRecord>, Vec<LogProblem>)> {
    let mut records = Vec::new();
    let mut problems = Vec::new();
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
            match serde_json::from_slice::<CompletionRecord>(&buf) {
                Ok(r) => records.push(r),
                Err(e) => problems.push(LogProblem::Malformed {
                    line,
                    offset,
                    reason: e.to_string(),
                }),
            }
        }
        offset += len as u64;
    }
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

/// One record as its log line (JSON and a newline); see
/// [`super::encode::encode_record`] for a line with parts serialized ahead.
pub fn encode_line(record: &CompletionRecord) -> Result<Vec<u8>, LogError> {
    let mut line = serde_json::to_vec(record)?;
    line.push(b'\n');
    Ok(line)
}

/// An open log, appended to with one write per record.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    file: File,
    durability: Durability,
}

impl LogFile {
    /// Opens (creating) the log at `path` for appending, after cutting off a
    /// torn last record. Returns the file and the bytes it held before, for
    /// rebuilding state. Blocking.
    pub fn open(path: &Path, durability: Durability) -> Result<(Self, Vec<u8>), LogError> {
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
                "cutting a torn last record off the capture log"
            );
            file.set_len(keep as u64)
                .map_err(|e| LogError::io("truncating", path, e))?;
            file.sync_all()
                .map_err(|e| LogError::io("syncing", path, e))?;
            bytes.truncate(keep);
        }
        file.seek(SeekFrom::End(0))
            .map_err(|e| LogError::io("seeking", path, e))?;
        Ok((
            Self {
                path: path.to_owned(),
                file,
                durability,
            },
            bytes,
        ))
    }

    /// Appends one encoded line ([`encode_line`]) with a single write and,
    /// unless [`Durability::NoSync`], waits until it is on disk. Blocking.
    pub fn append_line(&mut self, line: &[u8]) -> Result<(), LogError> {
        self.file
            .write_all(line)
            .map_err(|e| LogError::io("appending to", &self.path, e))?;
        if self.durability == Durability::Sync {
            self.file
                .sync_data()
                .map_err(|e| LogError::io("syncing", &self.path, e))?;
        }
        Ok(())
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
