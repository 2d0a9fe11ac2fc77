//! What a render takes ([`RenderInput`]: Hugging Face messages, tools,
//! documents, `add_generation_prompt`, extra template variables) and how
//! it becomes the template's context, as `apply_chat_template` builds it:
//! keys whose value is `null` dropped from each message; reasoning under
//! any of `reasoning_content`, `thinking`, `reasoning` copied to
//! `thinking` (first) and `reasoning_content` (which gpt-oss and Qwen
//! templates read); the special tokens, then the extra variables, then
//! `messages`, `tools`, `documents`, `add_generation_prompt`. Content parts
//! other than text (images, audio, video, files) are refused: rendering
//! them needs the model's processor, which this crate does not have.

use minijinja::Value as Jinja;
use serde_json::{Map, Value};

use crate::python::from_json;

/// One render's inputs, as `apply_chat_template` takes them.
#[derive(Clone, Copy, Debug)]
pub struct RenderInput<'a> {
    /// Messages as Hugging Face and vLLM pass them to templates
    /// (`role`, `content` as text or text parts, `tool_calls` with
    /// `arguments` as an object, `reasoning_content`, ...).
    pub messages: &'a [Value],
    /// Tool definitions (`{"type": "function", "function": {...}}`), or
    /// `None` (the template sees `none`).
    pub tools: Option<&'a [Value]>,
    /// RAG documents (`{"title", "text"}`), or `None`.
    pub documents: Option<&'a [Value]>,
    pub add_generation_prompt: bool,
    /// Extra template variables (`enable_thinking`, `reasoning_effort`,
    /// ...); they override special tokens of the same name.
    pub kwargs: &'a Map<String, Value>,
}

impl<'a> RenderInput<'a> {
    /// Messages alone, no tools, no extra variables.
    pub fn messages(messages: &'a [Value], add_generation_prompt: bool) -> Self {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        Self {
            messages,
            tools: None,
            documents: None,
            add_generation_prompt,
            kwargs: EMPTY.get_or_init(Map::new),
        }
    }
}

/// Why a conversation cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// No messages.
    #[error("cannot render an empty conversation")]
    Empty,
    /// A message, tool or document is not a JSON object.
    #[error("{what} {index} is {kind}, not an object")]
    NotAnObject {
        what: &'static str,
        index: usize,
        kind: &'static str,
    },
    /// A content part the template cannot render without the model's
    /// processor.
    #[error(
        "message {message}: content part {part} is of type {part_type:?}: only text can be rendered (this model's template is used without an image/audio processor)"
    )]
    UnsupportedContent {
        message: usize,
        part: usize,
        part_type: String,
    },
    /// An extra variable takes a name the render sets itself.
    #[error("template variable {0:?} is set by the render itself and cannot be passed as an extra")]
    ReservedName(String),
    /// The template called `raise_exception(message)`.
    #[error("the chat template refused the conversation: {message}")]
    Raised { message: String },
    /// The template failed (an undefined method, a type error, ...).
    #[error("the chat template failed{}: {reason}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Template { line: Option<usize>, reason: String },
}

/// The names the render sets.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];
/// Reasoning's names, in the order transformers picks the first set one.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// The template's context for `input`.
pub fn context(
    input: &RenderInput<'_>,
    special_tokens: &[(String, String)],
) -> Result<Jinja, RenderError> {
    if input.messages.is_empty() {
        return Err(RenderError::Empty);
    }
    let mut messages = Vec::with_capacity(input.messages.len());
    for (index, message) in input.messages.iter().enumerate() {
        let Value::Object(map) = message else {
            return Err(not_object("message", index, message));
        };
        check_content(index, map)?;
        messages.push(from_json(&Value::Object(normalize(map))));
    }
    let list = |what: &'static str, items: Option<&[Value]>| -> Result<Jinja, RenderError> {
        let Some(items) = items else {
            return Ok(Jinja::from(()));
        };
        for (index, item) in items.iter().enumerate() {
            if !item.is_object() {
                return Err(not_object(what, index, item));
            }
        }
        Ok(Jinja::from(items.iter().map(from_json).collect::<Vec<_>>()))
    };
    let tools = list("tool", input.tools)?;
    let documents = list("document", input.documents)?;
    let mut pairs: Vec<(String, Jinja)> = special_tokens
        .iter()
        .map(|(k, v)| (k.clone(), Jinja::from(v.as_str())))
        .collect();
    for (key, value) in input.kwargs {
        if RESERVED.contains(&key.as_str()) {
            return Err(RenderError::ReservedName(key.clone()));
        }
        pairs.push((key.clone(), from_json(value)));
    }
    pairs.push(("messages".into(), Jinja::from(messages)));
    pairs.push(("tools".into(), tools));
    pairs.push(("documents".into(), documents));
    pairs.push((
        "add_generation_prompt".into(),
        Jinja::from(input.add_generation_prompt),
    ));
    Ok(Jinja::from_pairs(pairs))
}

fn not_object(what: &'static str, index: usize, value: &Value) -> RenderError {
    RenderError::NotAnObject {
        what,
        index,
        kind: crate::files::kind(value),
    }
}

/// Refuses content parts other than text.
fn check_content(index: usize, message: &Map<String, Value>) -> Result<(), RenderError> {
    let Some(Value::Array(parts)) = message.get("content") else {
        return Ok(());
    };
    for (part, value) in parts.iter().enumerate() {
        let part_type = value.get("type").and_then(Value::as_str);
        if part_type != Some("text") {
            return Err(RenderError::UnsupportedContent {
                message: index,
                part,
                part_type: part_type.unwrap_or("(none)").to_owned(),
            });
        }
    }
    Ok(())
}

/// A message as transformers hands it to the template: `null` keys
/// dropped, reasoning aliased (`{"thinking": r, **message,
/// "reasoning_content": r}`).
fn normalize(message: &Map<String, Value>) -> Map<String, Value> {
    let set: Map<String, Value> = message
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let Some(reasoning) = REASONING_FIELDS.iter().find_map(|k| set.get(*k)).cloned() else {
        return set;
    };
    let mut out = Map::with_capacity(set.len() + 2);
    out.insert("thinking".into(), reasoning.clone());
    for (k, v) in set {
        out.insert(k, v);
    }
    out.insert("reasoning_content".into(), reasoning);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn null_keys_drop_and_reasoning_is_aliased() {
        let m = json!({"role": "assistant", "content": null, "reasoning": "r", "tool_calls": []});
        let out = normalize(m.as_object().unwrap());
        let keys: Vec<&str> = out.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "thinking",
                "role",
                "reasoning",
                "tool_calls",
                "reasoning_content"
            ]
        );
        assert_eq!(out["thinking"], "r");
        let plain = json!({"role": "user", "content": "hi"});
        assert_eq!(Value::Object(normalize(plain.as_object().unwrap())), plain);
    }

    #[test]
    fn images_are_refused() {
        let m = json!({"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
        ]});
        let err = check_content(3, m.as_object().unwrap()).unwrap_err();
        assert!(matches!(
            err,
            RenderError::UnsupportedContent {
                message: 3,
                part: 1,
                ..
            }
        ));
        assert!(err.to_string().contains("\"image_url\""), "{err}");
    }
}
