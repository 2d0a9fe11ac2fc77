//! What a generation is written and read with ([`Codec`]): the mock's own
//! template and tokenizer, or a real model's ([`crate::real`]). Everything
//! after admission (generation, continuation, logprob entries, raw text)
//! goes through it, so both modes share one path.

use std::ops::Range;
use std::sync::Arc;

use super::MockError;
use super::real::RealModel;
use super::script::Plan;
use super::template::{self, ParsedOutput, PromptFacts};
use super::tokenizer;

/// The vocabulary and turn format of a generation.
#[derive(Clone, Debug)]
pub enum Codec {
    /// The mock's ChatML-like template and deterministic tokenizer, with
    /// the server's generation glue.
    Mock {
        /// Text the generation prompt ends with.
        glue: String,
    },
    /// A real model's files.
    Real(Arc<RealModel>),
}

impl Codec {
    /// The text of a planned turn, end-of-turn token left out, as it
    /// follows `prompt_head` (the prompt up to the turn's first generated
    /// token: a real model's turn has no reasoning block when the
    /// generation prompt closed it).
    pub fn turn_text(&self, plan: &Plan, prompt_head: &[u32]) -> String {
        match self {
            Self::Mock { .. } => {
                let calls: Vec<(&str, &str)> = plan
                    .tool_calls
                    .iter()
                    .map(|(n, a)| (n.as_str(), a.as_str()))
                    .collect();
                template::render_assistant_body(plan.think.as_deref(), &plan.text, &calls)
            }
            Self::Real(m) => {
                let thinking = m.open_turn(prompt_head).map(|(_, on)| on);
                m.family().turn_text(
                    plan.think.as_deref(),
                    &plan.text,
                    &plan.tool_calls,
                    thinking,
                )
            }
        }
    }

    /// The text a planned turn ends with (its end-of-turn token).
    pub fn end_of_turn(&self, plan: &Plan) -> &'static str {
        match self {
            Self::Mock { .. } => "<|im_end|>",
            Self::Real(m) => m.family().turn_end(!plan.tool_calls.is_empty()),
        }
    }

    /// Ids with the byte span of `text` each covers.
    pub fn encode_with_spans(&self, text: &str) -> Vec<(u32, Range<usize>)> {
        match self {
            Self::Mock { .. } => tokenizer::encode_with_spans(text),
            Self::Real(m) => m.encode_with_spans(text),
        }
    }

    /// The ids of prompt text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, MockError> {
        match self {
            Self::Mock { .. } => Ok(tokenizer::encode(text)),
            Self::Real(m) => m.encode(text).map_err(MockError::BadRequest),
        }
    }

    /// The text of ids (`skip_special`: special tokens left out; the
    /// mock's own tokenizer always keeps them).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, MockError> {
        match self {
            Self::Mock { .. } => tokenizer::decode(ids),
            Self::Real(m) => m.decode(ids, skip_special).map_err(MockError::BadRequest),
        }
    }

    /// Generated text read back as the server's parsers read it.
    pub fn parse(&self, text: &str) -> ParsedOutput {
        match self {
            Self::Mock { .. } => template::parse_output(text),
            Self::Real(m) => m.family().parse(text),
        }
    }

    /// The ids at the end of `prompt_ids` that may be a turn left open
    /// (generated ids), as [`super::resume`] continues them: one
    /// candidate for the mock's own template, each place a turn may start
    /// for a real model's (latest first); none when the prompt ends with
    /// the generation prompt.
    pub fn partial_turns<'a>(&self, prompt_ids: &'a [u32]) -> Vec<&'a [u32]> {
        let turns: Vec<&[u32]> = match self {
            Self::Mock { glue } => vec![super::resume::partial_turn(prompt_ids, glue)],
            Self::Real(m) => m
                .turn_starts(prompt_ids)
                .into_iter()
                .map(|start| &prompt_ids[start..])
                .collect(),
        };
        turns.into_iter().filter(|t| !t.is_empty()).collect()
    }

    /// The script's facts of a token-in prompt, from its text.
    pub fn sniff(&self, prompt_ids: &[u32]) -> Result<PromptFacts, MockError> {
        let text = self.decode(prompt_ids, false)?;
        Ok(match self {
            Self::Mock { .. } => PromptFacts::sniff(&text),
            Self::Real(m) => m.facts(&text),
        })
    }

    /// Whether `id` ends a turn.
    pub fn is_stop(&self, id: u32) -> bool {
        match self {
            Self::Mock { .. } => id == tokenizer::IM_END || id == tokenizer::ENDOFTEXT,
            Self::Real(m) => m.stop_ids().contains(&id),
        }
    }

    /// Whether `id` is a special token.
    pub fn is_special(&self, id: u32) -> bool {
        match self {
            Self::Mock { .. } => tokenizer::is_special(id),
            Self::Real(m) => m.is_special(id),
        }
    }

    /// The id of the end-of-turn token (SGLang's `matched`).
    pub fn end_of_turn_id(&self) -> u32 {
        match self {
            Self::Mock { .. } => tokenizer::IM_END,
            Self::Real(m) => m.stop_ids().first().copied().unwrap_or_default(),
        }
    }

    /// The bytes one token stands for (lossy for a real model's token that
    /// is part of a character).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        match self {
            Self::Mock { .. } => tokenizer::token_bytes(id).unwrap_or_default(),
            Self::Real(m) => m.token_text(id).unwrap_or_default().into_bytes(),
        }
    }

    /// One token as text.
    pub fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(&self.token_bytes(id)).into_owned()
    }

    /// The number of ids.
    pub fn vocab_size(&self) -> u32 {
        match self {
            Self::Mock { .. } => tokenizer::VOCAB_SIZE,
            Self::Real(m) => m.vocab_size(),
        }
    }
}
