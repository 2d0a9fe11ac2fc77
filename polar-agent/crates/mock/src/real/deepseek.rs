//! DeepSeek-V3's and V3.1's output format ([`Deepseek`]): how the model
//! writes a turn, how vLLM reads it back (its `deepseek_v3` /
//! `deepseek_v31` tool parsers and DeepSeek reasoning parser, as
//! `polar_chat::output::deepseek_v3` has them), and how a prompt the
//! family's template rendered reads back as a conversation.
//!
//! A turn follows `<｜Assistant｜>` (the generation prompt; V3.1 adds
//! `<think></think>` out of thinking mode, `<think>` in it) or, after tool
//! results, the results themselves (the templates add no generation
//! prompt there). It is the reasoning closed by `</think>` (V3.1 in
//! thinking mode only), the text, then one block of calls
//! `<｜tool▁calls▁begin｜>CALL..<｜tool▁calls▁end｜>`, and
//! `<｜end▁of▁sentence｜>`. A V3 call is
//! `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`
//! (newline-separated), a V3.1 call
//! `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`; the
//! arguments as the templates' `tojson` writes them (`json.dumps`).
//!
//! The templates DeepSeek ships list no tools: DeepSeek's model card has
//! the caller describe them in the system prompt, and servers load a tool
//! template for it. [`with_tool_section`] adds such a section to a
//! template (`## Tools`, each tool's `### NAME`, `Description:` and
//! `Parameters:` JSON, then the call format), which a prompt read back
//! has its tools from; without one a prompt has no tools (the mock's
//! policy then answers as to a tool-less side request).

use polar_chat::output::OutputFormat as ChatFormat;
use polar_chat::{Message, Role, Tool};

use super::OutputFormat;
use super::qwen3::dumps;
use super::read::read_output;
use crate::template::ParsedOutput;

const BOS: &str = "<｜begin▁of▁sentence｜>";
const EOS: &str = "<｜end▁of▁sentence｜>";
const USER: &str = "<｜User｜>";
const ASSISTANT: &str = "<｜Assistant｜>";
const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const OUTPUTS_BEGIN: &str = "<｜tool▁outputs▁begin｜>";
const OUTPUTS_END: &str = "<｜tool▁outputs▁end｜>";
const OUTPUT_BEGIN: &str = "<｜tool▁output▁begin｜>";
const OUTPUT_END: &str = "<｜tool▁output▁end｜>";
const THINK_END: &str = "</think>";
const TOOLS: &str = "## Tools\nYou have access to the following tools:\n";
const TOOL: &str = "### ";
const PARAMETERS_LINE: &str = "\n\nParameters: ";
/// Where DeepSeek's templates write the system prompt.
const SYSTEM_AT: &str = "{{ bos_token }}{{ ns.system_prompt }}";

/// `template` (one of DeepSeek's) with a tool section after the system
/// prompt, as DeepSeek's model card lays it out: `None` when the template
/// does not write the system prompt where DeepSeek's templates do.
pub fn with_tool_section(template: &str) -> Option<String> {
    let at = template.find(SYSTEM_AT)? + SYSTEM_AT.len();
    let section = concat!(
        "{%- if tools -%}",
        "{%- if ns.system_prompt %}{{ '\\n\\n' }}{% endif -%}",
        "{{ '## Tools\\nYou have access to the following tools:\\n' }}",
        "{%- for tool in tools -%}",
        "{{ '\\n### ' + tool['function']['name'] + '\\nDescription: ' + (tool['function']['description'] or '') + '\\n\\nParameters: ' + (tool['function']['parameters'] | tojson) + '\\n' }}",
        "{%- endfor -%}",
        "{{ '\\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜><｜tool▁calls▁end｜>\\n' }}",
        "{%- endif -%}",
    );
    Some(format!("{}{section}{}", &template[..at], &template[at..]))
}

/// Makes `dst` a model directory of DeepSeek's model in `src` whose
/// template has a tool section ([`with_tool_section`]): its other files
/// linked, its `chat_template.jinja` written.
pub fn tool_model_dir(src: &std::path::Path, dst: &std::path::Path) -> Result<(), String> {
    let err = |what: &std::path::Path, e: std::io::Error| format!("{}: {e}", what.display());
    std::fs::create_dir_all(dst).map_err(|e| err(dst, e))?;
    let template_file = src.join("chat_template.jinja");
    let template = std::fs::read_to_string(&template_file).map_err(|e| err(&template_file, e))?;
    let with = with_tool_section(&template).ok_or_else(|| {
        format!(
            "{}: the system prompt is not written as DeepSeek's templates write it",
            template_file.display()
        )
    })?;
    for entry in std::fs::read_dir(src).map_err(|e| err(src, e))? {
        let path = entry.map_err(|e| err(src, e))?.path();
        let Some(name) = path.file_name() else {
            continue;
        };
        let to = dst.join(name);
        if name != "chat_template.jinja" && !to.exists() {
            std::os::unix::fs::symlink(&path, &to).map_err(|e| err(&to, e))?;
        }
    }
    let to = dst.join("chat_template.jinja");
    std::fs::write(&to, with).map_err(|e| err(&to, e))
}

/// The tools of a system prompt's tool section ([`with_tool_section`]),
/// and the system prompt before it.
fn tool_section(system: &str) -> (&str, Vec<Tool>) {
    let Some(at) = system.find(TOOLS) else {
        return (system, Vec::new());
    };
    // Each tool runs from its `### NAME` line to its `Parameters:` line
    // (a description may hold anything else).
    let mut tools = Vec::new();
    let mut rest = &system[at + TOOLS.len()..];
    while let Some(p) = rest.find(PARAMETERS_LINE) {
        let head = &rest[..p];
        let after = &rest[p + PARAMETERS_LINE.len()..];
        let line = after.lines().next().unwrap_or_default();
        rest = &after[line.len()..];
        let Some(name) = head
            .trim_start_matches('\n')
            .strip_prefix(TOOL)
            .and_then(|h| h.lines().next())
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let parameters = serde_json::from_str(line).unwrap_or(serde_json::Value::Null);
        tools.push(Tool {
            name: name.to_owned(),
            description: None,
            parameters: polar_json::RawJson::from_value(&parameters),
        });
    }
    (system[..at].trim_end_matches('\n'), tools)
}

/// DeepSeek-V3 (`v31` false) or V3.1.
#[derive(Clone, Copy, Debug, Default)]
pub struct Deepseek {
    /// V3.1's calls and thinking mode.
    pub v31: bool,
}

impl OutputFormat for Deepseek {
    fn name(&self) -> &'static str {
        if self.v31 {
            "deepseek-v3.1"
        } else {
            "deepseek-v3"
        }
    }

    fn end_of_turn(&self) -> &'static str {
        EOS
    }

    fn turn_head(&self) -> &'static str {
        ASSISTANT
    }

    fn no_think_glue(&self) -> &'static str {
        if self.v31 { "<think></think>" } else { "" }
    }

    fn headless_turn_after(&self) -> &'static [&'static str] {
        if self.v31 {
            &[OUTPUT_END]
        } else {
            &[OUTPUTS_END]
        }
    }

    fn turn_text(
        &self,
        think: Option<&str>,
        text: &str,
        calls: &[(String, String)],
        thinking: Option<bool>,
    ) -> String {
        let mut out = String::new();
        // Only V3.1 after a generation prompt that opened `<think>`.
        if self.v31 && thinking == Some(true) {
            out.push_str(think.unwrap_or_default());
            out.push_str(THINK_END);
        }
        out.push_str(text);
        if calls.is_empty() {
            return out;
        }
        out.push_str(CALLS_BEGIN);
        for (i, (name, args)) in calls.iter().enumerate() {
            if self.v31 {
                out.push_str(&format!("{CALL_BEGIN}{name}{SEP}{}{CALL_END}", dumps(args)));
            } else {
                if i > 0 {
                    out.push('\n');
                }
                out.push_str(&format!(
                    "{CALL_BEGIN}function{SEP}{name}\n```json\n{}\n```{CALL_END}",
                    dumps(args)
                ));
            }
        }
        out.push_str(CALLS_END);
        out
    }

    fn parse(&self, text: &str) -> ParsedOutput {
        // Reasoning only from a prompt that opened it (V3.1's thinking
        // mode), whose turn closes it before anything else.
        let open = self.v31
            && text.find(THINK_END).is_some_and(|at| {
                !text[..at].contains(CALLS_BEGIN) && !text.starts_with("<think>")
            });
        read_output(ChatFormat::DeepseekV3, open, text)
    }

    fn read_prompt(&self, prompt: &str) -> (Vec<Message>, Vec<Tool>) {
        let body = prompt.strip_prefix(BOS).unwrap_or(prompt);
        let mut messages = Vec::new();
        let first = body.find(USER).unwrap_or(body.len());
        let (system, tools) = tool_section(&body[..first]);
        if !system.is_empty() {
            messages.push(Message::text(Role::System, system));
        }
        let mut rest = &body[first..];
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix(USER) {
                let end = [ASSISTANT, USER, OUTPUTS_BEGIN, OUTPUT_BEGIN]
                    .iter()
                    .filter_map(|m| r.find(m))
                    .min()
                    .unwrap_or(r.len());
                messages.push(Message::text(Role::User, &r[..end]));
                rest = &r[end..];
            } else if let Some(r) = rest.strip_prefix(OUTPUT_BEGIN) {
                let Some(end) = r.find(OUTPUT_END) else { break };
                messages.push(Message::text(Role::Tool, &r[..end]));
                rest = &r[end + OUTPUT_END.len()..];
            } else if let Some(r) = [OUTPUTS_BEGIN, OUTPUTS_END, "\n"]
                .iter()
                .find_map(|m| rest.strip_prefix(m))
            {
                rest = r;
            } else {
                // An assistant turn: after its head, or right after tool
                // results; the one left open is the generation's.
                let r = rest.strip_prefix(ASSISTANT).unwrap_or(rest);
                let Some(end) = r.find(EOS) else { break };
                let turn = &r[..end];
                let turn = turn.strip_prefix("<think></think>").unwrap_or(turn);
                messages.push(super::qwen3::assistant(&self.parse(turn)));
                rest = &r[end + EOS.len()..];
            }
        }
        (messages, tools)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::Channel;

    fn calls() -> Vec<(String, String)> {
        vec![
            ("bash".into(), r#"{"command":"ls -la"}"#.into()),
            ("read".into(), r#"{"path":"a.txt"}"#.into()),
        ]
    }

    #[test]
    fn v31_turns_read_back_as_vllm_parses_them() {
        let f = Deepseek { v31: true };
        let text = f.turn_text(Some("why"), "Listing.", &calls(), Some(false));
        assert_eq!(
            text,
            "Listing.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{\"command\": \"ls -la\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>read<｜tool▁sep｜>{\"path\": \"a.txt\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        );
        let p = f.parse(&format!("{text}{EOS}"));
        assert_eq!(p.reasoning, None);
        assert_eq!(p.content, "Listing.");
        let got: Vec<(&str, &str)> = p
            .tool_calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("bash", r#"{"command": "ls -la"}"#),
                ("read", r#"{"path": "a.txt"}"#)
            ]
        );
        let mut at = 0;
        for (_, r) in &p.spans {
            assert_eq!(r.start, at);
            at = r.end;
        }
        assert_eq!(at, text.len() + EOS.len());
        // Thinking mode: the reasoning the prompt opened.
        let text = f.turn_text(Some("why"), "Done.", &[], Some(true));
        assert_eq!(text, "why</think>Done.");
        let p = f.parse(&text);
        assert_eq!(
            (p.reasoning.as_deref(), p.content.as_str()),
            (Some("why"), "Done.")
        );
        let reasoning: Vec<&str> = p
            .spans
            .iter()
            .filter(|(c, _)| *c == Channel::Reasoning)
            .map(|(_, r)| &text[r.clone()])
            .collect();
        assert_eq!(reasoning, ["why"]);
    }

    #[test]
    fn v3_calls_are_fenced_and_read_back() {
        let f = Deepseek { v31: false };
        let text = f.turn_text(Some("ignored"), "", &calls(), Some(true));
        assert!(text.starts_with("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n{\"command\": \"ls -la\"}\n```<｜tool▁call▁end｜>\n"));
        let p = f.parse(&text);
        assert_eq!(p.tool_calls.len(), 2);
        assert_eq!(p.tool_calls[1].arguments, r#"{"path": "a.txt"}"#);
        assert_eq!(p.content, "");
    }

    #[test]
    fn a_tool_section_lists_the_tools_and_reads_back() {
        let template = "{%- set ns = namespace(system_prompt='') -%}{%- for m in messages %}{% if m['role'] == 'system' %}{% set ns.system_prompt = m['content'] %}{% endif %}{% endfor %}{{ bos_token }}{{ ns.system_prompt }}<｜User｜>hi";
        let with = with_tool_section(template).unwrap();
        assert!(with.contains("## Tools"));
        assert!(with_tool_section("{{ messages }}").is_none());
        let system = "Be brief.\n\n## Tools\nYou have access to the following tools:\n\n### bash\nDescription: Runs.\n### not a tool\n\nParameters: {\"type\": \"object\", \"properties\": {\"command\": {\"type\": \"string\"}}}\n\n### read\nDescription: \n\nParameters: {}\n\nIMPORTANT: ...";
        let (before, tools) = tool_section(system);
        assert_eq!(before, "Be brief.");
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["bash", "read"]);
        assert_eq!(
            tools[0].parameters.to_value()["properties"]["command"]["type"],
            "string"
        );
    }

    #[test]
    fn a_rendered_prompt_reads_back_as_its_conversation() {
        let prompt = "<｜begin▁of▁sentence｜>Be brief.<｜User｜>fix it<｜Assistant｜><think></think>Looking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{\"command\": \"ls\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>out<｜tool▁output▁end｜><｜tool▁output▁begin｜>err<｜tool▁output▁end｜>Done.<｜end▁of▁sentence｜><｜User｜>again<｜Assistant｜><think></think>";
        let (messages, tools) = Deepseek { v31: true }.read_prompt(prompt);
        assert!(tools.is_empty());
        let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool,
                Role::Assistant,
                Role::User
            ]
        );
        assert_eq!(messages[2].tool_calls[0].name, "bash");
        assert_eq!(
            messages[4].content[0],
            polar_chat::Part::Text { text: "err".into() }
        );
    }
}
