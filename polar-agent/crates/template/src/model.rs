//! A loaded model's template and tokenizer ([`Model`]): rendering a
//! conversation as `apply_chat_template(tokenize=False)` does, tokenizing
//! as `apply_chat_template(tokenize=True)` does (the rendered text encoded
//! without added special tokens: the template writes them), decoding, and
//! the ids generation stops at. The template is compiled once, at load.

use minijinja::Environment;
use tokenizers::Tokenizer;

use crate::env::Raised;
use crate::input::{RenderError, RenderInput, context};

/// Why text and ids could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("tokenizing failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
}

/// A rendered prompt: its text and its token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub ids: Vec<u32>,
}

/// Either step of [`Model::render_ids`].
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
}

/// A model's chat template and tokenizer, loaded by [`Model::load`].
pub struct Model {
    env: Environment<'static>,
    /// The template used without tools (or always, when one was named).
    default: String,
    /// The template used with tools, if the model has a `tool_use` one.
    tool_use: Option<String>,
    tokenizer: Tokenizer,
    special_tokens: Vec<(String, String)>,
    stop_ids: Vec<u32>,
    context_len: Option<u32>,
    /// Whether decoding removes spaces before punctuation
    /// (`clean_up_tokenization_spaces`, which transformers ignores for BPE
    /// tokenizers unless told to corrupt their output anyway).
    clean_up_spaces: bool,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("special_tokens", &self.special_tokens)
            .field("stop_ids", &self.stop_ids)
            .field("context_len", &self.context_len)
            .finish_non_exhaustive()
    }
}

impl Model {
    pub(crate) fn new(
        env: Environment<'static>,
        (default, tool_use): (String, Option<String>),
        tokenizer: Tokenizer,
        special_tokens: Vec<(String, String)>,
        stop_ids: Vec<u32>,
        context_len: Option<u32>,
        clean_up_spaces: bool,
    ) -> Self {
        Self {
            env,
            default,
            tool_use,
            tokenizer,
            special_tokens,
            stop_ids,
            context_len,
            clean_up_spaces,
        }
    }

    /// The prompt text for `input`.
    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, RenderError> {
        let ctx = context(input, &self.special_tokens)?;
        let name = match (&self.tool_use, input.tools) {
            (Some(tool_use), Some(_)) => tool_use,
            _ => &self.default,
        };
        let template = self
            .env
            .get_template(name)
            .map_err(|e| template_error(&e))?;
        template.render(ctx).map_err(|e| template_error(&e))
    }

    /// The prompt text and its ids.
    pub fn render_ids(&self, input: &RenderInput<'_>) -> Result<Rendered, PromptError> {
        let text = self.render(input)?;
        let ids = self.encode(&text)?;
        Ok(Rendered { text, ids })
    }

    /// The ids of `text`, added tokens recognised, no special tokens added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError::Encode(e.to_string()))
    }

    /// The text of `ids`, as transformers' `decode` gives it;
    /// `skip_special` leaves special tokens out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizeError> {
        let text = self
            .tokenizer
            .decode(ids, skip_special)
            .map_err(|e| TokenizeError::Decode(e.to_string()))?;
        Ok(if self.clean_up_spaces {
            clean_up_tokenization(&text)
        } else {
            text
        })
    }

    /// The id of a token (`<|im_end|>`), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The token of an id.
    pub fn id_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// The ids generation ends a turn at: `generation_config.json`'s
    /// `eos_token_id`s, then the tokenizer's `eos_token`.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The context length (`config.json`'s `max_position_embeddings`), if
    /// the model directory says.
    pub fn context_len(&self) -> Option<u32> {
        self.context_len
    }

    /// The special tokens every render receives (`bos_token`, ...).
    pub fn special_tokens(&self) -> &[(String, String)] {
        &self.special_tokens
    }
}

/// transformers' `clean_up_tokenization`.
fn clean_up_tokenization(text: &str) -> String {
    text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

fn template_error(e: &minijinja::Error) -> RenderError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(Raised(message)) = err.downcast_ref::<Raised>() {
            return RenderError::Raised {
                message: message.clone(),
            };
        }
        source = err.source();
    }
    RenderError::Template {
        line: e.line(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_up_is_transformers() {
        assert_eq!(
            clean_up_tokenization("I do n't know , it 's here . Is it ? Yes !"),
            "I don't know, it's here. Is it? Yes!"
        );
    }
}
