//! Google Gemini (Gemini CLI; pi's default): `POST
//! /v1beta/models/{model}:generateContent`, `:streamGenerateContent` (SSE
//! with `alt=sse`, else one JSON array of chunks).
//!
//! Requests: the model comes from the path; `systemInstruction`,
//! `contents[{role user/model, parts}]` with parts `text` (`thought: true`
//! makes it reasoning), `functionCall{name,args,id?}`,
//! `functionResponse{name,response,id?}`, `inlineData`/`fileData` (images),
//! `thoughtSignature` (the first of a model turn becomes the reasoning's
//! signature; any others are kept in `extra.thought_signatures` as
//! `{"index": part, "signature"}`); `tools[{functionDeclarations}]` with
//! `parametersJsonSchema` as it is or `parameters` (OpenAPI types such as
//! `OBJECT` lowercased into JSON Schema); `toolConfig`; `generationConfig`
//! (`maxOutputTokens`, `temperature`, `topP`, `topK`, `stopSequences`;
//! `responseMimeType` with `responseJsonSchema` / `responseSchema` as the
//! request's structured output, see [`super::structured`]; the rest, such
//! as `thinkingConfig`, kept in `extra.generationConfig`). snake_case
//! spellings are accepted too.
//!
//! Gemini has no required call ids. A call without one gets
//! `gemini-call-{turn}-{part}` (its position in the conversation: stable
//! across requests that share the history, unique even when one function is
//! called twice). A response without an id answers the first unanswered call
//! of the same name (order among same-name calls); one that matches no call
//! gets `gemini-result-{turn}-{part}`. Replies put the call id in
//! `functionCall.id` so harnesses that echo it (Gemini CLI) keep it exact.
//! Arguments that are not a JSON object are sent as `{"arguments": text}`.
//! The stream encoder buffers each call until it is complete (Gemini never
//! streams partial arguments).

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::read::{
    array_field, body_object, bool_field, field_is, rest, stop_list, string_field, text,
    text_field, u32_of,
};
use super::{
    ErrorKind, Framing, ModelCall, ParsedRequest, ProviderError, ReplyOptions, StreamEncoder,
    arguments_object, effective_finish, push_indexed, sse,
};
use crate::Api;
use crate::{
    ChatRequest, ChatResponse, FinishReason, Message, Part, Reasoning, Role, Sampling, StreamEvent,
    Tool, ToolCall, ToolChoice, Usage,
};
use polar_json::{Json, RawJson};

// ---------------------------------------------------------------- types

/// The Gemini protocol.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gemini;

impl super::Protocol for Gemini {
    const API: Api = Api::Gemini;
    type Encoder = Encoder;

    fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError> {
        parse_request(call, body)
    }

    fn response_body(resp: &ChatResponse, _opts: &ReplyOptions) -> Bytes {
        super::json_bytes(&response_body(resp))
    }

    fn encoder(opts: &ReplyOptions) -> Encoder {
        Encoder::new(opts)
    }

    fn error_body(err: &ProviderError) -> (u16, Value) {
        error_body(err)
    }
}

/// `obj[camel]`, or `obj[snake]`.
fn get2<'d>(obj: Json<'d>, camel: &str, snake: &str) -> Option<Json<'d>> {
    obj.get(camel).or_else(|| obj.get(snake))
}

/// `obj[camel]` or `obj[snake]` if that is an object (no fallback to
/// `snake` when `camel` is there but not an object).
fn get2_object<'d>(obj: Json<'d>, camel: &str, snake: &str) -> Option<Json<'d>> {
    get2(obj, camel, snake).filter(|v| v.is_object())
}

// ---------------------------------------------------------------- request conversion

/// A call seen in the conversation, for matching responses without ids.
struct Pending {
    id: String,
    name: String,
    answered: bool,
}

fn parse_request(call: &ModelCall, body: Json<'_>) -> Result<ParsedRequest, ProviderError> {
    let obj = body_object(body)?;
    let model = call
        .path_model
        .clone()
        .or_else(|| string_field(obj, "model"))
        .map(|m| m.strip_prefix("models/").map(str::to_owned).unwrap_or(m))
        .ok_or_else(|| ProviderError::invalid("model: not in the path"))?;
    let contents = obj
        .get("contents")
        .and_then(|c| c.as_array())
        .ok_or_else(|| ProviderError::invalid("contents: field required"))?;
    let mut extra = rest(
        obj,
        &[
            "model",
            "contents",
            "systemInstruction",
            "system_instruction",
            "tools",
            "toolConfig",
            "tool_config",
            "generationConfig",
            "generation_config",
        ],
    );
    let mut messages = Vec::new();
    if let Some(si) = get2(obj, "systemInstruction", "system_instruction") {
        parse_system(si, &mut messages)?;
    }
    parse_contents(contents, &mut messages)?;
    let tools = parse_tools(obj, &mut extra);
    let tool_choice = parse_tool_choice(obj, &mut extra);
    let sampling = parse_sampling(obj, &mut extra);
    let response_format = super::structured::gemini(
        get2_object(obj, "generationConfig", "generation_config"),
        lower_types,
    )?;

    let request = ChatRequest {
        model,
        messages,
        tools,
        tool_choice,
        response_format,
        sampling,
        stream: call.framing != Framing::Json,
        extra,
    };
    Ok(ParsedRequest {
        request,
        previous_response_id: None,
        include_usage: false,
        compaction: false,
    })
}

/// `systemInstruction` (a string or a content object) as a system message,
/// pushed unless it has no parts.
fn parse_system(si: Json<'_>, messages: &mut Vec<Message>) -> Result<(), ProviderError> {
    let mut m = Message::new(Role::System);
    if let Some(text) = text(si) {
        m.content.push(Part::Text { text });
    } else if si.is_object() {
        for (k, p) in array_field(si, "parts").enumerate() {
            let (part, fields) = plain_part(p);
            m.content.push(part);
            push_indexed(&mut m.extra, "part_extra", k, fields);
        }
        m.extra.extend(rest(si, &["parts", "role"]));
    } else {
        return Err(ProviderError::invalid(
            "systemInstruction: must be a string or a content object",
        ));
    }
    if !m.content.is_empty() {
        messages.push(m);
    }
    Ok(())
}

/// `contents`: each turn's messages, with the turn's unknown fields on its
/// first message.
fn parse_contents<'d>(
    contents: impl Iterator<Item = Json<'d>>,
    messages: &mut Vec<Message>,
) -> Result<(), ProviderError> {
    let mut pending: Vec<Pending> = Vec::new();
    for (turn, c) in contents.enumerate() {
        let at = || format!("contents[{turn}]");
        if !c.is_object() {
            return Err(ProviderError::invalid(format!(
                "{}: must be an object",
                at()
            )));
        }
        let parts = array_field(c, "parts");
        let turn_extra = rest(c, &["role", "parts"]);
        let start = messages.len();
        match c.get_str("role").as_deref() {
            Some("model") => {
                let m = model_turn(turn, parts, &mut pending);
                messages.push(m);
            }
            Some("user" | "function") | None => {
                user_turn(turn, parts, &mut pending, messages);
            }
            Some(other) => {
                return Err(ProviderError::invalid(format!(
                    "{}.role: unknown role {other:?}",
                    at()
                )));
            }
        }
        if let Some(m) = messages.get_mut(start) {
            m.extra.extend(turn_extra);
        }
    }
    Ok(())
}

/// `tools[].functionDeclarations` as tools; any other tool fields (such as
/// `googleSearch`) go to `extra.tools_other`.
fn parse_tools(obj: Json<'_>, extra: &mut Map<String, Value>) -> Vec<Tool> {
    let mut tools = Vec::new();
    let mut other_tools = Vec::new();
    for t in array_field(obj, "tools") {
        if !t.is_object() {
            continue;
        }
        let decls =
            get2(t, "functionDeclarations", "function_declarations").and_then(|d| d.as_array());
        tools.extend(
            decls
                .into_iter()
                .flatten()
                .filter(|d| d.is_object())
                .map(parse_declaration),
        );
        let others = rest(t, &["functionDeclarations", "function_declarations"]);
        if !others.is_empty() {
            other_tools.push(Value::Object(others));
        }
    }
    if !other_tools.is_empty() {
        extra.insert("tools_other".into(), Value::Array(other_tools));
    }
    tools
}

/// One function declaration (an object) as a tool.
fn parse_declaration(d: Json<'_>) -> Tool {
    let parameters = match (
        get2(d, "parametersJsonSchema", "parameters_json_schema"),
        d.get("parameters"),
    ) {
        (Some(s), _) => s.to_value(),
        (None, Some(p)) => lower_types(p),
        (None, None) => json!({"type": "object", "properties": {}}),
    };
    Tool {
        name: string_field(d, "name").unwrap_or_default(),
        description: string_field(d, "description"),
        parameters: RawJson::from_value(&parameters),
    }
}

/// The tool choice of `toolConfig.functionCallingConfig`; the whole
/// `toolConfig` is kept in `extra`.
fn parse_tool_choice(obj: Json<'_>, extra: &mut Map<String, Value>) -> Option<ToolChoice> {
    let tc = get2(obj, "toolConfig", "tool_config")?;
    let fcc = get2(tc, "functionCallingConfig", "function_calling_config");
    let mode = fcc.and_then(|f| f.get_str("mode"));
    let allowed: Vec<Cow<'_, str>> = fcc
        .and_then(|f| get2(f, "allowedFunctionNames", "allowed_function_names"))
        .and_then(|a| a.as_array())
        .map(|a| a.filter_map(|n| n.as_str()).collect())
        .unwrap_or_default();
    let choice = match (mode.as_deref(), allowed.as_slice()) {
        (Some("AUTO"), _) => Some(ToolChoice::Auto),
        (Some("NONE"), _) => Some(ToolChoice::None),
        (Some("ANY"), [one]) => Some(ToolChoice::Tool {
            name: one.to_string(),
        }),
        (Some("ANY" | "VALIDATED"), _) => Some(ToolChoice::Required),
        _ => None,
    };
    extra.insert("toolConfig".into(), tc.to_value());
    choice
}

/// The sampling fields of `generationConfig`; its other fields but the
/// structured output's go to `extra.generationConfig`.
fn parse_sampling(obj: Json<'_>, extra: &mut Map<String, Value>) -> Sampling {
    let gc = get2_object(obj, "generationConfig", "generation_config");
    let g = |camel: &str, snake: &str| gc.and_then(|o| get2(o, camel, snake));
    let sampling = Sampling {
        max_tokens: u32_of(g("maxOutputTokens", "max_output_tokens")),
        temperature: g("temperature", "temperature").and_then(|v| v.as_f64()),
        top_p: g("topP", "top_p").and_then(|v| v.as_f64()),
        top_k: u32_of(g("topK", "top_k")),
        stop: stop_list(g("stopSequences", "stop_sequences")),
        seed: None,
    };
    if let Some(gc) = gc {
        let mut known = vec![
            "maxOutputTokens",
            "max_output_tokens",
            "temperature",
            "topP",
            "top_p",
            "topK",
            "top_k",
            "stopSequences",
            "stop_sequences",
        ];
        // Structured output: `request.response_format`.
        known.extend_from_slice(super::structured::GEMINI_KEYS);
        let r = rest(gc, &known);
        if !r.is_empty() {
            extra.insert("generationConfig".into(), Value::Object(r));
        }
    }
    sampling
}

/// The `Type` enum of Google's SDKs, as schemas carry it: upper-case
/// names of JSON Schema's types.
const SDK_TYPES: &[&str] = &[
    "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL",
];

/// OpenAPI-style schema types (`OBJECT`, `STRING`) lowercased, recursively.
fn lower_types(v: Json<'_>) -> Value {
    if let Some(members) = v.as_object() {
        return Value::Object(
            members
                .map(|(k, v)| {
                    let lowered = match v.as_str() {
                        Some(s) if k == "type" && SDK_TYPES.contains(&s.as_ref()) => {
                            Value::String(s.to_ascii_lowercase())
                        }
                        _ => lower_types(v),
                    };
                    (k.into_owned(), lowered)
                })
                .collect(),
        );
    }
    match v.as_array() {
        Some(elements) => Value::Array(elements.map(lower_types).collect()),
        None => v.to_value(),
    }
}

/// The MIME type of an `inlineData`/`fileData` object, if it is an image
/// type.
fn image_mime<'d>(d: Json<'d>) -> Option<Cow<'d, str>> {
    get2(d, "mimeType", "mime_type")
        .and_then(|m| m.as_str())
        .filter(|m| m.starts_with("image/"))
}

/// A text or media part (no calls, responses or thoughts).
fn plain_part(p: Json<'_>) -> (Part, Map<String, Value>) {
    let other = || {
        (
            Part::Other {
                value: p.to_value(),
            },
            Map::new(),
        )
    };
    if !p.is_object() {
        return other();
    }
    if let Some(text) = text_field(p, "text") {
        return (Part::Text { text }, rest(p, &["text"]));
    }
    if let Some(d) = get2_object(p, "inlineData", "inline_data")
        && let Some(mime) = image_mime(d)
    {
        return (
            Part::Image {
                media_type: Some(mime.into_owned()),
                data: string_field(d, "data"),
                url: None,
            },
            rest(p, &["inlineData", "inline_data"]),
        );
    }
    if let Some(d) = get2_object(p, "fileData", "file_data")
        && let Some(mime) = image_mime(d)
    {
        return (
            Part::Image {
                media_type: Some(mime.into_owned()),
                data: None,
                url: get2(d, "fileUri", "file_uri")
                    .and_then(|u| u.as_str())
                    .map(Cow::into_owned),
            },
            rest(p, &["fileData", "file_data"]),
        );
    }
    other()
}

fn model_turn<'d>(
    turn: usize,
    parts: impl Iterator<Item = Json<'d>>,
    pending: &mut Vec<Pending>,
) -> Message {
    let mut m = Message::new(Role::Assistant);
    let mut signatures = Vec::new();
    let sig_keys = ["thoughtSignature", "thought_signature"];
    for (k, p) in parts.enumerate() {
        if !p.is_object() {
            m.content.push(Part::Other {
                value: p.to_value(),
            });
            continue;
        }
        if let Some(sig) = get2(p, sig_keys[0], sig_keys[1]).and_then(|s| s.as_str()) {
            signatures.push((k, sig.into_owned()));
        }
        if let Some(fc) = get2_object(p, "functionCall", "function_call") {
            let id = string_field(fc, "id").unwrap_or_else(|| format!("gemini-call-{turn}-{k}"));
            let name = string_field(fc, "name").unwrap_or_default();
            let arguments = fc
                .get("args")
                .map_or_else(|| "{}".to_owned(), |args| args.to_compact_string());
            pending.push(Pending {
                id: id.clone(),
                name: name.clone(),
                answered: false,
            });
            m.tool_calls.push(ToolCall {
                id,
                name,
                arguments,
            });
            let mut fields = rest(
                p,
                &["functionCall", "function_call", sig_keys[0], sig_keys[1]],
            );
            fields.extend(rest(fc, &["id", "name", "args"]));
            push_indexed(&mut m.extra, "part_extra", k, fields);
        } else if bool_field(p, "thought") == Some(true) {
            let r = m.reasoning.get_or_insert_with(Reasoning::default);
            if let Some(text) = p.get_str("text") {
                r.text.push_str(&text);
            }
            push_indexed(
                &mut m.extra,
                "part_extra",
                k,
                rest(p, &["thought", "text", sig_keys[0], sig_keys[1]]),
            );
        } else if field_is(p, "text", "")
            && p.as_object()
                .into_iter()
                .flatten()
                .all(|(key, _)| sig_keys.contains(&key.as_ref()) || key == "text")
        {
            // An empty text part that only carries a signature.
        } else {
            let (part, mut fields) = plain_part(p);
            fields.remove(sig_keys[0]);
            fields.remove(sig_keys[1]);
            m.content.push(part);
            push_indexed(&mut m.extra, "part_extra", k, fields);
        }
    }
    let mut sigs = signatures.into_iter();
    if let Some((_, first)) = sigs.next() {
        m.reasoning.get_or_insert_with(Reasoning::default).signature = Some(first);
    }
    let others: Vec<Value> = sigs
        .map(|(k, s)| json!({"index": k, "signature": s}))
        .collect();
    if !others.is_empty() {
        m.extra
            .insert("thought_signatures".into(), Value::Array(others));
    }
    m
}

fn user_turn<'d>(
    turn: usize,
    parts: impl Iterator<Item = Json<'d>>,
    pending: &mut [Pending],
    out: &mut Vec<Message>,
) {
    let mut user: Option<Message> = None;
    for (k, p) in parts.enumerate() {
        let Some(fr) = get2_object(p, "functionResponse", "function_response") else {
            let m = user.get_or_insert_with(|| Message::new(Role::User));
            let (part, fields) = plain_part(p);
            let index = m.content.len();
            m.content.push(part);
            push_indexed(&mut m.extra, "part_extra", index, fields);
            continue;
        };
        if let Some(u) = user.take() {
            out.push(u);
        }
        let name = string_field(fr, "name").unwrap_or_default();
        let id = match fr.get_str("id") {
            Some(id) => {
                if let Some(c) = pending.iter_mut().find(|c| c.id == id) {
                    c.answered = true;
                }
                id.into_owned()
            }
            None => match pending.iter_mut().find(|c| !c.answered && c.name == name) {
                Some(c) => {
                    c.answered = true;
                    c.id.clone()
                }
                None => format!("gemini-result-{turn}-{k}"),
            },
        };
        let response = fr.get("response").unwrap_or_else(Json::null);
        // `get` finds nothing in a non-object.
        let is_error = response.get("error").is_some() && response.get("output").is_none();
        let mut m = Message::text(Role::Tool, response.to_compact_string());
        m.tool_call_id = Some(id);
        m.name = Some(name);
        m.is_error = is_error;
        m.extra.extend(rest(fr, &["id", "name", "response"]));
        m.extra
            .extend(rest(p, &["functionResponse", "function_response"]));
        out.push(m);
    }
    if let Some(u) = user {
        out.push(u);
    }
}

// ---------------------------------------------------------------- response conversion

/// Gemini's `finishReason` for a finish reason.
pub fn finish_reason(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "MAX_TOKENS",
        FinishReason::ContentFilter => "SAFETY",
        FinishReason::Other(_) => "OTHER",
        FinishReason::Stop | FinishReason::ToolCalls | FinishReason::Abort => "STOP",
    }
}

fn usage_json(u: &Usage) -> Value {
    let mut v = json!({
        "promptTokenCount": u.prompt_tokens,
        "candidatesTokenCount": u.completion_tokens,
        "totalTokenCount": u.prompt_tokens.saturating_add(u.completion_tokens),
    });
    if let (Some(c), Some(o)) = (u.cached_tokens, v.as_object_mut()) {
        o.insert("cachedContentTokenCount".into(), json!(c));
    }
    v
}

fn call_part(c: &ToolCall) -> Value {
    json!({"functionCall": {"id": c.id, "name": c.name, "args": arguments_object(&c.arguments)}})
}

fn with_signature(part: &mut Value, sig: Option<String>) {
    if let (Some(s), Some(o)) = (sig, part.as_object_mut()) {
        o.insert("thoughtSignature".into(), json!(s));
    }
}

fn candidate(parts: Vec<Value>, finish: Option<&str>) -> Value {
    let mut c = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if let (Some(f), Some(o)) = (finish, c.as_object_mut()) {
        o.insert("finishReason".into(), json!(f));
    }
    c
}

fn response_body(resp: &ChatResponse) -> Value {
    let m = &resp.message;
    let mut sig = m.reasoning.as_ref().and_then(|r| r.signature.clone());
    let mut thought = m
        .reasoning
        .as_ref()
        .filter(|r| !r.text.is_empty())
        .map(|r| json!({"text": r.text, "thought": true}));
    let text = m.joined_text();
    let mut text_part = (!text.is_empty()).then(|| json!({"text": text}));
    let mut calls: Vec<Value> = m.tool_calls.iter().map(call_part).collect();
    // The signature goes on the first call, else the text, else the thought.
    if let Some(first) = calls.first_mut() {
        with_signature(first, sig.take());
    } else if let Some(t) = text_part.as_mut() {
        with_signature(t, sig.take());
    } else if let Some(t) = thought.as_mut() {
        with_signature(t, sig.take());
    }
    let mut parts: Vec<Value> = thought.into_iter().chain(text_part).chain(calls).collect();
    if parts.is_empty() {
        let mut p = json!({"text": ""});
        with_signature(&mut p, sig);
        parts.push(p);
    }
    let reason = effective_finish(&resp.finish_reason, !m.tool_calls.is_empty());
    json!({
        "candidates": [candidate(parts, Some(finish_reason(&reason)))],
        "usageMetadata": usage_json(&resp.usage),
        "modelVersion": resp.model,
        "responseId": resp.id,
    })
}

// ---------------------------------------------------------------- stream encoder

#[derive(Debug)]
struct BufferedCall {
    index: u32,
    call: ToolCall,
}

/// Streams a reply as Gemini chunks (`data: {GenerateContentResponse}` per
/// chunk, no `[DONE]`; or one JSON array for `streamGenerateContent` without
/// `alt=sse`). Text and thoughts go out as they come; calls are buffered
/// until complete and sent whole; the last chunk has `finishReason` and
/// `usageMetadata`.
#[derive(Debug)]
pub struct Encoder {
    array: bool,
    id: String,
    model: String,
    wrote: bool,
    done: bool,
    signature: Option<String>,
    calls: Vec<BufferedCall>,
    seen_calls: Vec<u32>,
    prompt_tokens: u32,
}

impl Encoder {
    /// An encoder for one reply.
    pub fn new(opts: &ReplyOptions) -> Self {
        Self {
            array: opts.framing == Framing::JsonArray,
            id: String::new(),
            model: String::new(),
            wrote: false,
            done: false,
            signature: None,
            calls: Vec::new(),
            seen_calls: Vec::new(),
            prompt_tokens: 0,
        }
    }

    fn write(&mut self, out: &mut Vec<u8>, v: &Value) {
        if self.array {
            out.extend_from_slice(if self.wrote { b",\r\n" } else { b"[" });
            super::write_json(out, v);
        } else {
            sse::write_json(out, None, v);
        }
        self.wrote = true;
    }

    fn close_array(&self, out: &mut Vec<u8>) {
        if self.array {
            out.extend_from_slice(if self.wrote { b"]" } else { b"[]" });
        }
    }

    fn chunk(
        &mut self,
        out: &mut Vec<u8>,
        parts: Vec<Value>,
        finish: Option<&str>,
        usage: Option<Value>,
    ) {
        let mut v = json!({"candidates": [candidate(parts, finish)]});
        if let Some(o) = v.as_object_mut() {
            if let Some(u) = usage {
                o.insert("usageMetadata".into(), u);
            }
            o.insert("modelVersion".into(), json!(self.model));
            o.insert("responseId".into(), json!(self.id));
        }
        self.write(out, &v);
    }

    fn call_parts(&mut self) -> Vec<Value> {
        let mut calls = std::mem::take(&mut self.calls);
        calls.sort_by_key(|c| c.index);
        let mut parts: Vec<Value> = calls.iter().map(|c| call_part(&c.call)).collect();
        if let Some(first) = parts.first_mut() {
            with_signature(first, self.signature.take());
        }
        parts
    }

    fn flush_calls(&mut self, out: &mut Vec<u8>) {
        let parts = self.call_parts();
        if !parts.is_empty() {
            self.chunk(out, parts, None, None);
        }
    }
}

impl StreamEncoder for Encoder {
    fn push(&mut self, ev: &StreamEvent) -> Bytes {
        let mut out = Vec::new();
        if self.done {
            return Bytes::new();
        }
        match ev {
            StreamEvent::Start {
                id,
                model,
                prompt_tokens,
            } => {
                if self.id.is_empty() && self.model.is_empty() {
                    self.id.clone_from(id);
                    self.model.clone_from(model);
                    self.prompt_tokens = prompt_tokens.unwrap_or(0);
                }
            }
            StreamEvent::ReasoningDelta { text } => {
                if !text.is_empty() {
                    self.flush_calls(&mut out);
                    self.chunk(
                        &mut out,
                        vec![json!({"text": text, "thought": true})],
                        None,
                        None,
                    );
                }
            }
            StreamEvent::ReasoningDone { signature } => {
                if signature.is_some() {
                    self.signature.clone_from(signature);
                }
            }
            StreamEvent::TextDelta { text } => {
                if !text.is_empty() {
                    self.flush_calls(&mut out);
                    let mut part = json!({"text": text});
                    with_signature(&mut part, self.signature.take());
                    self.chunk(&mut out, vec![part], None, None);
                }
            }
            StreamEvent::ToolCallStart { index, id, name } => {
                if !self.seen_calls.contains(index) {
                    self.seen_calls.push(*index);
                    self.calls.push(BufferedCall {
                        index: *index,
                        call: ToolCall {
                            id: id.clone(),
                            name: name.clone(),
                            arguments: String::new(),
                        },
                    });
                }
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                if let Some(c) = self.calls.iter_mut().find(|c| c.index == *index) {
                    c.call.arguments.push_str(arguments);
                }
            }
            StreamEvent::Finish {
                finish_reason: reason,
                usage,
            } => {
                let mut parts = self.call_parts();
                if parts.is_empty() {
                    let mut p = json!({"text": ""});
                    with_signature(&mut p, self.signature.take());
                    parts.push(p);
                }
                let reason = effective_finish(reason, !self.seen_calls.is_empty());
                let mut usage = *usage;
                if usage.prompt_tokens == 0 {
                    usage.prompt_tokens = self.prompt_tokens;
                }
                self.chunk(
                    &mut out,
                    parts,
                    Some(finish_reason(&reason)),
                    Some(usage_json(&usage)),
                );
                self.close_array(&mut out);
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
        let mut out = Vec::new();
        let (_, body) = error_body(err);
        self.write(&mut out, &body);
        self.close_array(&mut out);
        Bytes::from(out)
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

// ---------------------------------------------------------------- errors

/// Google's canonical status name for a kind.
fn status_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest
        | ErrorKind::Unsupported
        | ErrorKind::TooLarge
        | ErrorKind::ContextOverflow { .. } => "INVALID_ARGUMENT",
        ErrorKind::NotFound => "NOT_FOUND",
        ErrorKind::Overloaded | ErrorKind::BackendUnavailable => "UNAVAILABLE",
        ErrorKind::BackendTimeout => "DEADLINE_EXCEEDED",
        ErrorKind::BackendError | ErrorKind::Internal => "INTERNAL",
    }
}

/// Status and `{"error":{"code","message","status"}}` body; a request
/// over the context in the Gemini API's own words.
pub fn error_body(err: &ProviderError) -> (u16, Value) {
    let status = err.kind.status(Api::Gemini);
    let message = match err.kind {
        ErrorKind::ContextOverflow { prompt, max, .. } => format!(
            "The input token count ({prompt}) exceeds the maximum number of tokens allowed ({max})."
        ),
        _ => err.message.clone(),
    };
    (
        status,
        json!({"error": {"code": status, "message": message, "status": status_name(err.kind)}}),
    )
}

// ---------------------------------------------------------------- tests

#[cfg(test)]
mod tests;
