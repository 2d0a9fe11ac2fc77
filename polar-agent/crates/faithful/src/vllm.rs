//! vLLM's request-to-conversation rules: how the `messages` of an OpenAI
//! chat body become the `messages` a chat template renders, as vLLM's chat
//! endpoint does it (`vllm/entrypoints/chat_utils.py`: `parse_chat_messages`,
//! `_parse_chat_message_content`, `_postprocess_messages`). Rendering what
//! this returns with the model's template gives the prompt vLLM would have
//! built from the same body.
//!
//! The rules, per message:
//! - `content`: absent or `null` is no parts, a string is one text part, a
//!   list is its parts. Text parts (`text`, `input_text`, `output_text`,
//!   `refusal`, `thinking`) give their text (a part whose text is `null` is
//!   skipped); `tool_reference` gives its name. With the `string` content
//!   format (most templates) the texts are joined with `"\n"` into one
//!   string (no parts: `""`); with `openai` they stay a list of
//!   `{"type": "text", "text": ...}`.
//! - Media parts (images, audio, video, embeddings) need the model's
//!   multimodal processor, which a text model has not: refused
//!   ([`ConversationError::Media`]), as vLLM refuses them for such a model.
//! - `assistant`: `tool_calls` kept (an empty list dropped), each call's
//!   `function.arguments` parsed from its JSON string (a string that is not
//!   JSON becomes `{}`, as does anything but an object or a list);
//!   `reasoning` kept and copied to `reasoning_content`, which templates
//!   read. A request's own `reasoning_content` is not read.
//! - `tool`: `tool_call_id` kept; a content of text parts only is one
//!   string even with the `openai` format.
//! - `name` and `task` kept when strings; a `developer` message gets
//!   `tools` (`null` when it has none). Every other key is dropped.
//!
//! Pure: JSON in, JSON out.

use serde_json::{Map, Value, json};

/// How a template reads a message's content (vLLM's
/// `--chat-template-content-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// One string per message (the texts joined with newlines).
    String,
    /// A list of `{"type": "text", "text": ...}` parts.
    OpenAi,
}

impl ContentFormat {
    /// The format a template expects, as vLLM's `auto` detects it: `openai`
    /// when the template loops over a message's content
    /// (`{% for x in message['content'] %}` or `message.content`), else
    /// `string`.
    pub fn detect(template: &str) -> Self {
        let loops_over_content = template.split("{%").skip(1).any(|block| {
            let stmt = block.split("%}").next().unwrap_or_default();
            let stmt = stmt.trim_start_matches(['-', '+']).trim_start();
            let Some(rest) = stmt.strip_prefix("for ") else {
                return false;
            };
            let Some((_, iterable)) = rest.split_once(" in ") else {
                return false;
            };
            let iterable: String = iterable.chars().filter(|c| !c.is_whitespace()).collect();
            ["['content']", "[\"content\"]", ".content"]
                .iter()
                .any(|suffix| {
                    iterable
                        .trim_end_matches(['-', '+'])
                        .split('|')
                        .next()
                        .is_some_and(|head| head.ends_with(suffix))
                })
        });
        if loops_over_content {
            Self::OpenAi
        } else {
            Self::String
        }
    }
}

/// Why a body's messages cannot be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConversationError {
    /// `messages[i]` is not an object with a string `role`.
    #[error("messages[{0}]: a message is an object with a string `role`")]
    NotAMessage(usize),
    /// `messages[i].content` is neither a string, a list nor null.
    #[error("messages[{0}].content: a string, a list of parts or null")]
    BadContent(usize),
    /// A part needs a multimodal processor, which a text model lacks.
    #[error(
        "messages[{index}].content: a `{kind}` part needs the model's multimodal \
         processor; this model renders text only"
    )]
    Media {
        /// The message.
        index: usize,
        /// The part's type.
        kind: String,
    },
    /// A part with no `type` (and no media field).
    #[error("messages[{0}].content: a part has no `type`")]
    MissingType(usize),
    /// A part of a type vLLM does not know.
    #[error("messages[{index}].content: unsupported part type `{kind}`")]
    UnknownPart {
        /// The message.
        index: usize,
        /// The part's type.
        kind: String,
    },
}

const MEDIA: [&str; 9] = [
    "image_url",
    "input_image",
    "image_pil",
    "image_embeds",
    "audio_embeds",
    "prompt_embeds",
    "audio_url",
    "input_audio",
    "video_url",
];

/// One part's text (or tool reference name); `None` for a text part whose
/// text is absent or null (skipped, as vLLM does).
fn part_text(index: usize, part: &Value) -> Result<Option<Value>, ConversationError> {
    let Some(obj) = part.as_object() else {
        return Ok(part.as_str().map(|s| Value::String(s.to_owned())));
    };
    let Some(kind) = obj.get("type").and_then(Value::as_str) else {
        if let Some(media) = MEDIA.iter().find(|m| obj.contains_key(**m)) {
            return Err(ConversationError::Media {
                index,
                kind: (*media).to_owned(),
            });
        }
        if obj.contains_key("tool_reference") {
            return Ok(obj.get("tool_reference").cloned());
        }
        return Err(ConversationError::MissingType(index));
    };
    let field = match kind {
        "text" | "input_text" | "output_text" => "text",
        "refusal" => "refusal",
        "thinking" => "thinking",
        "tool_reference" => "name",
        k if MEDIA.contains(&k) => {
            return Err(ConversationError::Media {
                index,
                kind: k.to_owned(),
            });
        }
        k => {
            return Err(ConversationError::UnknownPart {
                index,
                kind: k.to_owned(),
            });
        }
    };
    Ok(obj.get(field).filter(|v| !v.is_null()).cloned())
}

/// The content of `messages[index]` in `format`.
fn content(
    index: usize,
    msg: &Map<String, Value>,
    format: ContentFormat,
) -> Result<Value, ConversationError> {
    let parts: Vec<Value> = match msg.get("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![Value::String(s.clone())],
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for part in parts {
                if let Some(t) = part_text(index, part)? {
                    texts.push(t);
                }
            }
            texts
        }
        Some(_) => return Err(ConversationError::BadContent(index)),
    };
    let strings = || -> Vec<String> {
        parts
            .iter()
            .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_owned))
            .collect()
    };
    let tool = msg.get("role").and_then(Value::as_str) == Some("tool");
    Ok(match format {
        ContentFormat::String => Value::String(strings().join("\n")),
        // A tool message of text parts only is one string: most templates
        // handle no other tool content.
        ContentFormat::OpenAi if tool => Value::String(strings().join("\n")),
        ContentFormat::OpenAi => Value::Array(
            strings()
                .into_iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect(),
        ),
    })
}

/// A tool call's arguments as templates get them: the JSON the string
/// holds, `{}` for a string that is not JSON or anything but an object or
/// a list.
fn arguments(v: Option<&Value>) -> Value {
    match v {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| json!({})),
        Some(v @ (Value::Object(_) | Value::Array(_))) => v.clone(),
        _ => json!({}),
    }
}

/// A tool call with its `function.arguments` as templates get them.
fn with_parsed_arguments(call: &Value) -> Value {
    let mut call = call.clone();
    if let Some(f) = call.get_mut("function").and_then(Value::as_object_mut) {
        let args = arguments(f.get("arguments"));
        f.insert("arguments".into(), args);
    }
    call
}

/// The conversation vLLM renders for a chat body's `messages`.
pub fn conversation(
    messages: &[Value],
    format: ContentFormat,
) -> Result<Vec<Value>, ConversationError> {
    let mut out = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let msg = message
            .as_object()
            .ok_or(ConversationError::NotAMessage(index))?;
        let role = msg
            .get("role")
            .and_then(Value::as_str)
            .ok_or(ConversationError::NotAMessage(index))?;
        let mut m = Map::new();
        m.insert("role".into(), Value::String(role.to_owned()));
        m.insert("content".into(), content(index, msg, format)?);
        match role {
            "assistant" => {
                if let Some(Value::Array(calls)) = msg.get("tool_calls")
                    && !calls.is_empty()
                {
                    m.insert(
                        "tool_calls".into(),
                        calls.iter().map(with_parsed_arguments).collect(),
                    );
                }
                if let Some(r) = msg.get("reasoning").filter(|r| !r.is_null()) {
                    m.insert("reasoning".into(), r.clone());
                    m.insert("reasoning_content".into(), r.clone());
                }
            }
            "tool" => {
                if let Some(id) = msg.get("tool_call_id") {
                    m.insert("tool_call_id".into(), id.clone());
                }
            }
            _ => {}
        }
        for key in ["name", "task"] {
            if let Some(v @ Value::String(_)) = msg.get(key) {
                m.insert(key.into(), v.clone());
            }
        }
        if role == "developer" {
            m.insert(
                "tools".into(),
                msg.get("tools").cloned().unwrap_or(Value::Null),
            );
        }
        out.push(Value::Object(m));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(m: Value, f: ContentFormat) -> Value {
        conversation(&[m], f).unwrap().remove(0)
    }

    #[test]
    fn text_parts_are_joined_with_newlines_for_string_templates() {
        let m = json!({"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}, {"type": "text", "text": null}
        ], "cache_control": {"type": "ephemeral"}});
        assert_eq!(
            one(m.clone(), ContentFormat::String),
            json!({"role": "user", "content": "a\nb"})
        );
        assert_eq!(
            one(m, ContentFormat::OpenAi),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
        );
        assert_eq!(
            one(
                json!({"role": "assistant", "content": null}),
                ContentFormat::String
            ),
            json!({"role": "assistant", "content": ""})
        );
    }

    #[test]
    fn assistant_calls_get_parsed_arguments_and_reasoning_both_names() {
        let m = json!({"role": "assistant", "content": "\n\n", "reasoning": "think", "reasoning_content": "ignored",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\", \"n\": 1.0}"}},
            {"id": "c2", "type": "function", "function": {"name": "x", "arguments": "not json"}},
            {"id": "c3", "type": "function", "function": {"name": "y", "arguments": null}}
        ]});
        let c = one(m, ContentFormat::String);
        assert_eq!(c["content"], "\n\n");
        assert_eq!(c["reasoning"], "think");
        assert_eq!(c["reasoning_content"], "think");
        assert_eq!(
            c["tool_calls"][0]["function"]["arguments"],
            json!({"cmd": "ls", "n": 1.0})
        );
        assert_eq!(
            c["tool_calls"][0]["function"]["arguments"].to_string(),
            r#"{"cmd":"ls","n":1.0}"#
        );
        assert_eq!(c["tool_calls"][1]["function"]["arguments"], json!({}));
        assert_eq!(c["tool_calls"][2]["function"]["arguments"], json!({}));
        // Only `reasoning` is read.
        let c = one(
            json!({"role": "assistant", "content": "x", "reasoning_content": "r", "tool_calls": []}),
            ContentFormat::String,
        );
        assert_eq!(c, json!({"role": "assistant", "content": "x"}));
    }

    #[test]
    fn tool_results_keep_their_id_and_are_one_string() {
        let m = json!({"role": "tool", "tool_call_id": "c1", "name": "bash",
            "content": [{"type": "text", "text": "out"}, {"type": "text", "text": "err"}]});
        let expected =
            json!({"role": "tool", "content": "out\nerr", "tool_call_id": "c1", "name": "bash"});
        assert_eq!(one(m.clone(), ContentFormat::String), expected);
        assert_eq!(one(m, ContentFormat::OpenAi), expected);
        assert_eq!(
            one(
                json!({"role": "developer", "content": "d"}),
                ContentFormat::String
            ),
            json!({"role": "developer", "content": "d", "tools": null})
        );
    }

    #[test]
    fn media_and_unknown_parts_are_refused_with_the_message_named() {
        let img = json!({"role": "user", "content": [{"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]});
        let err = conversation(
            &[json!({"role": "system", "content": "s"}), img],
            ContentFormat::String,
        )
        .unwrap_err();
        assert_eq!(
            err,
            ConversationError::Media {
                index: 1,
                kind: "image_url".into()
            }
        );
        assert!(err.to_string().contains("messages[1]"), "{err}");
        assert!(matches!(
            conversation(
                &[json!({"role": "user", "content": [{"type": "file"}]})],
                ContentFormat::String
            ),
            Err(ConversationError::UnknownPart { index: 0, .. })
        ));
        assert_eq!(
            conversation(
                &[json!({"role": "user", "content": [{"x": 1}]})],
                ContentFormat::String
            ),
            Err(ConversationError::MissingType(0))
        );
        assert_eq!(
            conversation(&[json!({"content": "no role"})], ContentFormat::String),
            Err(ConversationError::NotAMessage(0))
        );
        assert_eq!(
            conversation(
                &[json!({"role": "user", "content": 5})],
                ContentFormat::String
            ),
            Err(ConversationError::BadContent(0))
        );
    }

    #[test]
    fn the_content_format_is_detected_from_loops_over_content() {
        assert_eq!(
            ContentFormat::detect("{%- for m in messages %}{{ m.content }}{% endfor %}"),
            ContentFormat::String
        );
        assert_eq!(
            ContentFormat::detect(
                "{% for m in messages %}{%- for part in m['content'] %}{{ part.text }}{% endfor %}{% endfor %}"
            ),
            ContentFormat::OpenAi
        );
        assert_eq!(
            ContentFormat::detect(
                "{% for m in messages %}{% for c in message.content | selectattr('type') %}{% endfor %}{% endfor %}"
            ),
            ContentFormat::OpenAi
        );
    }
}
