//! Capture of model calls: the record of each call and the durable
//! per-session log it is appended to.

pub mod record;
