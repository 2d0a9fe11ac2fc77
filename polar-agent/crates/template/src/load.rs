//! Loading a [`Model`] from its [`ModelFiles`], checked once: the
//! tokenizer parses; there is a chat template (the named one of a list)
//! and it compiles; every special token `tokenizer_config.json` names, and
//! every `<|...|>`-style token the template writes, is a token of the
//! tokenizer; the stop ids and context length read. Each error names the
//! file and the key.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use crate::env;
use crate::files::{self, FilesError, ModelFiles};
use crate::model::Model;

/// The special-token keys of `tokenizer_config.json` that transformers
/// puts in `special_tokens_map`, which every template render receives.
pub const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Why a model's files do not make a usable model.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Files(#[from] FilesError),
    /// `tokenizer.json` is not a tokenizer.
    #[error("{}: not a tokenizer: {reason}", path.display())]
    Tokenizer { path: PathBuf, reason: String },
    /// A key has a value of the wrong shape.
    #[error("{}: `{key}`: {reason}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        reason: String,
    },
    /// Neither `chat_template.jinja` nor a `chat_template` key.
    #[error("{}: no `chat_template` (and no chat_template.jinja beside it)", path.display())]
    NoChatTemplate { path: PathBuf },
    /// The template named is not among the file's templates.
    #[error("{}: `chat_template`: no template named {name:?} (there are: {available})", path.display())]
    NoSuchTemplate {
        path: PathBuf,
        name: String,
        available: String,
    },
    /// The template does not compile.
    #[error("{}: `{key}`: template syntax error{}: {reason}", path.display(), line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    TemplateSyntax {
        path: PathBuf,
        key: String,
        line: Option<usize>,
        reason: String,
    },
    /// The template engine's settings were refused (a bug of this crate).
    #[error("setting up the template engine failed: {0}")]
    Engine(String),
    /// A special token of the config is not a token of the tokenizer.
    #[error("{}: `{key}` is {token:?}, which {tokenizer} has no token for", path.display(), tokenizer = tokenizer.display())]
    SpecialTokenMissing {
        path: PathBuf,
        key: String,
        token: String,
        tokenizer: PathBuf,
    },
    /// The template writes a control token the tokenizer does not have:
    /// the template and the tokenizer are of different models.
    #[error("{}: `{key}` writes {token:?}, which {tokenizer} has no token for (template and tokenizer of different models?)", path.display(), tokenizer = tokenizer.display())]
    TemplateTokenMissing {
        path: PathBuf,
        key: String,
        token: String,
        tokenizer: PathBuf,
    },
}

/// A template and where it came from, for errors.
struct Source {
    /// Its name in the environment (`default`, `tool_use`, ...).
    name: String,
    path: PathBuf,
    key: String,
    text: String,
}

/// The model's templates and which of them a render uses.
struct Templates {
    sources: Vec<Source>,
    /// The one used without tools, or always when named.
    default: String,
    /// The one used when tools are given (`tool_use`, unless a template
    /// was named), as transformers' `get_chat_template` picks.
    tool_use: Option<String>,
}

impl Model {
    /// Reads, compiles and checks the model's files.
    pub fn load(files: &ModelFiles) -> Result<Self, LoadError> {
        let tokenizer =
            Tokenizer::from_file(&files.tokenizer).map_err(|e| {
                match std::fs::metadata(&files.tokenizer) {
                    Err(source) => LoadError::Files(FilesError::Read {
                        path: files.tokenizer.clone(),
                        source,
                    }),
                    Ok(_) => LoadError::Tokenizer {
                        path: files.tokenizer.clone(),
                        reason: e.to_string(),
                    },
                }
            })?;
        let config = files::read_object(&files.tokenizer_config)?;
        let templates = chat_templates(files, &config)?;
        let special_tokens = special_tokens(&files.tokenizer_config, &config)?;
        for (key, token) in &special_tokens {
            if tokenizer.token_to_id(token).is_none() {
                return Err(LoadError::SpecialTokenMissing {
                    path: files.tokenizer_config.clone(),
                    key: key.clone(),
                    token: token.clone(),
                    tokenizer: files.tokenizer.clone(),
                });
            }
        }
        for source in &templates.sources {
            if let Some(token) = control_tokens(&source.text)
                .into_iter()
                .find(|t| tokenizer.token_to_id(t).is_none())
            {
                return Err(LoadError::TemplateTokenMissing {
                    path: source.path.clone(),
                    key: source.key.clone(),
                    token: token.to_owned(),
                    tokenizer: files.tokenizer.clone(),
                });
            }
        }
        let mut env = env::environment().map_err(|e| LoadError::Engine(e.to_string()))?;
        for source in templates.sources {
            env::add(&mut env, source.name, &source.text).map_err(|e| {
                LoadError::TemplateSyntax {
                    path: source.path.clone(),
                    key: source.key.clone(),
                    line: e.line(),
                    reason: e.detail().map_or_else(|| e.to_string(), str::to_owned),
                }
            })?;
        }
        let mut stop_ids = match &files.generation_config {
            Some(path) => eos_ids(path, &files::read_object(path)?)?,
            None => Vec::new(),
        };
        if let Some((_, eos)) = special_tokens.iter().find(|(k, _)| k == "eos_token")
            && let Some(id) = tokenizer.token_to_id(eos)
            && !stop_ids.contains(&id)
        {
            stop_ids.push(id);
        }
        let context_len = match &files.config {
            Some(path) => context_len(path, &files::read_object(path)?)?,
            None => None,
        };
        let clean_up_spaces = flag(&config, "clean_up_tokenization_spaces")
            && (!matches!(tokenizer.get_model(), tokenizers::ModelWrapper::BPE(_))
                || flag(
                    &config,
                    "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
                ));
        Ok(Self::new(
            env,
            (templates.default, templates.tool_use),
            tokenizer,
            special_tokens,
            stop_ids,
            context_len,
            clean_up_spaces,
        ))
    }
}

/// The templates: `chat_template.jinja`, else the config's
/// `chat_template`, a string or a list of `{name, template}` (all compiled;
/// the named one used, else `default`, and `tool_use` when tools are
/// given).
fn chat_templates(files: &ModelFiles, config: &Map<String, Value>) -> Result<Templates, LoadError> {
    let single = |path: &Path, key: &str, text: String| Templates {
        sources: vec![Source {
            name: "default".into(),
            path: path.to_owned(),
            key: key.to_owned(),
            text,
        }],
        default: "default".into(),
        tool_use: None,
    };
    if let Some(path) = &files.chat_template {
        return Ok(single(path, files::CHAT_TEMPLATE, files::read_text(path)?));
    }
    let path = files.tokenizer_config.clone();
    let key_error = |reason: String| LoadError::Key {
        path: path.clone(),
        key: "chat_template".into(),
        reason,
    };
    match config.get("chat_template") {
        None | Some(Value::Null) => Err(LoadError::NoChatTemplate { path: path.clone() }),
        Some(Value::String(text)) => Ok(single(&path, "chat_template", text.clone())),
        Some(Value::Array(list)) => {
            let mut sources = Vec::new();
            for (i, entry) in list.iter().enumerate() {
                let name = entry.get("name").and_then(Value::as_str);
                let text = entry.get("template").and_then(Value::as_str);
                let (Some(name), Some(text)) = (name, text) else {
                    return Err(key_error(format!(
                        "entry {i} is not a {{\"name\": string, \"template\": string}} object"
                    )));
                };
                sources.push(Source {
                    name: name.to_owned(),
                    path: path.clone(),
                    key: format!("chat_template[{name}]"),
                    text: text.to_owned(),
                });
            }
            let has = |n: &str| sources.iter().any(|s| s.name == n);
            let wanted = files.template_name.as_deref().unwrap_or("default");
            if !has(wanted) {
                let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
                return Err(LoadError::NoSuchTemplate {
                    path: path.clone(),
                    name: wanted.to_owned(),
                    available: names.join(", "),
                });
            }
            let tool_use =
                (files.template_name.is_none() && has("tool_use")).then(|| "tool_use".to_owned());
            Ok(Templates {
                sources,
                default: wanted.to_owned(),
                tool_use,
            })
        }
        Some(other) => Err(key_error(format!(
            "is {}, not a string or a list of named templates",
            files::kind(other)
        ))),
    }
}

/// The special tokens of `special_tokens_map`, in its key order, set ones
/// only (a token is a string or an `AddedToken` object with `content`).
fn special_tokens(
    path: &Path,
    config: &Map<String, Value>,
) -> Result<Vec<(String, String)>, LoadError> {
    let mut out = Vec::new();
    for key in SPECIAL_TOKEN_KEYS {
        let token = match config.get(key) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) => s.clone(),
            Some(Value::Object(o)) => match o.get("content") {
                Some(Value::String(s)) => s.clone(),
                _ => {
                    return Err(LoadError::Key {
                        path: path.to_owned(),
                        key: key.into(),
                        reason: "an object without a string `content`".into(),
                    });
                }
            },
            Some(other) => {
                return Err(LoadError::Key {
                    path: path.to_owned(),
                    key: key.into(),
                    reason: format!("is {}, not a token", files::kind(other)),
                });
            }
        };
        out.push((key.to_owned(), token));
    }
    Ok(out)
}

/// The control tokens a template writes literally: `<|...|>` and
/// DeepSeek's full-width `<｜...｜>`, outside `{# comments #}`, with no
/// space, quote or template syntax inside (so `'<|' + role + '|>'` is not
/// one).
pub fn control_tokens(template: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    let mut rest = template;
    // Comments removed, byte offsets kept apart: scan piece by piece.
    let mut pieces = Vec::new();
    while let Some(start) = rest.find("{#") {
        pieces.push(&rest[..start]);
        rest = rest[start..]
            .find("#}")
            .map_or("", |end| &rest[start + end + 2..]);
    }
    pieces.push(rest);
    for piece in pieces {
        for (open, close) in [("<|", "|>"), ("<｜", "｜>")] {
            let mut text = piece;
            while let Some(at) = text.find(open) {
                let after = &text[at + open.len()..];
                let Some(end) = after.find(close) else { break };
                let inner = &after[..end];
                let plain = !inner.is_empty()
                    && !inner
                        .chars()
                        .any(|c| c.is_whitespace() || "'\"+{}<>|｜%#~".contains(c));
                if plain {
                    let token = &text[at..at + open.len() + end + close.len()];
                    if !out.contains(&token) {
                        out.push(token);
                    }
                    text = &after[end + close.len()..];
                } else {
                    text = after;
                }
            }
        }
    }
    out
}

/// A boolean key, `false` when absent or not a boolean.
fn flag(config: &Map<String, Value>, key: &str) -> bool {
    config.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// `eos_token_id` of `generation_config.json`: an id or a list of ids.
fn eos_ids(path: &Path, config: &Map<String, Value>) -> Result<Vec<u32>, LoadError> {
    let bad = |reason: &str| LoadError::Key {
        path: path.to_owned(),
        key: "eos_token_id".into(),
        reason: reason.into(),
    };
    let id = |v: &Value| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad("not a token id or a list of token ids"))
    };
    match config.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => {
            let mut ids = Vec::new();
            for v in list {
                let v = id(v)?;
                if !ids.contains(&v) {
                    ids.push(v);
                }
            }
            Ok(ids)
        }
        Some(v) => Ok(vec![id(v)?]),
    }
}

/// `max_position_embeddings` of `config.json` (or of its `text_config`,
/// for multimodal models).
fn context_len(path: &Path, config: &Map<String, Value>) -> Result<Option<u32>, LoadError> {
    let value = config.get("max_position_embeddings").or_else(|| {
        config
            .get("text_config")
            .and_then(|t| t.get("max_position_embeddings"))
    });
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| LoadError::Key {
                path: path.to_owned(),
                key: "max_position_embeddings".into(),
                reason: format!("is {}, not a token count", files::kind(v)),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_tokens_are_the_literal_ones() {
        let t = "{{- '<|im_start|>' + role }}{# <|not_this|> #}'<|' + x + '|>' <｜User｜> <| spaced |> <|im_start|>";
        assert_eq!(control_tokens(t), vec!["<|im_start|>", "<｜User｜>"]);
    }
}
