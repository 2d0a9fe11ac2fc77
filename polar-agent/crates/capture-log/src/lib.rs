//! The capture log's format, both ways: a call's
//! [`CompletionRecord`](polar_record::CompletionRecord) as the lines of its
//! session's `calls.jsonl` ([`encode`], its reply's token data serialized
//! while it streams by [`ReplyTokensJson`]), and the reader that joins them
//! back into records ([`read_log`], [`parse_calls`], [`parse_log`]), with
//! the errors of both ([`LogError`], [`LogProblem`]) and the names of the
//! files a session's capture leaves ([`CALLS_FILE`], [`SESSION_FILE`],
//! [`SESSIONS_DIR`]).
//!
//! Lines of a log, JSON each, one `write` each (`polar-capture` appends
//! them):
//!
//! - a **whole record**: the record as one line (no `part` field). Calls
//!   whose reply came whole from the backend, calls that failed before the
//!   backend's first event, and every fallback.
//! - a **request part** (`{"part":"request",...}`): the call's big fields
//!   (`native_request`, `request`, and `prompt_token_ids` when known),
//!   appended while the backend generates, off the reply's path.
//! - a **completion** (`{"part":"completion",...}`): the record's other
//!   fields, appended when the call ends. Its big fields are in the request
//!   part with the same `call_id`, earlier in the file; a
//!   `prompt_token_ids` of its own (an array, or `null` for none) replaces
//!   the part's.
//!
//! Layering: above `polar-record` and `polar-chat` only; no async runtime,
//! no inference client, no writer. `polar-capture` (the agent's writer)
//! builds on it; `polar-export` and the rollout server read logs with it
//! alone. Modules, each importing only those before it: `error`,
//! `layout`, `tokens_json`, `lines` (one line's kind, and the join of a
//! call's two lines), `encode`, `read`, and `fixture` (a sample record and
//! its two lines, for tests; feature `fixture`). Tests beside each (`lines_tests` with the
//! property test that any record written in two parts reads back equal,
//! `read_tests`, the encoders' byte-for-byte checks) and `tests/fuzz_seeds`.
#![forbid(unsafe_code)]

mod error;
mod layout;
mod lines;
mod read;

pub mod encode;
pub mod tokens_json;

#[cfg(any(test, feature = "fixture"))]
pub mod fixture;

pub use encode::{encode_line, encode_two_parts};
pub use error::{LogError, LogProblem};
pub use layout::{CALLS_FILE, SESSION_FILE, SESSIONS_DIR};
pub use read::{parse_calls, parse_log, read_log};
pub use tokens_json::ReplyTokensJson;
