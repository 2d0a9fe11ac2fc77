//! The names of what a session's capture leaves under `agent.state_dir`:
//! `sessions/<session id>/` holding `calls.jsonl` (the log) and
//! `session.json` (the session's task and metadata).

/// The directory of all sessions' directories, under `agent.state_dir`.
pub const SESSIONS_DIR: &str = "sessions";

/// Name of the record file inside a session directory.
pub const CALLS_FILE: &str = "calls.jsonl";

/// Name of the session's task and metadata file inside its directory.
pub const SESSION_FILE: &str = "session.json";
