//! The export module's error: every way writing, reading back or
//! re-deriving training data can fail, each naming what it was doing.

use std::path::PathBuf;

use polar_trajectory::{InvariantViolation, RewardError};

use super::source::SourceError;

/// Why an export (or reading an export back) failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A local file or directory operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (`creating`, `writing`, `syncing`, ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Arrow could not assemble a record batch (a bug, or more than 2 GiB
    /// in one list column of one session).
    #[error("building the Arrow batch: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// Parquet encoding or decoding failed.
    #[error("Parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A JSON value could not be encoded or decoded.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The object store refused an operation.
    #[error("object store {action} {location}: {source}")]
    ObjectStore {
        /// What was being done (`put`, `multipart upload`, `complete`, ...).
        action: &'static str,
        /// The object.
        location: String,
        /// The cause.
        #[source]
        source: object_store::Error,
    },
    /// The destination is not a usable directory or `s3://bucket/prefix`
    /// URL, or its options are inconsistent.
    #[error("invalid destination {destination:?}: {why}")]
    Destination {
        /// The destination as given.
        destination: String,
        /// What is wrong with it.
        why: String,
    },
    /// An exported file does not follow the export schema (reading back).
    #[error("not an export of schema version {version}: {detail}")]
    Schema {
        /// The schema version expected.
        version: u32,
        /// What does not match.
        detail: String,
    },
    /// A trajectory pushed into a batch file belongs to another task than
    /// the file's partition.
    #[error("session {session} of task {task:?} pushed into the partition of task {partition:?}")]
    WrongPartition {
        /// The session.
        session: String,
        /// Its task.
        task: Option<String>,
        /// The partition's task.
        partition: Option<String>,
    },
    /// The directory given to `--from` is not an export root.
    #[error(
        "{} is not an export root: {why} (expected the --out directory of an export, \
         holding task=<task>/<session>.calls.jsonl.zst){}",
        dir.display(),
        if *state_dir { "; it holds sessions/ like a state directory: use --state-dir" } else { "" }
    )]
    NotExportRoot {
        /// The directory.
        dir: PathBuf,
        /// What is missing.
        why: &'static str,
        /// Whether it looks like a state directory instead.
        state_dir: bool,
    },
    /// A session's log could not be read.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The rebuilt trajectory breaks an invariant: it is not exported.
    #[error("session {session}: rebuilt trajectory is invalid: {source}")]
    Invariant {
        /// The session.
        session: String,
        /// The broken invariant.
        #[source]
        source: InvariantViolation,
    },
    /// The session's recorded rewards do not fit its traces.
    #[error("session {session}: {source}")]
    Reward {
        /// The session.
        session: String,
        /// Why.
        #[source]
        source: RewardError,
    },
    /// A calls file could not be encoded or read.
    #[error(transparent)]
    Calls(#[from] super::calls::CallsError),
    /// The command-line options are inconsistent.
    #[error("{0}")]
    Usage(String),
    /// A blocking task panicked or was cancelled.
    #[error("background {0} task failed")]
    Join(&'static str),
}

impl ExportError {
    /// An I/O error on `path`.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// An object store error on `location`.
    pub(crate) fn store(
        action: &'static str,
        location: impl ToString,
        source: object_store::Error,
    ) -> Self {
        Self::ObjectStore {
            action,
            location: location.to_string(),
            source,
        }
    }
}
