//! Export of training data: trajectories to JSONL and Parquet files of a
//! documented, versioned schema (`docs/EXPORT-SCHEMA.md`), one row per
//! trace, partitioned by task (`<root>/task=<task_id>/<session>.<ext>`),
//! written atomically to a local directory (NFS and Lustre included) or an
//! S3-compatible store, one session at a time; and `polar export`, which
//! re-derives that data from captured session logs with any builder.
//!
//! Layout: `schema` (columns and version), `row` (one trace as a row, and
//! back), `batch` (rows to Arrow), `format` (streaming JSONL and Parquet
//! encoders, readers), `partition` (file names), `local` and `object`
//! (atomic files and objects), `dest` (destinations), `writer` (the
//! [`Exporter`]), `rebuild` (records to a checked trajectory), `source`
//! (session logs), `cli` (`polar export`).

mod batch;
pub mod cli;
pub mod dest;
mod error;
pub mod format;
pub mod local;
pub mod memory;
pub mod object;
pub mod partition;
pub mod rebuild;
pub mod row;
pub mod sample;
pub mod schema;
pub mod source;
pub mod writer;

#[cfg(test)]
mod tests;

pub use batch::{batch_rows, record_batch};
pub use cli::{ExportArgs, FailedSession, Summary, run};
pub use dest::{Destination, S3Options};
pub use error::ExportError;
pub use format::{Format, ParquetCompression, read_jsonl, read_parquet};
pub use rebuild::rebuild;
pub use row::{Row, trajectories};
pub use schema::{COLUMNS, EXPORT_SCHEMA_VERSION, arrow_schema};
pub use source::SourceError;
pub use writer::{
    BatchFile, ExportCounters, ExportOptions, Exporter, PendingCommit, Pipeline, WrittenFile,
};
