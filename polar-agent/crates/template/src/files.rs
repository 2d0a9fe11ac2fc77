//! Where a model's tokenizer and chat template live, and reading them: a
//! model directory as vLLM and SGLang load it (`tokenizer.json`,
//! `tokenizer_config.json`, optional `chat_template.jinja`,
//! `generation_config.json`, `config.json`) or the files named one by one.
//! This is the crate's only file I/O; everything after it works on the
//! text read here.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The tokenizer.
pub const TOKENIZER: &str = "tokenizer.json";
/// Special tokens and, usually, the chat template.
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// The chat template on its own (newer models); it wins over
/// `tokenizer_config.json`'s `chat_template`, as in transformers.
pub const CHAT_TEMPLATE: &str = "chat_template.jinja";
/// `eos_token_id`: the ids generation stops at.
pub const GENERATION_CONFIG: &str = "generation_config.json";
/// `max_position_embeddings`: the context length.
pub const CONFIG: &str = "config.json";

/// Why a model's files could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// A file is missing or unreadable.
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file does not parse, or is not an object.
    #[error("{}: not a JSON object: {reason}", path.display())]
    Json { path: PathBuf, reason: String },
}

/// The files of one model. Optional files that are absent are `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFiles {
    pub tokenizer: PathBuf,
    pub tokenizer_config: PathBuf,
    /// A `chat_template.jinja`, used instead of `tokenizer_config.json`'s
    /// `chat_template`.
    pub chat_template: Option<PathBuf>,
    pub generation_config: Option<PathBuf>,
    pub config: Option<PathBuf>,
    /// Which of several named templates (`tokenizer_config.json`'s list of
    /// `{name, template}`) to use; `None` is `default`.
    pub template_name: Option<String>,
}

impl ModelFiles {
    /// The files of a model directory: `tokenizer.json` and
    /// `tokenizer_config.json` (checked when loaded), and the optional
    /// ones that exist.
    pub fn from_dir(dir: &Path) -> Self {
        let optional = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
        Self {
            tokenizer: dir.join(TOKENIZER),
            tokenizer_config: dir.join(TOKENIZER_CONFIG),
            chat_template: optional(CHAT_TEMPLATE),
            generation_config: optional(GENERATION_CONFIG),
            config: optional(CONFIG),
            template_name: None,
        }
    }

    /// The same files with a named template (`tool_use`, ...).
    pub fn with_template_name(mut self, name: impl Into<String>) -> Self {
        self.template_name = Some(name.into());
        self
    }
}

/// A file's text.
pub fn read_text(path: &Path) -> Result<String, FilesError> {
    std::fs::read_to_string(path).map_err(|source| FilesError::Read {
        path: path.to_owned(),
        source,
    })
}

/// A JSON object file.
pub fn read_object(path: &Path) -> Result<serde_json::Map<String, Value>, FilesError> {
    let text = read_text(path)?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(FilesError::Json {
            path: path.to_owned(),
            reason: format!("the top level is {}", kind(&other)),
        }),
        Err(e) => Err(FilesError::Json {
            path: path.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// The JSON kind of a value, for messages.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
