//! The capture log's errors: what reading or writing a log can fail with
//! ([`LogError`]), and what a reader finds wrong in a log it still reads
//! ([`LogProblem`]).

use std::path::{Path, PathBuf};

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
    /// An [`LogError::Io`] of `action` on `path`.
    pub fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
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
