//! The `qwen3` format (ChatML / Hermes: Qwen2.5, Qwen3, QwQ and the mock
//! backend's template), as vLLM's `qwen3` reasoning parser and `hermes`
//! tool parser and SGLang's `qwen3`/`qwen25` parsers read it:
//! `<think>\n{reasoning}\n</think>\n\n{content}` then tool calls, each
//! `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`, separated by
//! newlines; `<|im_end|>` ends the output. The newline the template puts
//! between the text and a call is markup (not text). A call block that is
//! not `{"name": ..., "arguments": ...}` is an error.

use super::scan::{Cursor, held};
use super::{Feed, OutputError, ParsedCall};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "\n</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_OPEN_NL: &str = "\n<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Start,
    ThinkNewline,
    Reasoning,
    AfterThink,
    Content,
    CallHead,
    CallArgs,
    AfterCall,
    End,
}

/// The `qwen3` state machine.
#[derive(Clone, Debug)]
pub(super) struct Qwen3 {
    state: State,
}

impl Qwen3 {
    /// `open`: the prompt opened the reasoning block.
    pub(super) fn new(open: bool) -> Self {
        let state = if open { State::Reasoning } else { State::Start };
        Self { state }
    }

    pub(super) fn advance(&mut self, f: &mut Feed<'_>) -> Result<(), OutputError> {
        loop {
            let rest = &f.text[*f.pos..];
            let fin = f.fin;
            match self.state {
                State::Start => {
                    if rest.starts_with(THINK_OPEN) {
                        *f.pos += THINK_OPEN.len();
                        self.state = State::ThinkNewline;
                    } else if !fin && THINK_OPEN.starts_with(rest) {
                        return Ok(());
                    } else {
                        self.state = State::Content;
                    }
                }
                State::ThinkNewline => {
                    if rest.starts_with('\n') {
                        *f.pos += 1;
                    } else if rest.is_empty() && !fin {
                        return Ok(());
                    }
                    self.state = State::Reasoning;
                }
                State::Reasoning => match rest.find(&THINK_CLOSE[1..]) {
                    Some(i) => {
                        let text = &rest[..i];
                        let text = text.strip_suffix('\n').unwrap_or(text);
                        f.out.reasoning.push_str(text);
                        f.out.reasoning_done = true;
                        *f.pos += i + THINK_CLOSE.len() - 1;
                        self.state = State::AfterThink;
                    }
                    None => {
                        let keep = if fin {
                            rest.len()
                        } else {
                            rest.len() - held(rest, THINK_CLOSE).max(held(rest, &THINK_CLOSE[1..]))
                        };
                        f.out.reasoning.push_str(&rest[..keep]);
                        *f.pos += keep;
                        if !fin {
                            return Ok(());
                        }
                        self.state = State::End;
                    }
                },
                State::AfterThink => {
                    let newlines = rest.bytes().take(2).take_while(|&b| b == b'\n').count();
                    if newlines < 2 && newlines == rest.len() && !fin {
                        return Ok(());
                    }
                    *f.pos += newlines;
                    self.state = State::Content;
                }
                State::Content => match rest.find(CALL_OPEN) {
                    Some(i) => {
                        let text = &rest[..i];
                        let text = text.strip_suffix('\n').unwrap_or(text);
                        f.out.content.push_str(text);
                        *f.pos += i + CALL_OPEN.len();
                        self.state = State::CallHead;
                    }
                    None => {
                        let keep = if fin {
                            rest.len()
                        } else {
                            rest.len() - held(rest, CALL_OPEN_NL).max(held(rest, CALL_OPEN))
                        };
                        f.out.content.push_str(&rest[..keep]);
                        *f.pos += keep;
                        if !fin {
                            return Ok(());
                        }
                        self.state = State::End;
                    }
                },
                State::CallHead => match call_head(rest) {
                    Ok(Some((name, used))) => {
                        f.out.calls.push(ParsedCall {
                            name,
                            arguments: String::new(),
                            done: false,
                        });
                        *f.pos += used;
                        self.state = State::CallArgs;
                    }
                    Ok(None) if !fin => return Ok(()),
                    Ok(None) => {
                        return Err(OutputError::MalformedCall {
                            at: *f.pos,
                            why: "the output ended inside the call's name",
                        });
                    }
                    Err(why) => return Err(OutputError::MalformedCall { at: *f.pos, why }),
                },
                State::CallArgs => {
                    if !self.call_args(f)? {
                        return Ok(());
                    }
                }
                State::AfterCall => {
                    if let Some(open) = [CALL_OPEN_NL, CALL_OPEN]
                        .into_iter()
                        .find(|o| rest.starts_with(o))
                    {
                        *f.pos += open.len();
                        self.state = State::CallHead;
                    } else if !fin
                        && (CALL_OPEN_NL.starts_with(rest) || CALL_OPEN.starts_with(rest))
                    {
                        return Ok(());
                    } else {
                        self.state = State::Content;
                    }
                }
                State::End => return Ok(()),
            }
        }
    }

    /// The arguments of the open call: up to its closing tag, or as far
    /// as cannot be the closing `}` and tag (then `false`: more text is
    /// needed).
    fn call_args(&mut self, f: &mut Feed<'_>) -> Result<bool, OutputError> {
        let rest = &f.text[*f.pos..];
        let Some(call) = f.out.calls.last_mut() else {
            self.state = State::Content;
            return Ok(true);
        };
        // The tag cannot begin inside the arguments taken so far.
        let scanned = call.arguments.len();
        match rest[scanned..].find(CALL_CLOSE).map(|i| scanned + i) {
            Some(i) => {
                let Some(args) = rest[..i].trim_end().strip_suffix('}') else {
                    return Err(OutputError::MalformedCall {
                        at: *f.pos,
                        why: "no `}` before `</tool_call>`",
                    });
                };
                let Some(more) = args.get(call.arguments.len()..) else {
                    return Err(OutputError::MalformedCall {
                        at: *f.pos,
                        why: "the arguments end inside a character",
                    });
                };
                call.arguments.push_str(more);
                call.done = true;
                *f.pos += i + CALL_CLOSE.len();
                self.state = State::AfterCall;
                Ok(true)
            }
            None if f.fin => {
                let more = rest.get(call.arguments.len()..).unwrap_or_default();
                call.arguments.push_str(more);
                self.state = State::End;
                Ok(true)
            }
            None => {
                let safe = &rest[..rest.len() - held(rest, CALL_CLOSE)];
                let safe = safe.trim_end();
                let safe = safe.strip_suffix('}').unwrap_or(safe).trim_end();
                if safe.len() > call.arguments.len() {
                    call.arguments.push_str(&safe[call.arguments.len()..]);
                }
                // The call's text stays unconsumed until its end: the held
                // tail is looked at again with the next text.
                Ok(false)
            }
        }
    }
}

/// Reads `\n{"name": "<name>", "arguments": ` (whitespace free) at the
/// start of a call: the name and the bytes read, `None` when the text ends
/// before, an error when it is something else.
fn call_head(text: &str) -> Result<Option<(String, usize)>, &'static str> {
    let mut c = Cursor { text, at: 0 };
    const WHY: &str = "not `{\"name\": ..., \"arguments\": ...}`";
    for expect in ["{", "\"name\"", ":"] {
        c.ws();
        if !c.expect(expect, WHY)? {
            return Ok(None);
        }
    }
    c.ws();
    let Some(name) = c.string()? else {
        return Ok(None);
    };
    for expect in [",", "\"arguments\"", ":"] {
        c.ws();
        if !c.expect(expect, WHY)? {
            return Ok(None);
        }
    }
    c.ws();
    if c.at == text.len() {
        return Ok(None);
    }
    Ok(Some((name, c.at)))
}
