//! Model output formats: the raw text a model generates, as a token-in
//! endpoint returns it (vLLM `/v1/completions`, SGLang `/generate`),
//! parsed into reasoning, answer text and tool calls the way the backends'
//! chat endpoints parse it server-side (vLLM's `qwen3` reasoning parser and
//! `hermes` tool parser, SGLang's `qwen3`/`qwen25` parsers).
//!
//! [`OutputParser`] is incremental: text is pushed as it arrives and what
//! it says so far is [`OutputParser::parsed`], which only grows. Text that
//! may still turn out to be markup (a trailing newline that may precede
//! `</think>` or `<tool_call>`, a tool call's closing `}` and tag) is held
//! back until the next text or [`OutputParser::finish`] tells. The
//! resumption of a reply after a backend fault ([`resync`]) feeds it the
//! text generated before the fault, then the continuation's.
//!
//! Supported formats ([`OutputFormat`]):
//! - `qwen3` (ChatML / Hermes: Qwen2.5, Qwen3, QwQ and the mock backend's
//!   template): `<think>\n{reasoning}\n</think>\n\n{content}` then tool
//!   calls, each `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`,
//!   separated by newlines; `<|im_end|>` ends the output.

pub mod resync;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

/// The text format of a model's raw output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// ChatML / Hermes (Qwen2.5, Qwen3, QwQ): a leading `<think>` block
    /// and `<tool_call>` JSON blocks. `hermes` is accepted as its name too.
    #[serde(alias = "hermes")]
    Qwen3,
}

impl OutputFormat {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
        }
    }
}

/// A tool call parsed so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedCall {
    /// The tool's name (complete: a call appears once its name is).
    pub name: String,
    /// The arguments' JSON text so far.
    pub arguments: String,
    /// Whether the call's closing tag was seen (its arguments are final).
    pub done: bool,
}

/// What a model's output says so far. Every field only grows as text is
/// pushed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// The reasoning text.
    pub reasoning: String,
    /// Whether the reasoning is final (its block closed, or the output
    /// ended).
    pub reasoning_done: bool,
    /// The answer text (text after the tool calls included).
    pub content: String,
    /// The tool calls, in order.
    pub calls: Vec<ParsedCall>,
}

/// Why an output cannot be parsed, or resumed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    /// A `<tool_call>` block is not `{"name": ..., "arguments": ...}`.
    #[error("malformed tool call at byte {at}: {why}")]
    MalformedCall {
        /// Where the block's content begins.
        at: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// What was already sent to the harness is not a prefix of what the
    /// output parses into (the server's parser and this one disagree).
    #[error("the resumed output does not continue what was sent: {0}")]
    Diverged(String),
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "\n</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_OPEN_NL: &str = "\n<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const END_MARKERS: [&str; 2] = ["<|im_end|>", "<|endoftext|>"];

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

/// An incremental parser of one output (see the module docs).
#[derive(Clone, Debug)]
pub struct OutputParser {
    format: OutputFormat,
    text: String,
    pending: String,
    pos: usize,
    state: State,
    finished: bool,
    out: ParsedOutput,
}

impl OutputParser {
    /// A parser of an output in `format`.
    pub fn new(format: OutputFormat) -> Self {
        Self {
            format,
            text: String::new(),
            pending: String::new(),
            pos: 0,
            state: State::Start,
            finished: false,
            out: ParsedOutput::default(),
        }
    }

    /// The format parsed.
    pub fn format(&self) -> OutputFormat {
        self.format
    }

    /// Adds generated text. An end-of-turn marker ends the output (what
    /// follows it is ignored).
    pub fn push(&mut self, text: &str) -> Result<(), OutputError> {
        if self.finished {
            return Ok(());
        }
        self.pending.push_str(text);
        let marker = END_MARKERS
            .iter()
            .filter_map(|m| self.pending.find(m))
            .min();
        if let Some(at) = marker {
            self.pending.truncate(at);
            return self.finish();
        }
        // A marker's beginning stays out of the text until it is known not
        // to be one.
        let hold = END_MARKERS
            .iter()
            .map(|m| held(&self.pending, m))
            .max()
            .unwrap_or(0);
        let take = self.pending.len() - hold;
        self.text.push_str(&self.pending[..take]);
        self.pending.drain(..take);
        self.advance()
    }

    /// The output is over: what was held back is decided.
    pub fn finish(&mut self) -> Result<(), OutputError> {
        if self.finished {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        self.text.push_str(&pending);
        self.finished = true;
        self.advance()?;
        self.out.reasoning_done = true;
        Ok(())
    }

    /// Whether the output is over.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// What the output says so far.
    pub fn parsed(&self) -> &ParsedOutput {
        &self.out
    }

    fn advance(&mut self) -> Result<(), OutputError> {
        loop {
            let rest = &self.text[self.pos..];
            let fin = self.finished;
            match self.state {
                State::Start => {
                    if rest.starts_with(THINK_OPEN) {
                        self.pos += THINK_OPEN.len();
                        self.state = State::ThinkNewline;
                    } else if !fin && THINK_OPEN.starts_with(rest) {
                        return Ok(());
                    } else {
                        self.state = State::Content;
                    }
                }
                State::ThinkNewline => {
                    if rest.starts_with('\n') {
                        self.pos += 1;
                    } else if rest.is_empty() && !fin {
                        return Ok(());
                    }
                    self.state = State::Reasoning;
                }
                State::Reasoning => match rest.find(&THINK_CLOSE[1..]) {
                    Some(i) => {
                        let text = &rest[..i];
                        let text = text.strip_suffix('\n').unwrap_or(text);
                        self.out.reasoning.push_str(text);
                        self.out.reasoning_done = true;
                        self.pos += i + THINK_CLOSE.len() - 1;
                        self.state = State::AfterThink;
                    }
                    None => {
                        let keep = if fin {
                            rest.len()
                        } else {
                            rest.len() - held(rest, THINK_CLOSE).max(held(rest, &THINK_CLOSE[1..]))
                        };
                        self.out.reasoning.push_str(&rest[..keep]);
                        self.pos += keep;
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
                    self.pos += newlines;
                    self.state = State::Content;
                }
                State::Content => match rest.find(CALL_OPEN) {
                    Some(i) => {
                        let text = &rest[..i];
                        let text = text.strip_suffix('\n').unwrap_or(text);
                        self.out.content.push_str(text);
                        self.pos += i + CALL_OPEN.len();
                        self.state = State::CallHead;
                    }
                    None => {
                        let keep = if fin {
                            rest.len()
                        } else {
                            rest.len() - held(rest, CALL_OPEN_NL).max(held(rest, CALL_OPEN))
                        };
                        self.out.content.push_str(&rest[..keep]);
                        self.pos += keep;
                        if !fin {
                            return Ok(());
                        }
                        self.state = State::End;
                    }
                },
                State::CallHead => match call_head(rest) {
                    Ok(Some((name, used))) => {
                        self.out.calls.push(ParsedCall {
                            name,
                            arguments: String::new(),
                            done: false,
                        });
                        self.pos += used;
                        self.state = State::CallArgs;
                    }
                    Ok(None) if !fin => return Ok(()),
                    Ok(None) => {
                        return Err(OutputError::MalformedCall {
                            at: self.pos,
                            why: "the output ended inside the call's name",
                        });
                    }
                    Err(why) => return Err(OutputError::MalformedCall { at: self.pos, why }),
                },
                State::CallArgs => {
                    if !self.call_args()? {
                        return Ok(());
                    }
                }
                State::AfterCall => {
                    if let Some(open) = [CALL_OPEN_NL, CALL_OPEN]
                        .into_iter()
                        .find(|o| rest.starts_with(o))
                    {
                        self.pos += open.len();
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
    fn call_args(&mut self) -> Result<bool, OutputError> {
        let rest = &self.text[self.pos..];
        let Some(call) = self.out.calls.last_mut() else {
            self.state = State::Content;
            return Ok(true);
        };
        // The tag cannot begin inside the arguments taken so far.
        let scanned = call.arguments.len();
        match rest[scanned..].find(CALL_CLOSE).map(|i| scanned + i) {
            Some(i) => {
                let Some(args) = rest[..i].trim_end().strip_suffix('}') else {
                    return Err(OutputError::MalformedCall {
                        at: self.pos,
                        why: "no `}` before `</tool_call>`",
                    });
                };
                let Some(more) = args.get(call.arguments.len()..) else {
                    return Err(OutputError::MalformedCall {
                        at: self.pos,
                        why: "the arguments end inside a character",
                    });
                };
                call.arguments.push_str(more);
                call.done = true;
                self.pos += i + CALL_CLOSE.len();
                self.state = State::AfterCall;
                Ok(true)
            }
            None if self.finished => {
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

/// The length of the longest end of `text` that is a proper start of
/// `marker` (text that may become the marker with what comes next).
fn held(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

/// Reads `\n{"name": "<name>", "arguments": ` (whitespace free) at the
/// start of a call: the name and the bytes read, `None` when the text ends
/// before, an error when it is something else.
fn call_head(text: &str) -> Result<Option<(String, usize)>, &'static str> {
    let mut c = Cursor { text, at: 0 };
    for expect in ["{", "\"name\"", ":"] {
        c.ws();
        if !c.expect(expect)? {
            return Ok(None);
        }
    }
    c.ws();
    let Some(name) = c.string()? else {
        return Ok(None);
    };
    for expect in [",", "\"arguments\"", ":"] {
        c.ws();
        if !c.expect(expect)? {
            return Ok(None);
        }
    }
    c.ws();
    if c.at == text.len() {
        return Ok(None);
    }
    Ok(Some((name, c.at)))
}

struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl Cursor<'_> {
    fn ws(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    /// `Ok(true)` when `token` is next (and is read), `Ok(false)` when the
    /// text ends inside it.
    fn expect(&mut self, token: &str) -> Result<bool, &'static str> {
        let rest = &self.text[self.at..];
        if rest.starts_with(token) {
            self.at += token.len();
            Ok(true)
        } else if token.starts_with(rest) {
            Ok(false)
        } else {
            Err("not `{\"name\": ..., \"arguments\": ...}`")
        }
    }

    /// A JSON string, decoded; `None` when the text ends inside it.
    fn string(&mut self) -> Result<Option<String>, &'static str> {
        let rest = &self.text[self.at..];
        if rest.is_empty() {
            return Ok(None);
        }
        if !rest.starts_with('"') {
            return Err("the name is not a JSON string");
        }
        let mut escaped = false;
        for (i, b) in rest.bytes().enumerate().skip(1) {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => {
                    let name: String = serde_json::from_str(&rest[..=i])
                        .map_err(|_| "the name is not a valid JSON string")?;
                    self.at += i + 1;
                    return Ok(Some(name));
                }
                _ => {}
            }
        }
        Ok(None)
    }
}
