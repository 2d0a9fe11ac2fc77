//! Plumbing shared by Polar's servers, clients and stores, one copy of
//! each piece:
//!
//! - [`body`]: response bodies (a whole buffer, a channel-fed stream);
//! - [`http`]: the construction of outgoing HTTP clients;
//! - [`fs`]: atomic file writes (temporary file, fsync, rename, directory
//!   fsync);
//! - [`auth`]: constant-time comparison of tokens and keys.
//!
//! This crate sits below every other Polar crate that does I/O: it must not
//! depend on `polar-agent` or on any other Polar crate.

pub mod auth;
pub mod body;
pub mod fs;
pub mod http;
