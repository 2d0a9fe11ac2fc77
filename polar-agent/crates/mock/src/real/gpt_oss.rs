//! gpt-oss's output format, Harmony ([`GptOss`]): how the model writes a
//! turn, how vLLM reads it back (as `polar_chat::output::gpt_oss` has
//! it), and how a prompt gpt-oss's template rendered reads back as a
//! conversation.
//!
//! The generation prompt ends with `<|start|>assistant`; the turn is its
//! messages: the reasoning
//! `<|channel|>analysis<|message|>R<|end|><|start|>assistant`, then
//! either the answer `<|channel|>final<|message|>T<|return|>` or a
//! preamble `<|channel|>commentary<|message|>T<|end|><|start|>assistant`
//! (text before a call) and the call, written as the model writes it
//! (the template re-renders it with the recipient before the channel),
//! `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`
//! (the arguments as `tojson` writes them). `<|call|>` is a stop token:
//! the model makes one call per turn, so a turn scripted with several
//! calls is written with its first.
//!
//! The template lists the tools as a TypeScript namespace in the developer
//! message; a prompt read back has each tool's name and its parameters
//! with their types as far as the mock's policy needs them (an array or a
//! scalar).

use polar_chat::output::OutputFormat as ChatFormat;
use polar_chat::{Message, Role, Tool};
use serde_json::{Map, Value, json};

use super::OutputFormat;
use super::qwen3::dumps;
use super::read::read_output;
use crate::template::ParsedOutput;

const START: &str = "<|start|>";
const MESSAGE: &str = "<|message|>";
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
const NAMESPACE: &str = "namespace functions {\n";

/// gpt-oss (Harmony channels).
#[derive(Clone, Copy, Debug, Default)]
pub struct GptOss;

impl OutputFormat for GptOss {
    fn name(&self) -> &'static str {
        "gpt-oss (harmony)"
    }

    fn end_of_turn(&self) -> &'static str {
        "<|return|>"
    }

    fn turn_end(&self, calls: bool) -> &'static str {
        if calls { "<|call|>" } else { "<|return|>" }
    }

    fn turn_head(&self) -> &'static str {
        "<|start|>assistant"
    }

    fn no_think_glue(&self) -> &'static str {
        ""
    }

    fn turn_text(
        &self,
        think: Option<&str>,
        text: &str,
        calls: &[(String, String)],
        _thinking: Option<bool>,
    ) -> String {
        let mut out = String::new();
        if let Some(think) = think {
            out.push_str("<|channel|>analysis<|message|>");
            out.push_str(think);
            out.push_str("<|end|><|start|>assistant");
        }
        match calls.first() {
            None => {
                out.push_str("<|channel|>final<|message|>");
                out.push_str(text);
            }
            Some((name, args)) => {
                if !text.is_empty() {
                    out.push_str("<|channel|>commentary<|message|>");
                    out.push_str(text);
                    out.push_str("<|end|><|start|>assistant");
                }
                out.push_str("<|channel|>commentary to=functions.");
                out.push_str(name);
                out.push_str(" <|constrain|>json<|message|>");
                out.push_str(&dumps(args));
            }
        }
        out
    }

    fn parse(&self, text: &str) -> ParsedOutput {
        read_output(ChatFormat::GptOss, false, text)
    }

    fn read_prompt(&self, prompt: &str) -> (Vec<Message>, Vec<Tool>) {
        let mut messages = Vec::new();
        let mut tools = Vec::new();
        for block in prompt.split(START).skip(1) {
            let Some((header, rest)) = block.split_once(MESSAGE) else {
                continue;
            };
            let Some(end) = ENDS.iter().filter_map(|m| rest.find(m)).min() else {
                // The generation prompt (or a turn left open).
                continue;
            };
            let body = &rest[..end];
            if header.starts_with("system") {
                continue;
            } else if header.starts_with("developer") {
                tools.extend(namespace_tools(body));
                let instructions = body
                    .strip_prefix("# Instructions\n\n")
                    .map(|b| b.split("\n\n# Tools\n\n").next().unwrap_or(b));
                if let Some(text) = instructions {
                    messages.push(Message::text(Role::System, text.trim_end()));
                }
            } else if header.starts_with("user") {
                messages.push(Message::text(Role::User, body));
            } else if header.starts_with("functions.") {
                let result = serde_json::from_str::<String>(body).unwrap_or_else(|_| body.into());
                messages.push(Message::text(Role::Tool, result.as_str()));
            } else {
                // An assistant message, read as a generated one.
                let text = format!(
                    "{START}{header}{MESSAGE}{body}{}",
                    &rest[end..end + end_len(rest, end)]
                );
                messages.push(super::qwen3::assistant(&self.parse(&text)));
            }
        }
        (messages, tools)
    }
}

/// The length of the end marker at `rest[end..]`.
fn end_len(rest: &str, end: usize) -> usize {
    ENDS.iter()
        .find(|m| rest[end..].starts_with(*m))
        .map_or(0, |m| m.len())
}

/// The tools of the developer message's `functions` namespace: each
/// `type NAME = (_: {` block's parameters (`KEY?: TYPE,` lines), typed
/// `array` when their TypeScript type is one (`T[]`), else `string`.
fn namespace_tools(body: &str) -> Vec<Tool> {
    let Some((_, ns)) = body.split_once(NAMESPACE) else {
        return Vec::new();
    };
    let ns = ns.split("} // namespace functions").next().unwrap_or(ns);
    let mut tools = Vec::new();
    let mut current: Option<(String, Map<String, Value>)> = None;
    for line in ns.lines() {
        if let Some(rest) = line.strip_prefix("type ") {
            if let Some((name, _)) = current.take() {
                tools.push(tool(name, Map::new()));
            }
            let Some((name, sig)) = rest.split_once(" = ") else {
                continue;
            };
            if sig.starts_with("(_: {") {
                current = Some((name.to_owned(), Map::new()));
            } else {
                tools.push(tool(name.to_owned(), Map::new()));
            }
        } else if line.starts_with("}) => any;") {
            if let Some((name, props)) = current.take() {
                tools.push(tool(name, props));
            }
        } else if let Some((_, props)) = &mut current
            && !line.starts_with("//")
            && let Some((key, ty)) = line.split_once(": ")
        {
            let key = key.trim_end_matches('?');
            if !key.is_empty() && key.chars().all(|c| c.is_alphanumeric() || c == '_') {
                let ty = ty.split(',').next().unwrap_or(ty).trim();
                let kind = if ty.ends_with("[]") {
                    "array"
                } else {
                    "string"
                };
                props.insert(key.to_owned(), json!({ "type": kind }));
            }
        }
    }
    tools
}

fn tool(name: String, props: Map<String, Value>) -> Tool {
    Tool {
        name,
        description: None,
        parameters: polar_json::RawJson::from_value(
            &json!({ "type": "object", "properties": props }),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_reads_back_as_vllm_parses_it() {
        let calls = vec![("bash".to_owned(), r#"{"command":["ls","-la"]}"#.to_owned())];
        let text = GptOss.turn_text(Some("Look first."), "Listing.", &calls, None);
        assert_eq!(
            text,
            "<|channel|>analysis<|message|>Look first.<|end|><|start|>assistant<|channel|>commentary<|message|>Listing.<|end|><|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{\"command\": [\"ls\", \"-la\"]}"
        );
        let full = format!("{text}{}", GptOss.turn_end(true));
        let p = GptOss.parse(&full);
        assert_eq!(p.reasoning.as_deref(), Some("Look first."));
        assert_eq!(p.content, "Listing.");
        assert_eq!(p.tool_calls.len(), 1);
        assert_eq!(p.tool_calls[0].name, "bash");
        assert_eq!(p.tool_calls[0].arguments, r#"{"command": ["ls", "-la"]}"#);
        let mut at = 0;
        for (_, r) in &p.spans {
            assert_eq!(r.start, at);
            at = r.end;
        }
        assert_eq!(at, full.len());
        // An answer.
        let text = GptOss.turn_text(None, "done", &[], None);
        let p = GptOss.parse(&format!("{text}<|return|>"));
        assert_eq!((p.reasoning, p.content.as_str()), (None, "done"));
        assert!(p.tool_calls.is_empty());
    }

    #[test]
    fn a_rendered_prompt_reads_back_as_its_conversation() {
        let prompt = "<|start|>system<|message|>You are ChatGPT.<|end|><|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Runs a command\ntype shell = (_: {\n// The command\ncommand: string[],\nworkdir?: string,\n}) => any;\n\n// Lists\ntype list = () => any;\n\n} // namespace functions<|end|><|start|>user<|message|>fix it<|end|><|start|>assistant to=functions.shell<|channel|>commentary json<|message|>{\"command\": [\"ls\"]}<|call|><|start|>functions.shell to=assistant<|channel|>commentary<|message|>\"out\"<|end|><|start|>assistant";
        let (messages, tools) = GptOss.read_prompt(prompt);
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["shell", "list"]);
        assert_eq!(
            tools[0].parameters.to_value()["properties"]["command"]["type"],
            "array"
        );
        let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::Tool]
        );
        assert_eq!(messages[2].tool_calls[0].name, "shell");
        assert_eq!(
            messages[3].content,
            vec![polar_chat::Part::Text { text: "out".into() }]
        );
    }
}
