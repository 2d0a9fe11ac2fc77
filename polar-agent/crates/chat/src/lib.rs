//! The normalized chat model every harness API is translated to and from:
//! one request type the inference backends are called with, one response
//! type, and the stream events a backend's reply is made of. Pure data with
//! serde; fields a translator does not understand are kept in `extra`.
//!
//! [`output`] parses a model's raw output (what token-in endpoints return)
//! into the same events, for a reply resumed after a backend fault.
//!
//! [`provider`] holds the four harness APIs' translations (Anthropic
//! Messages, OpenAI Chat and Responses, Gemini) to and from this model:
//! detection, request parsing, stream encoders, error shapes; [`Api`]
//! names them.
//!
//! Pure: it depends on `polar-json` and `polar-sse` only, never on an I/O
//! crate (checked by `cargo xtask layers`). Tests: unit, property and
//! recorded-fixture tests in `provider/*/tests.rs` (fixtures in
//! `tests/fixtures/providers/`); the backend-body checks of the same
//! requests are `polar-inference`'s `tests/escaped_text.rs`.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use polar_json::RawJson;
use serde_json::{Map, Value};

mod api;
pub mod output;
pub mod provider;

pub use api::Api;

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// System prompt.
    System,
    /// Developer instructions (OpenAI Responses, Codex).
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

/// The text of a [`Part::Text`]. Text read from a harness's request is
/// kept as the request had it, JSON-escaped, so that writing it into the
/// backend's request is a copy ([`Text::escaped`]); the plain text is made
/// from it the first time it is read ([`Text::as_str`], or `Deref`), which
/// the agent does only off the reply's path. Serialized as a JSON string.
#[derive(Clone, Default)]
pub struct Text {
    plain: OnceLock<String>,
    /// The inside of a valid JSON string literal (no quotes), usually a
    /// slice of the request body itself.
    escaped: Option<Bytes>,
}

impl Text {
    /// Text from plain text.
    pub fn new(plain: String) -> Self {
        Self {
            plain: OnceLock::from(plain),
            escaped: None,
        }
    }

    /// Text from the inside of a JSON string literal that
    /// [`polar_json::Doc::parse`] accepted (UTF-8, valid escapes).
    pub(crate) fn from_escaped(escaped: Bytes) -> Self {
        Self {
            plain: OnceLock::new(),
            escaped: Some(escaped),
        }
    }

    fn unescaped(escaped: &[u8]) -> String {
        polar_json::unescape(std::str::from_utf8(escaped).unwrap_or_default())
    }

    /// The plain text.
    pub fn as_str(&self) -> &str {
        self.plain
            .get_or_init(|| Self::unescaped(self.escaped.as_deref().unwrap_or_default()))
    }

    /// Whether the text is empty (without unescaping it).
    pub fn is_empty(&self) -> bool {
        match &self.escaped {
            Some(e) => e.is_empty(),
            None => self.as_str().is_empty(),
        }
    }

    /// The text as the inside of a JSON string literal, when it was read
    /// that way.
    pub fn escaped(&self) -> Option<&[u8]> {
        self.escaped.as_deref()
    }

    /// The plain text, owned.
    pub fn into_string(self) -> String {
        let Self { mut plain, escaped } = self;
        plain
            .take()
            .unwrap_or_else(|| Self::unescaped(escaped.as_deref().unwrap_or_default()))
    }
}

impl std::ops::Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Self::new(s)
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Self::new(s.to_owned())
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Text {}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

impl Serialize for Text {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::new)
    }
}

/// A piece of message content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Text.
    Text {
        /// The text.
        text: Text,
    },
    /// An image, inline (base64) or by URL.
    Image {
        /// MIME type, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
        /// Base64 data, for inline images.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        /// URL, for linked images.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        url: Option<String>,
    },
    /// Content this model has no type for, kept as the harness sent it.
    Other {
        /// The original JSON.
        value: Value,
    },
}

/// A tool call the model made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id; round-trips exactly (synthesized, stably, where the
    /// harness API has none).
    pub id: String,
    /// The tool name.
    pub name: String,
    /// The arguments as JSON text, exactly as generated.
    pub arguments: String,
}

/// Reasoning ("thinking") the model produced, with what the harness API needs
/// to send it back on later turns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reasoning {
    /// The reasoning text.
    pub text: String,
    /// An opaque signature (Anthropic `signature`, Gemini `thoughtSignature`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// Opaque encrypted reasoning (OpenAI Responses `encrypted_content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<String>,
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// Content parts, in order.
    #[serde(default)]
    pub content: Vec<Part>,
    /// Reasoning before the content (assistant messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
    /// Tool calls (assistant messages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call this message answers (tool messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Whether a tool result is an error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// Name of the tool (tool messages) or speaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Fields kept from the harness's message that have no place above.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

impl Message {
    /// A message with no content yet.
    pub fn new(role: Role) -> Self {
        Self {
            role,
            content: Vec::new(),
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            is_error: false,
            name: None,
            extra: Map::new(),
        }
    }

    /// A message with text content only.
    pub fn text(role: Role, text: impl Into<Text>) -> Self {
        Self {
            content: vec![Part::Text { text: text.into() }],
            ..Self::new(role)
        }
    }

    /// The concatenated text parts.
    pub fn joined_text(&self) -> String {
        self.content
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// Name.
    pub name: String,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments, as the harness wrote it.
    pub parameters: RawJson,
}

/// How the model may use tools.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tools.
    None,
    /// Some tool must be called.
    Required,
    /// This tool must be called.
    Tool {
        /// Its name.
        name: String,
    },
}

/// Structured output: what the reply's text must be, whichever API asked
/// (OpenAI `response_format`, Responses `text.format`, Anthropic
/// `output_format` / `output_config.format`, Gemini `responseMimeType` with
/// `responseSchema` / `responseJsonSchema`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ResponseFormat {
    /// Any JSON object (JSON mode).
    JsonObject,
    /// JSON valid under a JSON Schema.
    JsonSchema {
        /// The schema's name (`response` when the harness gave none).
        name: String,
        /// The JSON Schema.
        schema: Value,
        /// Strict schema adherence, when the harness said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

/// Sampling parameters as the harness asked (the backend policy may override).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Maximum tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Top-k.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// The sampling seed: set by Polar's own calls (the `llm_judge`
    /// evaluator's), never read from a harness's request (a seed a harness
    /// sent stays in `extra`, so the samples of a group stay apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// The normalized request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model name the harness asked for.
    pub model: String,
    /// The conversation, system prompt first when there is one.
    pub messages: Vec<Message>,
    /// Tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// Tool choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// The structured output the harness asked for (JSON mode or a JSON
    /// schema), enforced by the backend's constrained decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Sampling.
    #[serde(default)]
    pub sampling: Sampling,
    /// Whether the harness wants a stream.
    #[serde(default)]
    pub stream: bool,
    /// Fields of the harness's request that have no place above.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

/// Why generation stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end or a stop sequence.
    Stop,
    /// The token limit.
    Length,
    /// The model called tools.
    ToolCalls,
    /// A content filter.
    ContentFilter,
    /// The backend aborted generation.
    Abort,
    /// Anything else the backend said.
    Other(String),
}

/// Token counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
}

/// Token-level data of a reply, as the backend reported it (never recomputed).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    /// The prompt as the server tokenized it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The generated token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_token_ids: Option<Vec<u32>>,
    /// The log-probability of each generated token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_logprobs: Option<Vec<f32>>,
}

/// The normalized, complete reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// Response id.
    pub id: String,
    /// The model name to show the harness (the name it asked for).
    pub model: String,
    /// The assistant message.
    pub message: Message,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Token-level data.
    #[serde(default)]
    pub tokens: Tokens,
}

/// One step of a streamed reply, in generation order. A provider's stream
/// encoder turns these into its API's exact event sequence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum StreamEvent {
    /// The reply begins.
    Start {
        /// Response id.
        id: String,
        /// Model name to show.
        model: String,
        /// Prompt tokens, when known up front.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_tokens: Option<u32>,
    },
    /// Reasoning text.
    ReasoningDelta {
        /// The text.
        text: String,
    },
    /// The reasoning block is complete (with its signature, if any).
    ReasoningDone {
        /// Signature.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// Answer text.
    TextDelta {
        /// The text.
        text: String,
    },
    /// A tool call begins.
    ToolCallStart {
        /// Position among this reply's tool calls.
        index: u32,
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// More argument text of a tool call.
    ToolCallDelta {
        /// Position among this reply's tool calls.
        index: u32,
        /// Argument JSON text fragment.
        arguments: String,
    },
    /// The reply is complete.
    Finish {
        /// Why generation stopped.
        finish_reason: FinishReason,
        /// Token counts.
        usage: Usage,
    },
}

/// Fold a stream's events into the complete reply. Text deltas become one
/// text part, reasoning deltas one [`Reasoning`], tool calls are ordered by
/// their `index`. A stream without `Finish` ends as [`FinishReason::Abort`].
/// Token-level data is left empty (the backend client fills it).
pub fn assemble(events: &[StreamEvent]) -> ChatResponse {
    let mut id = String::new();
    let mut model = String::new();
    let mut text = String::new();
    let mut reasoning: Option<Reasoning> = None;
    let mut calls: Vec<(u32, ToolCall)> = Vec::new();
    let mut finish = None;
    let mut usage = Usage::default();
    let mut start_prompt = None;
    for ev in events {
        match ev {
            StreamEvent::Start {
                id: i,
                model: m,
                prompt_tokens,
            } => {
                id.clone_from(i);
                model.clone_from(m);
                start_prompt = *prompt_tokens;
            }
            StreamEvent::ReasoningDelta { text: t } => {
                reasoning.get_or_insert_default().text.push_str(t);
            }
            StreamEvent::ReasoningDone { signature } => {
                let r = reasoning.get_or_insert_default();
                if signature.is_some() {
                    r.signature.clone_from(signature);
                }
            }
            StreamEvent::TextDelta { text: t } => text.push_str(t),
            StreamEvent::ToolCallStart { index, id, name } => {
                if let Some((_, c)) = calls.iter_mut().find(|(i, _)| i == index) {
                    c.id.clone_from(id);
                    c.name.clone_from(name);
                } else {
                    calls.push((
                        *index,
                        ToolCall {
                            id: id.clone(),
                            name: name.clone(),
                            arguments: String::new(),
                        },
                    ));
                }
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                if let Some((_, c)) = calls.iter_mut().find(|(i, _)| i == index) {
                    c.arguments.push_str(arguments);
                }
            }
            StreamEvent::Finish {
                finish_reason,
                usage: u,
            } => {
                finish = Some(finish_reason.clone());
                usage = *u;
            }
        }
    }
    if usage.prompt_tokens == 0
        && let Some(p) = start_prompt
    {
        usage.prompt_tokens = p;
    }
    calls.sort_by_key(|(i, _)| *i);
    let mut message = Message::text(Role::Assistant, text);
    if message.joined_text().is_empty() {
        message.content.clear();
    }
    message.reasoning = reasoning;
    message.tool_calls = calls.into_iter().map(|(_, c)| c).collect();
    ChatResponse {
        id,
        model,
        message,
        finish_reason: finish.unwrap_or(FinishReason::Abort),
        usage,
        tokens: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_text_reads_as_its_plain_text() {
        let raw = r#"a\nb \"q\" \u00e9\ud83d\ude00"#;
        let escaped = Text::from_escaped(Bytes::from_static(raw.as_bytes()));
        let plain = Text::new("a\nb \"q\" é😀".to_owned());
        assert_eq!(escaped.escaped(), Some(raw.as_bytes()));
        assert!(!escaped.is_empty());
        assert_eq!(escaped, plain);
        assert_eq!(escaped.as_str(), "a\nb \"q\" é😀");
        assert_eq!(&*escaped, plain.as_str());
        assert_eq!(escaped.clone().into_string(), plain.clone().into_string());
        assert_eq!(plain.escaped(), None);
        assert!(Text::new(String::new()).is_empty());
        assert!(Text::default().is_empty());
        // Serialized as the string it stands for; read back as plain text.
        let json = serde_json::to_string(&escaped).unwrap();
        assert_eq!(json, serde_json::to_string("a\nb \"q\" é😀").unwrap());
        let back: Text = serde_json::from_str(&json).unwrap();
        assert_eq!(back, escaped);
        assert_eq!(format!("{escaped:?}"), format!("{:?}", "a\nb \"q\" é😀"));
    }
}
