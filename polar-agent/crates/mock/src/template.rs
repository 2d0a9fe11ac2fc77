//! The mock's ChatML-like chat template: renders a conversation and its tools
//! into prompt text, renders a generated assistant turn, and parses generated
//! text back into reasoning, content and tool calls.
//!
//! Layout (every block ends with `<|im_end|>\n`):
//!
//! ```text
//! <|im_start|>system\n{system text}\n\n# Tools\n<tools>\n{one JSON per tool}\n</tools><|im_end|>\n
//! <|im_start|>user\n{text}<|im_end|>\n
//! <|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{text}\n<tool_call>\n{"name": N, "arguments": A}\n</tool_call><|im_end|>\n
//! <|im_start|>tool\n{result}<|im_end|>\n
//! <|im_start|>assistant\n{generation glue}        <- the generation prompt
//! ```
//!
//! Prefix preservation: a generated turn is `body + <|im_end|>` (see
//! [`render_assistant_body`]), and the same turn as history renders as
//! `<|im_start|>assistant\n + body + <|im_end|>\n`, so the prompt of the next
//! turn starts with this turn's prompt and response ids. Tool-call arguments
//! are rendered in one canonical JSON form (compact, keys sorted), both when
//! generated and as history.
//!
//! Two switches break that on purpose, as real templates do:
//! - [`StripReasoning`]: history assistant turns lose their `<think>` block
//!   (`BeforeLastUser` as Qwen3 does: only turns before the last user
//!   message; `All`: every history turn);
//! - `generation_glue`: text appended to the generation prompt only (Qwen3
//!   with `enable_thinking: false` appends `<think>\n\n</think>\n\n`), absent
//!   when the same turn is history.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use polar_chat::{Message, Part, Role, Tool};

/// What Qwen3 templates add to the generation prompt when thinking is off.
pub const NO_THINK_GLUE: &str = "<think>\n\n</think>\n\n";

/// Which history assistant turns lose their reasoning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StripReasoning {
    /// Keep every `<think>` block (prefix-preserving).
    #[default]
    Off,
    /// Drop it from assistant turns before the last user message (Qwen3).
    BeforeLastUser,
    /// Drop it from every history assistant turn.
    All,
}

/// The template's switches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateOptions {
    /// Reasoning of history turns.
    #[serde(default)]
    pub strip_reasoning: StripReasoning,
    /// Text appended to the generation prompt only.
    #[serde(default)]
    pub generation_glue: String,
}

/// Renders the prompt: system and tools block, every message, and, when
/// `add_generation_prompt`, `<|im_start|>assistant\n` plus the glue.
pub fn render_prompt(
    messages: &[Message],
    tools: &[Tool],
    opts: &TemplateOptions,
    add_generation_prompt: bool,
) -> String {
    let mut out = String::new();
    let mut rest = messages;
    let leading_system = match messages.first() {
        Some(m) if matches!(m.role, Role::System | Role::Developer) => {
            rest = &messages[1..];
            Some(content_text(m))
        }
        _ => None,
    };
    if leading_system.is_some() || !tools.is_empty() {
        out.push_str("<|im_start|>system\n");
        let system = leading_system.unwrap_or_default();
        out.push_str(&system);
        if !tools.is_empty() {
            if !system.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str("# Tools\n<tools>\n");
            let lines: Vec<String> = tools.iter().map(tool_line).collect();
            out.push_str(&lines.join("\n"));
            out.push_str("\n</tools>");
        }
        out.push_str("<|im_end|>\n");
    }
    let last_user = rest.iter().rposition(|m| m.role == Role::User);
    for (i, m) in rest.iter().enumerate() {
        match m.role {
            Role::System | Role::Developer => block(&mut out, "system", &content_text(m)),
            Role::User => block(&mut out, "user", &content_text(m)),
            Role::Tool => block(&mut out, "tool", &content_text(m)),
            Role::Assistant => {
                let strip = match opts.strip_reasoning {
                    StripReasoning::Off => false,
                    StripReasoning::All => true,
                    StripReasoning::BeforeLastUser => last_user.is_some_and(|u| i < u),
                };
                // Empty reasoning renders nothing, as Qwen3's template
                // tests `reasoning_content` for truth.
                let reasoning = m
                    .reasoning
                    .as_ref()
                    .filter(|r| !strip && !r.text.is_empty())
                    .map(|r| r.text.as_str());
                let calls: Vec<(&str, &str)> = m
                    .tool_calls
                    .iter()
                    .map(|c| (c.name.as_str(), c.arguments.as_str()))
                    .collect();
                let body = render_assistant_body(reasoning, &content_text(m), &calls);
                block(&mut out, "assistant", &body);
            }
        }
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
        out.push_str(&opts.generation_glue);
    }
    out
}

/// The text of an assistant turn between `<|im_start|>assistant\n` and
/// `<|im_end|>`: the reasoning block, the content, then each tool call.
pub fn render_assistant_body(
    reasoning: Option<&str>,
    content: &str,
    tool_calls: &[(&str, &str)],
) -> String {
    let mut out = String::new();
    if let Some(r) = reasoning {
        out.push_str("<think>\n");
        out.push_str(r);
        out.push_str("\n</think>\n\n");
    }
    out.push_str(content);
    for (i, (name, args)) in tool_calls.iter().enumerate() {
        if i > 0 || !content.is_empty() {
            out.push('\n');
        }
        out.push_str("<tool_call>\n{\"name\": ");
        out.push_str(&Value::from(*name).to_string());
        out.push_str(", \"arguments\": ");
        out.push_str(&canonical_arguments(args));
        out.push_str("}\n</tool_call>");
    }
    out
}

/// Tool-call arguments in canonical JSON (compact, keys sorted); text that is
/// not JSON is kept as it is.
pub fn canonical_arguments(args: &str) -> String {
    serde_json::from_str::<Value>(args).map_or_else(|_| args.to_owned(), |v| v.to_string())
}

fn block(out: &mut String, role: &str, body: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(body);
    out.push_str("<|im_end|>\n");
}

fn tool_line(t: &Tool) -> String {
    json!({"type": "function", "function": {
        "name": t.name,
        "description": t.description.clone().unwrap_or_default(),
        "parameters": t.parameters,
    }})
    .to_string()
}

/// A message's content as template text (images as `[image]`, unknown parts
/// as their JSON).
pub fn content_text(m: &Message) -> String {
    m.content
        .iter()
        .map(|p| match p {
            Part::Text { text } => text.to_string(),
            Part::Image { .. } => "[image]".to_owned(),
            Part::Other { value } => value.to_string(),
        })
        .collect()
}

/// What a byte range of generated text is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// Template markup: yields no text.
    Markup,
    /// Reasoning text.
    Reasoning,
    /// Answer text.
    Content,
    /// The head of tool call `n` (markup that carries its name).
    ToolHead(usize),
    /// The arguments JSON of tool call `n`.
    ToolArgs(usize),
}

/// A tool call parsed out of generated text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// Tool name.
    pub name: String,
    /// Arguments JSON text, as generated.
    pub arguments: String,
}

/// Generated text split into its parts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// The reasoning, when a `<think>` block was generated.
    pub reasoning: Option<String>,
    /// The answer text.
    pub content: String,
    /// Complete tool calls.
    pub tool_calls: Vec<ParsedCall>,
    /// Every byte of the text, in order, assigned to a channel.
    pub spans: Vec<(Channel, Range<usize>)>,
}

/// Parses generated text (possibly truncated, possibly ending with
/// `<|im_end|>`). An unterminated `<think>` block is all reasoning; an
/// unterminated tool call is kept as content.
pub fn parse_output(text: &str) -> ParsedOutput {
    let mut p = ParsedOutput::default();
    let end = text.strip_suffix("<|im_end|>").map_or(text.len(), str::len);
    let mut pos = 0;
    if let Some(after_open) = text.strip_prefix("<think>") {
        let open = "<think>".len() + usize::from(after_open.starts_with('\n'));
        p.spans.push((Channel::Markup, 0..open));
        match text[open..end].find("</think>") {
            Some(rel) => {
                let close = open + rel;
                let r_end = if text[open..close].ends_with('\n') && close > open {
                    close - 1
                } else {
                    close
                };
                p.reasoning = Some(text[open..r_end].to_owned());
                p.spans.push((Channel::Reasoning, open..r_end));
                let mut after = close + "</think>".len();
                after += text[after..end]
                    .bytes()
                    .take(2)
                    .take_while(|&b| b == b'\n')
                    .count();
                p.spans.push((Channel::Markup, r_end..after));
                pos = after;
            }
            None => {
                p.reasoning = Some(text[open..end].to_owned());
                p.spans.push((Channel::Reasoning, open..end));
                pos = end;
            }
        }
    }
    let first_call = text[pos..end].find("<tool_call>").map(|r| pos + r);
    let content_end = match first_call {
        Some(c) if c > pos && text[..c].ends_with('\n') => c - 1,
        Some(c) => c,
        None => end,
    };
    p.content = text[pos..content_end].to_owned();
    p.spans.push((Channel::Content, pos..content_end));
    pos = content_end;
    if first_call.is_some() {
        pos = parse_calls(text, pos, end, &mut p);
    }
    if pos < end {
        p.content.push_str(&text[pos..end]);
        p.spans.push((Channel::Content, pos..end));
    }
    p.spans.push((Channel::Markup, end..text.len()));
    p.spans.retain(|(_, r)| !r.is_empty());
    p
}

/// Parses complete tool calls from `pos`; returns where parsing stopped.
fn parse_calls(text: &str, mut pos: usize, end: usize, p: &mut ParsedOutput) -> usize {
    const HEAD: &str = "<tool_call>\n{\"name\": ";
    const ARGS: &str = ", \"arguments\": ";
    const TAIL: &str = "}\n</tool_call>";
    loop {
        let start = pos + usize::from(text[pos..end].starts_with("\n<tool_call>"));
        if !text[start..end].starts_with(HEAD) {
            return pos;
        }
        let Some(close) = text[start..end].find("</tool_call>").map(|r| start + r) else {
            return pos;
        };
        let call_end = close + "</tool_call>".len();
        let Some(args_at) = text[start..close]
            .find(ARGS)
            .map(|r| start + r + ARGS.len())
        else {
            return pos;
        };
        let Some(args_end) = text[..call_end].strip_suffix(TAIL).map(str::len) else {
            return pos;
        };
        let line = &text[start + "<tool_call>\n".len()..args_end + 1];
        let parsed: Option<(String, Value)> =
            serde_json::from_str::<Value>(line).ok().and_then(|v| {
                Some((
                    v.get("name")?.as_str()?.to_owned(),
                    v.get("arguments")?.clone(),
                ))
            });
        let Some((name, _)) = parsed else {
            return pos;
        };
        if args_at > args_end {
            return pos;
        }
        let n = p.tool_calls.len();
        p.tool_calls.push(ParsedCall {
            name,
            arguments: text[args_at..args_end].to_owned(),
        });
        p.spans.push((Channel::Markup, pos..start));
        p.spans.push((Channel::ToolHead(n), start..args_at));
        p.spans.push((Channel::ToolArgs(n), args_at..args_end));
        p.spans.push((Channel::Markup, args_end..call_end));
        pos = call_end;
    }
}

/// What the mock's policy needs to know about a prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromptFacts {
    /// The text of the first user message.
    pub first_user: Option<String>,
    /// The tools offered.
    pub tools: Vec<Tool>,
    /// Whether a tool result follows the last user message.
    pub tool_result_after_last_user: bool,
    /// The conversation's progress: the tool results after the last
    /// progress note (the mock's own summary, see
    /// [`super::script::PROGRESS_NOTE`]) plus the count that note carries.
    pub progress: usize,
    /// The tool results after the last progress note (all of them without
    /// one).
    pub fresh_tool_results: usize,
    /// Whether the request asks for a summary: its last message but system
    /// notes is a user message mentioning one ("summary", "summarize")
    /// after tool results (a harness compacting its context; Claude Code
    /// may append a system note after its request).
    pub summary_request: bool,
}

impl PromptFacts {
    /// The facts of a structured conversation.
    pub fn of_messages(messages: &[Message], tools: &[Tool]) -> Self {
        let last_user = messages.iter().rposition(|m| m.role == Role::User);
        let mut progress = Progress::default();
        for m in messages {
            progress.see(m.role == Role::Tool, &content_text(m));
        }
        let summary_request = messages
            .iter()
            .rfind(|m| m.role != Role::System)
            .is_some_and(|m| m.role == Role::User && asks_for_summary(&content_text(m)))
            && messages.iter().any(|m| m.role == Role::Tool);
        Self {
            first_user: messages
                .iter()
                .find(|m| m.role == Role::User)
                .map(content_text),
            tools: tools.to_vec(),
            tool_result_after_last_user: messages
                .iter()
                .skip(last_user.map_or(0, |u| u + 1))
                .any(|m| m.role == Role::Tool),
            progress: progress.count,
            fresh_tool_results: progress.fresh,
            summary_request,
        }
    }

    /// The facts recovered from rendered prompt text (token-in endpoints).
    pub fn sniff(prompt: &str) -> Self {
        let mut facts = Self::default();
        let mut progress = Progress::default();
        let mut tool_results = false;
        for block in prompt.split("<|im_start|>").skip(1) {
            let (role, body) = block.split_once('\n').unwrap_or((block, ""));
            let closed = body.contains("<|im_end|>");
            let body = body.split("<|im_end|>").next().unwrap_or_default();
            progress.see(role == "tool", body);
            tool_results |= role == "tool";
            if closed && role != "system" {
                // (The generation prompt is the one block left open.)
                facts.summary_request = role == "user" && tool_results && asks_for_summary(body);
            }
            match role {
                "system" => {
                    if let Some((_, list)) = body.split_once("<tools>\n") {
                        let list = list.split("\n</tools>").next().unwrap_or_default();
                        facts.tools.extend(list.lines().filter_map(tool_from_line));
                    }
                }
                "user" => {
                    if facts.first_user.is_none() {
                        facts.first_user = Some(body.to_owned());
                    }
                    facts.tool_result_after_last_user = false;
                }
                "tool" => facts.tool_result_after_last_user = true,
                _ => {}
            }
        }
        facts.progress = progress.count;
        facts.fresh_tool_results = progress.fresh;
        facts
    }
}

/// Whether a user message asks for a summary.
fn asks_for_summary(text: &str) -> bool {
    text.to_lowercase().contains("summar")
}

/// Counts a conversation's progress message by message.
#[derive(Debug, Default)]
struct Progress {
    count: usize,
    /// Tool results since the last note.
    fresh: usize,
}

impl Progress {
    /// A tool result adds one; a message carrying a progress note restarts
    /// the count from the note's number (a summary replaced what it covers).
    fn see(&mut self, tool_result: bool, text: &str) {
        if let Some(n) = super::script::progress_note(text) {
            self.count = n;
            self.fresh = 0;
        }
        if tool_result {
            self.count += 1;
            self.fresh += 1;
        }
    }
}

fn tool_from_line(line: &str) -> Option<Tool> {
    let v: Value = serde_json::from_str(line).ok()?;
    let f = v.get("function")?;
    Some(Tool {
        name: f.get("name")?.as_str()?.to_owned(),
        description: f
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned),
        parameters: polar_json::RawJson::from_value(f.get("parameters").unwrap_or(&Value::Null)),
    })
}

#[cfg(test)]
#[path = "template_tests.rs"]
mod tests;
