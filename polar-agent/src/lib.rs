//! Polar's node agent as a library: the `polar` binary is a thin shell over
//! [`cli::main`]. See ARCHITECTURE.md for the data path.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod agent;

pub mod cli;

pub mod gateway;
pub mod harness;
pub mod install;

pub mod metrics;

pub mod slurm;

pub mod telemetry;
