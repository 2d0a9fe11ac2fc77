//! A model's own chat template and tokenizer, in Rust: what vLLM and
//! SGLang do to a chat request before the model sees it, done the way
//! `transformers.apply_chat_template` does it, byte for byte and id for id.
//!
//! - [`ModelFiles`] names a model's files (a model directory, or each
//!   file); [`Model::load`] reads and checks them once (`load`).
//! - [`Model::render`] renders a [`RenderInput`] with the template,
//!   compiled once at load, in Hugging Face's Jinja environment (`env`,
//!   `python`, `strftime`); [`Model::encode`], [`Model::render_ids`],
//!   [`Model::decode`] and [`Model::token_id`] use the model's tokenizer;
//!   [`Model::stop_ids`] and [`Model::context_len`] say where generation
//!   ends.
//!
//! Pure: no network, no async; files are read only by [`Model::load`].
//! Messages are Hugging Face's (as vLLM passes them to templates: tool
//! call `arguments` as objects); turning Polar's normalized chat request
//! into them is the caller's.
//!
//! Checked against `transformers` (a Python environment `cargo xtask
//! chat-models` makes): `tests/differential.rs` renders, tokenizes and
//! decodes hundreds of conversations per real model (Qwen3, Qwen3-Coder,
//! DeepSeek-V3 and V3.1, Llama 3, gpt-oss) and compares text and ids;
//! `tests/templates.rs` renders every template of llama.cpp's collection
//! (about 70 models' own templates); `tests/environment.rs` the Jinja
//! features one by one.
//!
//! Two differences from Jinja2 remain, both in conversations or templates
//! transformers refuses or mangles: iterating `none` renders nothing where
//! Jinja2 raises a `TypeError` (minijinja has no hook for it), and
//! `"text" | safe + value` leaves `value` as it is where Jinja2's `Markup`
//! HTML-escapes it. Python's `repr` of a string escapes unassigned code
//! points, which this crate prints.

#![forbid(unsafe_code)]

mod env;
mod files;
mod input;
mod load;
mod model;
mod python;
mod strftime;

pub use files::{
    CHAT_TEMPLATE, CONFIG, FilesError, GENERATION_CONFIG, ModelFiles, TOKENIZER, TOKENIZER_CONFIG,
};
pub use input::{RenderError, RenderInput};
pub use load::{LoadError, SPECIAL_TOKEN_KEYS, control_tokens};
pub use model::{Model, PromptError, Rendered, TokenizeError};
