//! Anthropic Messages (Claude Code; opencode and pi with an Anthropic
//! provider): `POST /v1/messages[?beta=true]`.
//!
//! Requests: `system` as a string or blocks (a leading billing line of
//! Claude Code, `x-anthropic-billing-header: ...`, changes on every request;
//! it is moved to `extra.anthropic_billing_header` so prompts keep a stable
//! prefix), `{"role":"system"}` items in the middle of `messages`, content
//! blocks `text`, `image`, `tool_use`, `tool_result` (string or blocks,
//! `is_error`), `thinking` (the first per message becomes the message's
//! [`Reasoning`]; more, and `redacted_thinking`, stay as [`Part::Other`]).
//! Unknown fields of blocks (`cache_control`, `citations`, ...) are kept in
//! the message's `extra.block_extra` as `{"index": block index, ...fields}`; a
//! tool result's own fields go to its tool message's `extra`.
//!
//! Tool names are passed as they are, even past 64 characters (the backend
//! sees them as-is).

use std::collections::HashMap;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::read::{
    array_field, body_object, bool_field, f64_field, field_is, function_tool, request_model, rest,
    stop_list, string_field, text, text_field, u32_of,
};
use super::{
    ModelCall, ParsedRequest, ProviderError, ReplyOptions, StreamEncoder, effective_finish,
    prefixed_id, push_indexed, sse,
};
use crate::Api;
use crate::{
    ChatRequest, ChatResponse, FinishReason, Message, Part, Reasoning, Role, Sampling, StreamEvent,
    Tool, ToolCall, ToolChoice, Usage,
};
use polar_json::{Elements, Json};

// ---------------------------------------------------------------- types

/// The Anthropic Messages protocol.
#[derive(Clone, Copy, Debug, Default)]
pub struct Anthropic;

/// Prefix of Claude Code's per-request billing line in the system prompt.
pub const BILLING_PREFIX: &str = "x-anthropic-billing-header";

const REQUEST_KEYS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "stream",
    "output_format",
];

impl super::Protocol for Anthropic {
    const API: Api = Api::AnthropicMessages;
    type Encoder = Encoder;

    fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError> {
        parse_request(call, body)
    }

    fn response_body(resp: &ChatResponse, _opts: &ReplyOptions) -> Bytes {
        response_body(resp)
    }

    fn encoder(_opts: &ReplyOptions) -> Encoder {
        Encoder::default()
    }

    fn error_body(err: &ProviderError) -> (u16, Value) {
        error_body(err)
    }
}

// ---------------------------------------------------------------- request conversion

fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError> {
    let obj = body_object(body)?;
    let model = request_model(obj, call)?;
    let raw_messages = obj
        .get("messages")
        .and_then(|m| m.as_array())
        .ok_or_else(|| ProviderError::invalid("messages: field required"))?;
    let mut extra = rest(obj, REQUEST_KEYS);
    let mut messages = Vec::new();
    if let Some(system) = obj.get("system") {
        parse_system(system, &mut messages, &mut extra)?;
    }
    parse_messages(raw_messages, &mut messages)?;
    let tools = parse_tools(obj, &mut extra);
    let tool_choice = parse_tool_choice(obj, &mut extra);

    let response_format = super::structured::anthropic(obj)?;
    super::structured::take_nested(&mut extra, "output_config", "format");
    let request = ChatRequest {
        model,
        messages,
        tools,
        tool_choice,
        response_format,
        sampling: Sampling {
            max_tokens: u32_of(obj.get("max_tokens")),
            temperature: f64_field(obj, "temperature"),
            top_p: f64_field(obj, "top_p"),
            top_k: u32_of(obj.get("top_k")),
            stop: stop_list(obj.get("stop_sequences")),
            seed: None,
        },
        stream: bool_field(obj, "stream").unwrap_or(false),
        extra,
    };
    Ok(ParsedRequest {
        request,
        previous_response_id: None,
        include_usage: false,
        compaction: false,
    })
}

/// `system` as a system message, pushed unless it is empty. A leading
/// billing-header text block goes to `extra.anthropic_billing_header`
/// instead.
fn parse_system(
    system: Json<'_>,
    messages: &mut Vec<Message>,
    extra: &mut Map<String, Value>,
) -> Result<(), ProviderError> {
    let mut msg = content_message(Role::System, system, "system")?;
    if let Some(Part::Text { text }) = msg.content.first()
        && text.starts_with(BILLING_PREFIX)
    {
        extra.insert(
            "anthropic_billing_header".into(),
            Value::String(text.to_string()),
        );
        msg.content.remove(0);
        shift_block_extra(&mut msg.extra);
    }
    if !msg.content.is_empty() {
        messages.push(msg);
    }
    Ok(())
}

/// `messages`, each with its unknown fields on its (first) message; tool
/// results get the name of the call they answer.
fn parse_messages(
    raw_messages: Elements<'_>,
    messages: &mut Vec<Message>,
) -> Result<(), ProviderError> {
    messages.reserve(raw_messages.count());
    let mut tool_names: HashMap<String, String> = HashMap::new();
    for (i, m) in raw_messages.enumerate() {
        let at = || format!("messages[{i}]");
        if !m.is_object() {
            return Err(ProviderError::invalid(format!(
                "{}: must be an object",
                at()
            )));
        }
        let role = m.get_str("role").unwrap_or_default();
        let content = m.get("content");
        let msg_extra = rest(m, &["role", "content"]);
        match role.as_ref() {
            "system" => {
                let mut msg = content_message(Role::System, content_or_null(content), &at())?;
                msg.extra.extend(msg_extra);
                messages.push(msg);
            }
            "assistant" => {
                let mut msg = assistant_message(content, &at)?;
                for c in &msg.tool_calls {
                    tool_names.insert(c.id.clone(), c.name.clone());
                }
                msg.extra.extend(msg_extra);
                messages.push(msg);
            }
            "user" => {
                let start = messages.len();
                user_messages(content, &at, &tool_names, messages)?;
                if let Some(first) = messages.get_mut(start) {
                    first.extra.extend(msg_extra);
                }
            }
            other => {
                return Err(ProviderError::invalid(format!(
                    "{}.role: unknown role {other:?}",
                    at()
                )));
            }
        }
    }
    Ok(())
}

/// `tools`: custom tools (a name and an `input_schema`) as tools; server
/// tools go to `extra.server_tools`, the tools' unknown fields to
/// `extra.tool_extra`.
fn parse_tools(obj: Json<'_>, extra: &mut Map<String, Value>) -> Vec<Tool> {
    let mut tools = Vec::new();
    let mut server_tools = Vec::new();
    let mut tool_extra = Vec::new();
    for t in array_field(obj, "tools") {
        if !t.is_object() {
            continue;
        }
        match (t.get_str("name"), t.get("input_schema")) {
            (Some(_), Some(schema)) => {
                tools.push(function_tool(
                    t,
                    Some(schema),
                    &["name", "description", "input_schema"],
                    &mut tool_extra,
                ));
            }
            _ => server_tools.push(t.to_value()),
        }
    }
    if !server_tools.is_empty() {
        extra.insert("server_tools".into(), Value::Array(server_tools));
    }
    if !tool_extra.is_empty() {
        extra.insert("tool_extra".into(), Value::Array(tool_extra));
    }
    tools
}

/// `tool_choice`; `disable_parallel_tool_use` becomes
/// `extra.parallel_tool_calls: false`.
fn parse_tool_choice(obj: Json<'_>, extra: &mut Map<String, Value>) -> Option<ToolChoice> {
    let tc = obj.get("tool_choice").filter(|tc| tc.is_object())?;
    if bool_field(tc, "disable_parallel_tool_use") == Some(true) {
        extra.insert("parallel_tool_calls".into(), Value::Bool(false));
    }
    match tc.get_str("type").as_deref() {
        Some("auto") => Some(ToolChoice::Auto),
        Some("any") => Some(ToolChoice::Required),
        Some("none") => Some(ToolChoice::None),
        Some("tool") => string_field(tc, "name").map(|name| ToolChoice::Tool { name }),
        _ => None,
    }
}

/// After removing block 0, renumber `block_extra` entries.
fn shift_block_extra(extra: &mut Map<String, Value>) {
    if let Some(Value::Array(list)) = extra.get_mut("block_extra") {
        list.retain(|e| e.get("index").and_then(Value::as_u64) != Some(0));
        for e in list.iter_mut() {
            if let Some(n) = e.get("index").and_then(Value::as_u64)
                && let Some(o) = e.as_object_mut()
            {
                o.insert("index".into(), json!(n - 1));
            }
        }
        if list.is_empty() {
            extra.remove("block_extra");
        }
    }
}

/// A non-tool content block as a part, with its unknown fields.
fn block_part(b: Json<'_>) -> (Part, Map<String, Value>) {
    let other = || {
        (
            Part::Other {
                value: b.to_value(),
            },
            Map::new(),
        )
    };
    if !b.is_object() {
        return other();
    }
    match b.get_str("type").as_deref() {
        Some("text") => (
            Part::Text {
                text: text_field(b, "text").unwrap_or_default(),
            },
            rest(b, &["type", "text"]),
        ),
        Some("image") => {
            let src = b.get("source").filter(|s| s.is_object());
            let src_field = |k: &str| src.and_then(|s| string_field(s, k));
            let part = match src.and_then(|s| s.get_str("type")).as_deref() {
                Some("base64") => Part::Image {
                    media_type: src_field("media_type"),
                    data: src_field("data"),
                    url: None,
                },
                Some("url") => Part::Image {
                    media_type: None,
                    data: None,
                    url: src_field("url"),
                },
                _ => return other(),
            };
            (part, rest(b, &["type", "source"]))
        }
        _ => other(),
    }
}

/// `content`, or `null` when absent.
fn content_or_null(content: Option<Json<'_>>) -> Json<'_> {
    content.unwrap_or_else(Json::null)
}

/// A message of `role` from content given as a string or blocks.
fn content_message(role: Role, content: Json<'_>, at: &str) -> Result<Message, ProviderError> {
    let mut msg = Message::new(role);
    if let Some(text) = text(content) {
        msg.content.push(Part::Text { text });
    } else if let Some(blocks) = content.as_array() {
        for (i, b) in blocks.enumerate() {
            let (part, fields) = block_part(b);
            msg.content.push(part);
            push_indexed(&mut msg.extra, "block_extra", i, fields);
        }
    } else if !content.is_null() {
        return Err(ProviderError::invalid(format!(
            "{at}.content: must be a string or an array of blocks"
        )));
    }
    Ok(msg)
}

fn assistant_message(
    content: Option<Json<'_>>,
    at: &dyn Fn() -> String,
) -> Result<Message, ProviderError> {
    let Some(blocks) = content.and_then(|c| c.as_array()) else {
        return content_message(Role::Assistant, content_or_null(content), &at());
    };
    let mut msg = Message::new(Role::Assistant);
    for (i, b) in blocks.enumerate() {
        if !b.is_object() {
            return Err(ProviderError::invalid(format!(
                "{}.content[{i}]: must be an object",
                at()
            )));
        }
        match b.get_str("type").as_deref() {
            Some("thinking") if msg.reasoning.is_none() => {
                msg.reasoning = Some(Reasoning {
                    text: string_field(b, "thinking").unwrap_or_default(),
                    signature: string_field(b, "signature").filter(|s| !s.is_empty()),
                    encrypted: None,
                });
                push_indexed(
                    &mut msg.extra,
                    "block_extra",
                    i,
                    rest(b, &["type", "thinking", "signature"]),
                );
            }
            Some("tool_use") => {
                let id = string_field(b, "id").ok_or_else(|| {
                    ProviderError::invalid(format!("{}.content[{i}].id: field required", at()))
                })?;
                msg.tool_calls.push(ToolCall {
                    id,
                    name: string_field(b, "name").unwrap_or_default(),
                    arguments: b
                        .get("input")
                        .map_or_else(|| "{}".to_owned(), |input| input.to_compact_string()),
                });
                push_indexed(
                    &mut msg.extra,
                    "block_extra",
                    i,
                    rest(b, &["type", "id", "name", "input"]),
                );
            }
            _ => {
                let (part, fields) = block_part(b);
                msg.content.push(part);
                push_indexed(&mut msg.extra, "block_extra", i, fields);
            }
        }
    }
    Ok(msg)
}

/// A user turn: `tool_result` blocks become tool messages, the other blocks
/// user messages, in their order.
fn user_messages(
    content: Option<Json<'_>>,
    at: &dyn Fn() -> String,
    tool_names: &HashMap<String, String>,
    out: &mut Vec<Message>,
) -> Result<(), ProviderError> {
    let Some(blocks) = content.and_then(|c| c.as_array()) else {
        out.push(content_message(
            Role::User,
            content_or_null(content),
            &at(),
        )?);
        return Ok(());
    };
    let mut pending: Option<Message> = None;
    for (i, b) in blocks.enumerate() {
        if !b.is_object() {
            return Err(ProviderError::invalid(format!(
                "{}.content[{i}]: must be an object",
                at()
            )));
        }
        if field_is(b, "type", "tool_result") {
            if let Some(p) = pending.take() {
                out.push(p);
            }
            let id = string_field(b, "tool_use_id").ok_or_else(|| {
                ProviderError::invalid(format!("{}.content[{i}].tool_use_id: field required", at()))
            })?;
            let mut msg = content_message(Role::Tool, content_or_null(b.get("content")), &at())?;
            msg.name = tool_names.get(&id).cloned();
            msg.tool_call_id = Some(id);
            msg.is_error = bool_field(b, "is_error").unwrap_or(false);
            msg.extra
                .extend(rest(b, &["type", "tool_use_id", "content", "is_error"]));
            out.push(msg);
        } else {
            let msg = pending.get_or_insert_with(|| Message::new(Role::User));
            let (part, fields) = block_part(b);
            let index = msg.content.len();
            msg.content.push(part);
            push_indexed(&mut msg.extra, "block_extra", index, fields);
        }
    }
    if let Some(p) = pending {
        out.push(p);
    }
    Ok(())
}

// ---------------------------------------------------------------- response conversion

/// Anthropic's `stop_reason` for a finish reason.
pub fn stop_reason(reason: &FinishReason, has_tool_calls: bool) -> &'static str {
    match effective_finish(reason, has_tool_calls) {
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::ContentFilter => "refusal",
        FinishReason::Stop | FinishReason::Abort | FinishReason::Other(_) => "end_turn",
    }
}

/// `usage` of a message (in `message_start` with the prompt's tokens
/// only) and of `message_delta`.
#[derive(Serialize)]
struct UsageOut {
    input_tokens: u32,
    output_tokens: u32,
    cache_creation_input_tokens: u32,
    cache_read_input_tokens: u32,
}

impl UsageOut {
    fn of(u: &Usage) -> Self {
        let cached = u.cached_tokens.unwrap_or(0);
        Self {
            input_tokens: u.prompt_tokens.saturating_sub(cached),
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
        }
    }
}

fn message_id(id: &str) -> String {
    prefixed_id("msg_", id)
}

/// A message: the whole reply, or its head in `message_start`.
#[derive(Serialize)]
struct MessageOut<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<Block<'a>>,
    /// `null` in `message_start`.
    stop_reason: Option<&'static str>,
    /// Always `null`.
    stop_sequence: (),
    usage: UsageOut,
}

/// A content block, whole in a reply, or as `content_block_start` opens it.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
}

/// A `content_block_delta`'s `delta`.
#[derive(Serialize)]
#[serde(tag = "type")]
enum BlockDelta<'a> {
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// `message_delta`'s `delta`.
#[derive(Serialize)]
struct StopOut {
    stop_reason: &'static str,
    /// Always `null`.
    stop_sequence: (),
}

/// One streamed event; its `type` is also its SSE event name.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum EventOut<'a> {
    MessageStart {
        message: MessageOut<'a>,
    },
    ContentBlockStart {
        index: u32,
        content_block: Block<'a>,
    },
    ContentBlockDelta {
        index: u32,
        delta: BlockDelta<'a>,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        delta: StopOut,
        usage: UsageOut,
    },
    MessageStop,
}

impl EventOut<'_> {
    fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
        }
    }
}

fn response_body(resp: &ChatResponse) -> Bytes {
    let m = &resp.message;
    let mut content = Vec::new();
    if let Some(r) = &m.reasoning {
        content.push(Block::Thinking {
            thinking: &r.text,
            signature: r.signature.as_deref().unwrap_or_default(),
        });
    }
    let text = m.joined_text();
    if !text.is_empty() {
        content.push(Block::Text { text: &text });
    }
    for c in &m.tool_calls {
        content.push(Block::ToolUse {
            id: &c.id,
            name: &c.name,
            input: super::arguments_object(&c.arguments),
        });
    }
    super::json_bytes(&MessageOut {
        id: message_id(&resp.id),
        kind: "message",
        role: "assistant",
        model: &resp.model,
        content,
        stop_reason: Some(stop_reason(&resp.finish_reason, !m.tool_calls.is_empty())),
        stop_sequence: (),
        usage: UsageOut::of(&resp.usage),
    })
}

// ---------------------------------------------------------------- stream encoder

/// Streams a reply as Anthropic SSE: `message_start`, blocks
/// (`content_block_start` / `_delta` / `_stop`), `message_delta`,
/// `message_stop`. Tool-use blocks stay open until another kind of block
/// starts or the reply ends, so arguments of interleaved calls all land in
/// their own block.
#[derive(Debug, Default)]
pub struct Encoder {
    started: bool,
    done: bool,
    next_index: u32,
    thinking: Option<u32>,
    text: Option<u32>,
    /// Open tool blocks: (call index, block index).
    tools: Vec<(u32, u32)>,
    saw_tool: bool,
    prompt_tokens: u32,
}

fn event(out: &mut Vec<u8>, event: &EventOut<'_>) {
    sse::write_json(out, Some(event.name()), event);
}

impl Encoder {
    fn start(&mut self, out: &mut Vec<u8>, id: &str, model: &str, prompt: Option<u32>) {
        self.started = true;
        self.prompt_tokens = prompt.unwrap_or(0);
        let message = MessageOut {
            id: message_id(id),
            kind: "message",
            role: "assistant",
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: (),
            usage: UsageOut {
                input_tokens: self.prompt_tokens,
                output_tokens: 0,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
            },
        };
        event(out, &EventOut::MessageStart { message });
    }

    fn open(&mut self, out: &mut Vec<u8>, content_block: Block<'_>) -> u32 {
        let index = self.next_index;
        self.next_index += 1;
        event(
            out,
            &EventOut::ContentBlockStart {
                index,
                content_block,
            },
        );
        index
    }

    fn stop_block(out: &mut Vec<u8>, index: u32) {
        event(out, &EventOut::ContentBlockStop { index });
    }

    fn delta(out: &mut Vec<u8>, index: u32, delta: BlockDelta<'_>) {
        event(out, &EventOut::ContentBlockDelta { index, delta });
    }

    fn close_text_like(&mut self, out: &mut Vec<u8>) {
        for i in [self.thinking.take(), self.text.take()]
            .into_iter()
            .flatten()
        {
            Self::stop_block(out, i);
        }
    }

    fn close_all(&mut self, out: &mut Vec<u8>) {
        self.close_text_like(out);
        for (_, i) in std::mem::take(&mut self.tools) {
            Self::stop_block(out, i);
        }
    }

    fn open_thinking(&mut self, out: &mut Vec<u8>) -> u32 {
        match self.thinking {
            Some(i) => i,
            None => {
                self.close_all(out);
                let i = self.open(
                    out,
                    Block::Thinking {
                        thinking: "",
                        signature: "",
                    },
                );
                self.thinking = Some(i);
                i
            }
        }
    }

    /// The open text block, else a new one (closing the others).
    fn open_text(&mut self, out: &mut Vec<u8>) -> u32 {
        match self.text {
            Some(i) => i,
            None => {
                self.close_all(out);
                let i = self.open(out, Block::Text { text: "" });
                self.text = Some(i);
                i
            }
        }
    }

    /// Closes every block and sends `message_delta` (the stop reason and
    /// usage, with the prompt tokens given at the start when `usage` has
    /// none) and `message_stop`.
    fn finish(&mut self, out: &mut Vec<u8>, finish_reason: &FinishReason, usage: &Usage) {
        self.close_all(out);
        let mut usage_out = UsageOut::of(usage);
        if usage.prompt_tokens == 0 {
            usage_out.input_tokens = self.prompt_tokens;
        }
        let delta = StopOut {
            stop_reason: stop_reason(finish_reason, self.saw_tool),
            stop_sequence: (),
        };
        event(
            out,
            &EventOut::MessageDelta {
                delta,
                usage: usage_out,
            },
        );
        event(out, &EventOut::MessageStop);
        self.done = true;
    }
}

impl StreamEncoder for Encoder {
    fn push(&mut self, ev: &StreamEvent) -> Bytes {
        let mut out = Vec::new();
        if self.done {
            return Bytes::new();
        }
        if let StreamEvent::Start {
            id,
            model,
            prompt_tokens,
        } = ev
        {
            if !self.started {
                self.start(&mut out, id, model, *prompt_tokens);
            }
            return Bytes::from(out);
        }
        if !self.started {
            self.start(&mut out, "", "", None);
        }
        match ev {
            StreamEvent::Start { .. } => {}
            StreamEvent::ReasoningDelta { text } => {
                let i = self.open_thinking(&mut out);
                if !text.is_empty() {
                    Self::delta(&mut out, i, BlockDelta::Thinking { thinking: text });
                }
            }
            StreamEvent::ReasoningDone { signature } => {
                if self.thinking.is_some() || signature.is_some() {
                    let i = self.open_thinking(&mut out);
                    if let Some(sig) = signature {
                        Self::delta(&mut out, i, BlockDelta::Signature { signature: sig });
                    }
                    self.thinking = None;
                    Self::stop_block(&mut out, i);
                }
            }
            StreamEvent::TextDelta { text } => {
                if !text.is_empty() {
                    let i = self.open_text(&mut out);
                    Self::delta(&mut out, i, BlockDelta::Text { text });
                }
            }
            StreamEvent::ToolCallStart { index, id, name } => {
                if !self.tools.iter().any(|(c, _)| c == index) {
                    self.close_text_like(&mut out);
                    let b = self.open(
                        &mut out,
                        Block::ToolUse {
                            id,
                            name,
                            input: Value::Object(Map::new()),
                        },
                    );
                    self.tools.push((*index, b));
                    self.saw_tool = true;
                }
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                if let Some((_, b)) = self.tools.iter().find(|(c, _)| c == index)
                    && !arguments.is_empty()
                {
                    Self::delta(
                        &mut out,
                        *b,
                        BlockDelta::InputJson {
                            partial_json: arguments,
                        },
                    );
                }
            }
            StreamEvent::Finish {
                finish_reason,
                usage,
            } => self.finish(&mut out, finish_reason, usage),
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
        sse::write_json(&mut out, Some("error"), &body);
        Bytes::from(out)
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

// ---------------------------------------------------------------- errors

/// Anthropic's error `type` for a kind.
fn error_type(kind: super::ErrorKind) -> &'static str {
    use super::ErrorKind as K;
    match kind {
        K::InvalidRequest | K::Unsupported | K::ContextOverflow { .. } => "invalid_request_error",
        K::TooLarge => "request_too_large",
        K::NotFound => "not_found_error",
        K::Overloaded => "overloaded_error",
        K::BackendTimeout => "timeout_error",
        K::BackendUnavailable | K::BackendError | K::Internal => "api_error",
    }
}

/// Anthropic's own words for a request over the context: Claude Code
/// compacts on "prompt is too long: P tokens > M maximum" and lowers
/// `max_tokens` on "input length and `max_tokens` exceed context limit".
fn overflow_message(prompt: u32, completion: Option<u32>, max: u32) -> String {
    match completion {
        Some(c) if prompt < max => format!(
            "input length and `max_tokens` exceed context limit: {prompt} + {c} > {max}, \
             decrease input length or `max_tokens` and try again"
        ),
        _ => format!("prompt is too long: {prompt} tokens > {max} maximum"),
    }
}

/// Status and `{"type":"error","error":{"type","message"}}` body.
pub fn error_body(err: &ProviderError) -> (u16, Value) {
    let message = match err.kind {
        super::ErrorKind::ContextOverflow {
            prompt,
            completion,
            max,
        } => overflow_message(prompt, completion, max),
        _ => err.message.clone(),
    };
    (
        err.kind.status(Api::AnthropicMessages),
        json!({
            "type": "error",
            "error": {"type": error_type(err.kind), "message": message},
        }),
    )
}

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests;
