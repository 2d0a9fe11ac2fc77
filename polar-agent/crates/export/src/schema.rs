//! The export schema: the columns of one exported row (one trace, with its
//! trajectory's columns repeated), their Arrow types, and the version that
//! names this layout. `docs/EXPORT-SCHEMA.md` is the human description of
//! the same list; a test keeps the two in step.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};

/// Version of the export layout, stored in every row (`schema_version`) and
/// in the Parquet file metadata. Bumped when a column is removed, renamed,
/// or changes type or meaning; adding a nullable column does not bump it
/// (readers select columns by name). Version 1 carries trajectory layout
/// [`polar_trajectory::SCHEMA_VERSION`] 1.
pub const EXPORT_SCHEMA_VERSION: u32 = 1;

/// Parquet key-value metadata key holding [`EXPORT_SCHEMA_VERSION`].
pub const META_SCHEMA_VERSION: &str = "polar.export_schema_version";
/// Parquet key-value metadata key holding the trajectory layout version.
pub const META_TRAJECTORY_VERSION: &str = "polar.trajectory_schema_version";

/// The Arrow type of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    /// `uint32`.
    UInt32,
    /// `float64`.
    Float64,
    /// `utf8`.
    Utf8,
    /// `utf8` holding a JSON document (in JSONL: the JSON value itself).
    Json,
    /// `list<uint32>`.
    ListUInt32,
    /// `list<uint8>`.
    ListUInt8,
    /// `list<float32>`.
    ListFloat32,
    /// `list<utf8>`.
    ListUtf8,
}

impl ColumnType {
    /// The Arrow data type.
    pub fn data_type(self) -> DataType {
        match self {
            Self::UInt32 => DataType::UInt32,
            Self::Float64 => DataType::Float64,
            Self::Utf8 | Self::Json => DataType::Utf8,
            Self::ListUInt32 => DataType::List(item_field(DataType::UInt32)),
            Self::ListUInt8 => DataType::List(item_field(DataType::UInt8)),
            Self::ListFloat32 => DataType::List(item_field(DataType::Float32)),
            Self::ListUtf8 => DataType::List(item_field(DataType::Utf8)),
        }
    }

    /// The name used in `docs/EXPORT-SCHEMA.md`.
    pub fn doc_name(self) -> &'static str {
        match self {
            Self::UInt32 => "uint32",
            Self::Float64 => "float64",
            Self::Utf8 => "utf8",
            Self::Json => "utf8 (JSON)",
            Self::ListUInt32 => "list<uint32>",
            Self::ListUInt8 => "list<uint8>",
            Self::ListFloat32 => "list<float32>",
            Self::ListUtf8 => "list<utf8>",
        }
    }
}

/// The element field of every list column: named `item`, never null.
pub fn item_field(data_type: DataType) -> FieldRef {
    Arc::new(Field::new("item", data_type, false))
}

/// One column of the export schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// Its name (also the JSONL key).
    pub name: &'static str,
    /// Its type.
    pub ty: ColumnType,
    /// Whether it may be null.
    pub nullable: bool,
}

const fn col(name: &'static str, ty: ColumnType, nullable: bool) -> Column {
    Column { name, ty, nullable }
}

/// The columns, in file order.
pub const COLUMNS: &[Column] = &[
    col("schema_version", ColumnType::UInt32, false),
    col("trace_id", ColumnType::Utf8, false),
    col("session_id", ColumnType::Utf8, false),
    col("task_id", ColumnType::Utf8, true),
    col("group_id", ColumnType::Utf8, true),
    col("attempt", ColumnType::UInt32, true),
    col("policy_version", ColumnType::Utf8, true),
    col("weight_version", ColumnType::Utf8, true),
    col("status", ColumnType::Utf8, false),
    col("error", ColumnType::Utf8, true),
    col("builder", ColumnType::Utf8, false),
    col("trace_index", ColumnType::UInt32, false),
    col("chain", ColumnType::UInt32, false),
    // Nullable only so that adding it kept the layout version (never null).
    col("chain_role", ColumnType::Utf8, true),
    col("segment", ColumnType::UInt32, false),
    col("segment_kind", ColumnType::Utf8, false),
    col("break_reason", ColumnType::Utf8, true),
    col("labels", ColumnType::ListUtf8, false),
    col("finish_reason", ColumnType::Utf8, true),
    col("reward", ColumnType::Float64, true),
    col("prompt_ids", ColumnType::ListUInt32, false),
    col("response_ids", ColumnType::ListUInt32, false),
    col("loss_mask", ColumnType::ListUInt8, false),
    col("response_logprobs", ColumnType::ListFloat32, true),
    col("prompt_messages", ColumnType::Json, false),
    col("response_messages", ColumnType::Json, false),
    col("tools", ColumnType::Json, false),
    col("call_ids", ColumnType::ListUtf8, false),
    col("trace_metadata", ColumnType::Json, false),
    col("trajectory_metadata", ColumnType::Json, false),
    col("stats", ColumnType::Json, false),
    // Nullable only so that adding it kept the layout version (null in
    // files written before it existed).
    col("off_policy_context_tokens", ColumnType::UInt32, true),
];

/// Flat string columns worth dictionary-encoding in Parquet (few distinct
/// values per file).
pub const DICTIONARY_COLUMNS: &[&str] = &[
    "session_id",
    "task_id",
    "group_id",
    "policy_version",
    "weight_version",
    "status",
    "error",
    "builder",
    "chain_role",
    "segment_kind",
    "break_reason",
    "finish_reason",
    "trajectory_metadata",
    "stats",
];

/// The Arrow schema of an export, with the version metadata.
pub fn arrow_schema() -> SchemaRef {
    let fields: Vec<Field> = COLUMNS
        .iter()
        .map(|c| Field::new(c.name, c.ty.data_type(), c.nullable))
        .collect();
    let metadata = HashMap::from([
        (
            META_SCHEMA_VERSION.to_owned(),
            EXPORT_SCHEMA_VERSION.to_string(),
        ),
        (
            META_TRAJECTORY_VERSION.to_owned(),
            polar_trajectory::SCHEMA_VERSION.to_string(),
        ),
    ]);
    Arc::new(Schema::new_with_metadata(fields, metadata))
}
