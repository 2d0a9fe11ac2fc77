//! The `qwen3_coder` format (Qwen3-Coder), as vLLM's `qwen3_coder` tool
//! parser reads it: ChatML with a leading `<think>` block as in `qwen3`,
//! then the text, then tool calls, each
//! `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>`
//! (a bare `<function=` without `<tool_call>` is read as a call too);
//! `<|im_end|>` ends the output.
//!
//! A parameter's value is what lies between its tag and `</parameter>`
//! (or the next `<parameter=`, or `</function>`), one leading and one
//! trailing newline removed, typed by the tool's schema as vLLM does
//! ([`super::ToolSchemas`]). The arguments grow one whole parameter at a
//! time: `{` once the function's name is read, then `"P": value` items,
//! `}` at `</function>` (a cut call keeps them open). Text between
//! parameters is ignored, as vLLM's parser ignores it.
//!
//! Unlike vLLM's parser, which keeps it in the text, the newline the
//! template writes between the text and a call is read as markup, so the
//! text parses back to what the template rendered. A `<tool_call>` not
//! followed by `<function=NAME>` stays text.

use super::scan::{Sink, Think, ThinkMarkup, find_first_after, may_become, text_until};
use super::typed_args::ArgsWriter;
use super::{Feed, OutputError, ParsedCall, ToolSchemas};

const CALL_OPEN: &str = "<tool_call>";
const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";
const CALL_CLOSE: &str = "</tool_call>";

/// Qwen3's reasoning block markup.
pub(super) const QWEN_THINK: ThinkMarkup = ThinkMarkup {
    lead: "",
    after_open: "\n",
    before_close: "\n",
    after_close: "\n\n",
};

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Think,
    Content,
    /// After `<tool_call>` (markup from `start`): `<function=` is next.
    CallOpen {
        start: usize,
    },
    /// After `<function=` (markup from `start`): the name up to `>`.
    Name {
        start: usize,
        wrapped: bool,
    },
    /// Inside a function: parameters, then `</function>`.
    Params {
        wrapped: bool,
    },
    /// After `</function>`: `</tool_call>` when the call opened with one.
    CallClose {
        wrapped: bool,
    },
}

/// The `qwen3_coder` state machine.
#[derive(Clone, Debug)]
pub(super) struct Qwen3Coder {
    state: State,
    think: Think,
    tools: ToolSchemas,
    args: ArgsWriter,
    /// Bytes of the open parameter's value searched for its end.
    scanned: usize,
}

impl Qwen3Coder {
    pub(super) fn new(open: bool, tools: ToolSchemas) -> Self {
        Self {
            state: State::Think,
            think: Think::new(QWEN_THINK, open),
            tools,
            args: ArgsWriter::default(),
            scanned: 0,
        }
    }

    pub(super) fn advance(&mut self, f: &mut Feed<'_>) -> Result<(), OutputError> {
        loop {
            let rest = f.rest();
            match self.state.clone() {
                State::Think => {
                    if !self.think.step(f) {
                        return Ok(());
                    }
                    self.state = State::Content;
                }
                State::Content => {
                    match text_until(f, &[CALL_OPEN, FUNCTION_OPEN], "\n", Sink::Content) {
                        Some(found) if found.which == 0 => {
                            self.state = State::CallOpen { start: found.start };
                        }
                        Some(found) => {
                            self.state = State::Name {
                                start: found.start,
                                wrapped: false,
                            };
                        }
                        None => return Ok(()),
                    }
                }
                State::CallOpen { start } => {
                    let ws = rest.len() - rest.trim_start().len();
                    let after = &rest[ws..];
                    if after.starts_with(FUNCTION_OPEN) {
                        *f.pos += ws + FUNCTION_OPEN.len();
                        self.state = State::Name {
                            start,
                            wrapped: true,
                        };
                    } else if !f.fin && (after.is_empty() || may_become(after, FUNCTION_OPEN)) {
                        return Ok(());
                    } else {
                        self.give_back(f, start);
                    }
                }
                State::Name { start, wrapped } => match rest.find(['>', '<', '\n']) {
                    Some(i) if rest.as_bytes()[i] == b'>' && !rest[..i].trim().is_empty() => {
                        f.out.calls.push(ParsedCall {
                            name: rest[..i].trim().to_owned(),
                            arguments: "{".into(),
                            done: false,
                        });
                        self.args = ArgsWriter::default();
                        *f.pos += i + 1;
                        self.state = State::Params { wrapped };
                    }
                    None if !f.fin => return Ok(()),
                    _ => self.give_back(f, start),
                },
                State::Params { wrapped } => {
                    if !self.params(f)? {
                        return Ok(());
                    }
                    self.state = State::CallClose { wrapped };
                }
                State::CallClose { wrapped } => {
                    let ws = rest.len() - rest.trim_start().len();
                    let after = &rest[ws..];
                    if !wrapped {
                        self.state = State::Content;
                    } else if after.starts_with(CALL_CLOSE) {
                        *f.pos += ws + CALL_CLOSE.len();
                        self.state = State::Content;
                    } else if !f.fin && (after.is_empty() || may_become(after, CALL_CLOSE)) {
                        return Ok(());
                    } else {
                        self.state = State::Content;
                    }
                }
            }
        }
    }

    /// Markup from `start` that turned out not to be a call: back to text.
    fn give_back(&mut self, f: &mut Feed<'_>, start: usize) {
        f.out.content.push_str(&f.text[start..*f.pos]);
        self.state = State::Content;
    }

    /// Reads parameters up to `</function>` (then `true`, the call done);
    /// `false` when more text is needed (or the output ended inside).
    fn params(&mut self, f: &mut Feed<'_>) -> Result<bool, OutputError> {
        loop {
            let rest = f.rest();
            let ws = rest.len() - rest.trim_start().len();
            let after = &rest[ws..];
            if after.starts_with(FUNCTION_CLOSE) {
                *f.pos += ws + FUNCTION_CLOSE.len();
                self.close_call(f);
                return Ok(true);
            }
            if after.starts_with(CALL_CLOSE) {
                // `</function>` left out: the call ends all the same.
                *f.pos += ws;
                self.close_call(f);
                return Ok(true);
            }
            if after.starts_with(PARAM_OPEN) {
                if !self.param(f, ws)? {
                    return Ok(false);
                }
                continue;
            }
            let pending = after.is_empty()
                || [FUNCTION_CLOSE, PARAM_OPEN, CALL_CLOSE]
                    .iter()
                    .any(|m| may_become(after, m));
            if after.is_empty() {
                *f.pos += ws;
                return Ok(false);
            }
            if pending && !f.fin {
                return Ok(false);
            }
            // Stray text inside the function: skipped up to the next tag.
            let first = after.chars().next().map_or(1, char::len_utf8);
            let skip = after[first..].find('<').map_or(after.len(), |i| i + first);
            *f.pos += ws + skip;
        }
    }

    /// One `<parameter=P>VALUE</parameter>` at `ws` bytes into the rest:
    /// `true` once read, `false` when more text is needed.
    fn param(&mut self, f: &mut Feed<'_>, ws: usize) -> Result<bool, OutputError> {
        let rest = &f.rest()[ws + PARAM_OPEN.len()..];
        let Some(gt) = rest.find('>') else {
            if f.fin {
                *f.pos = f.text.len();
            }
            return Ok(false);
        };
        let name = rest[..gt].trim();
        let body = &rest[gt + 1..];
        let ends = [PARAM_CLOSE, PARAM_OPEN, FUNCTION_CLOSE];
        let (value, used) = match find_first_after(body, &ends, self.scanned) {
            Some((i, 0)) => (&body[..i], i + PARAM_CLOSE.len()),
            Some((i, _)) => (&body[..i], i),
            None if f.fin => (body, body.len()),
            None => {
                self.scanned = body.len();
                return Ok(false);
            }
        };
        self.scanned = 0;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let Some(call) = f.out.calls.last_mut() else {
            return Err(OutputError::MalformedCall {
                at: *f.pos,
                why: "a parameter outside a call",
            });
        };
        let typed = self.tools.qwen3_coder_value(&call.name, name, value);
        call.arguments
            .push_str(&self.args.param(name, &typed, false));
        *f.pos += ws + PARAM_OPEN.len() + gt + 1 + used;
        Ok(true)
    }

    fn close_call(&mut self, f: &mut Feed<'_>) {
        if let Some(call) = f.out.calls.last_mut() {
            call.arguments.push('}');
            call.done = true;
        }
    }
}
