//! Turning a [`Plan`] into generated tokens: the assistant turn is written
//! as the served model writes it ([`Codec`]), tokenized, cut at the token limit, given
//! deterministic logprobs, and parsed back; [`DeltaSplitter`] then cuts it
//! into the per-chunk deltas a streaming reply carries.

use std::collections::BTreeSet;
use std::ops::Range;

use super::codec::Codec;
use super::forced::{self, Forced};
use super::script::Plan;
use super::template::{Channel, ParsedOutput};

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The end-of-turn token.
    Stop,
    /// The token limit (or a scripted `length`).
    Length,
    /// The end-of-turn token after tool calls.
    ToolCalls,
    /// The request was aborted (a scripted `abort_after`), as SGLang and
    /// vLLM answer a request stopped by an abort or a pause.
    Abort,
}

impl Finish {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::Abort => "abort",
        }
    }

    /// SGLang's `finish_reason.type` (`stop` for tool calls too).
    pub fn sglang_type(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::Abort => "abort",
            _ => "stop",
        }
    }
}

/// A generated reply.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The prompt ids.
    pub prompt_ids: Vec<u32>,
    /// The generated text (special tokens included).
    pub text: String,
    /// Generated token ids.
    pub ids: Vec<u32>,
    /// Byte range of `text` each token covers.
    pub spans: Vec<Range<usize>>,
    /// The logprob of each token.
    pub logprobs: Vec<f32>,
    /// The text parsed into reasoning, content and tool calls (what a
    /// whole reply carries).
    pub parsed: ParsedOutput,
    /// What a streamed reply's deltas follow, when not `parsed`: the parse
    /// of the whole turn a scripted abort cut short, so that an abort
    /// inside a tool call streams the call's head and the part of its
    /// arguments generated, as vLLM's and SGLang's streaming tool parsers
    /// do (a whole reply's parse of the cut text has no call: its raw text
    /// is answer text).
    pub streamed: Option<ParsedOutput>,
    /// Why generation stopped.
    pub finish: Finish,
    /// Cut the connection after this many tokens.
    pub disconnect_after: Option<usize>,
    /// What it was written and tokenized with (for token texts).
    pub codec: Codec,
}

/// Generates the reply to `prompt_ids` following `plan` with the mock's
/// own template and tokenizer, at most `max_tokens` tokens.
#[cfg(test)]
pub fn generate(prompt_ids: Vec<u32>, plan: &Plan, max_tokens: usize) -> Generation {
    generate_with(
        &Codec::Mock {
            glue: String::new(),
        },
        prompt_ids,
        plan,
        max_tokens,
    )
}

/// Generates the reply to `prompt_ids` following `plan`, written and
/// tokenized with `codec`, at most `max_tokens` tokens (cut back to a whole
/// character).
pub fn generate_with(
    codec: &Codec,
    prompt_ids: Vec<u32>,
    plan: &Plan,
    max_tokens: usize,
) -> Generation {
    let forced = plan
        .forced
        .filter(|_| !plan.tool_calls.is_empty())
        .map(|f| (f, forced::body(f, plan.think.as_deref(), &plan.tool_calls)));
    let mut full = match &forced {
        Some((_, body)) => body.text.clone(),
        None => codec.turn_text(plan, &prompt_ids),
    };
    if !plan.force_length {
        full.push_str(codec.end_of_turn(plan));
    }
    let mut tokens = codec.encode_with_spans(&full);
    let limit = plan.abort_after.map_or(max_tokens, |n| n.min(max_tokens));
    let truncated = tokens.len() > limit;
    // (A forced call's cut generation is parsed as far as it got anyway.)
    let streamed =
        (forced.is_none() && plan.abort_after.is_some() && truncated).then(|| codec.parse(&full));
    // A cut inside a character a later token finishes (its span is empty)
    // drops the character's first token too.
    let mut keep = limit.min(tokens.len());
    while keep > 0 && keep < tokens.len() && tokens[keep].1.is_empty() {
        keep -= 1;
    }
    tokens.truncate(keep);
    while let Some((_, span)) = tokens.last() {
        if full.is_char_boundary(span.end) {
            break;
        }
        tokens.pop();
    }
    let end = tokens.last().map_or(0, |(_, s)| s.end);
    full.truncate(end);
    let parsed = match &forced {
        Some((f, body)) => forced::parse(body, *f, &full),
        None => codec.parse(&full),
    };
    let finish = if plan.abort_after.is_some() {
        Finish::Abort
    } else if plan.force_length || truncated {
        Finish::Length
    } else if parsed.tool_calls.is_empty() || matches!(forced, Some((Forced::Arguments, _))) {
        // vLLM reports a named tool choice's call with `stop`.
        Finish::Stop
    } else {
        Finish::ToolCalls
    };
    let base = prompt_ids.len();
    let logprobs = tokens
        .iter()
        .enumerate()
        .map(|(i, (id, _))| logprob(base + i, *id))
        .collect();
    let (ids, spans) = tokens.into_iter().unzip();
    Generation {
        prompt_ids,
        text: full,
        ids,
        spans,
        logprobs,
        parsed,
        streamed,
        finish,
        disconnect_after: plan.disconnect_after,
        codec: codec.clone(),
    }
}

impl Generation {
    /// The parse a streamed reply's deltas follow (see
    /// [`Generation::streamed`]).
    pub fn streamed(&self) -> &ParsedOutput {
        self.streamed.as_ref().unwrap_or(&self.parsed)
    }
}

/// The deterministic logprob of `id` at `position`, in (-5, 0].
pub fn logprob(position: usize, id: u32) -> f32 {
    let h = mix((position as u64) << 32 | u64::from(id));
    let frac = (h >> 11) as f64 / (1u64 << 53) as f64;
    (-5.0 * frac) as f32
}

/// A 64-bit mixer (splitmix64's finalizer).
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// FNV-1a over bytes, mixed: a stable hash for session keys.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    mix(h)
}

/// The text deltas one chunk of tokens carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Reasoning text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
    /// Tool calls that begin in this chunk (their index).
    pub tool_starts: Vec<usize>,
    /// Argument text per tool call index.
    pub tool_args: Vec<(usize, String)>,
}

/// Where a scan of JSON text stands (inside a string, after a backslash),
/// to write it as Python's `json.dumps` does.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonScan {
    in_string: bool,
    escaped: bool,
}

impl JsonScan {
    /// `piece`, the next part of the compact JSON text scanned so far,
    /// with items separated as `json.dumps` separates them (`", "`,
    /// `": "`): the way vLLM's `hermes` and SGLang's tool parsers send the
    /// arguments they parsed, whatever the model's spacing.
    pub fn dumps_style(&mut self, piece: &str) -> String {
        let mut out = String::with_capacity(piece.len() + 8);
        for c in piece.chars() {
            out.push(c);
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if c == '\\' {
                    self.escaped = true;
                } else if c == '"' {
                    self.in_string = false;
                }
            } else if c == '"' {
                self.in_string = true;
            } else if matches!(c, ',' | ':') {
                out.push(' ');
            }
        }
        out
    }
}

/// A tool call's arguments as a reply sends them: the model's text, or
/// (`dumps`) as `json.dumps` writes them ([`JsonScan::dumps_style`]).
pub fn arguments_as_sent(arguments: &str, dumps: bool) -> String {
    if dumps {
        JsonScan::default().dumps_style(arguments)
    } else {
        arguments.to_owned()
    }
}

/// Cuts a generation into per-chunk deltas, holding back incomplete UTF-8.
#[derive(Debug)]
pub struct DeltaSplitter<'a> {
    generation: &'a Generation,
    reasoning: Vec<u8>,
    content: Vec<u8>,
    args: Vec<(usize, Vec<u8>)>,
    started: BTreeSet<usize>,
    /// Per tool call: its arguments' scan, when they are sent as
    /// `json.dumps` writes them.
    dumps: Option<Vec<(usize, JsonScan)>>,
}

impl<'a> DeltaSplitter<'a> {
    /// A splitter over `generation`.
    pub fn new(generation: &'a Generation) -> Self {
        Self {
            generation,
            reasoning: Vec::new(),
            content: Vec::new(),
            args: Vec::new(),
            started: BTreeSet::new(),
            dumps: None,
        }
    }

    /// Sends tool call arguments as `json.dumps` writes them (`on`).
    pub fn json_dumps_arguments(mut self, on: bool) -> Self {
        self.dumps = on.then(Vec::new);
        self
    }

    /// The delta of tokens `tokens` (indices into the generation).
    pub fn chunk(&mut self, tokens: Range<usize>) -> Delta {
        let g = self.generation;
        let bytes = g.text.as_bytes();
        let mut delta = Delta::default();
        for span in &g.spans[tokens] {
            for (channel, seg) in &g.streamed().spans {
                let (a, b) = (span.start.max(seg.start), span.end.min(seg.end));
                if a >= b {
                    continue;
                }
                let piece = &bytes[a..b];
                match *channel {
                    Channel::Markup => {}
                    Channel::Reasoning => self.reasoning.extend(piece),
                    Channel::Content => self.content.extend(piece),
                    Channel::ToolHead(n) => self.start(n, &mut delta),
                    Channel::ToolArgs(n) => {
                        self.start(n, &mut delta);
                        match self.args.iter_mut().find(|(i, _)| *i == n) {
                            Some((_, buf)) => buf.extend(piece),
                            None => self.args.push((n, piece.to_vec())),
                        }
                    }
                }
            }
        }
        delta.reasoning = take_utf8(&mut self.reasoning);
        delta.content = take_utf8(&mut self.content);
        for (n, buf) in &mut self.args {
            let mut text = take_utf8(buf);
            if let Some(scans) = &mut self.dumps {
                let i = match scans.iter().position(|(m, _)| m == n) {
                    Some(i) => i,
                    None => {
                        scans.push((*n, JsonScan::default()));
                        scans.len() - 1
                    }
                };
                text = scans[i].1.dumps_style(&text);
            }
            if !text.is_empty() {
                delta.tool_args.push((*n, text));
            }
        }
        delta
    }

    fn start(&mut self, n: usize, delta: &mut Delta) {
        if self.started.insert(n) {
            delta.tool_starts.push(n);
        }
    }
}

/// Takes the longest valid UTF-8 prefix out of `buf`.
fn take_utf8(buf: &mut Vec<u8>) -> String {
    let valid = match std::str::from_utf8(buf) {
        Ok(_) => buf.len(),
        Err(e) => e.valid_up_to(),
    };
    let rest = buf.split_off(valid);
    let text = String::from_utf8_lossy(buf).into_owned();
    *buf = rest;
    text
}
