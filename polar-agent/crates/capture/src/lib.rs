//! Capture of model calls: how the record of each call (`polar-record`) is
//! built from a call's parts ([`build`]), the
//! durable per-session log it is appended to ([`log`]; in `power` mode its
//! lines also go to the agent's journal, `journal` in [`frame`]s, synced
//! in groups by the syncing thread of `sync`, each agent's journal apart
//! and locked (`owners`), what a gone agent left replayed into the logs at
//! start-up by [`replay`]; its lines written by
//! [`encode`], the calls' last lines on the store's writing thread
//! (`writer`), the call's request part while the backend generates by
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
//! capture-journal/lock                 power mode: taken to make, replay
//!                                      or remove an agent's journal
//! capture-journal/<owner>/lock         held by the agent writing the journal
//! capture-journal/<owner>/<seg>.pcj    every line the agent wrote to a log
//!                                      since its last sync, as frames
//! ```
//!
//! Layering: above `polar-record` (the record itself), `polar-chat`,
//! `polar-inference` (the backend's stream a record is built from) and
//! `polar-io`; it must not know the proxy, the gateway or trajectories (the
//! proxy's capture stage calls into it). Tests: the unit tests beside each
//! module (`log_tests`, `lines_tests`, `sync_tests` with the simulated power
//! loss and journal replay, `replay_tests`, the encoders' byte-for-byte checks)
//! and the agent's `capture_e2e`, `capture_failures`, `capture_kill`.
#![forbid(unsafe_code)]

pub mod build;
pub mod encode;
pub mod frame;
mod journal;
mod lines;
pub mod log;
mod owners;
pub mod part;
pub mod replay;
mod session;
mod stats;
pub mod store;
mod sync;
pub mod tokens_json;
mod worker;
mod writer;

pub use journal::{DEFAULT_JOURNAL_BYTES, JOURNAL_DIR};
pub use log::{Durability, LogError, LogProblem, parse_calls, parse_log, read_log};
pub use replay::Replayed;
pub use session::{INSTRUCTION_KEY, POLICY_VERSION_KEY, SessionInfo, SessionRegistry};
pub use stats::CaptureStats;
pub use store::{CallHook, CaptureStore, SessionLog};
pub use sync::GroupCommit;
