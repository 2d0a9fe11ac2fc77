//! Qwen3's output format ([`Qwen3`]): how the model writes a turn
//! (`<think>\n{reasoning}\n</think>\n\n{text}`, then each call as
//! `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`, then
//! `<|im_end|>`), how vLLM reads it back (its `qwen3` reasoning parser and
//! `hermes` tool parser), and how a prompt Qwen3's template rendered reads
//! back as a conversation (for the token-in endpoints' script facts).
//!
//! vLLM's parsers, as `vllm/reasoning/qwen3_reasoning_parser.py` and
//! `vllm/tool_parsers/hermes_tool_parser.py` have them:
//! - reasoning only when `</think>` was generated: the text between the
//!   first `<think>` (text before it dropped) and `</think>`, newlines kept;
//!   the content is everything after `</think>` (`"\n\n..."`);
//! - tool calls only when `<tool_call>` is in the content: each
//!   `<tool_call>(.*?)</tool_call>` (or an unterminated last one) is JSON
//!   with `name` and `arguments`, the arguments sent as `json.dumps` writes
//!   them; the content is the text before the first `<tool_call>`
//!   (`"\n\n"` after a reasoning block), text between and after calls is
//!   dropped; a call that is not such JSON leaves all of it content.
//!
//! SGLang's `qwen3` reasoning detector splits the same way; its `qwen25`
//! tool detector strips the text before the first call (`""` where vLLM
//! has `"\n\n"`), which its chat reply applies (`crate::sglang`).

use std::ops::Range;

use serde_json::Value;

use polar_chat::{Message, Part, Reasoning, Role, Tool, ToolCall};

use super::OutputFormat;
use crate::generate::JsonScan;
use crate::template::{Channel, ParsedCall, ParsedOutput};

const THINK: &str = "<think>";
const THINK_END: &str = "</think>";
const CALL: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";
const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";
const RESPONSE: &str = "<tool_response>\n";
const TOOLS: &str = "# Tools\n\nYou may call one or more functions";
const RESPONSE_END: &str = "\n</tool_response>";

/// Qwen3 (ChatML turns, `<think>` reasoning, Hermes tool calls).
#[derive(Clone, Copy, Debug, Default)]
pub struct Qwen3;

/// JSON text as Python's `json.dumps` writes it (`", "`, `": "`; keys in
/// their order): `text` parsed and written again, or `text` itself when it
/// is not JSON.
pub fn dumps(text: &str) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => JsonScan::default().dumps_style(&v.to_string()),
        Err(_) => text.to_owned(),
    }
}

impl OutputFormat for Qwen3 {
    fn name(&self) -> &'static str {
        "qwen3 (hermes tool calls)"
    }

    fn end_of_turn(&self) -> &'static str {
        IM_END
    }

    fn turn_head(&self) -> &'static str {
        "<|im_start|>assistant\n"
    }

    fn no_think_glue(&self) -> &'static str {
        "<think>\n\n</think>\n\n"
    }

    fn turn_text(
        &self,
        think: Option<&str>,
        text: &str,
        calls: &[(String, String)],
        thinking: Option<bool>,
    ) -> String {
        let mut out = String::new();
        if thinking != Some(false) {
            out.push_str("<think>\n");
            out.push_str(think.unwrap_or_default());
            out.push_str("\n</think>\n\n");
        }
        out.push_str(text);
        for (i, (name, args)) in calls.iter().enumerate() {
            if i > 0 || !text.is_empty() {
                out.push('\n');
            }
            out.push_str("<tool_call>\n{\"name\": \"");
            out.push_str(name);
            out.push_str("\", \"arguments\": ");
            out.push_str(&dumps(args));
            out.push_str("}\n</tool_call>");
        }
        out
    }

    fn parse(&self, text: &str) -> ParsedOutput {
        let mut p = ParsedOutput::default();
        let end = text.strip_suffix(IM_END).map_or(text.len(), str::len);
        let mut pos = 0;
        if let Some(close) = text[..end].find(THINK_END) {
            let open = text[..close].find(THINK).map_or(0, |at| at + THINK.len());
            p.spans.push((Channel::Markup, 0..open));
            p.reasoning = Some(text[open..close].to_owned());
            p.spans.push((Channel::Reasoning, open..close));
            pos = close + THINK_END.len();
            p.spans.push((Channel::Markup, close..pos));
        }
        match calls(text, pos, end) {
            Some((first, calls)) => {
                p.content = text[pos..first].to_owned();
                p.spans.push((Channel::Content, pos..first));
                let mut at = first;
                for (n, (call, head, args)) in calls.into_iter().enumerate() {
                    p.spans.push((Channel::Markup, at..head.start));
                    p.spans.push((Channel::ToolHead(n), head.clone()));
                    p.spans.push((Channel::ToolArgs(n), args.clone()));
                    at = args.end;
                    p.tool_calls.push(call);
                }
                p.spans.push((Channel::Markup, at..text.len()));
            }
            None => {
                p.content = text[pos..end].to_owned();
                p.spans.push((Channel::Content, pos..end));
                p.spans.push((Channel::Markup, end..text.len()));
            }
        }
        p.spans.retain(|(_, r)| !r.is_empty());
        p
    }

    fn read_prompt(&self, prompt: &str) -> (Vec<Message>, Vec<Tool>) {
        let mut messages = Vec::new();
        let mut tools = Vec::new();
        for block in prompt.split(IM_START).skip(1) {
            let Some((body, _)) = block.split_once(IM_END) else {
                // The generation prompt (or a turn left open).
                continue;
            };
            let (role, body) = body.split_once('\n').unwrap_or((body, ""));
            match role {
                "system" => {
                    // The template's tools section comes after the system
                    // text (which may itself hold such a heading).
                    let (system, tool_list) = match body.rfind(TOOLS) {
                        Some(at) => (
                            body[..at].strip_suffix("\n\n").unwrap_or(&body[..at]),
                            Some(&body[at..]),
                        ),
                        None => (body, None),
                    };
                    if let Some(list) = tool_list.and_then(|r| r.split_once("<tools>\n")) {
                        let list = list.1.split("\n</tools>").next().unwrap_or_default();
                        tools.extend(list.lines().filter_map(tool_from_line));
                    }
                    if !system.is_empty() || tool_list.is_none() {
                        messages.push(Message::text(Role::System, system));
                    }
                }
                "user" => match tool_responses(body) {
                    Some(results) => {
                        messages.extend(results.into_iter().map(|r| Message::text(Role::Tool, r)))
                    }
                    None => messages.push(Message::text(Role::User, body)),
                },
                "assistant" => messages.push(assistant(&self.parse(body))),
                _ => messages.push(Message::text(Role::User, body)),
            }
        }
        (messages, tools)
    }
}

/// The calls of `text[pos..end]` as vLLM's `hermes` parser finds them:
/// where the first `<tool_call>` is, and each call with the byte ranges of
/// its head (`<tool_call>\n{"name": .., "arguments": `) and of its
/// arguments (through `</tool_call>` for the last part); `None` without a
/// call or when one is not valid JSON with a string `name` and `arguments`.
#[expect(
    clippy::type_complexity,
    reason = "private: the calls with their two ranges"
)]
fn calls(
    text: &str,
    pos: usize,
    end: usize,
) -> Option<(usize, Vec<(ParsedCall, Range<usize>, Range<usize>)>)> {
    let first = pos + text[pos..end].find(CALL)?;
    let mut out = Vec::new();
    let mut at = first;
    while let Some(rel) = text[at..end].find(CALL) {
        let start = at + rel;
        let inner_start = start + CALL.len();
        let (inner_end, call_end) = match text[inner_start..end].find(CALL_END) {
            Some(r) => (inner_start + r, inner_start + r + CALL_END.len()),
            None => (end, end),
        };
        let json: Value = serde_json::from_str(text[inner_start..inner_end].trim()).ok()?;
        let name = json.get("name")?.as_str()?.to_owned();
        let arguments = json.get("arguments")?;
        let args_text = JsonScan::default().dumps_style(&arguments.to_string());
        // Where the model's own text has the arguments (its layout is the
        // template's): the rest of the call is markup.
        let key = "\"arguments\": ";
        let args_at = text[inner_start..inner_end]
            .find(key)
            .map_or(inner_end, |r| inner_start + r + key.len());
        let args_end = text[args_at..inner_end]
            .rfind('}')
            .map_or(args_at, |r| args_at + r);
        out.push((
            ParsedCall {
                name,
                arguments: args_text,
            },
            start..args_at,
            args_at..args_end,
        ));
        at = call_end;
    }
    Some((first, out))
}

/// A user block of tool results (`<tool_response>\n..\n</tool_response>`,
/// one per result, newline-separated): the results; `None` for a user
/// message.
fn tool_responses(body: &str) -> Option<Vec<String>> {
    let inner = body.strip_prefix(RESPONSE)?.strip_suffix(RESPONSE_END)?;
    Some(
        inner
            .split(&format!("{RESPONSE_END}\n{RESPONSE}"))
            .map(str::to_owned)
            .collect(),
    )
}

/// An assistant message from its parsed turn.
pub(crate) fn assistant(p: &ParsedOutput) -> Message {
    let mut m = Message::text(Role::Assistant, "");
    m.content = vec![Part::Text {
        text: p.content.as_str().into(),
    }];
    m.reasoning = p.reasoning.as_ref().map(|r| Reasoning {
        text: r.clone(),
        ..Reasoning::default()
    });
    m.tool_calls = p
        .tool_calls
        .iter()
        .map(|c| ToolCall {
            id: String::new(),
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        })
        .collect();
    m
}

/// A tool of the template's `<tools>` list (one JSON per line).
fn tool_from_line(line: &str) -> Option<Tool> {
    let v: Value = serde_json::from_str(line).ok()?;
    let f = v.get("function").unwrap_or(&v);
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
mod tests {
    use super::*;

    fn calls() -> Vec<(String, String)> {
        vec![
            ("bash".into(), r#"{"command":"ls -la","n":1}"#.into()),
            ("read".into(), r#"{"path":"a.txt"}"#.into()),
        ]
    }

    #[test]
    fn a_turn_reads_back_as_vllm_parses_it() {
        let text = Qwen3.turn_text(Some("Let me look."), "", &calls(), Some(true));
        assert_eq!(
            text,
            "<think>\nLet me look.\n</think>\n\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\", \"n\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>"
        );
        let p = Qwen3.parse(&format!("{text}<|im_end|>"));
        assert_eq!(p.reasoning.as_deref(), Some("\nLet me look.\n"));
        assert_eq!(p.content, "\n\n");
        assert_eq!(p.tool_calls.len(), 2);
        assert_eq!(p.tool_calls[0].name, "bash");
        assert_eq!(
            p.tool_calls[0].arguments,
            r#"{"command": "ls -la", "n": 1}"#
        );
        // Every byte has one channel, in order.
        let mut at = 0;
        for (_, r) in &p.spans {
            assert_eq!(r.start, at);
            at = r.end;
        }
        assert_eq!(at, text.len() + IM_END.len());
        let args: Vec<&str> = p
            .spans
            .iter()
            .filter(|(c, _)| matches!(c, Channel::ToolArgs(_)))
            .map(|(_, r)| &text[r.clone()])
            .collect();
        assert_eq!(
            args,
            [r#"{"command": "ls -la", "n": 1}"#, r#"{"path": "a.txt"}"#]
        );
    }

    #[test]
    fn text_before_calls_is_content_and_no_think_end_means_no_reasoning() {
        let text = Qwen3.turn_text(None, "Listing.", &calls()[..1], Some(false));
        let p = Qwen3.parse(&text);
        assert_eq!(p.reasoning, None);
        assert_eq!(p.content, "Listing.\n");
        assert_eq!(p.tool_calls.len(), 1);
        // Cut inside the reasoning: all of it is content, as vLLM has it.
        let p = Qwen3.parse("<think>\nhalf way");
        assert_eq!(
            (p.reasoning, p.content.as_str()),
            (None, "<think>\nhalf way")
        );
        // A call that is not JSON leaves the text content.
        let p = Qwen3.parse("<tool_call>\n{\"name\": \"x\", \"argu\n</tool_call><|im_end|>");
        assert!(p.tool_calls.is_empty());
        assert!(p.content.starts_with("<tool_call>"));
    }

    #[test]
    fn a_rendered_prompt_reads_back_as_its_conversation() {
        let prompt = "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"bash\", \"description\": \"Run\", \"parameters\": {}}}\n</tools>\n\nFor each function call, ...<|im_end|>\n<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n\n\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nout\n</tool_response>\n<tool_response>\nerr\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
        let (messages, tools) = Qwen3.read_prompt(prompt);
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name, "bash");
        let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool
            ]
        );
        assert_eq!(messages[2].tool_calls[0].arguments, r#"{"command": "ls"}"#);
        assert_eq!(messages[4].content, vec![Part::Text { text: "err".into() }]);
    }
}
