//! Tests of the trajectory builders: a tiny ChatML-like renderer and
//! session simulator (`kit`), exact scenario tests and property tests.

mod checker;
mod compaction;
pub(crate) mod kit;
mod labels;
mod props;
mod qwen3_drift;
mod retry_splices;
mod roles;
mod scenarios;
mod serde_compat;
mod session;
