//! The record's internals the agent's capture benchmark times one by one
//! (`cargo bench -p polar-agent --bench capture`): a record built from its
//! draft, a log file appended to with and without the journal. Only with
//! the `bench` feature, which only that benchmark turns on; not an API.

pub use crate::build::{Draft, Produced, call_id, keep_event, now_ms};
pub use crate::log::{Journaled, LogFile};
