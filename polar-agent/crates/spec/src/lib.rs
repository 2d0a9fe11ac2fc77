//! Task-spec types shared by the rollout server and the nodes: the agent
//! and evaluator parts of a task ([`AgentSpec`], [`EvaluatorSpec`]), the
//! runtime spec ([`runtime::RuntimeSpec`]), the node-side policy a spec is
//! checked against ([`policy::Policy`]), the harness presets
//! ([`harness::HarnessName`]) and the [`KeyPath`] errors name.
//!
//! Pure: no I/O crate below it (the runtime spec reads its own file with
//! `std::fs` alone; the node's policy canonicalises paths with it). Tests:
//! the unit tests of [`runtime`] and [`policy`].
#![forbid(unsafe_code)]

pub mod harness;
mod key_path;
pub mod policy;
pub mod runtime;
mod task;

pub use key_path::{KeyError, KeyPath, Segment};
pub use task::{AgentSpec, EvaluatorSpec};
