//! The client side of inference: calls to the team's vLLM or SGLang
//! replicas that return token ids and logprobs with the reply (never
//! recomputed from text), streamed as the backend produces them.
//!
//! - [`config`]: [`BackendConfig`] (serde, `deny_unknown_fields`);
//! - [`pool`]: replicas, session affinity, health, pause/resume, stats;
//! - [`request`]: the normalized request as backend JSON; [`wire`]: the
//!   same body serialized directly (what is sent);
//! - [`client`]: [`Client::chat`], retries only before a replica was reached;
//!   [`Client::count_tokens`] with [`tokenize`] (the backend's tokenizer);
//! - [`stream`]: [`ChatStream`] of [`StreamEvent`](polar_chat::StreamEvent)s
//!   with [`Tokens`](polar_chat::Tokens), timings and backend facts;
//! - `decode`: reply parsing (the SSE framing is [`polar_sse`]).
//! - `faithful` and `token_in`: with `model_dir`, prompts rendered here
//!   with the model's own files and sent token-in, each session's chains
//!   kept ([`polar_faithful`]); `guided`: constrained output (structured
//!   output, forced tool choices) on the token-in endpoints.
//!
//! vLLM is called with `stream: true` and `return_token_ids`, so events reach
//! the consumer as they are generated. SGLang returns ids only without
//! streaming: its reply is read whole and its events replayed.
//!
//! Layering: above `polar-chat`, `polar-json`, `polar-sse`, `polar-io`,
//! `polar-template` and `polar-faithful`;
//! it must not know capture, the proxy or the mock. Tests: the unit tests
//! beside `decode`, `request`, `wire`, `config`; `tests/escaped_text.rs`;
//! and the client against the real mock backend in `polar-mock`'s
//! `tests/inference/` (the mock depends on this crate, so those tests live
//! there).
#![forbid(unsafe_code)]

mod client;
mod config;
mod decode;
mod error;
mod faithful;
mod guided;
mod overflow;
mod pool;
pub mod request;
pub mod stream;
mod token_in;
pub mod tokenize;
pub mod wire;

pub use client::{Client, needs_constrained_decoding};
pub use config::{
    BackendConfig, Dialect, ReasoningField, SamplingMode, SamplingOverrides, SamplingPolicy,
};
pub use error::InferenceError;
pub use overflow::{ContextOverflow, context_overflow};
pub use polar_faithful::Serving;
pub use pool::{HEALTH_GRACE, Pool, PoolStats, ReplicaStats};
pub use stream::failover::Resumption;
pub use stream::{BackendInfo, ChatStream, Completed, Timings};
