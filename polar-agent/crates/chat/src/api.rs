//! The harness APIs Polar translates, named as records and exports name them.

use serde::{Deserialize, Serialize};

/// The harness API a call came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// Anthropic Messages.
    AnthropicMessages,
    /// OpenAI Chat Completions.
    OpenaiChat,
    /// OpenAI Responses.
    OpenaiResponses,
    /// Google Gemini generateContent / streamGenerateContent.
    Gemini,
}
