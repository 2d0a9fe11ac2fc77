//! Capture of model calls: each call's record (`polar-record`) built and
//! appended to its session's durable log, through one type the proxy's
//! capture stage drives, [`Recording`] (start, request, events, finish);
//! the store of all sessions' logs with their Responses-API history
//! ([`CaptureStore`]), the sessions' task and metadata ([`SessionRegistry`]),
//! counters of what the logs hold ([`CaptureStats`]), and the journal that
//! makes a record survive a power loss in `power` mode ([`GroupCommit`],
//! replayed at start-up: [`Replayed`]). The lines' format and the log
//! reader are `polar-capture-log`'s (re-exported here: [`read_log`],
//! [`LogError`], ...).
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
//! Modules, bottom up; each imports only modules above it in this list
//! (errors come from `polar-capture-log`):
//!
//! 1. `dir` (a directory's `fsync`), `worker` (a thread with a bell),
//!    [`frame`] (the journal's frames);
//! 2. `owners` (each agent's journal directory, locked), `journal` (its
//!    segments), `sync` (the syncing thread: group commit);
//! 3. `log` (a log file appended to, one write per line, made durable per
//!    [`Durability`]), `writer` (the store's writing thread), `replay`
//!    (what a gone agent's journal holds, put back at start-up);
//! 4. `session`, `stats`, `build` (a record from its draft and what the
//!    backend produced);
//! 5. `store` (the sessions' open logs);
//! 6. `part` (a call's request part written while the backend generates),
//!    `ahead` (where a call's big parts are while it runs);
//! 7. `recording` ([`Recording`]).
//!
//! Layering: above `polar-capture-log`, `polar-record`, `polar-chat`,
//! `polar-inference` (the backend's stream a record is built from) and
//! `polar-io`; it must not know the proxy, the gateway or trajectories.
//! Tests: the unit tests beside each module (`log_tests`, `sync_tests` with
//! the simulated power loss and journal replay, `replay_tests`,
//! `recording`'s own) and the agent's `capture_e2e`, `capture_failures`,
//! `capture_kill`.
#![forbid(unsafe_code)]

mod dir;
pub mod frame;
mod worker;

mod journal;
mod owners;
mod sync;

mod log;
mod replay;
mod writer;

mod build;
mod session;
mod stats;

mod store;

mod ahead;
mod part;

mod recording;

#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;

pub use build::INLINE_REQUEST_BYTES;
pub use journal::{DEFAULT_JOURNAL_BYTES, JOURNAL_DIR};
pub use log::Durability;
pub use polar_capture_log::{
    CALLS_FILE, LogError, LogProblem, SESSION_FILE, SESSIONS_DIR, parse_calls, parse_log, read_log,
};
pub use recording::{Outcome, Recording};
pub use replay::Replayed;
pub use session::{INSTRUCTION_KEY, POLICY_VERSION_KEY, SessionInfo, SessionRegistry};
pub use stats::CaptureStats;
pub use store::{CallHook, CaptureStore, record_session_fields, session_dir};
pub use sync::GroupCommit;
