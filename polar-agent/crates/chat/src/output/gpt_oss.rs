//! The `gpt_oss` format (OpenAI's Harmony, gpt-oss models), as vLLM reads
//! it for chat completions: the output is a sequence of messages, each a
//! header (`<|start|>assistant`, left out for the first message since the
//! generation prompt ends with it; `<|channel|>CHANNEL`; a recipient
//! ` to=functions.NAME` in the role part or after the channel; a content
//! type ` <|constrain|>json` or ` json`), `<|message|>`, the body, and
//! `<|end|>`, `<|call|>` (a tool call's) or `<|return|>` (the output's end,
//! as is `<|endoftext|>`):
//!
//! `<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`
//!
//! The `analysis` channel is reasoning, a message to `functions.NAME` (or
//! any recipient: the name is the recipient without `functions.`) is a
//! tool call whose arguments are the body as written, `final` and a
//! `commentary` without recipient (a preamble) are text. Several
//! reasoning or text messages are joined with a newline. The reasoning is
//! done at the first message of another kind. What openai-harmony's own
//! renderer writes for a turn parses back to it
//! (`tests/fixtures/output/gptoss.json`).
//!
//! Harmony is parsed here as text, not through the `openai-harmony`
//! crate: that crate parses token ids with its own vocabulary, which its
//! encoding loader downloads (`o200k_base`) at run time unless a local
//! copy is configured, which cannot work on air-gapped nodes; and Polar
//! gets the generated text from the token-in endpoints anyway (which must
//! be detokenized keeping the special tokens, as the markup is made of
//! them). Text before the first header, and a header that never reaches
//! `<|message|>`, are text.

use super::scan::{Sink, find_first, may_become, text_until};
use super::{Feed, OutputError, ParsedCall};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
/// Longest header read before it is taken as text.
const MAX_HEADER: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    Call,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A header from `start` (its text not yet known to be one).
    Header {
        start: usize,
    },
    Body(Body),
    /// After a message: the next header, or text.
    Between,
    /// Text to the end.
    Text,
}

/// The `gpt_oss` state machine.
#[derive(Clone, Debug)]
pub(super) struct GptOss {
    state: State,
    /// Messages read per kind (for the joining newline).
    reasoning_msgs: usize,
    content_msgs: usize,
}

impl Default for GptOss {
    fn default() -> Self {
        Self {
            state: State::Header { start: 0 },
            reasoning_msgs: 0,
            content_msgs: 0,
        }
    }
}

impl GptOss {
    pub(super) fn advance(&mut self, f: &mut Feed<'_>) -> Result<(), OutputError> {
        loop {
            let rest = f.rest();
            match self.state {
                State::Header { start } => {
                    let header = &f.text[start..];
                    let looks = header.starts_with(START)
                        || header.starts_with(CHANNEL)
                        || may_become(header, START)
                        || may_become(header, CHANNEL);
                    match header.find(MESSAGE) {
                        Some(i) if looks => {
                            self.open(f, &header[..i]);
                            *f.pos = start + i + MESSAGE.len();
                        }
                        None if looks && !f.fin && header.len() <= MAX_HEADER => {
                            return Ok(());
                        }
                        _ => {
                            *f.pos = start;
                            self.enter_text(f);
                        }
                    }
                }
                State::Body(kind) => {
                    let ends = [END, CALL];
                    let found = match kind {
                        Body::Reasoning => text_until(f, &ends, "", Sink::Reasoning),
                        Body::Content => text_until(f, &ends, "", Sink::Content),
                        Body::Call => {
                            let Some(call) = f.out.calls.last_mut() else {
                                self.state = State::Between;
                                continue;
                            };
                            let mut args = std::mem::take(&mut call.arguments);
                            let mut out = super::ParsedOutput {
                                content: args,
                                ..Default::default()
                            };
                            let mut sub = Feed {
                                text: f.text,
                                pos: &mut *f.pos,
                                fin: f.fin,
                                out: &mut out,
                            };
                            let found = text_until(&mut sub, &ends, "", Sink::Content);
                            args = out.content;
                            if let Some(call) = f.out.calls.last_mut() {
                                call.arguments = args;
                                call.done |= found.is_some();
                            }
                            found
                        }
                    };
                    if found.is_none() {
                        return Ok(());
                    }
                    self.state = State::Between;
                }
                State::Between => {
                    if rest.starts_with(START) {
                        self.state = State::Header { start: *f.pos };
                    } else if rest.is_empty() || (!f.fin && may_become(rest, START)) {
                        return Ok(());
                    } else {
                        self.enter_text(f);
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

    /// A message with `header` begins.
    fn open(&mut self, f: &mut Feed<'_>, header: &str) {
        let header = header.strip_prefix(START).unwrap_or(header);
        let (role, channel) = match header.find(CHANNEL) {
            Some(i) => (&header[..i], &header[i + CHANNEL.len()..]),
            None => (header, ""),
        };
        let recipient = recipient(role).or_else(|| recipient(channel));
        let channel = channel
            .split(|c: char| c.is_whitespace() || c == '<')
            .next()
            .unwrap_or_default();
        let kind = match (recipient, channel) {
            (Some(_), _) => Body::Call,
            (None, "analysis") => Body::Reasoning,
            _ => Body::Content,
        };
        if kind != Body::Reasoning {
            f.out.reasoning_done = true;
        }
        match (kind, recipient) {
            (Body::Call, Some(to)) => f.out.calls.push(ParsedCall {
                name: to.strip_prefix("functions.").unwrap_or(to).to_owned(),
                arguments: String::new(),
                done: false,
            }),
            _ => self.join(f, kind),
        }
        self.state = State::Body(kind);
    }

    /// What follows is text, not messages.
    fn enter_text(&mut self, f: &mut Feed<'_>) {
        if !f.rest().is_empty() {
            self.join(f, Body::Content);
        }
        self.state = State::Text;
    }

    /// Counts a reasoning or text message, after a newline if one came
    /// before.
    fn join(&mut self, f: &mut Feed<'_>, kind: Body) {
        let (count, text) = match kind {
            Body::Reasoning => (&mut self.reasoning_msgs, &mut f.out.reasoning),
            Body::Content => (&mut self.content_msgs, &mut f.out.content),
            Body::Call => return,
        };
        if *count > 0 {
            text.push('\n');
        }
        *count += 1;
    }
}

/// The recipient named by ` to=NAME` in a header part.
fn recipient(part: &str) -> Option<&str> {
    let at = part.find("to=")?;
    if at > 0 && !part[..at].ends_with(char::is_whitespace) {
        return None;
    }
    let name = &part[at + 3..];
    let end = find_first(name, &[" ", "\t", "\n", "<|"]).map_or(name.len(), |(i, _)| i);
    let name = &name[..end];
    (!name.is_empty()).then_some(name)
}
