//! The two file formats and their streaming encoders. An [`Encoder`] takes
//! one trajectory at a time and hands back the bytes to append to the file
//! (for Parquet, one row group per trajectory), so a file of many sessions
//! is written with the memory of one.

use std::fmt;

use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use serde::{Deserialize, Serialize};

use polar_trajectory::Trajectory;

use super::batch::{batch_rows, record_batch};
use super::error::ExportError;
use super::row::{Row, rows};
use super::schema::{
    DICTIONARY_COLUMNS, EXPORT_SCHEMA_VERSION, META_SCHEMA_VERSION, META_TRAJECTORY_VERSION,
    arrow_schema,
};

/// A file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// One JSON object per line, one line per trace.
    Jsonl,
    /// Apache Parquet, one row per trace, one row group per session.
    Parquet,
}

impl Format {
    /// The file extension (without the dot).
    pub fn extension(self) -> &'static str {
        match self {
            Self::Jsonl => "jsonl",
            Self::Parquet => "parquet",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.extension())
    }
}

/// Parquet compression codec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ParquetCompression {
    /// Snappy: fast, read by every Parquet reader.
    #[default]
    Snappy,
    /// No compression.
    None,
}

/// Parquet leaf columns written without statistics.
pub const NO_STATISTICS_COLUMNS: &[&[&str]] = &[
    &["prompt_ids", "list", "item"],
    &["response_ids", "list", "item"],
    &["loss_mask", "list", "item"],
    &["response_logprobs", "list", "item"],
    &["prompt_messages"],
    &["response_messages"],
    &["tools"],
    &["trace_metadata"],
    &["trajectory_metadata"],
    &["stats"],
];

/// A streaming encoder of one file.
pub enum Encoder {
    /// JSONL: stateless.
    Jsonl,
    /// Parquet: the writer (its sink is drained after every trajectory).
    Parquet(Box<ArrowWriter<Vec<u8>>>),
}

impl fmt::Debug for Encoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Jsonl => f.write_str("Encoder::Jsonl"),
            Self::Parquet(_) => f.write_str("Encoder::Parquet"),
        }
    }
}

/// The writer properties of an export.
pub fn writer_properties(compression: ParquetCompression) -> WriterProperties {
    let codec = match compression {
        ParquetCompression::Snappy => Compression::SNAPPY,
        ParquetCompression::None => Compression::UNCOMPRESSED,
    };
    let mut props = WriterProperties::builder()
        .set_compression(codec)
        // Token ids, masks, logprobs and message JSON have few repeats:
        // dictionaries would only be built to be thrown away.
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_max_row_group_row_count(None)
        .set_created_by(format!("polar {}", env!("CARGO_PKG_VERSION")))
        .set_key_value_metadata(Some(vec![
            KeyValue::new(
                META_SCHEMA_VERSION.to_owned(),
                EXPORT_SCHEMA_VERSION.to_string(),
            ),
            KeyValue::new(
                META_TRAJECTORY_VERSION.to_owned(),
                polar_trajectory::SCHEMA_VERSION.to_string(),
            ),
        ]));
    for c in DICTIONARY_COLUMNS {
        props = props.set_column_dictionary_enabled(ColumnPath::from(*c), true);
    }
    // Min/max of token lists and message JSON filter nothing: skip them.
    for c in NO_STATISTICS_COLUMNS {
        props = props.set_column_statistics_enabled(
            ColumnPath::new(c.iter().map(|p| (*p).to_owned()).collect()),
            EnabledStatistics::None,
        );
    }
    props.build()
}

impl Encoder {
    /// A fresh encoder for `format`.
    pub fn new(format: Format, compression: ParquetCompression) -> Result<Self, ExportError> {
        Ok(match format {
            Format::Jsonl => Self::Jsonl,
            Format::Parquet => Self::Parquet(Box::new(ArrowWriter::try_new(
                Vec::new(),
                arrow_schema(),
                Some(writer_properties(compression)),
            )?)),
        })
    }

    /// Encodes `traj`; returns the bytes to append to the file.
    pub fn push(&mut self, traj: &Trajectory) -> Result<Vec<u8>, ExportError> {
        match self {
            Self::Jsonl => jsonl(traj),
            Self::Parquet(w) => {
                w.write(&record_batch(traj)?)?;
                w.flush()?;
                drain(w)
            }
        }
    }

    /// Ends the file; returns its last bytes (the Parquet footer).
    pub fn finish(self) -> Result<Vec<u8>, ExportError> {
        match self {
            Self::Jsonl => Ok(Vec::new()),
            Self::Parquet(mut w) => {
                w.finish()?;
                drain(&mut w)
            }
        }
    }
}

/// Takes what the writer has produced so far. The writer counts offsets
/// itself and never seeks, so emptying its sink is safe.
fn drain(w: &mut ArrowWriter<Vec<u8>>) -> Result<Vec<u8>, ExportError> {
    w.sync()
        .map_err(|e| ExportError::Parquet(parquet::errors::ParquetError::External(Box::new(e))))?;
    Ok(std::mem::take(w.inner_mut()))
}

/// The JSONL lines of `traj`.
pub fn jsonl(traj: &Trajectory) -> Result<Vec<u8>, ExportError> {
    let mut out = Vec::with_capacity(estimated_size(traj));
    for row in rows(traj) {
        serde_json::to_writer(&mut out, &row)?;
        out.push(b'\n');
    }
    Ok(out)
}

fn estimated_size(traj: &Trajectory) -> usize {
    traj.traces
        .iter()
        .map(|t| 8 * (t.prompt_ids.len() + t.response_ids.len()) + 4096)
        .sum()
}

/// Reads the rows of a JSONL export.
pub fn read_jsonl(bytes: &[u8]) -> Result<Vec<Row<'static>>, ExportError> {
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .map(|l| serde_json::from_slice(l).map_err(ExportError::from))
        .collect()
}

/// Reads the rows of a Parquet export, checking its schema version.
pub fn read_parquet(bytes: bytes::Bytes) -> Result<Vec<Row<'static>>, ExportError> {
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)?;
    let version = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|k| k.key == META_SCHEMA_VERSION))
        .and_then(|k| k.value.as_deref())
        .and_then(|v| v.parse::<u32>().ok());
    if version != Some(EXPORT_SCHEMA_VERSION) {
        return Err(ExportError::Schema {
            version: EXPORT_SCHEMA_VERSION,
            detail: format!("file metadata {META_SCHEMA_VERSION} is {version:?}"),
        });
    }
    let mut out = Vec::new();
    for batch in builder.build()? {
        out.extend(batch_rows(&batch?)?);
    }
    Ok(out)
}
