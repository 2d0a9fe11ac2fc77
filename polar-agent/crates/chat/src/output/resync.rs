//! Going on with a reply from a local parse of the model's raw output:
//! [`Resync`] knows what the harness already got (the events sent before a
//! backend fault, [`Resync::observe`]) and, given what the output parses
//! into so far ([`ParsedOutput`], which only grows), yields the events that
//! go beyond it: the reasoning and text suffixes, the tool calls' new
//! names and argument suffixes, per tool index. What was sent must stay a
//! prefix of the parse: where the parse is behind, nothing is yielded until
//! it catches up; where it disagrees (or is still behind once the output is
//! over) the reply cannot go on ([`OutputError::Diverged`]), and nothing
//! inconsistent is ever yielded. Every field is compared in the order a
//! reply carries them (reasoning, text, tool calls): a field that is
//! behind holds back the later ones.
//!
//! Whitespace the harness got that the parse reads as markup is taken as
//! sent: the newline at the start and at the end of the reasoning (after
//! `<think>`, before `</think>`), at the start of the text (the newlines
//! after `</think>`) and, once the parse has a tool call, at its end (the
//! newline between the text and the call). vLLM's parsers keep both in the text; Polar's read them as
//! markup so that a turn parses back to what the template rendered.
//!
//! A tool call's arguments are compared as JSON text without the
//! whitespace outside its strings ([`compare_arguments`]): a server's
//! streaming tool parser may have sent them re-serialized (vLLM's `hermes`
//! parser sends the first part as Python's `json.dumps` writes it, `", "`
//! and `": "` between items, whatever spacing the model generated), and
//! what goes beyond is then the raw output's own text, so the harness gets
//! the same JSON value. Strings are compared byte for byte: arguments
//! whose strings the server wrote with other escapes than the model (a
//! `\u00e9` for `é`, a `\/` for `/`) still diverge.

use super::{OutputError, ParsedCall, ParsedOutput};
use crate::{FinishReason, StreamEvent};

/// What the harness has, and the events that continue it.
#[derive(Clone, Debug, Default)]
pub struct Resync {
    response_id: String,
    sent: ParsedOutput,
}

/// Where a sent field stands against the parse.
enum Standing {
    /// The parse has this much more (possibly nothing).
    Ahead(String),
    /// The parse has less so far, and what it has agrees.
    Behind,
}

fn compare(
    sent: &str,
    parsed: &str,
    parsed_final: bool,
    what: &str,
) -> Result<Standing, OutputError> {
    if let Some(more) = parsed.strip_prefix(sent) {
        return Ok(Standing::Ahead(more.to_owned()));
    }
    if !parsed_final && sent.starts_with(parsed) {
        return Ok(Standing::Behind);
    }
    Err(OutputError::Diverged(format!(
        "the {what} sent ({} bytes) is not a prefix of the parsed {what} ({} bytes{})",
        sent.len(),
        parsed.len(),
        if parsed_final { ", final" } else { "" }
    )))
}

/// `t`, JSON text possibly cut short, without the whitespace outside its
/// strings; and for each byte kept, the offset in `t` just after the
/// character it belongs to.
fn compact_json(t: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(t.len());
    let mut ends = Vec::with_capacity(t.len());
    let (mut in_string, mut escaped) = (false, false);
    for (i, c) in t.char_indices() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if matches!(c, ' ' | '\t' | '\n' | '\r') {
            continue;
        } else if c == '"' {
            in_string = true;
        }
        out.push(c);
        ends.extend(std::iter::repeat_n(i + c.len_utf8(), c.len_utf8()));
    }
    (out, ends)
}

/// [`compare`] for a tool call's arguments: as they are, else as JSON text
/// without the whitespace outside strings (see the module docs); what the
/// parse has more is then its own text after the part that was sent.
fn compare_arguments(
    sent: &str,
    parsed: &str,
    parsed_final: bool,
) -> Result<Standing, OutputError> {
    const WHAT: &str = "tool call arguments";
    if let Ok(standing) = compare(sent, parsed, parsed_final, WHAT) {
        return Ok(standing);
    }
    let (sent_c, _) = compact_json(sent);
    let (parsed_c, ends) = compact_json(parsed);
    if parsed_c.starts_with(&sent_c) {
        let offset = sent_c.len().checked_sub(1).map_or(0, |last| ends[last]);
        return Ok(Standing::Ahead(parsed[offset..].to_owned()));
    }
    if !parsed_final && sent_c.starts_with(&parsed_c) {
        return Ok(Standing::Behind);
    }
    compare(sent, parsed, parsed_final, WHAT)
}

/// [`compare`] for the text, with the whitespace a server kept where the
/// parse reads markup taken as sent (see the module docs): at the start
/// (after `</think>`) and, once the parse has a tool call, at the end.
fn compare_text(
    sent: &str,
    parsed: &ParsedOutput,
    finished: bool,
) -> Result<Standing, OutputError> {
    let text = parsed.content.as_str();
    let lead = sent.len() - sent.trim_start().len();
    let starts = (0..=lead).filter(|&w| sent.is_char_boundary(w));
    for w in starts {
        let sent = &sent[w..];
        let kept_before_call = !parsed.calls.is_empty()
            && sent
                .strip_prefix(text)
                .is_some_and(|ws| !ws.is_empty() && ws.trim().is_empty());
        if kept_before_call {
            return Ok(Standing::Ahead(String::new()));
        }
        if let Ok(standing) = compare(sent, text, finished, "text") {
            return Ok(standing);
        }
    }
    compare(sent, text, finished, "text")
}

/// `sent` reasoning against the parse's, taking as sent the newline a
/// server keeps at its start (after `<think>`) and at its end (before
/// `</think>`), which Polar's parsers read as markup.
fn compare_reasoning(
    sent: &str,
    parsed: &str,
    parsed_final: bool,
) -> Result<Standing, OutputError> {
    let sent = match sent.strip_prefix('\n') {
        Some(rest) if !parsed.starts_with('\n') => rest,
        _ => sent,
    };
    if parsed_final
        && sent
            .strip_prefix(parsed)
            .is_some_and(|ws| !ws.is_empty() && ws.trim().is_empty())
    {
        return Ok(Standing::Ahead(String::new()));
    }
    compare(sent, parsed, parsed_final, "reasoning")
}

impl Resync {
    /// Nothing sent yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes an event the harness got.
    pub fn observe(&mut self, event: &StreamEvent) {
        match event {
            StreamEvent::Start { id, .. } => self.response_id.clone_from(id),
            StreamEvent::ReasoningDelta { text } => self.sent.reasoning.push_str(text),
            StreamEvent::ReasoningDone { .. } => self.sent.reasoning_done = true,
            StreamEvent::TextDelta { text } => self.sent.content.push_str(text),
            StreamEvent::ToolCallStart { index, name, .. } => {
                let i = *index as usize;
                while self.sent.calls.len() <= i {
                    self.sent.calls.push(ParsedCall::default());
                }
                self.sent.calls[i].name.clone_from(name);
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                if let Some(call) = self.sent.calls.get_mut(*index as usize) {
                    call.arguments.push_str(arguments);
                }
            }
            StreamEvent::Finish { .. } => {}
        }
    }

    /// What the harness has (as a parse).
    pub fn sent(&self) -> &ParsedOutput {
        &self.sent
    }

    /// The events that take the harness from what it has to `parsed`
    /// (`finished`: the output is over, so `parsed` is final). They are
    /// not noted as sent: [`Resync::observe`] each one as it goes out
    /// (before the next step).
    pub fn step(
        &self,
        parsed: &ParsedOutput,
        finished: bool,
    ) -> Result<Vec<StreamEvent>, OutputError> {
        let mut out = Vec::new();
        let sent = &self.sent;
        let reasoning_final = parsed.reasoning_done || finished;
        match compare_reasoning(&sent.reasoning, &parsed.reasoning, reasoning_final)? {
            Standing::Behind => return Ok(out),
            Standing::Ahead(more) if !more.is_empty() => {
                out.push(StreamEvent::ReasoningDelta { text: more });
            }
            Standing::Ahead(_) => {}
        }
        if !reasoning_final {
            return Ok(out);
        }
        if !sent.reasoning_done && !parsed.reasoning.is_empty() {
            out.push(StreamEvent::ReasoningDone { signature: None });
        }
        let content = compare_text(&sent.content, parsed, finished)?;
        match content {
            Standing::Behind => return Ok(out),
            Standing::Ahead(more) if !more.is_empty() => {
                out.push(StreamEvent::TextDelta { text: more });
            }
            Standing::Ahead(_) => {}
        }
        for (i, call) in parsed.calls.iter().enumerate() {
            let index = i as u32;
            let Some(was) = sent.calls.get(i) else {
                out.push(StreamEvent::ToolCallStart {
                    index,
                    id: format!("{}-call-{i}", self.response_id),
                    name: call.name.clone(),
                });
                if !call.arguments.is_empty() {
                    out.push(StreamEvent::ToolCallDelta {
                        index,
                        arguments: call.arguments.clone(),
                    });
                }
                continue;
            };
            if was.name != call.name {
                return Err(OutputError::Diverged(format!(
                    "tool call {i} was sent as {:?}, parsed as {:?}",
                    was.name, call.name
                )));
            }
            match compare_arguments(&was.arguments, &call.arguments, call.done || finished)? {
                Standing::Behind => return Ok(out),
                Standing::Ahead(more) if !more.is_empty() => {
                    out.push(StreamEvent::ToolCallDelta {
                        index,
                        arguments: more,
                    });
                }
                Standing::Ahead(_) => {}
            }
        }
        if finished && sent.calls.len() > parsed.calls.len() {
            return Err(OutputError::Diverged(format!(
                "{} tool call(s) were sent, the output has {}",
                sent.calls.len(),
                parsed.calls.len()
            )));
        }
        Ok(out)
    }
}

impl ParsedOutput {
    /// The finish reason of the reply this output ends, from the one the
    /// token-in endpoint gave (which knows nothing of tool calls).
    pub fn finish_reason(&self, backend: FinishReason) -> FinishReason {
        match backend {
            FinishReason::Stop if !self.calls.is_empty() => FinishReason::ToolCalls,
            other => other,
        }
    }
}
