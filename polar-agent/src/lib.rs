//! Polar's node agent as a library: the `polar` binary is a thin shell over
//! [`cli::main`]. See ARCHITECTURE.md for the data path.

pub mod agent;
pub mod capture;
pub mod chat;
pub mod cli;
pub mod config;
pub mod dns;
pub mod evaluate;
pub mod export;
pub mod gateway;
pub mod harness;
pub mod ids;
pub mod inference;
pub mod install;
pub mod json_doc;
pub mod listener;
pub mod metrics;
pub mod mock;
pub mod netns;
pub mod provider;
pub mod proxy;
pub mod redirect;
pub mod rollout;
pub mod runtime;
pub mod sandbox;
pub mod signals;
pub mod tasks;
pub mod telemetry;
pub mod tls;
pub mod trajectory;
