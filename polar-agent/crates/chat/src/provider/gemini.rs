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
use serde::Serialize;
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
        response_body(resp)
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

/// `usageMetadata`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct UsageOut {
    prompt_token_count: u32,
    candidates_token_count: u32,
    total_token_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    cached_content_token_count: Option<u32>,
}

impl UsageOut {
    fn of(u: &Usage) -> Self {
        Self {
            prompt_token_count: u.prompt_tokens,
            candidates_token_count: u.completion_tokens,
            total_token_count: u.prompt_tokens.saturating_add(u.completion_tokens),
            cached_content_token_count: u.cached_tokens,
        }
    }
}

/// A part: text, a thought (`thought: true`) or a function call, each
/// with the reasoning's signature when it is the part that carries it.
#[derive(Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct PartOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    thought: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    function_call: Option<CallOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thought_signature: Option<&'a str>,
}

#[derive(Serialize)]
struct CallOut<'a> {
    id: &'a str,
    name: &'a str,
    args: Value,
}

impl<'a> PartOut<'a> {
    fn text(text: &'a str, thought_signature: Option<&'a str>) -> Self {
        Self {
            text: Some(text),
            thought_signature,
            ..Self::default()
        }
    }

    fn thought(text: &'a str) -> Self {
        Self {
            text: Some(text),
            thought: true,
            ..Self::default()
        }
    }

    fn call(c: &'a ToolCall) -> Self {
        Self {
            function_call: Some(CallOut {
                id: &c.id,
                name: &c.name,
                args: arguments_object(&c.arguments),
            }),
            ..Self::default()
        }
    }
}

/// A `GenerateContentResponse`: the whole reply, or one streamed chunk
/// (`usageMetadata` on the last only).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    candidates: [CandidateOut<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage_metadata: Option<UsageOut>,
    model_version: &'a str,
    response_id: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CandidateOut<'a> {
    content: ContentOut<'a>,
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct ContentOut<'a> {
    role: &'static str,
    parts: Vec<PartOut<'a>>,
}

impl<'a> CandidateOut<'a> {
    fn new(parts: Vec<PartOut<'a>>, finish_reason: Option<&'static str>) -> Self {
        Self {
            content: ContentOut {
                role: "model",
                parts,
            },
            index: 0,
            finish_reason,
        }
    }
}

fn response_body(resp: &ChatResponse) -> Bytes {
    let m = &resp.message;
    let mut sig = m.reasoning.as_ref().and_then(|r| r.signature.as_deref());
    let mut thought = m
        .reasoning
        .as_ref()
        .filter(|r| !r.text.is_empty())
        .map(|r| PartOut::thought(&r.text));
    let text = m.joined_text();
    let mut text_part = (!text.is_empty()).then(|| PartOut::text(&text, None));
    let mut calls: Vec<PartOut<'_>> = m.tool_calls.iter().map(PartOut::call).collect();
    // The signature goes on the first call, else the text, else the thought.
    if let Some(first) = calls.first_mut() {
        first.thought_signature = sig.take();
    } else if let Some(t) = text_part.as_mut() {
        t.thought_signature = sig.take();
    } else if let Some(t) = thought.as_mut() {
        t.thought_signature = sig.take();
    }
    let mut parts: Vec<PartOut<'_>> = thought.into_iter().chain(text_part).chain(calls).collect();
    if parts.is_empty() {
        parts.push(PartOut::text("", sig));
    }
    let reason = effective_finish(&resp.finish_reason, !m.tool_calls.is_empty());
    super::json_bytes(&ResponseOut {
        candidates: [CandidateOut::new(parts, Some(finish_reason(&reason)))],
        usage_metadata: Some(UsageOut::of(&resp.usage)),
        model_version: &resp.model,
        response_id: &resp.id,
    })
}

// ---------------------------------------------------------------- stream encoder

#[derive(Debug)]
struct BufferedCall {
    index: u32,
    call: ToolCall,
}

/// The parts of `calls`, the signature on the first.
fn call_parts<'a>(calls: &'a [BufferedCall], sig: Option<&'a str>) -> Vec<PartOut<'a>> {
    let mut parts: Vec<PartOut<'_>> = calls.iter().map(|c| PartOut::call(&c.call)).collect();
    if let Some(first) = parts.first_mut() {
        first.thought_signature = sig;
    }
    parts
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

    /// Writes one chunk (or the error) framed as asked: an SSE event, or
    /// the next element of the array.
    fn write(array: bool, wrote: &mut bool, out: &mut Vec<u8>, v: &impl Serialize) {
        if array {
            out.extend_from_slice(if *wrote { b",\r\n" } else { b"[" });
            super::write_json(out, v);
        } else {
            sse::write_json(out, None, v);
        }
        *wrote = true;
    }

    fn close_array(&self, out: &mut Vec<u8>) {
        if self.array {
            out.extend_from_slice(if self.wrote { b"]" } else { b"[]" });
        }
    }

    fn chunk(
        &mut self,
        out: &mut Vec<u8>,
        parts: Vec<PartOut<'_>>,
        finish: Option<&'static str>,
        usage: Option<UsageOut>,
    ) {
        let chunk = ResponseOut {
            candidates: [CandidateOut::new(parts, finish)],
            usage_metadata: usage,
            model_version: &self.model,
            response_id: &self.id,
        };
        Self::write(self.array, &mut self.wrote, out, &chunk);
    }

    /// The buffered calls in their order, and the signature that goes on
    /// the first (taken only when there is one).
    fn take_calls(&mut self) -> (Vec<BufferedCall>, Option<String>) {
        let mut calls = std::mem::take(&mut self.calls);
        calls.sort_by_key(|c| c.index);
        let sig = if calls.is_empty() {
            None
        } else {
            self.signature.take()
        };
        (calls, sig)
    }

    fn flush_calls(&mut self, out: &mut Vec<u8>) {
        let (calls, sig) = self.take_calls();
        if !calls.is_empty() {
            self.chunk(out, call_parts(&calls, sig.as_deref()), None, None);
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
                    self.chunk(&mut out, vec![PartOut::thought(text)], None, None);
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
                    let sig = self.signature.take();
                    let part = PartOut::text(text, sig.as_deref());
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
                let (calls, call_sig) = self.take_calls();
                let last_sig = if calls.is_empty() {
                    self.signature.take()
                } else {
                    None
                };
                let mut parts = call_parts(&calls, call_sig.as_deref());
                if parts.is_empty() {
                    parts.push(PartOut::text("", last_sig.as_deref()));
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
                    Some(UsageOut::of(&usage)),
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
        Self::write(self.array, &mut self.wrote, &mut out, &body);
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
