//! The wire formats a sandbox's bytes are read in before the agent knows
//! what they are, pure and I/O-free, each never panicking on any input
//! (property-tested here, fuzzed by `fuzz/`):
//!
//! - [`peek`]: the first bytes of a connection classified: a TLS
//!   ClientHello (its SNI host name and ALPN list, reassembled across
//!   records), plain HTTP, or something else;
//! - [`sniff`]: what the proxy decides from them, with the `Host` of a
//!   plain HTTP request head;
//! - [`dns`]: DNS questions parsed and answers built, for the agent's DNS
//!   responder;
//! - [`gzip`]: gzip request bodies inflated within a limit.
//!
//! Layering: no workspace crate below it; the agent's listener, proxy,
//! TLS and DNS modules use it.
#![forbid(unsafe_code)]

pub mod dns;
pub mod gzip;
pub mod peek;
pub mod sniff;
