//! Plumbing shared by Polar's servers, clients and stores, one copy of
//! each piece:
//!
//! - [`body`]: response bodies (a whole buffer, a channel-fed stream);
//! - [`http`]: the construction of outgoing HTTP clients;
//! - [`tls`]: the control plane's TLS (PEM files, rustls server and client
//!   configurations, peer names) and its cluster CA;
//! - [`fs`]: atomic file writes (temporary file, fsync, rename, directory
//!   fsync);
//! - [`beneath`]: files beneath a directory a sandbox controls, written
//!   and read without following what it planted (`openat2`);
//! - [`auth`]: constant-time comparison of tokens and keys;
//! - [`tasks`]: the one place background tasks are spawned, and a
//!   future's panic caught as an error ([`tasks::caught`]);
//! - [`chain`]: an error with its causes, on one line.
//!
//! This crate sits below every other Polar crate that does I/O: it must not
//! depend on `polar-agent` or on any other Polar crate.
#![forbid(unsafe_code)]

pub mod auth;
pub mod beneath;
pub mod body;
pub mod fs;
pub mod http;
pub mod tasks;
pub mod tls;

/// An error with its causes, one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_text = s.to_string();
        if !msg.contains(&s_text) {
            msg.push_str(": ");
            msg.push_str(&s_text);
        }
        src = s.source();
    }
    msg
}
