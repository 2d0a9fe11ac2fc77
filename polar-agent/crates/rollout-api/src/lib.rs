//! The rollout API from both sides, shared by the rollout server, the
//! gateway nodes and `polar submit`: the wire types (re-exported from
//! `polar-rollout-types`), the checks a task or an assignment passes
//! ([`validate`], [`session_spec`]: the server runs them on submission, the
//! gateway again on arrival), the client ([`client`]) and its event stream
//! reader ([`sse`]), and the HTTP plumbing both servers use ([`http`];
//! [`serve`]: the accept loop with its header-read timeout, connection
//! cap and TLS; [`tls`]: the TLS settings both servers and their clients
//! share, and the plain-HTTP rule).
//!
//! Below it: the spec types, the evaluators (for checking their options)
//! and the I/O plumbing; never the node agent or the server. Tests: the
//! unit tests of [`validate`], and the rollout server's API tests.
#![forbid(unsafe_code)]

pub mod client;
pub mod http;
pub mod route;
pub mod serve;
pub mod session_spec;
pub mod sse;
pub mod tls;
pub mod validate;

pub use client::{ClientError, RolloutClient};
pub use polar_rollout_types::*;
