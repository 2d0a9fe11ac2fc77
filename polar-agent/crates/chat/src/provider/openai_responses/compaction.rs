//! Server-side compaction in the Responses API, as Codex CLI asks for it:
//! when its context fills, it sends an ordinary request whose last input
//! item is `{"type": "compaction_trigger"}` and expects exactly one output
//! item back, `{"type": "compaction", "id", "encrypted_content"}`, which it
//! then sends in later requests' input in place of the history it covers.
//!
//! Polar serves it with the backend: the request becomes a summary request
//! (the conversation, then a user message with [`INSTRUCTIONS`]; no tools
//! offered, since a summary calls none) and the reply's text becomes the
//! compaction item. Codex sends no instructions of its own with the trigger
//! (the server is meant to bring them), so Polar brings its own. The item's
//! opaque content is the summary itself behind [`CONTENT_PREFIX`]: no state
//! is kept, and a later request's `compaction` item expands back into a
//! user message holding the summary (marked with [`super::SOURCE_KEY`] =
//! `"compaction"`). A `compaction` item Polar did not make (another
//! server's) cannot be expanded and is kept in `extra.input_other`, like any
//! unknown item. The record of the summary call keeps the native request,
//! whose trigger item tells the trajectory builder it is a compaction
//! summary (`polar-trajectory` labels it `compaction_summary`).

use serde_json::json;

use crate::{Message, Role};

use super::super::SOURCE_KEY;

/// The input item type that asks for a compaction.
pub const TRIGGER: &str = "compaction_trigger";
/// The output (and later input) item type holding a compaction.
pub const ITEM: &str = "compaction";
/// What starts the `encrypted_content` of a compaction item Polar made.
pub const CONTENT_PREFIX: &str = "polar-compaction-v1:";

/// What the backend is asked to do with the conversation.
pub const INSTRUCTIONS: &str = "Your context is about to be compacted. Write a summary of \
the conversation so far that lets you continue the task from it alone: the task and the \
user's requirements, what has been done and found (files changed, commands run and their \
results), what is left to do next, and anything else needed to finish. Answer with the \
summary only.";

/// The user message asking for the summary (last in the summary request).
pub fn instructions_message() -> Message {
    let mut m = Message::text(Role::User, INSTRUCTIONS);
    m.extra.insert(SOURCE_KEY.into(), json!(TRIGGER));
    m
}

/// The opaque content of the compaction item for `summary`.
pub fn encode(summary: &str) -> String {
    format!("{CONTENT_PREFIX}{summary}")
}

/// The summary a compaction item's content holds, when Polar made it.
pub fn decode(content: &str) -> Option<&str> {
    content.strip_prefix(CONTENT_PREFIX)
}

/// The user message a compaction item Polar made expands into.
pub fn summary_message(summary: &str) -> Message {
    let mut m = Message::text(Role::User, summary);
    m.extra.insert(SOURCE_KEY.into(), json!(ITEM));
    m
}

#[cfg(test)]
#[path = "compaction_tests.rs"]
mod tests;
