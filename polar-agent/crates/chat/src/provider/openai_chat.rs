//! OpenAI Chat Completions (Qwen Code, opencode and pi with a compatible
//! provider): `POST /v1/chat/completions`, also dashscope's
//! `/compatible-mode/v1/chat/completions` and any `*/chat/completions`.
//!
//! Requests: `system`/`developer`/`user`/`assistant`/`tool` (and legacy
//! `function`) messages, content as a string, `null` or an array of parts
//! (`text`, `image_url` with `data:` URLs made inline, others kept as
//! [`Part::Other`]); tool results as strings or arrays of text parts (Qwen
//! Code); `tool_calls`; `reasoning_content` (or vLLM's `reasoning`);
//! `max_completion_tokens` before `max_tokens`; `stream_options.include_usage`.
//! Unknown fields of parts are kept in the message's `extra.part_extra` as
//! `{"index": part index, ...fields}`.

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::read::{
    array_field, body_object, bool_field, f64_field, function_tool, request_model, rest, stop_list,
    string_field, text, text_field, text_of, u32_of,
};
use super::{
    ErrorKind, ModelCall, ParsedRequest, ProviderError, ReplyOptions, StreamEncoder,
    effective_finish, image_from_url, prefixed_id, push_indexed, sse,
};
use crate::Api;
use crate::{
    ChatRequest, ChatResponse, FinishReason, Message, Part, Reasoning, Role, Sampling, StreamEvent,
    ToolCall, ToolChoice, Usage,
};
use polar_json::Json;

// ---------------------------------------------------------------- types

/// The OpenAI Chat Completions protocol.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenaiChat;

const REQUEST_KEYS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stream",
    "stream_options",
    "response_format",
];

const MESSAGE_KEYS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    "reasoning",
];

impl super::Protocol for OpenaiChat {
    const API: Api = Api::OpenaiChat;
    type Encoder = Encoder;

    fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError> {
        parse_request(call, body)
    }

    fn response_body(resp: &ChatResponse, opts: &ReplyOptions) -> Bytes {
        response_body(resp, opts)
    }

    fn encoder(opts: &ReplyOptions) -> Encoder {
        Encoder::new(opts)
    }

    fn error_body(err: &ProviderError) -> (u16, Value) {
        error_body(err)
    }
}

// ---------------------------------------------------------------- request conversion

fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError> {
    let obj = body_object(body)?;
    let model = request_model(obj, call)?;
    let raw = obj
        .get("messages")
        .and_then(|m| m.as_array())
        .ok_or_else(|| ProviderError::invalid("messages: field required"))?;
    let mut extra = rest(obj, REQUEST_KEYS);
    let messages = raw
        .enumerate()
        .map(|(i, m)| parse_message(m, &|| format!("messages[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;

    let mut tools = Vec::new();
    let mut other_tools = Vec::new();
    let mut tool_extra = Vec::new();
    for t in array_field(obj, "tools") {
        let f = t.get("function").filter(|f| f.is_object());
        match (t.get_str("type").as_deref(), f) {
            (Some("function") | None, Some(f)) if f.get("name").is_some() => {
                tools.push(function_tool(
                    f,
                    f.get("parameters"),
                    &["name", "description", "parameters"],
                    &mut tool_extra,
                ));
            }
            _ => other_tools.push(t.to_value()),
        }
    }
    if !other_tools.is_empty() {
        extra.insert("tools_other".into(), Value::Array(other_tools));
    }
    if !tool_extra.is_empty() {
        extra.insert("tool_extra".into(), Value::Array(tool_extra));
    }

    let choice = obj.get("tool_choice");
    let tool_choice = choice.and_then(|tc| match tc.as_str().as_deref() {
        Some("auto") => Some(ToolChoice::Auto),
        Some("none") => Some(ToolChoice::None),
        Some("required") => Some(ToolChoice::Required),
        Some(_) => None,
        None => tc
            .get("function")
            .and_then(|f| string_field(f, "name"))
            .map(|name| ToolChoice::Tool { name }),
    });
    if tool_choice.is_none()
        && let Some(tc) = choice
    {
        extra.insert("tool_choice".into(), tc.to_value());
    }

    let stream_options = obj.get("stream_options");
    let include_usage = stream_options
        .and_then(|o| bool_field(o, "include_usage"))
        .unwrap_or(false);
    if let Some(so) = stream_options.filter(|so| so.is_object()) {
        let r = rest(so, &["include_usage"]);
        if !r.is_empty() {
            extra.insert("stream_options".into(), Value::Object(r));
        }
    }

    let response_format = super::structured::openai_chat(obj.get("response_format"))?;
    let request = ChatRequest {
        model,
        messages,
        tools,
        tool_choice,
        response_format,
        sampling: Sampling {
            max_tokens: u32_of(obj.get("max_completion_tokens"))
                .or_else(|| u32_of(obj.get("max_tokens"))),
            temperature: f64_field(obj, "temperature"),
            top_p: f64_field(obj, "top_p"),
            top_k: u32_of(obj.get("top_k")),
            stop: stop_list(obj.get("stop")),
            seed: None,
        },
        stream: bool_field(obj, "stream").unwrap_or(false),
        extra,
    };
    Ok(ParsedRequest {
        request,
        previous_response_id: None,
        include_usage,
        compaction: false,
    })
}

fn parse_message(m: Json<'_>, at: &dyn Fn() -> String) -> Result<Message, ProviderError> {
    if !m.is_object() {
        return Err(ProviderError::invalid(format!(
            "{}: must be an object",
            at()
        )));
    }
    let role = match m.get_str("role").as_deref() {
        Some("system") => Role::System,
        Some("developer") => Role::Developer,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool" | "function") => Role::Tool,
        other => {
            return Err(ProviderError::invalid(format!(
                "{}.role: unknown role {other:?}",
                at()
            )));
        }
    };
    let mut msg = Message::new(role);
    if let Some(content) = m.get("content").filter(|c| !c.is_null()) {
        if let Some(text) = text(content) {
            msg.content.push(Part::Text { text });
        } else if let Some(parts) = content.as_array() {
            for (i, p) in parts.enumerate() {
                let (part, fields) = content_part(p);
                msg.content.push(part);
                push_indexed(&mut msg.extra, "part_extra", i, fields);
            }
        } else {
            return Err(ProviderError::invalid(format!(
                "{}.content: must be a string, null or an array of parts",
                at()
            )));
        }
    }
    msg.name = string_field(m, "name");
    msg.tool_call_id = string_field(m, "tool_call_id");
    let reasoning = m
        .get_str("reasoning_content")
        .or_else(|| m.get_str("reasoning"));
    if let Some(text) = reasoning {
        msg.reasoning = Some(Reasoning {
            text: text.into_owned(),
            signature: None,
            encrypted: None,
        });
    }
    for (i, c) in array_field(m, "tool_calls").enumerate() {
        let f = c.get("function").unwrap_or_else(Json::null);
        let id = string_field(c, "id").ok_or_else(|| {
            ProviderError::invalid(format!("{}.tool_calls[{i}].id: field required", at()))
        })?;
        msg.tool_calls.push(ToolCall {
            id,
            name: string_field(f, "name").unwrap_or_default(),
            arguments: f.get("arguments").map(text_of).unwrap_or_default(),
        });
    }
    msg.extra.extend(rest(m, MESSAGE_KEYS));
    Ok(msg)
}

fn content_part(p: Json<'_>) -> (Part, Map<String, Value>) {
    let other = || {
        (
            Part::Other {
                value: p.to_value(),
            },
            Map::new(),
        )
    };
    if let Some(text) = text(p) {
        return (Part::Text { text }, Map::new());
    }
    if !p.is_object() {
        return other();
    }
    match p.get_str("type").as_deref() {
        Some("text" | "input_text") => (
            Part::Text {
                text: text_field(p, "text").unwrap_or_default(),
            },
            rest(p, &["type", "text"]),
        ),
        Some("image_url") => {
            let iu = p.get("image_url");
            let url = iu
                .and_then(|u| u.get_str("url").or_else(|| u.as_str()))
                .unwrap_or_default();
            let mut fields = rest(p, &["type", "image_url"]);
            if let Some(iu) = iu.filter(|iu| iu.is_object()) {
                fields.extend(rest(iu, &["url"]));
            }
            (image_from_url(&url), fields)
        }
        _ => other(),
    }
}

// ---------------------------------------------------------------- response conversion

/// Chat's `finish_reason` for a finish reason.
pub fn finish_reason(reason: &FinishReason, has_tool_calls: bool) -> String {
    match effective_finish(reason, has_tool_calls) {
        FinishReason::Stop | FinishReason::Abort => "stop".into(),
        FinishReason::Length => "length".into(),
        FinishReason::ToolCalls => "tool_calls".into(),
        FinishReason::ContentFilter => "content_filter".into(),
        FinishReason::Other(s) => s,
    }
}

/// `usage` of a completion, and of the last chunk when asked for.
#[derive(Serialize)]
struct UsageOut {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<CachedTokens>,
}

#[derive(Serialize)]
struct CachedTokens {
    cached_tokens: u32,
}

impl UsageOut {
    fn of(u: &Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens.saturating_add(u.completion_tokens),
            prompt_tokens_details: u
                .cached_tokens
                .map(|cached_tokens| CachedTokens { cached_tokens }),
        }
    }
}

/// A tool call: whole in a completion (`id`, `type`, `function.name` and
/// `.arguments`); in a chunk, its start (with `index`, and empty
/// arguments) or a piece of its arguments (`index` and
/// `function.arguments` only).
#[derive(Serialize)]
struct CallOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionOut<'a>,
}

#[derive(Serialize)]
struct FunctionOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// A complete (non-streamed) reply, its fields in the order they are
/// written.
#[derive(Serialize)]
struct Completion<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [CompletionChoice<'a>; 1],
    usage: UsageOut,
}

#[derive(Serialize)]
struct CompletionChoice<'a> {
    index: u32,
    message: MessageOut<'a>,
    /// Always `null`.
    logprobs: (),
    finish_reason: String,
}

#[derive(Serialize)]
struct MessageOut<'a> {
    role: &'static str,
    /// `null` when the reply is only tool calls.
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<CallOut<'a>>,
}

/// One streamed chunk.
#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    /// Empty in the usage chunk.
    choices: &'a [ChunkChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageOut>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    /// Always `null`.
    logprobs: (),
    finish_reason: Option<&'a str>,
}

/// A chunk's `delta`: what is set of it (`{}` in the finish chunk).
#[derive(Default, Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[CallOut<'a>; 1]>,
}

impl<'a> Delta<'a> {
    fn call(call: CallOut<'a>) -> Self {
        Self {
            tool_calls: Some([call]),
            ..Self::default()
        }
    }
}

fn completion_id(id: &str) -> String {
    prefixed_id("chatcmpl-", id)
}

fn response_body(resp: &ChatResponse, opts: &ReplyOptions) -> Bytes {
    let m = &resp.message;
    let text = m.joined_text();
    let completion = Completion {
        id: completion_id(&resp.id),
        object: "chat.completion",
        created: opts.created,
        model: &resp.model,
        choices: [CompletionChoice {
            index: 0,
            message: MessageOut {
                role: "assistant",
                content: (!text.is_empty() || m.tool_calls.is_empty()).then_some(text),
                reasoning_content: m.reasoning.as_ref().map(|r| r.text.as_str()),
                tool_calls: m
                    .tool_calls
                    .iter()
                    .map(|c| CallOut {
                        index: None,
                        id: Some(&c.id),
                        kind: Some("function"),
                        function: FunctionOut {
                            name: Some(&c.name),
                            arguments: &c.arguments,
                        },
                    })
                    .collect(),
            },
            logprobs: (),
            finish_reason: finish_reason(&resp.finish_reason, !m.tool_calls.is_empty()),
        }],
        usage: UsageOut::of(&resp.usage),
    };
    super::json_bytes(&completion)
}

// ---------------------------------------------------------------- stream encoder

/// Streams a reply as Chat Completions chunks: a first chunk with the role,
/// content / `reasoning_content` / `tool_calls` deltas, a chunk with only the
/// finish reason, a usage chunk when asked, then `data: [DONE]`.
#[derive(Debug)]
pub struct Encoder {
    created: u64,
    include_usage: bool,
    id: String,
    model: String,
    started: bool,
    done: bool,
    calls: Vec<u32>,
}

impl Encoder {
    /// An encoder for one reply.
    pub fn new(opts: &ReplyOptions) -> Self {
        Self {
            created: opts.created,
            include_usage: opts.include_usage,
            id: completion_id(""),
            model: String::new(),
            started: false,
            done: false,
            calls: Vec::new(),
        }
    }

    fn write(&self, out: &mut Vec<u8>, choices: &[ChunkChoice<'_>], usage: Option<UsageOut>) {
        let chunk = Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices,
            usage,
        };
        sse::write_json(out, None, &chunk);
    }

    fn chunk(&self, out: &mut Vec<u8>, delta: Delta<'_>, finish_reason: Option<&str>) {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs: (),
            finish_reason,
        };
        self.write(out, &[choice], None);
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        self.started = true;
        let delta = Delta {
            role: Some("assistant"),
            content: Some(""),
            ..Delta::default()
        };
        self.chunk(out, delta, None);
    }
}

impl StreamEncoder for Encoder {
    fn push(&mut self, ev: &StreamEvent) -> Bytes {
        let mut out = Vec::new();
        if self.done {
            return Bytes::new();
        }
        if let StreamEvent::Start { id, model, .. } = ev {
            if !self.started {
                self.id = completion_id(id);
                self.model.clone_from(model);
                self.start(&mut out);
            }
            return Bytes::from(out);
        }
        if !self.started {
            self.start(&mut out);
        }
        match ev {
            StreamEvent::Start { .. } | StreamEvent::ReasoningDone { .. } => {}
            StreamEvent::ReasoningDelta { text } if !text.is_empty() => {
                let delta = Delta {
                    reasoning_content: Some(text),
                    ..Delta::default()
                };
                self.chunk(&mut out, delta, None);
            }
            StreamEvent::TextDelta { text } if !text.is_empty() => {
                let delta = Delta {
                    content: Some(text),
                    ..Delta::default()
                };
                self.chunk(&mut out, delta, None);
            }
            StreamEvent::ReasoningDelta { .. } | StreamEvent::TextDelta { .. } => {}
            StreamEvent::ToolCallStart { index, id, name } => {
                if !self.calls.contains(index) {
                    self.calls.push(*index);
                    let call = CallOut {
                        index: Some(*index),
                        id: Some(id),
                        kind: Some("function"),
                        function: FunctionOut {
                            name: Some(name),
                            arguments: "",
                        },
                    };
                    self.chunk(&mut out, Delta::call(call), None);
                }
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                if self.calls.contains(index) && !arguments.is_empty() {
                    let call = CallOut {
                        index: Some(*index),
                        id: None,
                        kind: None,
                        function: FunctionOut {
                            name: None,
                            arguments,
                        },
                    };
                    self.chunk(&mut out, Delta::call(call), None);
                }
            }
            StreamEvent::Finish {
                finish_reason: reason,
                usage,
            } => {
                let reason = finish_reason(reason, !self.calls.is_empty());
                self.chunk(&mut out, Delta::default(), Some(&reason));
                if self.include_usage {
                    self.write(&mut out, &[], Some(UsageOut::of(usage)));
                }
                sse::write(&mut out, None, "[DONE]");
                self.done = true;
            }
        }
        Bytes::from(out)
    }

    fn error(&mut self, err: &ProviderError) -> Bytes {
        if self.done {
            return Bytes::new();
        }
        self.done = true;
        let (_, body) = error_body(err);
        let mut out = Vec::new();
        sse::write_json(&mut out, None, &body);
        sse::write(&mut out, None, "[DONE]");
        Bytes::from(out)
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

// ---------------------------------------------------------------- errors

/// OpenAI's error `type` and `code` for a kind (shared with Responses).
pub(crate) fn openai_error_type(kind: ErrorKind) -> (&'static str, &'static str) {
    match kind {
        ErrorKind::InvalidRequest => ("invalid_request_error", "invalid_request"),
        ErrorKind::Unsupported => ("invalid_request_error", "unsupported"),
        ErrorKind::TooLarge | ErrorKind::ContextOverflow { .. } => {
            ("invalid_request_error", "context_length_exceeded")
        }
        ErrorKind::NotFound => ("invalid_request_error", "model_not_found"),
        ErrorKind::Overloaded => ("rate_limit_error", "server_is_overloaded"),
        ErrorKind::BackendUnavailable => ("server_error", "backend_unavailable"),
        ErrorKind::BackendTimeout => ("server_error", "backend_timeout"),
        ErrorKind::BackendError => ("server_error", "backend_error"),
        ErrorKind::Internal => ("server_error", "internal_error"),
    }
}

/// The OpenAI error body `{"error":{"message","type","param","code"}}`; a
/// request over the context in OpenAI's own words.
pub(crate) fn openai_error_value(err: &ProviderError) -> Value {
    let (ty, code) = openai_error_type(err.kind);
    let message = match err.kind {
        ErrorKind::ContextOverflow {
            prompt,
            completion: Some(c),
            max,
        } => format!(
            "This model's maximum context length is {max} tokens. However, you requested {} \
             tokens ({prompt} in the messages, {c} in the completion). Please reduce the \
             length of the messages or completion.",
            u64::from(prompt) + u64::from(c)
        ),
        ErrorKind::ContextOverflow { prompt, max, .. } => format!(
            "This model's maximum context length is {max} tokens. However, your messages \
             resulted in {prompt} tokens. Please reduce the length of the messages."
        ),
        _ => err.message.clone(),
    };
    json!({"error": {"message": message, "type": ty, "param": null, "code": code}})
}

/// Status and OpenAI error body.
pub fn error_body(err: &ProviderError) -> (u16, Value) {
    (err.kind.status(Api::OpenaiChat), openai_error_value(err))
}

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests;
