//! The `deepseek_v3` format (DeepSeek V3, V3.1, R1), as vLLM's
//! `deepseek_v3` / `deepseek_v31` tool parsers and `deepseek_r1`
//! reasoning parser read it: an optional `<think>` block (R1, and V3.1 in
//! thinking mode, whose generation prompt opens it:
//! [`super::OutputOptions::reasoning_open`]), the text, then one block of
//! tool calls `<｜tool▁calls▁begin｜>CALL...<｜tool▁calls▁end｜>`;
//! `<｜end▁of▁sentence｜>` ends the output. A call is either V3's
//! `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`
//! or V3.1's `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`
//! (told apart by what follows the separator: V3 has a name, V3.1 JSON).
//! Calls may be separated by whitespace (the V3 template writes a
//! newline). The arguments are the model's own text, as vLLM passes them.
//!
//! Nothing is stripped around the reasoning or the text (vLLM strips
//! nothing either). Text after the calls block is text. Markup that is not
//! a call before its name is read stays text.

use super::scan::{Sink, Think, ThinkMarkup, find_first_after, held, may_become, text_until};
use super::{Feed, OutputError, ParsedCall};

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const FENCE_OPEN: &str = "\n```json\n";

const THINK: ThinkMarkup = ThinkMarkup {
    lead: "",
    after_open: "",
    before_close: "",
    after_close: "",
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Think,
    Content,
    /// Inside the calls block (its markup unconfirmed from `start`).
    Calls {
        start: usize,
    },
    /// After `<｜tool▁call▁begin｜>` (markup from `start`).
    Head {
        start: usize,
    },
    /// V3's fenced arguments.
    FencedArgs,
    /// V3.1's bare arguments.
    BareArgs,
}

/// The `deepseek_v3` state machine.
#[derive(Clone, Debug)]
pub(super) struct DeepseekV3 {
    state: State,
    think: Think,
}

impl DeepseekV3 {
    pub(super) fn new(open: bool) -> Self {
        Self {
            state: State::Think,
            think: Think::new(THINK, open),
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
                State::Content => match text_until(f, &[CALLS_BEGIN], "", Sink::Content) {
                    Some(found) => self.state = State::Calls { start: found.start },
                    None => return Ok(()),
                },
                State::Calls { start } => {
                    let ws = rest.len() - rest.trim_start().len();
                    let after = &rest[ws..];
                    if after.starts_with(CALL_BEGIN) {
                        *f.pos += ws + CALL_BEGIN.len();
                        self.state = State::Head { start };
                    } else if after.starts_with(CALLS_END) {
                        *f.pos += ws + CALLS_END.len();
                        self.state = State::Content;
                    } else if !f.fin
                        && (after.is_empty()
                            || may_become(after, CALL_BEGIN)
                            || may_become(after, CALLS_END))
                    {
                        return Ok(());
                    } else {
                        self.give_back(f, start);
                    }
                }
                State::Head { start } => match head(rest, f.fin) {
                    Head::More => return Ok(()),
                    Head::Malformed => self.give_back(f, start),
                    Head::Call { name, used, fenced } => {
                        f.out.calls.push(ParsedCall {
                            name,
                            arguments: String::new(),
                            done: false,
                        });
                        *f.pos += used;
                        self.state = if fenced {
                            State::FencedArgs
                        } else {
                            State::BareArgs
                        };
                    }
                },
                State::FencedArgs | State::BareArgs => {
                    if !self.args(f) {
                        return Ok(());
                    }
                    // Markup after a whole call is markup (never given back).
                    self.state = State::Calls { start: *f.pos };
                }
            }
        }
    }

    /// Markup from `start` that turned out not to be a call: back to text.
    fn give_back(&mut self, f: &mut Feed<'_>, start: usize) {
        f.out.content.push_str(&f.text[start..*f.pos]);
        self.state = State::Content;
    }

    /// The open call's arguments up to `<｜tool▁call▁end｜>` (then `true`),
    /// or as far as cannot be the fence and tag.
    fn args(&mut self, f: &mut Feed<'_>) -> bool {
        let fenced = self.state == State::FencedArgs;
        let rest = f.rest();
        let Some(call) = f.out.calls.last_mut() else {
            return true;
        };
        let strip_fence = |t: &str| -> usize {
            if !fenced {
                return t.len();
            }
            // A closing fence: "```" and the newline before it.
            let t2 = t.trim_end_matches('`');
            let ticks = t.len() - t2.len();
            if ticks > 3 {
                return t.len();
            }
            t2.strip_suffix('\n').unwrap_or(t2).len()
        };
        // The tag cannot begin inside the arguments taken so far.
        match find_first_after(rest, &[CALL_END], call.arguments.len()).map(|(i, _)| i) {
            Some(i) => {
                let args = &rest[..strip_fence(&rest[..i])];
                if let Some(more) = args.get(call.arguments.len()..) {
                    call.arguments.push_str(more);
                }
                call.done = true;
                *f.pos += i + CALL_END.len();
                true
            }
            None if f.fin => {
                if let Some(more) = rest.get(call.arguments.len()..) {
                    call.arguments.push_str(more);
                }
                *f.pos = f.text.len();
                false
            }
            None => {
                let safe = &rest[..rest.len() - held(rest, CALL_END)];
                let mut keep = strip_fence(safe);
                if fenced && keep == safe.len() && safe.ends_with('\n') {
                    keep -= 1;
                }
                let safe = &safe[..keep];
                if safe.len() > call.arguments.len()
                    && let Some(more) = safe.get(call.arguments.len()..)
                {
                    call.arguments.push_str(more);
                }
                false
            }
        }
    }
}

enum Head {
    More,
    Malformed,
    Call {
        name: String,
        used: usize,
        fenced: bool,
    },
}

/// A call's head after `<｜tool▁call▁begin｜>`: V3's
/// `function<｜tool▁sep｜>NAME\n```json\n` or V3.1's `NAME<｜tool▁sep｜>`.
fn head(rest: &str, fin: bool) -> Head {
    let Some(sep) = rest.find(SEP) else {
        let bad = rest.contains(['\n', '<']) && !may_become_sep_tail(rest);
        return if fin || bad {
            Head::Malformed
        } else {
            Head::More
        };
    };
    let kind = &rest[..sep];
    if kind.is_empty() || kind.contains(['\n', '<']) {
        return Head::Malformed;
    }
    let after = &rest[sep + SEP.len()..];
    if kind != "function" || after.starts_with('{') {
        return Head::Call {
            name: kind.to_owned(),
            used: sep + SEP.len(),
            fenced: false,
        };
    }
    if after.is_empty() && !fin {
        return Head::More;
    }
    match after.find(FENCE_OPEN) {
        Some(i) if i > 0 && !after[..i].contains(['\n', '<']) => Head::Call {
            name: after[..i].to_owned(),
            used: sep + SEP.len() + i + FENCE_OPEN.len(),
            fenced: true,
        },
        Some(_) => Head::Malformed,
        None if fin => Head::Malformed,
        None => {
            // The name, then (part of) the fence.
            let line = after.find('\n').map_or(after, |i| &after[..i]);
            let bad = line.contains('<')
                || after
                    .find('\n')
                    .is_some_and(|i| !may_become(&after[i..], FENCE_OPEN));
            if bad { Head::Malformed } else { Head::More }
        }
    }
}

/// Whether the text after `<｜tool▁call▁begin｜>` ends in what may become
/// the separator (a `<` there is not yet malformed).
fn may_become_sep_tail(rest: &str) -> bool {
    let cut = rest.len() - held(rest, SEP);
    !rest[..cut].contains(['\n', '<'])
}
