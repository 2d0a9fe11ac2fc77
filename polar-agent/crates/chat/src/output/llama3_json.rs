//! The `llama3_json` format (Llama 3.1 / 3.3 JSON tool calls), as vLLM's
//! `llama3_json` tool parser reads it: an output that begins with
//! `<|python_tag|>` or `{` is tool calls, each
//! `{"name": NAME, "parameters": ARGS}` (`"arguments"` is read too),
//! several separated by `;`; any other output is text. `<|eot_id|>`,
//! `<|eom_id|>` (after a `<|python_tag|>` call) and `<|end_of_text|>` end
//! it. The model has no reasoning block.
//!
//! A call appears once its name and the `"parameters":` key are read; its
//! arguments are the model's own JSON text of the value, growing as it
//! comes, and the call is done at the object's closing `}` (keys after
//! the arguments are skipped). An output that begins with `{` but is not
//! such an object (a JSON answer) stays text, whole. Text after the calls
//! other than whitespace and `;` is text.

use super::scan::{Cursor, may_become};
use super::{Feed, OutputError, ParsedCall};

const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Start,
    /// A call's head from `start`.
    Head {
        start: usize,
    },
    /// The arguments (and any keys after them) up to the object's end.
    Body,
    /// After a call: `;` and the next, or the end.
    Between,
    /// Text to the end.
    Text,
}

/// Where a JSON scan stands.
#[derive(Clone, Copy, Debug, Default)]
struct Scan {
    /// Bytes of the call's body scanned.
    at: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// Where the arguments' value ended (its length), once it did.
    args_end: Option<usize>,
}

/// The `llama3_json` state machine.
#[derive(Clone, Debug)]
pub(super) struct Llama3Json {
    state: State,
    scan: Scan,
}

impl Default for Llama3Json {
    fn default() -> Self {
        Self {
            state: State::Start,
            scan: Scan::default(),
        }
    }
}

impl Llama3Json {
    pub(super) fn advance(&mut self, f: &mut Feed<'_>) -> Result<(), OutputError> {
        // No reasoning in this format.
        f.out.reasoning_done = true;
        loop {
            let rest = f.rest();
            match self.state {
                State::Start => {
                    if rest.starts_with(PYTHON_TAG) {
                        // Given back with the call if it is none.
                        self.state = State::Head { start: *f.pos };
                        *f.pos += PYTHON_TAG.len();
                    } else if rest.starts_with('{') {
                        self.state = State::Head { start: *f.pos };
                    } else if !f.fin && (rest.is_empty() || may_become(rest, PYTHON_TAG)) {
                        return Ok(());
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Head { start } => match call_head(rest) {
                    Ok(Some((name, used))) => {
                        f.out.calls.push(ParsedCall {
                            name,
                            arguments: String::new(),
                            done: false,
                        });
                        *f.pos += used;
                        self.scan = Scan::default();
                        self.state = State::Body;
                    }
                    Ok(None) if !f.fin => return Ok(()),
                    _ => {
                        // Not a call: what was read as its markup is text.
                        *f.pos = start;
                        self.state = State::Text;
                    }
                },
                State::Body => {
                    if !self.body(f) {
                        return Ok(());
                    }
                    self.state = State::Between;
                }
                State::Between => {
                    let trimmed = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
                    let ws = rest.len() - trimmed.len();
                    if trimmed.starts_with('{') {
                        *f.pos += ws;
                        self.state = State::Head { start: *f.pos };
                    } else if trimmed.is_empty() {
                        if f.fin {
                            *f.pos = f.text.len();
                        }
                        return Ok(());
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Text => {
                    f.out.content.push_str(rest);
                    *f.pos = f.text.len();
                    return Ok(());
                }
            }
        }
    }

    /// Scans the open call's body: `true` at the object's closing `}`,
    /// else the arguments as far as read (`false`).
    fn body(&mut self, f: &mut Feed<'_>) -> bool {
        let rest = f.rest();
        let Some(call) = f.out.calls.last_mut() else {
            return true;
        };
        let s = &mut self.scan;
        let bytes = rest.as_bytes();
        let mut closed = None;
        while s.at < bytes.len() {
            let b = bytes[s.at];
            s.at += 1;
            if s.in_string {
                match b {
                    _ if s.escaped => s.escaped = false,
                    b'\\' => s.escaped = true,
                    b'"' => s.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => s.in_string = true,
                b'{' | b'[' => s.depth += 1,
                b'}' | b']' if s.depth == 0 => {
                    closed = Some(s.at - 1);
                    break;
                }
                b'}' | b']' => {
                    s.depth -= 1;
                    if s.depth == 0 && s.args_end.is_none() {
                        s.args_end = Some(s.at);
                    }
                }
                b',' if s.depth == 0 && s.args_end.is_none() => s.args_end = Some(s.at - 1),
                _ => {}
            }
        }
        let upto = s.args_end.or(closed).unwrap_or(s.at);
        let args = rest[..upto].trim_end();
        if args.len() > call.arguments.len()
            && let Some(more) = args.get(call.arguments.len()..)
        {
            call.arguments.push_str(more);
        }
        match closed {
            Some(i) => {
                call.done = true;
                *f.pos += i + 1;
                true
            }
            None => {
                if f.fin {
                    *f.pos = f.text.len();
                }
                false
            }
        }
    }
}

/// Reads `{"name": "<name>", "parameters": ` (whitespace free; or
/// `"arguments"`): the name and the bytes read, `None` when the text ends
/// before, an error when it is something else.
fn call_head(text: &str) -> Result<Option<(String, usize)>, &'static str> {
    const WHY: &str = "not `{\"name\": ..., \"parameters\": ...}`";
    let mut c = Cursor { text, at: 0 };
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
    c.ws();
    if !c.expect(",", WHY)? {
        return Ok(None);
    }
    c.ws();
    let key = &text[c.at..];
    let key_len = ["\"parameters\"", "\"arguments\""].iter().find_map(|k| {
        if key.starts_with(k) {
            Some(Ok(k.len()))
        } else if k.starts_with(key) {
            Some(Err(()))
        } else {
            None
        }
    });
    match key_len {
        Some(Ok(n)) => c.at += n,
        Some(Err(())) => return Ok(None),
        None => return Err(WHY),
    }
    c.ws();
    if !c.expect(":", WHY)? {
        return Ok(None);
    }
    c.ws();
    if c.at == text.len() {
        return Ok(None);
    }
    Ok(Some((name, c.at)))
}
