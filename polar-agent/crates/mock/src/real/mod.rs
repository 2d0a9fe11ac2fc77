//! The mock serving a real model's directory as vLLM serves that model
//! (`--model-dir DIR`): a chat body's messages become vLLM's conversation
//! (`polar_faithful::vllm::conversation`, content format detected from the
//! template), rendered by the model's own chat template with the body's
//! `tools`, `chat_template_kwargs` and the generation prompt
//! (`polar_template::Model`, as `transformers.apply_chat_template`
//! renders), and encoded with the model's tokenizer: these are the prompt
//! ids. The scripted turn is written as the model writes it and read back
//! as vLLM's parsers for the family read it ([`OutputFormat`]: Qwen3 with
//! Hermes tool calls in [`qwen3`], DeepSeek-V3 and V3.1 in [`deepseek`],
//! gpt-oss's Harmony in [`gpt_oss`]; the last two read back by
//! `polar_chat::output`'s parsers, [`read`]), encoded with the same
//! tokenizer, each id with the byte span of the text it stands for.
//!
//! A family is recognised by its template's markup; other families plug
//! in as another [`OutputFormat`].

pub mod deepseek;
pub mod gpt_oss;
pub mod qwen3;
pub mod read;

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use tokenizers::Tokenizer;

use polar_chat::{Message, Tool};
use polar_faithful::vllm::{ContentFormat, conversation};
use polar_template::{Model, ModelFiles, RenderInput};

/// How a model family writes a turn and how the server reads it back.
pub trait OutputFormat: Send + Sync + std::fmt::Debug {
    /// The family's name (for logs and errors).
    fn name(&self) -> &'static str;
    /// The text the model ends a turn with (its end-of-turn token).
    fn end_of_turn(&self) -> &'static str;
    /// The text the model ends a turn with, when the turn has tool calls
    /// (`calls`) or not (gpt-oss ends a call with `<|call|>`).
    fn turn_end(&self, calls: bool) -> &'static str {
        let _ = calls;
        self.end_of_turn()
    }
    /// What the template renders before a generated turn.
    fn turn_head(&self) -> &'static str;
    /// What the generation prompt adds after [`Self::turn_head`] when
    /// thinking is off (empty when the family has no such switch).
    fn no_think_glue(&self) -> &'static str;
    /// Markup after which the model's turn starts with no turn head
    /// (DeepSeek's templates add no generation prompt after tool results).
    fn headless_turn_after(&self) -> &'static [&'static str] {
        &[]
    }
    /// The text of a turn (without the end-of-turn token) as the model
    /// writes it: `think` and `text`, then the calls (name, arguments JSON);
    /// `thinking` is whether the generation prompt left the reasoning open
    /// (`Some(false)`: it closed it), `None` when the prompt does not end
    /// with the turn head (DeepSeek's turns after tool results).
    fn turn_text(
        &self,
        think: Option<&str>,
        text: &str,
        calls: &[(String, String)],
        thinking: Option<bool>,
    ) -> String;
    /// Generated text as the server's reasoning and tool parsers read it,
    /// every byte assigned to a channel.
    fn parse(&self, text: &str) -> ParsedOutput;
    /// The conversation a prompt the template rendered holds (closed
    /// blocks only) and the tools it lists.
    fn read_prompt(&self, prompt: &str) -> (Vec<Message>, Vec<Tool>);
}

use crate::template::ParsedOutput;

/// Why a model directory cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum RealError {
    /// The model's files failed to load (the cause names the file and key).
    #[error("model directory {dir}: {reason}")]
    Load {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No output format is known for the template's family.
    #[error(
        "model directory {dir}: no output format is known for its chat template \
         (known: Qwen3 with Hermes tool calls: `<|im_start|>`, `<tool_call>`; \
         DeepSeek-V3/V3.1: `<｜tool▁calls▁begin｜>`; gpt-oss: `<|start|>`, `<|channel|>`)"
    )]
    UnknownFamily {
        /// The directory.
        dir: PathBuf,
    },
    /// The tokenizer lacks a token the output format writes.
    #[error("model directory {dir}: the tokenizer has no token {token:?}, which {family} writes")]
    MissingToken {
        /// The directory.
        dir: PathBuf,
        /// The token.
        token: String,
        /// The family.
        family: &'static str,
    },
}

/// A real model's files, loaded once at start.
#[derive(Debug)]
pub struct RealModel {
    dir: PathBuf,
    model: Model,
    /// The same `tokenizer.json`, for byte offsets and special flags.
    tokenizer: Tokenizer,
    special: HashSet<u32>,
    format: ContentFormat,
    family: Box<dyn OutputFormat>,
    head: Vec<u32>,
    glue: Vec<u32>,
    headless: Vec<Vec<u32>>,
    stop_ids: Vec<u32>,
}

impl RealModel {
    /// Loads and checks `dir` (`tokenizer.json`, `tokenizer_config.json`,
    /// optional `chat_template.jinja`, `generation_config.json`,
    /// `config.json`).
    pub fn load(dir: &Path) -> Result<Self, RealError> {
        let load_err = |reason: String| RealError::Load {
            dir: dir.to_owned(),
            reason,
        };
        let files = ModelFiles::from_dir(dir);
        let model = Model::load(&files).map_err(|e| load_err(e.to_string()))?;
        let tokenizer = Tokenizer::from_file(&files.tokenizer)
            .map_err(|e| load_err(format!("{}: {e}", files.tokenizer.display())))?;
        let template = template_text(&files).map_err(load_err)?;
        let family: Box<dyn OutputFormat> =
            if template.contains("<|im_start|>") && template.contains("<tool_call>") {
                Box::new(qwen3::Qwen3)
            } else if template.contains("<｜tool▁calls▁begin｜>") {
                Box::new(deepseek::Deepseek {
                    v31: template.contains("<think>"),
                })
            } else if template.contains("<|start|>") && template.contains("<|channel|>") {
                Box::new(gpt_oss::GptOss)
            } else {
                return Err(RealError::UnknownFamily {
                    dir: dir.to_owned(),
                });
            };
        let end = family.end_of_turn();
        let Some(end_id) = model.token_id(end) else {
            return Err(RealError::MissingToken {
                dir: dir.to_owned(),
                token: end.to_owned(),
                family: family.name(),
            });
        };
        let mut stop_ids = model.stop_ids().to_vec();
        if !stop_ids.contains(&end_id) {
            stop_ids.push(end_id);
        }
        let special = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let encode = |text: &str| {
            model
                .encode(text)
                .map_err(|e| load_err(format!("cannot encode {text:?}: {e}")))
        };
        let head = encode(family.turn_head())?;
        let glue = encode(family.no_think_glue())?;
        let headless = family
            .headless_turn_after()
            .iter()
            .map(|m| encode(m))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            dir: dir.to_owned(),
            format: ContentFormat::detect(&template),
            model,
            tokenizer,
            special,
            family,
            head,
            glue,
            headless,
            stop_ids,
        })
    }

    /// The directory served.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The output format.
    pub fn family(&self) -> &dyn OutputFormat {
        self.family.as_ref()
    }

    /// The context length the model's `config.json` gives.
    pub fn context_len(&self) -> Option<usize> {
        self.model.context_len().map(|n| n as usize)
    }

    /// The ids generation ends a turn at.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Whether `id` is a special token (left out of text decoded with
    /// `skip_special_tokens`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> u32 {
        self.tokenizer.get_vocab_size(true) as u32
    }

    /// The ids of `text` (added tokens recognised, none added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.model.encode(text).map_err(|e| e.to_string())
    }

    /// The ids of `text`, each with the bytes of `text` it stands for: the
    /// spans cover the text in order; a token that ends inside a character
    /// another token finishes has the character, the other an empty span.
    pub fn encode_with_spans(&self, text: &str) -> Vec<(u32, Range<usize>)> {
        let Ok(enc) = self.tokenizer.encode(text, false) else {
            return Vec::new();
        };
        let mut at = 0;
        let n = enc.get_ids().len();
        enc.get_ids()
            .iter()
            .zip(enc.get_offsets())
            .enumerate()
            .map(|(i, (&id, &(_, end)))| {
                let end = if i + 1 == n { text.len() } else { end.max(at) };
                let span = at..end;
                at = end;
                (id, span)
            })
            .collect()
    }

    /// The text of `ids` (`skip_special`: special tokens left out).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, String> {
        if let Some(bad) = ids.iter().find(|&&id| id >= self.vocab_size()) {
            return Err(format!("unknown token id {bad}"));
        }
        self.model
            .decode(ids, skip_special)
            .map_err(|e| e.to_string())
    }

    /// One token's text, as logprob entries show it.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.decode(&[id], false).ok()
    }

    /// Where a turn left open at the end of `prompt_ids` may start, latest
    /// first: after each turn head (and the generation prompt's empty
    /// reasoning) or headless opener
    /// ([`OutputFormat::headless_turn_after`]) since the last end-of-turn
    /// token. Several, as a turn may hold the head itself (gpt-oss writes
    /// `<|start|>assistant` between its messages): which one the generated
    /// ids follow is told by what they are.
    pub fn turn_starts(&self, prompt_ids: &[u32]) -> Vec<usize> {
        let from = prompt_ids
            .iter()
            .rposition(|id| self.stop_ids.contains(id))
            .map_or(0, |at| at + 1);
        let mut starts = Vec::new();
        for end in (from..=prompt_ids.len()).rev() {
            let before = &prompt_ids[from..end];
            if !self.head.is_empty() && before.ends_with(&self.head) {
                let rest = &prompt_ids[end..];
                let glued = !self.glue.is_empty() && rest.starts_with(&self.glue);
                starts.push(if glued { end + self.glue.len() } else { end });
            } else if self
                .headless
                .iter()
                .any(|m| !m.is_empty() && before.ends_with(m))
            {
                starts.push(end);
            }
        }
        starts
    }

    /// Where the turn left open at the end of `prompt_ids` starts (after the
    /// turn head and, when thinking is off, the generation prompt's empty
    /// reasoning), and whether thinking is on; `None` when the prompt does
    /// not end inside an assistant turn.
    pub fn open_turn(&self, prompt_ids: &[u32]) -> Option<(usize, bool)> {
        let first = *self.head.first()?;
        let at = prompt_ids.iter().rposition(|&id| id == first)?;
        let rest = prompt_ids[at..].strip_prefix(self.head.as_slice())?;
        if rest.iter().any(|id| self.stop_ids.contains(id)) {
            return None;
        }
        let start = prompt_ids.len() - rest.len();
        if !self.glue.is_empty() && rest.starts_with(&self.glue) {
            return Some((start + self.glue.len(), false));
        }
        Some((start, true))
    }

    /// The script's facts of a prompt this model's template rendered (its
    /// closed blocks read back as a conversation).
    pub fn facts(&self, prompt: &str) -> crate::template::PromptFacts {
        let (messages, tools) = self.family.read_prompt(prompt);
        crate::template::PromptFacts::of_messages(&messages, &tools)
    }

    /// The prompt of a chat body, as vLLM renders it: text and ids.
    /// `tools` are the tools the template gets (`None`: the body's).
    pub fn chat_prompt(
        &self,
        body: &Map<String, Value>,
        tool_filter: Option<&[String]>,
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<u32>), crate::MockError> {
        let bad = |m: String| crate::MockError::BadRequest(m);
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("`messages` must be an array".into()))?;
        let conv = conversation(messages, self.format).map_err(|e| bad(e.to_string()))?;
        let tools: Option<Vec<Value>> = body.get("tools").and_then(Value::as_array).map(|ts| {
            ts.iter()
                .filter_map(vllm_tool)
                .filter(|t| {
                    tool_filter.is_none_or(|names| {
                        t.pointer("/function/name")
                            .and_then(Value::as_str)
                            .is_some_and(|n| names.iter().any(|m| m == n))
                    })
                })
                .collect()
        });
        let no_kwargs = Map::new();
        let kwargs = body
            .get("chat_template_kwargs")
            .and_then(Value::as_object)
            .unwrap_or(&no_kwargs);
        let input = RenderInput {
            messages: &conv,
            tools: tools.as_deref(),
            documents: None,
            add_generation_prompt,
            kwargs,
        };
        let text = self.model.render(&input).map_err(|e| bad(e.to_string()))?;
        let ids = self
            .encode(&text)
            .map_err(|e| bad(format!("tokenizing the prompt: {e}")))?;
        Ok((text, ids))
    }
}

/// A request tool as vLLM hands it to the template: its
/// `ChatCompletionToolsParam` dumped, `description` and `parameters`
/// `null` when absent.
fn vllm_tool(tool: &Value) -> Option<Value> {
    let f = tool.get("function")?;
    Some(json!({"type": "function", "function": {
        "name": f.get("name")?.as_str()?,
        "description": f.get("description").cloned().unwrap_or(Value::Null),
        "parameters": f.get("parameters").cloned().unwrap_or(Value::Null),
    }}))
}

/// The template's text (for the family and the content format):
/// `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`
/// (a string, or the `default` of a list of named ones).
fn template_text(files: &ModelFiles) -> Result<String, String> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    if let Some(path) = &files.chat_template {
        return read(path);
    }
    let config: Value = serde_json::from_str(&read(&files.tokenizer_config)?)
        .map_err(|e| format!("{}: {e}", files.tokenizer_config.display()))?;
    match config.get("chat_template") {
        Some(Value::String(t)) => Ok(t.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("{}: no `chat_template`", files.tokenizer_config.display())),
        _ => Err(format!(
            "{}: no `chat_template`",
            files.tokenizer_config.display()
        )),
    }
}
