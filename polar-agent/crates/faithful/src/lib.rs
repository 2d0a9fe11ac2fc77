//! Token-faithful prompts: Polar renders a call's prompt with the model's
//! own chat template and tokenizer and keeps, per session and chain, the
//! exact ids the model saw and generated, so that a call that continues a
//! chain is sent as those ids plus the ids of the new messages only. The
//! sample a chain makes is then one sequence the model saw as it is, with
//! no re-rendered history in it (a server that renders the template
//! itself re-renders the history differently from what was generated:
//! reasoning dropped by position, whitespace merged into one token, tool
//! arguments re-serialized).
//!
//! - [`vllm`]: vLLM's rules for the conversation a chat body's messages
//!   are to the template (what the server would have rendered);
//! - [`render`]: what this needs of the model's files ([`Renderer`]),
//!   and [`model`]: that, over `polar-template`'s model;
//! - [`window`]: the messages a call's prompt renders once its chain
//!   has shown the template renders windows of that shape as it renders
//!   the whole conversation ([`Windows`]);
//! - [`chains`]: the session's chains, the prompt of a call
//!   ([`Chains::prompt`]), how it was built ([`Origin`]) and how a call
//!   reached the backend ([`Serving`], recorded with each call).
//!
//! Pure: no I/O; the model's files are `polar-template`'s, the calls the
//! inference client's. Tests: unit and property tests here, with a small
//! ChatML renderer, and with the real templates in `polar-template`'s.
#![forbid(unsafe_code)]

pub mod chains;
pub mod model;
pub mod render;
pub mod vllm;
pub mod window;

#[cfg(test)]
mod tests;

pub use chains::{Asked, Chains, Fresh, Origin, Prompt, Serving, same_reply};
pub use render::{Conversation, RenderFailure, Renderer};
pub use window::{Window, Windows};
