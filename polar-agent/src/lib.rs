//! Polar's node agent as a library: the `polar` binary is a thin shell over
//! [`cli::main`]. What is left here is the wiring: the command line, install
//! and uninstall, Slurm jobs, the agent's metrics page and logging set-up;
//! each concern it starts lives in its own crate (`polar-node` for the
//! node's work, `polar-proxy`, `polar-sandbox`, `polar-redirect`,
//! `polar-tls`, `polar-harness`, ...). See ARCHITECTURE.md for the data path.
#![forbid(unsafe_code)]

pub mod cli;
pub(crate) mod install;
pub mod metrics;
pub(crate) mod slurm;
pub(crate) mod telemetry;
