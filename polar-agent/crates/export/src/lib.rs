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
//! (atomic files and objects; bounded reads of one object), `dest`
//! (destinations), `writer` (the
//! [`Exporter`]), `rebuild` (records to a checked trajectory), `source`
//! (session logs), `cli` (`polar export`).
//!
//! The only crate that depends on `arrow-*`, `parquet` and `object_store`
//! (checked by `cargo xtask layers`); above `polar-capture-log` (the logs it
//! reads; not the agent's writer, nor its inference client) and
//! `polar-trajectory`; it must not know the agent (`polar
//! export`'s configuration is resolved by the CLI). Tests: `tests.rs` and
//! the agent's `tests/export/` (local, S3 against moto, pyarrow/datasets
//! readers).
#![deny(unsafe_op_in_unsafe_fn)]

mod batch;
pub mod calls;
pub mod cli;
mod dest;
mod error;
pub mod exported;
mod format;
mod local;
pub mod memory;
pub mod object;
mod partition;
pub mod rebuild;
mod row;
pub mod sample;
mod schema;
pub mod source;
mod writer;

#[cfg(test)]
mod exported_tests;
#[cfg(test)]
mod nothing_tests;
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
