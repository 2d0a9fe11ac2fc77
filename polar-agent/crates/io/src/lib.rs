//! Plumbing shared by Polar's servers and clients: response bodies
//! ([`body`]) and the one place background tasks are spawned ([`tasks`]).
//!
//! This crate sits below every other Polar crate that does I/O and depends
//! on no Polar crate.

pub mod body;
pub mod tasks;
