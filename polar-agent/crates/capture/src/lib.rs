//! Capture of model calls: the record of each call ([`record`]) and how it
//! is built from a call's parts ([`build`]), the
//! durable per-session log it is appended to ([`log`]; its lines written by
//! [`encode`], the call's request part while the backend generates by
//! [`part`], the reply's token data while it streams by [`tokens_json`],
//! read and joined by [`lines`]), the store of all
//! sessions' logs with their Responses-API history ([`store`]), the
//! sessions' task and metadata ([`session`]), and counters of what the logs
//! hold ([`stats`]).
//!
//! Layout on disk, under `agent.state_dir`:
//!
//! ```text
//! sessions/<session id>/session.json   session id, task id, metadata
//! sessions/<session id>/calls.jsonl    one CompletionRecord per call: a whole
//!                                      line, or a request part and, later,
//!                                      the call's completion
//! ```

pub mod build;
pub mod encode;
pub mod lines;
pub mod log;
pub mod part;
pub mod session;
pub mod stats;
pub mod store;
pub mod tokens_json;

pub use log::{Durability, LogError, LogProblem, parse_calls, parse_log, read_log};
pub use session::{SessionInfo, SessionRegistry};
pub use stats::CaptureStats;
pub use store::{CaptureStore, SessionLog};
