//! A loaded model's template and tokenizer ([`Model`]): rendering a
//! conversation as `apply_chat_template(tokenize=False)` does, tokenizing
//! as `apply_chat_template(tokenize=True)` does (the rendered text encoded
//! without added special tokens: the template writes them), decoding, and
//! the ids generation stops at. The template is compiled once, at load.

use minijinja::Environment;
use tokenizers::Tokenizer;

use crate::env::{Raised, TEMPLATE_NAME};
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
    tokenizer: Tokenizer,
    special_tokens: Vec<(String, String)>,
    stop_ids: Vec<u32>,
    context_len: Option<u32>,
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
        tokenizer: Tokenizer,
        special_tokens: Vec<(String, String)>,
        stop_ids: Vec<u32>,
        context_len: Option<u32>,
    ) -> Self {
        Self {
            env,
            tokenizer,
            special_tokens,
            stop_ids,
            context_len,
        }
    }

    /// The prompt text for `input`.
    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, RenderError> {
        let ctx = context(input, &self.special_tokens)?;
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
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

    /// The text of `ids`; `skip_special` leaves special tokens out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizeError> {
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(|e| TokenizeError::Decode(e.to_string()))
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
