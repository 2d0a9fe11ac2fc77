//! What a forced tool call generates under the backends' constrained
//! decoding, in place of the template's tool-call markup: vLLM makes the
//! model generate a named tool choice's arguments JSON alone and a
//! `required` choice's calls as a JSON array of `{"name", "parameters"}`
//! objects (`serving_chat.py` builds the reply's tool calls from that JSON,
//! not with its tool parser); SGLang generates the array for both
//! (`function_call/utils.py`, `get_json_schema_constraint`). A later prompt
//! renders the call through the template, so the next turn does not
//! continue these tokens: the trajectory's template-mismatch path.
//!
//! [`body`] writes the JSON after the reasoning block and says which bytes
//! are which call's name and arguments; [`parse`] reads a (possibly cut)
//! generation of it back.

use std::ops::Range;

use serde_json::Value;

use super::template::{self, Channel, ParsedCall, ParsedOutput};

/// The shape a forced tool choice makes the model generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forced {
    /// The arguments JSON of one call (vLLM, a named tool).
    Arguments,
    /// An array of `{"name", "parameters"}` calls (vLLM `required`;
    /// SGLang, both).
    Array,
}

/// A forced turn's text: the reasoning block, then the JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Body {
    /// The turn's text, without the end-of-turn token.
    pub text: String,
    /// Where the JSON starts.
    json_start: usize,
    /// Each call's name and arguments, with the byte ranges of the name's
    /// string and of the arguments in `text`.
    calls: Vec<(String, Range<usize>, Range<usize>)>,
}

/// The text `forced` makes the model generate for `calls` (name, arguments
/// JSON text), after `think`'s reasoning block.
pub fn body(forced: Forced, think: Option<&str>, calls: &[(String, String)]) -> Body {
    let mut text = template::render_assistant_body(think, "", &[]);
    let json_start = text.len();
    let mut spans = Vec::new();
    match forced {
        Forced::Arguments => {
            let (name, args) = calls.first().map_or(("", "{}"), |(n, a)| (n, a));
            text.push_str(args);
            spans.push((
                name.to_owned(),
                json_start..json_start,
                json_start..text.len(),
            ));
        }
        Forced::Array => {
            text.push('[');
            for (i, (name, args)) in calls.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str("{\"name\":");
                let name_start = text.len();
                text.push_str(&Value::from(name.as_str()).to_string());
                let name_end = text.len();
                text.push_str(",\"parameters\":");
                let args_start = text.len();
                text.push_str(args);
                spans.push((name.clone(), name_start..name_end, args_start..text.len()));
                text.push('}');
            }
            text.push(']');
        }
    }
    Body {
        text,
        json_start,
        calls: spans,
    }
}

/// `generated` (a prefix of `body.text`, maybe followed by the end-of-turn
/// token) parsed: the reasoning as the template's parser reads it, no
/// answer text, and the calls whose arguments were generated whole (a
/// named call's arguments as far as they got, as vLLM reports them).
pub fn parse(body: &Body, forced: Forced, generated: &str) -> ParsedOutput {
    let json_start = body.json_start.min(generated.len());
    let mut out = template::parse_output(&generated[..json_start]);
    out.content.clear();
    out.spans.retain(|(c, _)| *c != Channel::Content);
    let end = generated
        .strip_suffix("<|im_end|>")
        .map_or(generated.len(), str::len)
        .max(json_start);
    let mut last = json_start;
    for (n, (name, name_at, args_at)) in body.calls.iter().enumerate() {
        let whole = args_at.end <= end;
        if forced == Forced::Array && !whole {
            break;
        }
        let args = args_at.start.min(end)..args_at.end.min(end);
        if name_at.start > last {
            out.spans
                .push((Channel::Markup, last..name_at.start.min(end)));
        }
        if !name_at.is_empty() && name_at.end <= end {
            out.spans.push((Channel::ToolHead(n), name_at.clone()));
        }
        if name_at.end < args.start {
            out.spans.push((Channel::Markup, name_at.end..args.start));
        }
        out.spans.push((Channel::ToolArgs(n), args.clone()));
        out.tool_calls.push(ParsedCall {
            name: name.clone(),
            arguments: generated[args.clone()].to_owned(),
        });
        last = args.end;
    }
    if last < generated.len() {
        out.spans.push((Channel::Markup, last..generated.len()));
    }
    out.spans.retain(|(_, r)| !r.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls() -> Vec<(String, String)> {
        vec![
            ("bash".into(), r#"{"command":"ls"}"#.into()),
            ("read".into(), r#"{"path":"a b"}"#.into()),
        ]
    }

    /// The bytes of each channel, in order.
    fn channels(p: &ParsedOutput, text: &str) -> Vec<(Channel, String)> {
        p.spans
            .iter()
            .map(|(c, r)| (*c, text[r.clone()].to_owned()))
            .collect()
    }

    #[test]
    fn a_call_of_its_arguments_is_that_json() {
        let b = body(Forced::Arguments, Some("why"), &calls());
        assert_eq!(b.text, "<think>\nwhy\n</think>\n\n{\"command\":\"ls\"}");
        let text = format!("{}<|im_end|>", b.text);
        let p = parse(&b, Forced::Arguments, &text);
        assert_eq!(p.reasoning.as_deref(), Some("why"));
        assert_eq!(p.content, "");
        assert_eq!(
            p.tool_calls,
            vec![ParsedCall {
                name: "bash".into(),
                arguments: r#"{"command":"ls"}"#.into()
            }]
        );
        let c = channels(&p, &text);
        assert_eq!(c.last(), Some(&(Channel::Markup, "<|im_end|>".into())));
        assert!(c.contains(&(Channel::ToolArgs(0), r#"{"command":"ls"}"#.into())));
        // Cut inside the arguments: as far as they got.
        let cut = &b.text[..b.text.len() - 3];
        let p = parse(&b, Forced::Arguments, cut);
        assert_eq!(p.tool_calls[0].arguments, r#"{"command":"l"#);
    }

    #[test]
    fn an_array_of_calls_leaves_a_cut_one_out() {
        let b = body(Forced::Array, None, &calls());
        assert_eq!(
            b.text,
            r#"[{"name":"bash","parameters":{"command":"ls"}},{"name":"read","parameters":{"path":"a b"}}]"#
        );
        let p = parse(&b, Forced::Array, &b.text);
        assert_eq!(p.tool_calls.len(), 2);
        assert_eq!(p.tool_calls[1].arguments, r#"{"path":"a b"}"#);
        let c = channels(&p, &b.text);
        assert!(c.contains(&(Channel::ToolHead(1), "\"read\"".into())));
        // Every byte is in exactly one span, in order.
        let mut at = 0;
        for (_, r) in &p.spans {
            assert_eq!(r.start, at);
            at = r.end;
        }
        assert_eq!(at, b.text.len());
        let cut = &b.text[..b.text.len() - 5];
        let p = parse(&b, Forced::Array, cut);
        assert_eq!(p.tool_calls.len(), 1);
        assert_eq!(p.spans.last().map(|(_, r)| r.end), Some(cut.len()));
    }
}
