//! Replies in the Responses shape: the complete response object
//! ([`body`]) and the stream of events that builds it ([`Encoder`]).
//!
//! Both are serialized straight into their buffers from borrowed types
//! ([`ResponseOut`], [`Item`], the event data): no `serde_json::Value`
//! tree. Fields are declared in the order the harnesses see them.

use std::borrow::Cow;

use bytes::Bytes;
use serde::{Serialize, Serializer};

use super::super::openai_chat::openai_error_type;
use super::super::{
    ErrorKind, ProviderError, ReplyOptions, StreamEncoder, effective_finish, json_bytes, sse,
};
use super::{compaction, response_id};
use crate::{ChatResponse, FinishReason, ResponseFormat, StreamEvent, Usage};

// ---------------------------------------------------------------- the response object

/// An output item id: `{prefix}{response id without resp_}_{index}`.
fn item_id(prefix: &str, resp_id: &str, index: u32) -> String {
    let base = resp_id.strip_prefix("resp_").unwrap_or(resp_id);
    format!("{prefix}{base}_{index}")
}

/// `usage`.
#[derive(Serialize)]
struct UsageOut {
    input_tokens: u32,
    input_tokens_details: CachedTokens,
    output_tokens: u32,
    output_tokens_details: ReasoningTokens,
    total_tokens: u32,
}

#[derive(Serialize)]
struct CachedTokens {
    cached_tokens: u32,
}

/// Always 0: the reasoning is counted in `output_tokens`.
#[derive(Serialize)]
struct ReasoningTokens {
    reasoning_tokens: u32,
}

impl UsageOut {
    fn of(u: &Usage) -> Self {
        Self {
            input_tokens: u.prompt_tokens,
            input_tokens_details: CachedTokens {
                cached_tokens: u.cached_tokens.unwrap_or(0),
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: ReasoningTokens {
                reasoning_tokens: 0,
            },
            total_tokens: u.prompt_tokens.saturating_add(u.completion_tokens),
        }
    }
}

/// `incomplete_details`.
#[derive(Serialize)]
struct Incomplete {
    reason: &'static str,
}

/// The response `status` and `incomplete_details` for a finish reason.
fn status_of(reason: &FinishReason) -> (&'static str, Option<Incomplete>) {
    let incomplete = |reason| ("incomplete", Some(Incomplete { reason }));
    match reason {
        FinishReason::Length => incomplete("max_output_tokens"),
        FinishReason::ContentFilter => incomplete("content_filter"),
        _ => ("completed", None),
    }
}

/// The `error` of a failed response.
#[derive(Serialize)]
struct ErrorOut<'a> {
    code: &'static str,
    message: &'a str,
}

/// The `text.format` a reply echoes: the request's structured output
/// (whose own serialization is the Responses shape: `{"type":
/// "json_schema", "name", "schema", "strict"}`, `{"type":
/// "json_object"}`), else `{"type": "text"}`.
struct TextFormat<'a>(Option<&'a ResponseFormat>);

impl Serialize for TextFormat<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Text {
            #[serde(rename = "type")]
            kind: &'static str,
        }
        match self.0 {
            Some(f) => f.serialize(s),
            None => Text { kind: "text" }.serialize(s),
        }
    }
}

/// `text`.
#[derive(Serialize)]
struct TextOut<'a> {
    format: TextFormat<'a>,
}

/// `reasoning`: both `null`.
#[derive(Serialize)]
struct ReasoningOut {
    effort: (),
    summary: (),
}

/// `{}`.
#[derive(Serialize)]
struct Empty {}

/// The output items, in output order (a list of `(output index, item)`
/// sorted by index).
struct Output<'a>(&'a [(u32, Item<'a>)]);

impl Serialize for Output<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(_, item)| item))
    }
}

/// The response object, complete or as a snapshot in a stream's
/// `response.*` events. The fields Polar does not vary are constants
/// (`null` where the request's setting is not echoed).
#[derive(Serialize)]
struct ResponseOut<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'static str,
    background: bool,
    error: Option<ErrorOut<'a>>,
    incomplete_details: Option<Incomplete>,
    instructions: (),
    max_output_tokens: (),
    model: &'a str,
    output: Output<'a>,
    parallel_tool_calls: bool,
    previous_response_id: (),
    reasoning: ReasoningOut,
    store: bool,
    temperature: (),
    text: TextOut<'a>,
    tool_choice: &'static str,
    tools: [(); 0],
    top_p: (),
    truncation: &'static str,
    usage: Option<UsageOut>,
    metadata: Empty,
}

/// What identifies a reply: its response id, model, creation time and
/// echoed text format.
struct Head<'a> {
    id: &'a str,
    model: &'a str,
    created: u64,
    format: Option<&'a ResponseFormat>,
}

impl<'a> Head<'a> {
    /// The response object with `output`, `in_progress`, no usage.
    fn response(&self, output: &'a [(u32, Item<'a>)]) -> ResponseOut<'a> {
        ResponseOut {
            id: self.id,
            object: "response",
            created_at: self.created,
            status: "in_progress",
            background: false,
            error: None,
            incomplete_details: None,
            instructions: (),
            max_output_tokens: (),
            model: self.model,
            output: Output(output),
            parallel_tool_calls: true,
            previous_response_id: (),
            reasoning: ReasoningOut {
                effort: (),
                summary: (),
            },
            store: false,
            temperature: (),
            text: TextOut {
                format: TextFormat(self.format),
            },
            tool_choice: "auto",
            tools: [],
            top_p: (),
            truncation: "disabled",
            usage: None,
            metadata: Empty {},
        }
    }

    /// The finished response object: `completed` (or `incomplete`) for
    /// `reason`, with `usage`.
    fn finished(
        &self,
        output: &'a [(u32, Item<'a>)],
        reason: &FinishReason,
        usage: &Usage,
    ) -> ResponseOut<'a> {
        let (status, incomplete) = status_of(reason);
        ResponseOut {
            status,
            incomplete_details: incomplete,
            usage: Some(UsageOut::of(usage)),
            ..self.response(output)
        }
    }
}

/// A list of zero or one element (`summary`, `content`: empty while the
/// item is being streamed, one part when it is done).
#[derive(Debug)]
struct One<T>(Option<T>);

impl<T: Serialize> Serialize for One<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

/// A part of an item: the reasoning's summary, the message's text.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part<'a> {
    SummaryText {
        text: Cow<'a, str>,
    },
    OutputText {
        text: Cow<'a, str>,
        /// Always empty.
        annotations: [(); 0],
    },
}

impl<'a> Part<'a> {
    fn summary(text: impl Into<Cow<'a, str>>) -> Self {
        Part::SummaryText { text: text.into() }
    }

    fn output(text: impl Into<Cow<'a, str>>) -> Self {
        Part::OutputText {
            text: text.into(),
            annotations: [],
        }
    }
}

/// An output item, as the reply's `output` lists it and as the stream's
/// `response.output_item.*` events carry it.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item<'a> {
    Reasoning {
        id: Cow<'a, str>,
        summary: One<Part<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<Cow<'a, str>>,
    },
    Message {
        id: Cow<'a, str>,
        status: &'static str,
        /// Always `assistant`.
        role: &'static str,
        content: One<Part<'a>>,
    },
    FunctionCall {
        id: Cow<'a, str>,
        call_id: Cow<'a, str>,
        name: Cow<'a, str>,
        arguments: Cow<'a, str>,
        status: &'static str,
    },
    /// See [`compaction`]; no content while it is being streamed.
    Compaction {
        id: Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
    },
}

impl<'a> Item<'a> {
    fn message(
        id: impl Into<Cow<'a, str>>,
        status: &'static str,
        content: Option<Part<'a>>,
    ) -> Self {
        Item::Message {
            id: id.into(),
            status,
            role: "assistant",
            content: One(content),
        }
    }

    fn call(
        id: impl Into<Cow<'a, str>>,
        call_id: impl Into<Cow<'a, str>>,
        name: impl Into<Cow<'a, str>>,
        arguments: impl Into<Cow<'a, str>>,
        status: &'static str,
    ) -> Self {
        Item::FunctionCall {
            id: id.into(),
            call_id: call_id.into(),
            name: name.into(),
            arguments: arguments.into(),
            status,
        }
    }
}

/// The complete (non-streamed) response object for `resp`.
pub(super) fn body(resp: &ChatResponse, opts: &ReplyOptions) -> Bytes {
    let id = response_id(&resp.id);
    let head = Head {
        id: &id,
        model: &resp.model,
        created: opts.created,
        format: opts.response_format.as_ref(),
    };
    let m = &resp.message;
    if opts.compaction {
        let item = Item::Compaction {
            id: item_id("cmp_", &id, 0).into(),
            encrypted_content: Some(compaction::encode(&m.joined_text())),
        };
        let output = [(0, item)];
        return json_bytes(&head.finished(&output, &resp.finish_reason, &resp.usage));
    }
    // Each item's output index is its place in the list.
    let mut output: Vec<(u32, Item<'_>)> = Vec::new();
    let next = |output: &Vec<_>| u32::try_from(output.len()).unwrap_or(u32::MAX);
    if let Some(r) = &m.reasoning {
        let i = next(&output);
        let item = Item::Reasoning {
            id: item_id("rs_", &id, i).into(),
            summary: One(Some(Part::summary(r.text.as_str()))),
            encrypted_content: r
                .encrypted
                .as_deref()
                .or(r.signature.as_deref())
                .map(Cow::from),
        };
        output.push((i, item));
    }
    let text = m.joined_text();
    if !text.is_empty() {
        let i = next(&output);
        let item = Item::message(
            item_id("msg_", &id, i),
            "completed",
            Some(Part::output(text)),
        );
        output.push((i, item));
    }
    for c in &m.tool_calls {
        let i = next(&output);
        let item = Item::call(
            item_id("fc_", &id, i),
            &c.id,
            &c.name,
            &c.arguments,
            "completed",
        );
        output.push((i, item));
    }
    let reason = effective_finish(&resp.finish_reason, !m.tool_calls.is_empty());
    json_bytes(&head.finished(&output, &reason, &resp.usage))
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

/// The data of `response.created`, `.in_progress`, `.completed`,
/// `.incomplete` and `.failed`.
#[derive(Serialize)]
struct ResponseEvent<'a> {
    response: ResponseOut<'a>,
}

/// The data of `response.output_item.added` and `.done`.
#[derive(Serialize)]
struct ItemEvent<'a> {
    output_index: u32,
    item: &'a Item<'a>,
}

/// The data of the events about a part of an item: the deltas (one per
/// token: `response.output_text.delta` with `content_index` and an empty
/// `logprobs`, `response.reasoning_summary_text.delta` with
/// `summary_index`, `response.function_call_arguments.delta`), the text's
/// and arguments' `.done` events (`text`, `arguments`) and the parts'
/// `.added` and `.done` events (`part`).
#[derive(Default, Serialize)]
struct PartEvent<'a> {
    item_id: &'a str,
    output_index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<Part<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[(); 0]>,
}

/// The reasoning or message item being streamed.
#[derive(Debug)]
struct OpenItem {
    output_index: u32,
    id: String,
    text: String,
}

impl OpenItem {
    /// Event data about this item's one summary part (reasoning) or content
    /// part (message).
    fn part_event(&self, reasoning: bool) -> PartEvent<'_> {
        PartEvent {
            item_id: &self.id,
            output_index: self.output_index,
            summary_index: reasoning.then_some(0),
            content_index: (!reasoning).then_some(0),
            ..PartEvent::default()
        }
    }
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

/// An encoder's [`Head`], owned.
#[derive(Debug)]
struct Meta {
    id: String,
    model: String,
    created: u64,
    /// The structured output echoed in `text.format`.
    format: Option<ResponseFormat>,
}

impl Meta {
    fn head(&self) -> Head<'_> {
        Head {
            id: &self.id,
            model: &self.model,
            created: self.created,
            format: self.format.as_ref(),
        }
    }
}

/// Streams a reply as Responses events, each with a strictly increasing
/// `sequence_number`: `response.created`, `response.in_progress`, then per
/// output item `response.output_item.added`, its parts and deltas,
/// `.done` events and `response.output_item.done`, then
/// `response.completed` (or `response.incomplete`) with the full response.
#[derive(Debug)]
pub struct Encoder {
    meta: Meta,
    seq: u64,
    started: bool,
    done: bool,
    next_output: u32,
    /// Finished items, sorted by output index.
    output: Vec<(u32, Item<'static>)>,
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
            meta: Meta {
                id: response_id(""),
                model: String::new(),
                created: opts.created,
                format: opts.response_format.clone(),
            },
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
                let id = item_id("cmp_", &self.meta.id, output_index);
                let added = Item::Compaction {
                    id: id.as_str().into(),
                    encrypted_content: None,
                };
                self.item_event(out, "response.output_item.added", output_index, &added);
                let summary = self.summary.as_deref().unwrap_or_default();
                let item = Item::Compaction {
                    id: id.into(),
                    encrypted_content: Some(compaction::encode(summary)),
                };
                self.close_item(out, output_index, item);
                self.finish_with(out, finish_reason, usage);
            }
            _ => {}
        }
    }

    fn item_event(&mut self, out: &mut Vec<u8>, ty: &str, output_index: u32, item: &Item<'_>) {
        emit(out, &mut self.seq, ty, &ItemEvent { output_index, item });
    }

    /// `response.output_item.done` for `item`, which joins the output.
    fn close_item(&mut self, out: &mut Vec<u8>, output_index: u32, item: Item<'static>) {
        self.item_event(out, "response.output_item.done", output_index, &item);
        let at = self.output.partition_point(|(i, _)| *i < output_index);
        self.output.insert(at, (output_index, item));
    }

    /// A `response.*` event carrying the response object.
    fn response_event(out: &mut Vec<u8>, seq: &mut u64, ty: &str, response: ResponseOut<'_>) {
        emit(out, seq, ty, &ResponseEvent { response });
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        self.started = true;
        for ty in ["response.created", "response.in_progress"] {
            let r = self.meta.head().response(&self.output);
            Self::response_event(out, &mut self.seq, ty, r);
        }
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
        let seq = &mut self.seq;
        let data = PartEvent {
            text: Some(&r.text),
            ..r.part_event(true)
        };
        emit(out, seq, "response.reasoning_summary_text.done", &data);
        let data = PartEvent {
            part: Some(Part::summary(r.text.as_str())),
            ..r.part_event(true)
        };
        emit(out, seq, "response.reasoning_summary_part.done", &data);
        let item = Item::Reasoning {
            id: r.id.into(),
            summary: One(Some(Part::summary(r.text))),
            encrypted_content: encrypted.map(|e| Cow::Owned(e.to_owned())),
        };
        self.close_item(out, r.output_index, item);
    }

    fn close_message(&mut self, out: &mut Vec<u8>) {
        let Some(m) = self.message.take() else { return };
        let seq = &mut self.seq;
        let data = PartEvent {
            text: Some(&m.text),
            logprobs: Some([]),
            ..m.part_event(false)
        };
        emit(out, seq, "response.output_text.done", &data);
        let data = PartEvent {
            part: Some(Part::output(m.text.as_str())),
            ..m.part_event(false)
        };
        emit(out, seq, "response.content_part.done", &data);
        let item = Item::message(m.id, "completed", Some(Part::output(m.text)));
        self.close_item(out, m.output_index, item);
    }

    fn close_calls(&mut self, out: &mut Vec<u8>) {
        for c in std::mem::take(&mut self.calls) {
            let data = PartEvent {
                item_id: &c.id,
                output_index: c.output_index,
                arguments: Some(&c.arguments),
                ..PartEvent::default()
            };
            emit(
                out,
                &mut self.seq,
                "response.function_call_arguments.done",
                &data,
            );
            let item = Item::call(c.id, c.call_id, c.name, c.arguments, "completed");
            self.close_item(out, c.output_index, item);
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
        let r = OpenItem {
            output_index,
            id: item_id("rs_", &self.meta.id, output_index),
            text: String::new(),
        };
        let added = Item::Reasoning {
            id: r.id.as_str().into(),
            summary: One(None),
            encrypted_content: None,
        };
        self.item_event(out, "response.output_item.added", output_index, &added);
        let data = PartEvent {
            part: Some(Part::summary("")),
            ..r.part_event(true)
        };
        emit(
            out,
            &mut self.seq,
            "response.reasoning_summary_part.added",
            &data,
        );
        self.reasoning = Some(r);
    }

    /// Answer text (not empty): opens the message item (closing the others)
    /// if none is open, then its delta.
    fn text_delta(&mut self, out: &mut Vec<u8>, text: &str) {
        if self.message.is_none() {
            self.close_all(out);
            let output_index = self.next_output();
            let m = OpenItem {
                output_index,
                id: item_id("msg_", &self.meta.id, output_index),
                text: String::new(),
            };
            let added = Item::message(m.id.as_str(), "in_progress", None);
            self.item_event(out, "response.output_item.added", output_index, &added);
            let data = PartEvent {
                part: Some(Part::output("")),
                ..m.part_event(false)
            };
            emit(out, &mut self.seq, "response.content_part.added", &data);
            self.message = Some(m);
        }
        if let Some(m) = self.message.as_mut() {
            m.text.push_str(text);
            let data = PartEvent {
                delta: Some(text),
                logprobs: Some([]),
                ..m.part_event(false)
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
        let item = item_id("fc_", &self.meta.id, output_index);
        let added = Item::call(item.as_str(), id, name, "", "in_progress");
        self.item_event(out, "response.output_item.added", output_index, &added);
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
        self.finish_with(out, &reason, usage);
    }

    /// `response.completed` (or `response.incomplete`) for `reason`.
    fn finish_with(&mut self, out: &mut Vec<u8>, reason: &FinishReason, usage: &Usage) {
        let r = self.meta.head().finished(&self.output, reason, usage);
        let ty = if r.status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        Self::response_event(out, &mut self.seq, ty, r);
        self.done = true;
    }

    /// A delta of the open reasoning item (`response.reasoning_summary_text.delta`).
    fn reasoning_delta(&mut self, out: &mut Vec<u8>, text: &str) {
        self.open_reasoning(out);
        if let Some(r) = self.reasoning.as_mut()
            && !text.is_empty()
        {
            r.text.push_str(text);
            let data = PartEvent {
                delta: Some(text),
                ..r.part_event(true)
            };
            emit(
                out,
                &mut self.seq,
                "response.reasoning_summary_text.delta",
                &data,
            );
        }
    }

    /// A delta of call `index`'s arguments (`response.function_call_arguments.delta`).
    fn call_delta(&mut self, out: &mut Vec<u8>, index: u32, arguments: &str) {
        if let Some(c) = self.calls.iter_mut().find(|c| c.index == index)
            && !arguments.is_empty()
        {
            c.arguments.push_str(arguments);
            let data = PartEvent {
                item_id: &c.id,
                output_index: c.output_index,
                delta: Some(arguments),
                ..PartEvent::default()
            };
            emit(
                out,
                &mut self.seq,
                "response.function_call_arguments.delta",
                &data,
            );
        }
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
                self.meta.id = response_id(id);
                self.meta.model.clone_from(model);
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
            StreamEvent::ReasoningDelta { text } => self.reasoning_delta(&mut out, text),
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
                self.call_delta(&mut out, *index, arguments);
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
        let r = ResponseOut {
            status: "failed",
            error: Some(ErrorOut {
                code: stream_error_code(err.kind),
                message: &err.message,
            }),
            ..self.meta.head().response(&self.output)
        };
        Self::response_event(&mut out, &mut self.seq, "response.failed", r);
        Bytes::from(out)
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

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
