//! What token-faithful prompts need of a model's files: its chat template
//! and tokenizer ([`Renderer`]), and what one conversation is to them
//! ([`Conversation`]).

use serde_json::{Map, Value};

/// The model's chat template and tokenizer (`polar-template`'s model, or a
/// test's).
pub trait Renderer {
    /// The template rendered over `conv` (as `transformers`'
    /// `apply_chat_template` renders it), with the generation prompt when
    /// `add_generation_prompt`.
    fn render(
        &self,
        conv: &Conversation<'_>,
        add_generation_prompt: bool,
    ) -> Result<String, RenderFailure>;

    /// The ids of `text`, special tokens parsed, none added (as a rendered
    /// chat prompt is tokenized).
    fn encode(&self, text: &str) -> Result<Vec<u32>, RenderFailure>;

    /// The text of one token id (special tokens included), `None` for an id
    /// the vocabulary lacks.
    fn token_text(&self, id: u32) -> Option<String>;

    /// The ids generation stops at (the model's end-of-turn ids).
    fn stop_ids(&self) -> &[u32];
}

/// A conversation as the template gets it: vLLM's conversation messages
/// ([`crate::vllm::conversation`]), the tools, the extra template
/// arguments (`chat_template_kwargs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Conversation<'a> {
    /// The messages.
    pub messages: &'a [Value],
    /// The tools (OpenAI function tools), `None` when there are none.
    pub tools: Option<&'a [Value]>,
    /// Extra template arguments (`enable_thinking`, `reasoning_effort`, ...).
    pub kwargs: &'a Map<String, Value>,
}

/// A template or tokenizer failure, with its message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenderFailure {
    /// The template raised (`raise_exception`) or failed to render: the
    /// request is one this model cannot take (the harness's fault).
    #[error("the chat template refused the conversation: {0}")]
    Template(String),
    /// The tokenizer failed (the node's model files are at fault).
    #[error("the tokenizer failed: {0}")]
    Tokenizer(String),
}
