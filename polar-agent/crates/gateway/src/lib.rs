//! The gateway's session pipeline, generic over the work it runs:
//!
//! - [`stages`]: INIT -> READY -> RUNNING -> POSTRUN with bounded pools,
//!   the READY buffer, budgets, cancellation, pause/resume (pure of I/O);
//! - [`node`]: the rollout protocol on the gateway's side (registration,
//!   heartbeats, assignments, cancellations, results), drain; `http`: its
//!   routes, status and metrics views; `tokens`: the tokens in force and
//!   their rotation;
//! - [`sim`]: simulated work (sleeps), for the rollout server's tests and
//!   benchmarks.
//!
//! The real work (harness sessions in sandboxes, evaluation, export) is the
//! node agent's (`polar-agent`'s `gateway::work`); this crate knows nothing
//! of sandboxes, eBPF or the proxy, so the rollout server tests against
//! [`sim`] without the node agent. Tests: `tests` (the stages and node
//! against scripted work).
#![forbid(unsafe_code)]

mod http;
mod node;
pub mod sim;
pub mod stages;
mod tokens;

pub use node::{Node, NodeError, NodeOptions, Progress};
pub use sim::{SimGateway, SimGatewayConfig};
pub use stages::{Stage, StageLimits, Stages, Work};
pub use tokens::{REREAD_EVERY, TokenSource};

#[cfg(test)]
mod tests;
