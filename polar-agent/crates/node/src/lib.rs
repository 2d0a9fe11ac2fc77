//! A node's work, between the crates that do each part and the `polar`
//! command that starts it:
//!
//! - [`agent`]: the agent's parts assembled from a validated configuration
//!   (CA, leaf issuer, DNS policy, proxy, capture store, model pipeline),
//!   its state directory and live reload;
//! - [`harness`]: one harness session end to end on a runtime, and
//!   base-URL mode from inside a sandbox;
//! - [`gateway`]: the gateway daemon's work (harness sessions for the
//!   rollout server, the judge, verdicts, attempts, retention, timeline).
//!
//! It knows nothing of the command line, installation or Slurm (the
//! `polar` command's) and prints nothing: errors go back to the caller.
#![forbid(unsafe_code)]

pub mod agent;
pub mod gateway;
pub mod harness;
