//! A gateway node (`polar agent --config FILE`, one per training node): the
//! agent (redirect, proxy, capture) plus the session pipeline that runs the
//! rollout server's sessions on it.
//!
//! - `config`: the `[gateway]` table;
//! - `stages`: INIT -> READY -> RUNNING -> POSTRUN with bounded pools, the
//!   READY buffer, budgets, cancellation, pause/resume (generic over the
//!   work, pure of I/O);
//! - `node`: the rollout protocol on the gateway's side (registration,
//!   heartbeats, assignments, cancellations, results), drain; `http`: its
//!   routes, status and metrics views;
//! - `spec`: the checked harness, agent options, runtime and evaluator of
//!   a session (also checked by the rollout server at submission);
//! - `work`: the stages' real work: harness sessions, evaluation,
//!   trajectory export; `attempts`: an earlier attempt's directories moved
//!   apart before a newer attempt starts; `retention`: a session's
//!   directories removed once exported, failed ones kept for a while
//!   under a disk ceiling;
//! - `judge`: the judge model of the `llm_judge` evaluator (clients of its
//!   own, calls recorded in the session's `judge.jsonl`) and the
//!   transcript it reads;
//! - `verdict`: what a finished session amounts to (pure); `timeline`: the
//!   calls of a session as the result's `stats.calls` lists them (pure);
//!   `live`: the running sessions' calls as they end, reported with their
//!   progress (the dashboard's live timeline);
//! - `sim`: simulated work (sleeps) for tests and benchmarks.

mod attempts;
pub mod config;
pub(crate) mod judge;
mod live;
pub mod retention;
mod timeline;
mod verdict;
pub mod work;

pub use config::{GatewayConfig, GatewayConfigError};
pub use polar_gateway::{Node, NodeError, NodeOptions, Progress, Stage, StageLimits, Stages, Work};
