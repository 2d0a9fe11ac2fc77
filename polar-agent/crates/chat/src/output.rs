//! Model output formats: the raw text a model generates, as a token-in
//! endpoint returns it (vLLM `/v1/completions`, SGLang `/generate`),
//! parsed into reasoning, answer text and tool calls the way the backends'
//! chat endpoints parse it server-side.
//!
//! [`OutputParser`] is incremental: text is pushed as it arrives and what
//! it says so far is [`OutputParser::parsed`], which only grows. Text that
//! may still turn out to be markup (a trailing newline that may precede
//! `</think>` or `<tool_call>`, a tool call's closing `}` and tag) is held
//! back until the next text or [`OutputParser::finish`] tells. The
//! resumption of a reply after a backend fault ([`resync`]) feeds it the
//! text generated before the fault, then the continuation's.
//!
//! Supported formats ([`OutputFormat`]), one file each:
//! - `qwen3` ([`qwen3`]): ChatML / Hermes `<think>` and `<tool_call>` JSON;
//! - `qwen3_coder` ([`qwen3_coder`]): Qwen3-Coder's XML tool calls, their
//!   parameters typed by the request's tool schemas;
//! - `deepseek_v3` ([`deepseek_v3`]): DeepSeek V3 / V3.1 / R1;
//! - `llama3_json` ([`llama3_json`]): Llama 3.1 / 3.3 JSON tool calls;
//! - `gpt_oss` ([`gpt_oss`]): gpt-oss Harmony channels;
//! - `glm45` ([`glm45`]): GLM-4.5 / 4.6 `<arg_key>`/`<arg_value>` calls.
//!
//! What a format needs besides the text is in [`OutputOptions`]: the
//! request's tools (the XML formats type parameter values by their JSON
//! schema) and whether the prompt already opened the reasoning block.
//! Markup that turns out malformed before a tool call is known (its name
//! read) is kept as answer text, never dropped.

pub mod deepseek_v3;
pub mod glm45;
pub mod gpt_oss;
pub mod llama3_json;
pub mod qwen3;
pub mod qwen3_coder;
pub mod resync;
mod scan;
mod typed_args;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::Tool;
pub use typed_args::ToolSchemas;

/// The text format of a model's raw output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// ChatML / Hermes (Qwen2.5, Qwen3, QwQ): a leading `<think>` block
    /// and `<tool_call>` JSON blocks. `hermes` is accepted as its name too.
    #[serde(alias = "hermes")]
    Qwen3,
    /// Qwen3-Coder: ChatML with `<tool_call><function=NAME><parameter=P>`
    /// XML blocks (vLLM's `qwen3_coder` tool parser).
    Qwen3Coder,
    /// DeepSeek V3, V3.1 and R1: `<｜tool▁calls▁begin｜>` blocks, `<think>`
    /// reasoning (vLLM's `deepseek_v3`/`deepseek_v31` tool parsers and
    /// `deepseek_r1` reasoning parser).
    #[serde(rename = "deepseek_v3")]
    DeepseekV3,
    /// Llama 3.1 / 3.3: `{"name": ..., "parameters": ...}` tool calls,
    /// optionally after `<|python_tag|>` (vLLM's `llama3_json`).
    #[serde(rename = "llama3_json")]
    Llama3Json,
    /// gpt-oss Harmony: `analysis`, `commentary` and `final` channels.
    GptOss,
    /// GLM-4.5 / 4.6: `<think>` and `<tool_call>NAME<arg_key>..` blocks
    /// (vLLM's `glm45` tool and reasoning parsers).
    Glm45,
}

impl OutputFormat {
    /// Every format, in the order the docs list them.
    pub const ALL: [Self; 6] = [
        Self::Qwen3,
        Self::Qwen3Coder,
        Self::DeepseekV3,
        Self::Llama3Json,
        Self::GptOss,
        Self::Glm45,
    ];

    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::Qwen3Coder => "qwen3_coder",
            Self::DeepseekV3 => "deepseek_v3",
            Self::Llama3Json => "llama3_json",
            Self::GptOss => "gpt_oss",
            Self::Glm45 => "glm45",
        }
    }

    /// Whether the format's markup is made of special tokens (gpt-oss's
    /// Harmony tokens, Llama's `<|python_tag|>`), which detokenizers drop
    /// unless told to keep them (vLLM's and SGLang's
    /// `skip_special_tokens = false`).
    pub fn markup_is_special(self) -> bool {
        matches!(self, Self::GptOss | Self::Llama3Json)
    }

    /// The texts that end the model's turn (what follows is ignored).
    fn end_markers(self) -> &'static [&'static str] {
        match self {
            Self::Qwen3 | Self::Qwen3Coder => &["<|im_end|>", "<|endoftext|>"],
            Self::DeepseekV3 => &["<｜end▁of▁sentence｜>"],
            Self::Llama3Json => &["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
            Self::GptOss => &["<|return|>", "<|endoftext|>"],
            Self::Glm45 => &["<|user|>", "<|observation|>", "<|endoftext|>"],
        }
    }
}

/// What a format needs to know besides the output's text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutputOptions {
    /// The request's tools: `qwen3_coder` and `glm45` type parameter values
    /// by their schemas (the others ignore them).
    pub tools: ToolSchemas,
    /// The prompt ended inside a reasoning block (a generation prompt that
    /// opens `<think>`: DeepSeek-R1 and V3.1 thinking mode, Qwen3 thinking
    /// templates): the output starts as reasoning. `llama3_json` and
    /// `gpt_oss` ignore it.
    pub reasoning_open: bool,
}

impl OutputOptions {
    /// Options with the schemas of `tools`.
    pub fn with_tools(tools: &[Tool]) -> Self {
        Self {
            tools: ToolSchemas::of(tools),
            reasoning_open: false,
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
    /// A tool call block is not what its format says.
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

/// The text a format's state machine reads: `text[*pos..]` is unread,
/// `fin` says no more will come.
pub(crate) struct Feed<'a> {
    text: &'a str,
    pos: &'a mut usize,
    fin: bool,
    out: &'a mut ParsedOutput,
}

impl<'a> Feed<'a> {
    fn rest(&self) -> &'a str {
        &self.text[*self.pos..]
    }
}

/// One format's state.
#[derive(Clone, Debug)]
enum Machine {
    Qwen3(qwen3::Qwen3),
    Qwen3Coder(qwen3_coder::Qwen3Coder),
    DeepseekV3(deepseek_v3::DeepseekV3),
    Llama3Json(llama3_json::Llama3Json),
    GptOss(gpt_oss::GptOss),
    Glm45(glm45::Glm45),
}

impl Machine {
    fn advance(&mut self, f: &mut Feed<'_>) -> Result<(), OutputError> {
        match self {
            Self::Qwen3(m) => m.advance(f),
            Self::Qwen3Coder(m) => m.advance(f),
            Self::DeepseekV3(m) => m.advance(f),
            Self::Llama3Json(m) => m.advance(f),
            Self::GptOss(m) => m.advance(f),
            Self::Glm45(m) => m.advance(f),
        }
    }
}

/// An incremental parser of one output (see the module docs).
#[derive(Clone, Debug)]
pub struct OutputParser {
    format: OutputFormat,
    text: String,
    pending: String,
    pos: usize,
    finished: bool,
    out: ParsedOutput,
    machine: Machine,
}

impl OutputParser {
    /// A parser of an output in `format`, with no tools and the reasoning
    /// block not opened by the prompt.
    pub fn new(format: OutputFormat) -> Self {
        Self::with_options(format, &OutputOptions::default())
    }

    /// A parser of an output in `format` for a request with `options`.
    pub fn with_options(format: OutputFormat, options: &OutputOptions) -> Self {
        let open = options.reasoning_open;
        let machine = match format {
            OutputFormat::Qwen3 => Machine::Qwen3(qwen3::Qwen3::new(open)),
            OutputFormat::Qwen3Coder => {
                Machine::Qwen3Coder(qwen3_coder::Qwen3Coder::new(open, options.tools.clone()))
            }
            OutputFormat::DeepseekV3 => Machine::DeepseekV3(deepseek_v3::DeepseekV3::new(open)),
            OutputFormat::Llama3Json => Machine::Llama3Json(llama3_json::Llama3Json::default()),
            OutputFormat::GptOss => Machine::GptOss(gpt_oss::GptOss::default()),
            OutputFormat::Glm45 => Machine::Glm45(glm45::Glm45::new(open, options.tools.clone())),
        };
        Self {
            format,
            text: String::new(),
            pending: String::new(),
            pos: 0,
            finished: false,
            out: ParsedOutput::default(),
            machine,
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
        let markers = self.format.end_markers();
        if let Some((at, _)) = scan::find_first(&self.pending, markers) {
            self.pending.truncate(at);
            return self.finish();
        }
        // A marker's beginning stays out of the text until it is known not
        // to be one.
        let take = self.pending.len() - scan::held_any(&self.pending, markers);
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
        let mut feed = Feed {
            text: &self.text,
            pos: &mut self.pos,
            fin: self.finished,
            out: &mut self.out,
        };
        self.machine.advance(&mut feed)
    }
}
