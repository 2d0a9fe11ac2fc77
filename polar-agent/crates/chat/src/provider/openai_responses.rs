//! OpenAI Responses (Codex CLI; opencode and pi with an OpenAI provider):
//! `POST /v1/responses`.
//!
//! Requests: `instructions` (a system message marked with
//! [`super::SOURCE_KEY`]` = "instructions"`) or none (Codex puts its prompt in
//! `developer` items); `input` as a string or items: `message` (also without
//! `type`, as opencode and pi send), `function_call`, `function_call_output`,
//! `reasoning` (`summary`, `content`, `encrypted_content`),
//! `local_shell_call` (a call named `local_shell` whose arguments are the
//! `action`), `custom_tool_call` (arguments = its `input` text), their
//! outputs, Codex's `additional_tools` (its tools join the tool list, the
//! item is kept in `extra.additional_tools`), and any other item kept in
//! `extra.input_other` as `{"index", "item"}`. Consecutive reasoning /
//! assistant message / call items form one assistant [`Message`]; fields of
//! those items without a place (`id`, `status`, `type` of non-function
//! calls, ...) are kept in its `extra.item_extra` as `{"index": input index,
//! ...}`. `previous_response_id` is exposed on [`ParsedRequest`]; see
//! [`super::with_history`].
//!
//! Replies carry reasoning as a `reasoning` item whose one `summary_text`
//! part holds the full reasoning text (harnesses send it back, so it
//! round-trips), with `encrypted_content` from [`Reasoning::encrypted`] or,
//! failing that, the signature. Tools other than `function` (web search,
//! local shell, custom/freeform) are not offered to the backend; they are
//! kept in `extra.tools_other`.
//!
//! A request ending with a `compaction_trigger` item is a server-side
//! compaction, answered with one `compaction` item; `compaction` items in
//! later input expand into the summary (see [`compaction`]).

use std::collections::HashMap;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::openai_chat::openai_error_type;
use super::read::{
    array_field, body_object, bool_field, f64_field, field_is, function_tool, request_model, rest,
    string_field, text, text_field, text_of, u32_of,
};
use super::{
    ErrorKind, ModelCall, ParsedRequest, ProviderError, ReplyOptions, SOURCE_KEY, StreamEncoder,
    effective_finish, image_from_url, prefixed_id, push_indexed, sse,
};
use crate::Api;
use crate::{
    ChatRequest, ChatResponse, FinishReason, Message, Part, Reasoning, ResponseFormat, Role,
    Sampling, StreamEvent, Tool, ToolCall, ToolChoice, Usage,
};
use polar_json::Json;

pub mod compaction;

// ---------------------------------------------------------------- types

/// The OpenAI Responses protocol.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenaiResponses;

const REQUEST_KEYS: &[&str] = &[
    "model",
    "instructions",
    "input",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "previous_response_id",
];

impl super::Protocol for OpenaiResponses {
    const API: Api = Api::OpenaiResponses;
    type Encoder = Encoder;

    fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError> {
        parse_request(call, body)
    }

    fn response_body(resp: &ChatResponse, opts: &ReplyOptions) -> Bytes {
        super::json_bytes(&response_body(resp, opts))
    }

    fn encoder(opts: &ReplyOptions) -> Encoder {
        Encoder::new(opts)
    }

    fn error_body(err: &ProviderError) -> (u16, Value) {
        error_body(err)
    }
}

// ---------------------------------------------------------------- request conversion

/// Builds the message list from input items.
#[derive(Default)]
struct Items {
    messages: Vec<Message>,
    /// The assistant message being built from consecutive items.
    assistant: Option<Message>,
    tool_names: HashMap<String, String>,
    /// The input index of a `compaction_trigger` item.
    compaction_trigger: Option<usize>,
}

impl Items {
    fn flush(&mut self) {
        if let Some(m) = self.assistant.take() {
            for c in &m.tool_calls {
                self.tool_names.insert(c.id.clone(), c.name.clone());
            }
            self.messages.push(m);
        }
    }

    fn push(&mut self, m: Message) {
        self.flush();
        self.messages.push(m);
    }

    fn assistant(&mut self) -> &mut Message {
        self.assistant
            .get_or_insert_with(|| Message::new(Role::Assistant))
    }

    fn tool_result(
        &mut self,
        item: Json<'_>,
        at: &dyn Fn() -> String,
    ) -> Result<(), ProviderError> {
        self.flush();
        let id = string_field(item, "call_id")
            .ok_or_else(|| ProviderError::invalid(format!("{}.call_id: field required", at())))?;
        let mut m = Message::new(Role::Tool);
        if let Some(output) = item.get("output") {
            if let Some(parts) = output.as_array() {
                for (i, p) in parts.enumerate() {
                    let (part, fields) = content_part(p);
                    m.content.push(part);
                    push_indexed(&mut m.extra, "part_extra", i, fields);
                }
            } else {
                let text = text(output).unwrap_or_else(|| text_of(output).into());
                m.content.push(Part::Text { text });
            }
        }
        m.name = self.tool_names.get(&id).cloned();
        m.tool_call_id = Some(id);
        m.extra.extend(rest(item, &["call_id", "output"]));
        self.messages.push(m);
        Ok(())
    }
}

fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError> {
    let obj = body_object(body)?;
    let model = request_model(obj, call)?;
    let mut extra = rest(obj, REQUEST_KEYS);
    let mut items = Items::default();
    let mut tools = Vec::new();
    let mut other_tools = Vec::new();
    let mut tool_extra = Vec::new();

    if let Some(v) = obj.get("instructions").filter(|v| !v.is_null()) {
        match text(v) {
            Some(t) if t.is_empty() => {}
            Some(t) => {
                let mut m = Message::text(Role::System, t);
                m.extra
                    .insert(SOURCE_KEY.into(), Value::String("instructions".into()));
                items.push(m);
            }
            None => {
                extra.insert("instructions".into(), v.to_value());
            }
        }
    }

    if let Some(input) = obj.get("input") {
        if let Some(t) = text(input) {
            items.push(Message::text(Role::User, t));
        } else if let Some(list) = input.as_array() {
            for (i, item) in list.enumerate() {
                parse_item(
                    i,
                    item,
                    &mut items,
                    &mut extra,
                    &mut tools,
                    &mut other_tools,
                    &mut tool_extra,
                )?;
            }
        } else if !input.is_null() {
            return Err(ProviderError::invalid(
                "input: must be a string or an array of items",
            ));
        }
    }
    items.flush();
    let compacting = items.compaction_trigger.is_some();
    if let Some(i) = items.compaction_trigger {
        let last = obj
            .get("input")
            .and_then(|l| l.as_array())
            .map(Iterator::count);
        if last != Some(i + 1) {
            return Err(ProviderError::invalid(format!(
                "input[{i}]: {} must be the last input item",
                compaction::TRIGGER
            )));
        }
    }

    for t in array_field(obj, "tools") {
        add_tool(t, &mut tools, &mut other_tools, &mut tool_extra);
    }
    if compacting {
        // A summary calls no tools: none is offered to the backend (the
        // native request keeps them).
        tools.clear();
    }
    if !other_tools.is_empty() {
        extra.insert("tools_other".into(), Value::Array(other_tools));
    }
    if !tool_extra.is_empty() {
        extra.insert("tool_extra".into(), Value::Array(tool_extra));
    }

    let tc = obj.get("tool_choice");
    let tool_choice = tc.and_then(|tc| match tc.as_str() {
        Some(s) => match s.as_ref() {
            "auto" => Some(ToolChoice::Auto),
            "none" => Some(ToolChoice::None),
            "required" => Some(ToolChoice::Required),
            _ => None,
        },
        None if field_is(tc, "type", "function") => {
            string_field(tc, "name").map(|name| ToolChoice::Tool { name })
        }
        None => None,
    });
    if tool_choice.is_none()
        && let Some(tc) = tc
    {
        extra.insert("tool_choice".into(), tc.to_value());
    }

    let response_format = super::structured::openai_responses(obj.get("text"))?;
    super::structured::take_nested(&mut extra, "text", "format");
    let request = ChatRequest {
        model,
        messages: items.messages,
        tools,
        tool_choice: if compacting { None } else { tool_choice },
        response_format,
        sampling: Sampling {
            max_tokens: u32_of(obj.get("max_output_tokens")),
            temperature: f64_field(obj, "temperature"),
            top_p: f64_field(obj, "top_p"),
            top_k: u32_of(obj.get("top_k")),
            stop: Vec::new(),
            seed: None,
        },
        stream: bool_field(obj, "stream").unwrap_or(false),
        extra,
    };
    Ok(ParsedRequest {
        request,
        previous_response_id: string_field(obj, "previous_response_id"),
        include_usage: false,
        compaction: compacting,
    })
}

fn add_tool(
    t: Json<'_>,
    tools: &mut Vec<Tool>,
    other: &mut Vec<Value>,
    tool_extra: &mut Vec<Value>,
) {
    if !(field_is(t, "type", "function") && t.get("name").is_some()) {
        other.push(t.to_value());
        return;
    }
    tools.push(function_tool(
        t,
        t.get("parameters"),
        &["type", "name", "description", "parameters"],
        tool_extra,
    ));
}

fn parse_item(
    i: usize,
    item: Json<'_>,
    items: &mut Items,
    extra: &mut Map<String, Value>,
    tools: &mut Vec<Tool>,
    other_tools: &mut Vec<Value>,
    tool_extra: &mut Vec<Value>,
) -> Result<(), ProviderError> {
    let at = || format!("input[{i}]");
    if !item.is_object() {
        return Err(ProviderError::invalid(format!(
            "{}: must be an object",
            at()
        )));
    }
    let ty = item.get_str("type");
    let ty = ty.as_deref();
    match ty {
        Some("message") | None if item.get("role").is_some() => {
            input_message(i, item, items, &at)?;
        }
        Some("reasoning") => input_reasoning(i, item, items),
        Some("function_call" | "local_shell_call" | "custom_tool_call") => {
            input_call(i, item, ty, items, &at)?;
        }
        Some("function_call_output" | "local_shell_call_output" | "custom_tool_call_output") => {
            items.tool_result(item, &at)?;
            if ty != Some("function_call_output")
                && let Some(m) = items.messages.last_mut()
            {
                m.extra.insert("type".into(), json!(ty));
            } else if let Some(m) = items.messages.last_mut() {
                m.extra.remove("type");
            }
        }
        Some("additional_tools") => {
            for t in array_field(item, "tools") {
                add_tool(t, tools, other_tools, tool_extra);
            }
            push_list(extra, "additional_tools", item.to_value());
        }
        Some(compaction::TRIGGER) => {
            items.push(compaction::instructions_message());
            items.compaction_trigger = Some(i);
        }
        Some(compaction::ITEM) => {
            let content = item.get_str("encrypted_content");
            match content.as_deref().and_then(compaction::decode) {
                Some(summary) => items.push(compaction::summary_message(summary)),
                None => push_list(
                    extra,
                    "input_other",
                    json!({"index": i, "item": item.to_value()}),
                ),
            }
        }
        _ => push_list(
            extra,
            "input_other",
            json!({"index": i, "item": item.to_value()}),
        ),
    }
    Ok(())
}

/// A `message` item (input item `i`). Assistant content joins the assistant
/// message being built unless that already has content or calls.
fn input_message(
    i: usize,
    item: Json<'_>,
    items: &mut Items,
    at: &dyn Fn() -> String,
) -> Result<(), ProviderError> {
    let role = match item.get_str("role").as_deref() {
        Some("system") => Role::System,
        Some("developer") => Role::Developer,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        other => {
            return Err(ProviderError::invalid(format!(
                "{}.role: unknown role {other:?}",
                at()
            )));
        }
    };
    let mut parts = Vec::new();
    let mut part_extra = Map::new();
    if let Some(content) = item.get("content") {
        if let Some(text) = text(content) {
            parts.push(Part::Text { text });
        } else if let Some(list) = content.as_array() {
            for (k, p) in list.enumerate() {
                let (part, fields) = content_part(p);
                parts.push(part);
                push_indexed(&mut part_extra, "part_extra", k, fields);
            }
        }
    }
    let fields = rest(item, &["type", "role", "content"]);
    if role == Role::Assistant {
        let a = items.assistant();
        if !a.content.is_empty() || !a.tool_calls.is_empty() {
            items.flush();
        }
        let a = items.assistant();
        a.content.extend(parts);
        a.extra.extend(part_extra);
        push_indexed(&mut a.extra, "item_extra", i, fields);
    } else {
        let mut m = Message::new(role);
        m.content = parts;
        m.extra = part_extra;
        m.extra.extend(fields);
        items.push(m);
    }
    Ok(())
}

/// A `reasoning` item (input item `i`): the reasoning of a new assistant
/// message, its text from `content`, else `summary`.
fn input_reasoning(i: usize, item: Json<'_>, items: &mut Items) {
    items.flush();
    let texts = |key: &str| -> Option<String> {
        let t: Vec<_> = item
            .get(key)?
            .as_array()?
            .filter_map(|p| p.get_str("text"))
            .collect();
        (!t.is_empty()).then(|| t.join("\n\n"))
    };
    let text = texts("content")
        .or_else(|| texts("summary"))
        .unwrap_or_default();
    let a = items.assistant();
    a.reasoning = Some(Reasoning {
        text,
        signature: None,
        encrypted: string_field(item, "encrypted_content"),
    });
    push_indexed(
        &mut a.extra,
        "item_extra",
        i,
        rest(item, &["summary", "content", "encrypted_content"]),
    );
}

/// A `function_call`, `local_shell_call` or `custom_tool_call` item (input
/// item `i`, of type `ty`) as a call of the assistant message being built.
fn input_call(
    i: usize,
    item: Json<'_>,
    ty: Option<&str>,
    items: &mut Items,
    at: &dyn Fn() -> String,
) -> Result<(), ProviderError> {
    let call_id = string_field(item, "call_id")
        .or_else(|| string_field(item, "id"))
        .ok_or_else(|| ProviderError::invalid(format!("{}.call_id: field required", at())))?;
    let text = |key: &str| item.get(key).map(text_of).unwrap_or_default();
    let (name, arguments, known): (String, String, &[&str]) = match ty {
        Some("function_call") => (
            string_field(item, "name").unwrap_or_default(),
            text("arguments"),
            &["type", "call_id", "name", "arguments"],
        ),
        Some("local_shell_call") => (
            "local_shell".to_owned(),
            item.get("action")
                .map(|a| a.to_compact_string())
                .unwrap_or_default(),
            &["call_id", "action"],
        ),
        _ => (
            string_field(item, "name").unwrap_or_default(),
            text("input"),
            &["call_id", "name", "input"],
        ),
    };
    let a = items.assistant();
    a.tool_calls.push(ToolCall {
        id: call_id,
        name,
        arguments,
    });
    push_indexed(&mut a.extra, "item_extra", i, rest(item, known));
    Ok(())
}

fn push_list(extra: &mut Map<String, Value>, key: &str, v: Value) {
    if let Value::Array(list) = extra.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
        list.push(v);
    }
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
        Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => (
            Part::Text {
                text: text_field(p, "text").unwrap_or_default(),
            },
            rest(p, &["type", "text"]),
        ),
        Some("input_image") => match p.get_str("image_url") {
            Some(url) => (image_from_url(&url), rest(p, &["type", "image_url"])),
            None => other(),
        },
        _ => other(),
    }
}

// ---------------------------------------------------------------- response conversion

/// The `resp_...` id the harness sees for a reply whose backend id is `id`:
/// the key under which the proxy stores [`super::conversation_after`] for a
/// later `previous_response_id`.
pub fn response_id(id: &str) -> String {
    prefixed_id("resp_", id)
}

/// An output item id: `{prefix}{response id without resp_}_{index}`.
fn item_id(prefix: &str, resp_id: &str, index: u32) -> String {
    let base = resp_id.strip_prefix("resp_").unwrap_or(resp_id);
    format!("{prefix}{base}_{index}")
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens.unwrap_or(0)},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens.saturating_add(u.completion_tokens),
    })
}

/// The response `status` and `incomplete_details` for a finish reason.
fn status_of(reason: &FinishReason) -> (&'static str, Value) {
    match reason {
        FinishReason::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        FinishReason::ContentFilter => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// The `text.format` a reply echoes: the request's structured output, in
/// the Responses shape (`{"type": "json_schema", "name", "schema",
/// "strict"}`, `{"type": "json_object"}`), else `{"type": "text"}`.
fn text_format(format: Option<&ResponseFormat>) -> Value {
    match format {
        None => json!({"type": "text"}),
        Some(ResponseFormat::JsonObject) => json!({"type": "json_object"}),
        Some(ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
        }) => {
            let mut f = json!({"type": "json_schema", "name": name, "schema": schema});
            if let Some(s) = strict {
                f["strict"] = json!(s);
            }
            f
        }
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one value per field of the response object that varies"
)]
fn response_object(
    format: Value,
    id: &str,
    model: &str,
    created: u64,
    status: &str,
    output: Vec<Value>,
    usage: Value,
    incomplete: Value,
    error: Value,
) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": false,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": null,
        "max_output_tokens": null,
        "model": model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": null,
        "text": {"format": format},
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    })
}

fn reasoning_item(id: &str, text: &str, encrypted: Option<&str>) -> Value {
    let mut v = json!({
        "type": "reasoning",
        "id": id,
        "summary": [{"type": "summary_text", "text": text}],
    });
    if let (Some(e), Some(o)) = (encrypted, v.as_object_mut()) {
        o.insert("encrypted_content".into(), json!(e));
    }
    v
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

fn response_body(resp: &ChatResponse, opts: &ReplyOptions) -> Value {
    let id = response_id(&resp.id);
    let m = &resp.message;
    if opts.compaction {
        let item = compaction::item(&item_id("cmp_", &id, 0), &m.joined_text());
        let (status, incomplete) = status_of(&resp.finish_reason);
        return response_object(
            text_format(opts.response_format.as_ref()),
            &id,
            &resp.model,
            opts.created,
            status,
            vec![item],
            usage_json(&resp.usage),
            incomplete,
            Value::Null,
        );
    }
    let mut output = Vec::new();
    let mut next = 0u32;
    let mut next_index = || {
        let i = next;
        next += 1;
        i
    };
    if let Some(r) = &m.reasoning {
        let enc = r.encrypted.as_deref().or(r.signature.as_deref());
        output.push(reasoning_item(
            &item_id("rs_", &id, next_index()),
            &r.text,
            enc,
        ));
    }
    let text = m.joined_text();
    if !text.is_empty() {
        output.push(message_item(
            &item_id("msg_", &id, next_index()),
            &text,
            "completed",
        ));
    }
    for c in &m.tool_calls {
        output.push(call_item(
            &item_id("fc_", &id, next_index()),
            &c.id,
            &c.name,
            &c.arguments,
            "completed",
        ));
    }
    let reason = effective_finish(&resp.finish_reason, !m.tool_calls.is_empty());
    let (status, incomplete) = status_of(&reason);
    response_object(
        text_format(opts.response_format.as_ref()),
        &id,
        &resp.model,
        opts.created,
        status,
        output,
        usage_json(&resp.usage),
        incomplete,
        Value::Null,
    )
}

// ---------------------------------------------------------------- stream encoder

/// One streamed event: its `type` (also its SSE event name), its data's
/// fields, and its `sequence_number`, counted by `seq`.
fn emit(out: &mut Vec<u8>, seq: &mut u64, ty: &str, data: &impl Serialize) {
    let event = EventOut {
        kind: ty,
        data,
        sequence_number: *seq,
    };
    *seq += 1;
    sse::write_json(out, Some(ty), &event);
}

#[derive(Serialize)]
struct EventOut<'a, T> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(flatten)]
    data: T,
    sequence_number: u64,
}

/// The data of the events that carry a piece of text or arguments (one
/// per token): `response.output_text.delta` (with `content_index` and an
/// empty `logprobs`), `response.reasoning_summary_text.delta` (with
/// `summary_index`), `response.function_call_arguments.delta`.
#[derive(Serialize)]
struct Delta<'a> {
    item_id: &'a str,
    output_index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_index: Option<u32>,
    delta: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[(); 0]>,
}

#[derive(Debug)]
struct OpenItem {
    output_index: u32,
    id: String,
    text: String,
}

#[derive(Debug)]
struct OpenCall {
    index: u32,
    output_index: u32,
    id: String,
    call_id: String,
    name: String,
    arguments: String,
}

/// Streams a reply as Responses events, each with a strictly increasing
/// `sequence_number`: `response.created`, `response.in_progress`, then per
/// output item `response.output_item.added`, its parts and deltas,
/// `.done` events and `response.output_item.done`, then
/// `response.completed` (or `response.incomplete`) with the full response.
#[derive(Debug)]
pub struct Encoder {
    created: u64,
    /// The `text.format` echoed (see [`text_format`]).
    format: Value,
    id: String,
    model: String,
    seq: u64,
    started: bool,
    done: bool,
    next_output: u32,
    /// Finished items by output index.
    output: Vec<(u32, Value)>,
    reasoning: Option<OpenItem>,
    message: Option<OpenItem>,
    calls: Vec<OpenCall>,
    seen_calls: Vec<u32>,
    /// A compaction reply: the summary text so far (sent as one compaction
    /// item at the end).
    summary: Option<String>,
}

impl Encoder {
    /// An encoder for one reply.
    pub fn new(opts: &ReplyOptions) -> Self {
        Self {
            created: opts.created,
            format: text_format(opts.response_format.as_ref()),
            id: response_id(""),
            model: String::new(),
            seq: 0,
            started: false,
            done: false,
            next_output: 0,
            output: Vec::new(),
            reasoning: None,
            message: None,
            calls: Vec::new(),
            seen_calls: Vec::new(),
            summary: opts.compaction.then(String::new),
        }
    }

    /// A compaction reply's event: text joins the summary (reasoning and
    /// tool calls are no part of it); at the end the summary goes out as
    /// the one compaction item, then the response.
    fn push_compaction(&mut self, out: &mut Vec<u8>, ev: &StreamEvent) {
        match ev {
            StreamEvent::TextDelta { text } => {
                if let Some(s) = self.summary.as_mut() {
                    s.push_str(text);
                }
            }
            StreamEvent::Finish {
                finish_reason,
                usage,
            } => {
                let output_index = self.next_output();
                let id = item_id("cmp_", &self.id, output_index);
                self.emit(
                    out,
                    "response.output_item.added",
                    json!({"output_index": output_index, "item": {"type": compaction::ITEM, "id": id}}),
                );
                let item = compaction::item(&id, self.summary.as_deref().unwrap_or_default());
                self.emit(
                    out,
                    "response.output_item.done",
                    json!({"output_index": output_index, "item": item}),
                );
                self.output.push((output_index, item));
                let (status, incomplete) = status_of(finish_reason);
                let r = self.snapshot(status, usage_json(usage), incomplete, Value::Null);
                let ty = if status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                self.emit(out, ty, json!({"response": r}));
                self.done = true;
            }
            _ => {}
        }
    }

    fn emit(&mut self, out: &mut Vec<u8>, ty: &str, data: Value) {
        emit(out, &mut self.seq, ty, &data);
    }

    fn snapshot(&self, status: &str, usage: Value, incomplete: Value, error: Value) -> Value {
        let mut items = self.output.clone();
        items.sort_by_key(|(i, _)| *i);
        response_object(
            self.format.clone(),
            &self.id,
            &self.model,
            self.created,
            status,
            items.into_iter().map(|(_, v)| v).collect(),
            usage,
            incomplete,
            error,
        )
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        self.started = true;
        let r = self.snapshot("in_progress", Value::Null, Value::Null, Value::Null);
        self.emit(out, "response.created", json!({"response": r}));
        let r = self.snapshot("in_progress", Value::Null, Value::Null, Value::Null);
        self.emit(out, "response.in_progress", json!({"response": r}));
    }

    fn next_output(&mut self) -> u32 {
        let i = self.next_output;
        self.next_output += 1;
        i
    }

    fn close_reasoning(&mut self, out: &mut Vec<u8>, encrypted: Option<&str>) {
        let Some(r) = self.reasoning.take() else {
            return;
        };
        let part = json!({"type": "summary_text", "text": r.text});
        let common = |extra: Value| {
            let mut v =
                json!({"item_id": r.id, "output_index": r.output_index, "summary_index": 0});
            if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
                o.extend(e);
            }
            v
        };
        self.emit(
            out,
            "response.reasoning_summary_text.done",
            common(json!({"text": r.text})),
        );
        self.emit(
            out,
            "response.reasoning_summary_part.done",
            common(json!({"part": part})),
        );
        let item = reasoning_item(&r.id, &r.text, encrypted);
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": r.output_index, "item": item}),
        );
        self.output.push((r.output_index, item));
    }

    fn close_message(&mut self, out: &mut Vec<u8>) {
        let Some(m) = self.message.take() else { return };
        let part = json!({"type": "output_text", "text": m.text, "annotations": []});
        self.emit(
            out,
            "response.output_text.done",
            json!({"item_id": m.id, "output_index": m.output_index, "content_index": 0, "text": m.text, "logprobs": []}),
        );
        self.emit(
            out,
            "response.content_part.done",
            json!({"item_id": m.id, "output_index": m.output_index, "content_index": 0, "part": part}),
        );
        let item = message_item(&m.id, &m.text, "completed");
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": m.output_index, "item": item}),
        );
        self.output.push((m.output_index, item));
    }

    fn close_calls(&mut self, out: &mut Vec<u8>) {
        for c in std::mem::take(&mut self.calls) {
            self.emit(
                out,
                "response.function_call_arguments.done",
                json!({"item_id": c.id, "output_index": c.output_index, "arguments": c.arguments}),
            );
            let item = call_item(&c.id, &c.call_id, &c.name, &c.arguments, "completed");
            self.emit(
                out,
                "response.output_item.done",
                json!({"output_index": c.output_index, "item": item}),
            );
            self.output.push((c.output_index, item));
        }
    }

    fn close_all(&mut self, out: &mut Vec<u8>) {
        self.close_reasoning(out, None);
        self.close_message(out);
        self.close_calls(out);
    }

    fn open_reasoning(&mut self, out: &mut Vec<u8>) {
        if self.reasoning.is_some() {
            return;
        }
        self.close_all(out);
        let output_index = self.next_output();
        let id = item_id("rs_", &self.id, output_index);
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": output_index, "item": {"type": "reasoning", "id": id, "summary": []}}),
        );
        self.emit(
            out,
            "response.reasoning_summary_part.added",
            json!({"item_id": id, "output_index": output_index, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
        );
        self.reasoning = Some(OpenItem {
            output_index,
            id,
            text: String::new(),
        });
    }

    /// Answer text (not empty): opens the message item (closing the others)
    /// if none is open, then its delta.
    fn text_delta(&mut self, out: &mut Vec<u8>, text: &str) {
        if self.message.is_none() {
            self.close_all(out);
            let output_index = self.next_output();
            let id = item_id("msg_", &self.id, output_index);
            self.emit(
                out,
                "response.output_item.added",
                json!({"output_index": output_index, "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}}),
            );
            self.emit(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            self.message = Some(OpenItem {
                output_index,
                id,
                text: String::new(),
            });
        }
        if let Some(m) = self.message.as_mut() {
            m.text.push_str(text);
            let data = Delta {
                item_id: &m.id,
                output_index: m.output_index,
                summary_index: None,
                content_index: Some(0),
                delta: text,
                logprobs: Some([]),
            };
            emit(out, &mut self.seq, "response.output_text.delta", &data);
        }
    }

    /// The first start of call `index`: closes the reasoning and message
    /// items and opens a function call item.
    fn start_call(&mut self, out: &mut Vec<u8>, index: u32, id: &str, name: &str) {
        self.seen_calls.push(index);
        self.close_reasoning(out, None);
        self.close_message(out);
        let output_index = self.next_output();
        let item = item_id("fc_", &self.id, output_index);
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": output_index, "item": call_item(&item, id, name, "", "in_progress")}),
        );
        self.calls.push(OpenCall {
            index,
            output_index,
            id: item,
            call_id: id.to_owned(),
            name: name.to_owned(),
            arguments: String::new(),
        });
    }

    /// Closes every item and sends `response.completed` (or
    /// `response.incomplete`) with the full response.
    fn finish(&mut self, out: &mut Vec<u8>, finish_reason: &FinishReason, usage: &Usage) {
        self.close_all(out);
        let reason = effective_finish(finish_reason, !self.seen_calls.is_empty());
        let (status, incomplete) = status_of(&reason);
        let r = self.snapshot(status, usage_json(usage), incomplete, Value::Null);
        let ty = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        self.emit(out, ty, json!({"response": r}));
        self.done = true;
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
                self.id = response_id(id);
                self.model.clone_from(model);
                self.start(&mut out);
            }
            return Bytes::from(out);
        }
        if !self.started {
            self.start(&mut out);
        }
        if self.summary.is_some() {
            self.push_compaction(&mut out, ev);
            return Bytes::from(out);
        }
        match ev {
            StreamEvent::Start { .. } => {}
            StreamEvent::ReasoningDelta { text } => {
                self.open_reasoning(&mut out);
                if let Some(r) = self.reasoning.as_mut()
                    && !text.is_empty()
                {
                    r.text.push_str(text);
                    let data = Delta {
                        item_id: &r.id,
                        output_index: r.output_index,
                        summary_index: Some(0),
                        content_index: None,
                        delta: text,
                        logprobs: None,
                    };
                    let ty = "response.reasoning_summary_text.delta";
                    emit(&mut out, &mut self.seq, ty, &data);
                }
            }
            StreamEvent::ReasoningDone { signature } => {
                if self.reasoning.is_some() || signature.is_some() {
                    self.open_reasoning(&mut out);
                    self.close_reasoning(&mut out, signature.as_deref());
                }
            }
            StreamEvent::TextDelta { text } => {
                if !text.is_empty() {
                    self.text_delta(&mut out, text);
                }
            }
            StreamEvent::ToolCallStart { index, id, name } => {
                if !self.seen_calls.contains(index) {
                    self.start_call(&mut out, *index, id, name);
                }
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                if let Some(c) = self.calls.iter_mut().find(|c| c.index == *index)
                    && !arguments.is_empty()
                {
                    c.arguments.push_str(arguments);
                    let data = Delta {
                        item_id: &c.id,
                        output_index: c.output_index,
                        summary_index: None,
                        content_index: None,
                        delta: arguments,
                        logprobs: None,
                    };
                    let ty = "response.function_call_arguments.delta";
                    emit(&mut out, &mut self.seq, ty, &data);
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
        let mut out = Vec::new();
        let error = json!({"code": stream_error_code(err.kind), "message": err.message});
        let r = self.snapshot("failed", Value::Null, Value::Null, error);
        self.emit(&mut out, "response.failed", json!({"response": r}));
        Bytes::from(out)
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

// ---------------------------------------------------------------- errors

/// The `error.code` of a `response.failed` event.
fn stream_error_code(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Overloaded => "server_is_overloaded",
        ErrorKind::TooLarge | ErrorKind::ContextOverflow { .. } => "context_length_exceeded",
        ErrorKind::InvalidRequest | ErrorKind::Unsupported | ErrorKind::NotFound => {
            openai_error_type(kind).1
        }
        _ => "server_error",
    }
}

/// Status and OpenAI error body (the same shape as Chat Completions).
pub fn error_body(err: &ProviderError) -> (u16, Value) {
    (
        err.kind.status(Api::OpenaiResponses),
        super::openai_chat::openai_error_value(err),
    )
}

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests;
