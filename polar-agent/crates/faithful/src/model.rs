//! [`Renderer`] over a model's own files ([`polar_template::Model`]), and
//! the content format its templates expect.

use polar_template::{Model, RenderInput};

use super::render::{Conversation, RenderFailure, Renderer};
use super::vllm::ContentFormat;

impl Renderer for Model {
    fn render(
        &self,
        conv: &Conversation<'_>,
        add_generation_prompt: bool,
    ) -> Result<String, RenderFailure> {
        let input = RenderInput {
            messages: conv.messages,
            tools: conv.tools,
            documents: None,
            add_generation_prompt,
            kwargs: conv.kwargs,
        };
        Model::render(self, &input).map_err(|e| RenderFailure::Template(e.to_string()))
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, RenderFailure> {
        Model::encode(self, text).map_err(|e| RenderFailure::Tokenizer(e.to_string()))
    }

    fn token_text(&self, id: u32) -> Option<String> {
        self.id_token(id)
    }

    fn stop_ids(&self) -> &[u32] {
        Model::stop_ids(self)
    }
}

/// The content format `model`'s templates expect: `openai` when any of
/// them loops over a message's content.
pub fn content_format(model: &Model) -> ContentFormat {
    if model
        .template_sources()
        .any(|t| ContentFormat::detect(t) == ContentFormat::OpenAi)
    {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}
