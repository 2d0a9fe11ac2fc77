//! The `glm45` format (GLM-4.5, GLM-4.6), as vLLM's `glm45` tool and
//! reasoning parsers read it: `\n<think>{reasoning}</think>\n{content}`
//! (the leading newline optional), then tool calls, each
//! `\n<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>`;
//! `<|user|>`, `<|observation|>` and `<|endoftext|>` end the output.
//!
//! Keys and values are trimmed; a value is a string when the tool's schema
//! says `string`, else read as JSON where it is JSON ([`super::ToolSchemas`]),
//! as vLLM does. The arguments grow one whole pair at a time, written as
//! vLLM writes them (Python's `json.dumps`, non-ASCII escaped): `{` once the
//! name is read, `}` at `</tool_call>` (a cut call keeps them open). Text
//! between pairs is ignored, as vLLM ignores it.
//!
//! The newlines the template writes after `</think>` and before
//! `<tool_call>` are read as markup (vLLM keeps them in the text), so the
//! text parses back to what the template rendered. A `<tool_call>` whose
//! name is not followed by a newline, `<arg_key>` or `</tool_call>` stays
//! text.

use super::scan::{Sink, Think, ThinkMarkup, find_first, find_first_after, may_become, text_until};
use super::typed_args::ArgsWriter;
use super::{Feed, OutputError, ParsedCall, ToolSchemas};

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const KEY_OPEN: &str = "<arg_key>";
const KEY_CLOSE: &str = "</arg_key>";
const VALUE_OPEN: &str = "<arg_value>";
const VALUE_CLOSE: &str = "</arg_value>";
/// Longest name read before the call is taken as text.
const MAX_NAME: usize = 256;

const THINK: ThinkMarkup = ThinkMarkup {
    lead: "\n",
    after_open: "",
    before_close: "",
    after_close: "\n",
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Think,
    Content,
    /// After `<tool_call>` (markup from `start`): the name.
    Name {
        start: usize,
    },
    /// Inside a call: pairs, then `</tool_call>`.
    Pairs,
}

/// The `glm45` state machine.
#[derive(Clone, Debug)]
pub(super) struct Glm45 {
    state: State,
    think: Think,
    tools: ToolSchemas,
    args: ArgsWriter,
    /// Bytes of the open value searched for its end.
    scanned: usize,
}

impl Glm45 {
    pub(super) fn new(open: bool, tools: ToolSchemas) -> Self {
        Self {
            state: State::Think,
            think: Think::new(THINK, open),
            tools,
            args: ArgsWriter::default(),
            scanned: 0,
        }
    }

    pub(super) fn advance(&mut self, f: &mut Feed<'_>) -> Result<(), OutputError> {
        loop {
            let rest = f.rest();
            match self.state {
                State::Think => {
                    if !self.think.step(f) {
                        return Ok(());
                    }
                    self.state = State::Content;
                }
                State::Content => match text_until(f, &[CALL_OPEN], "\n", Sink::Content) {
                    Some(found) => self.state = State::Name { start: found.start },
                    None => return Ok(()),
                },
                State::Name { start } => match find_first(rest, &["\n", "<"]) {
                    Some((i, _)) if !rest[..i].trim().is_empty() && i <= MAX_NAME => {
                        f.out.calls.push(ParsedCall {
                            name: rest[..i].trim().to_owned(),
                            arguments: "{".into(),
                            done: false,
                        });
                        self.args = ArgsWriter::default();
                        *f.pos += i;
                        self.state = State::Pairs;
                    }
                    None if !f.fin && rest.len() <= MAX_NAME => return Ok(()),
                    _ => {
                        f.out.content.push_str(&f.text[start..*f.pos]);
                        self.state = State::Content;
                    }
                },
                State::Pairs => {
                    if !self.pairs(f) {
                        return Ok(());
                    }
                    self.state = State::Content;
                }
            }
        }
    }

    /// Reads pairs up to `</tool_call>` (then `true`, the call done);
    /// `false` when more text is needed (or the output ended inside).
    fn pairs(&mut self, f: &mut Feed<'_>) -> bool {
        loop {
            let rest = f.rest();
            let ws = rest.len() - rest.trim_start().len();
            let after = &rest[ws..];
            if after.starts_with(CALL_CLOSE) {
                *f.pos += ws + CALL_CLOSE.len();
                if let Some(call) = f.out.calls.last_mut() {
                    call.arguments.push('}');
                    call.done = true;
                }
                return true;
            }
            if after.starts_with(KEY_OPEN) {
                match self.pair(f, ws) {
                    Some(()) => continue,
                    None => return false,
                }
            }
            let pending =
                after.is_empty() || may_become(after, CALL_CLOSE) || may_become(after, KEY_OPEN);
            if after.is_empty() {
                *f.pos += ws;
                return false;
            }
            if pending && !f.fin {
                return false;
            }
            // Stray text inside the call: skipped up to the next tag.
            let first = after.chars().next().map_or(1, char::len_utf8);
            let skip = after[first..].find('<').map_or(after.len(), |i| i + first);
            *f.pos += ws + skip;
        }
    }

    /// One `<arg_key>K</arg_key><arg_value>V</arg_value>` at `ws` bytes
    /// into the rest: `Some` once read (or skipped, malformed), `None`
    /// when more text is needed. At the output's end a pair without its
    /// closing tag is read as far as it goes.
    fn pair(&mut self, f: &mut Feed<'_>, ws: usize) -> Option<()> {
        let text = &f.rest()[ws + KEY_OPEN.len()..];
        let Some(k) = text.find(KEY_CLOSE) else {
            if f.fin {
                *f.pos = f.text.len();
                return Some(());
            }
            return None;
        };
        let key = text[..k].trim();
        let after_key = &text[k + KEY_CLOSE.len()..];
        let gap = after_key.len() - after_key.trim_start().len();
        let at_value = &after_key[gap..];
        if !at_value.starts_with(VALUE_OPEN) {
            if !f.fin && (at_value.is_empty() || may_become(at_value, VALUE_OPEN)) {
                return None;
            }
            *f.pos += ws + KEY_OPEN.len() + k + KEY_CLOSE.len();
            return Some(());
        }
        let value_text = &at_value[VALUE_OPEN.len()..];
        let (v, close) = match find_first_after(value_text, &[VALUE_CLOSE], self.scanned) {
            Some((v, _)) => (v, VALUE_CLOSE.len()),
            None if f.fin => (value_text.len(), 0),
            None => {
                self.scanned = value_text.len();
                return None;
            }
        };
        self.scanned = 0;
        let value = value_text[..v].trim();
        let Some(call) = f.out.calls.last_mut() else {
            *f.pos = f.text.len();
            return Some(());
        };
        let typed = self.tools.glm45_value(&call.name, key, value);
        call.arguments.push_str(&self.args.param(key, &typed, true));
        let used = KEY_OPEN.len() + k + KEY_CLOSE.len() + gap + VALUE_OPEN.len() + v + close;
        *f.pos += ws + used;
        Some(())
    }
}
