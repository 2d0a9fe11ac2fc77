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
use serde_json::{Map, Value, json};

use super::read::{
    array_field, body_object, bool_field, f64_field, field_is, function_tool, request_model, rest,
    string_field, text, text_field, text_of, u32_of,
};
use super::{
    ModelCall, ParsedRequest, ProviderError, ReplyOptions, SOURCE_KEY, image_from_url, prefixed_id,
    push_indexed,
};
use crate::Api;
use crate::{
    ChatRequest, ChatResponse, Message, Part, Reasoning, Role, Sampling, Tool, ToolCall, ToolChoice,
};
use polar_json::Json;

pub mod compaction;
mod reply;

pub use reply::Encoder;

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
        reply::body(resp, opts)
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

// ---------------------------------------------------------------- errors

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
