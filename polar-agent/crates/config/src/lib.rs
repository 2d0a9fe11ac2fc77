//! The agent's configuration: one TOML file, validated before anything is
//! bound or loaded. Every key has an embedded default, so no file at all is
//! a valid configuration ([`Config::default`]).
//!
//! - `raw.rs`: the file as written ([`RawConfig`], serde, no unknown keys).
//! - `validated.rs`: [`Config`], built with `TryFrom<RawConfig>`, and its
//!   loading from text or a file.
//! - `harness.rs`: `[harness.NAME]`, the harnesses the operator defines
//!   ([`CustomHarness`]).
//! - `sections.rs`, `route.rs`, `host.rs`, `upstream.rs`, `cidr.rs`: the
//!   validated values and their checks; `defaults.rs`: the defaults.
//! - `rules.rs`: [`Rules`], the compiled router (connections, DNS, CA names);
//!   `live.rs`: [`LiveRules`], the rules in force, swapped on a reload.
//! - `error.rs`, `locate.rs`: [`ConfigError`] with key paths and locations.
//! - `check.rs`: [`check_file`] for `polar config check FILE`.
//! - `uids.rs`: [`UidRange`], the node's sandbox uids.
//!
//! `config/polar.example.toml` at the repository root documents every key.
#![forbid(unsafe_code)]

mod check;
mod cidr;
pub mod defaults;
mod error;
mod harness;
mod host;
mod live;
mod locate;
mod net;
mod raw;
mod route;
mod rules;
mod sections;
mod uids;
mod upstream;
mod validated;

pub use check::{Summary, check_file};
pub use cidr::Ipv4Cidr;
pub use error::{ConfigError, KeyError, KeyPath, Location, Segment};
pub use harness::{CustomHarness, PLACEHOLDERS, RawHarness};
pub use host::{DnsName, HostPattern};
pub use host::{SeenHost, normalize_seen};
pub use live::LiveRules;
pub use net::IpNet;
pub use raw::{RawAgent, RawCa, RawConfig, RawDns, RawProxy, RawRoute};
pub use route::{ActionKind, DEFAULT_PORTS, DefaultAction, ProviderHint, Route, RouteAction};
pub use rules::{Decision, DnsDecision, MatchedRule, Rules};
pub use sections::{AgentConfig, CaConfig, DnsConfig, LogFormat, ProxyConfig, SandboxConfig};
pub use uids::{DEFAULT_COUNT, DEFAULT_FIRST, MAX_UID, UidRange};
pub use upstream::{Scheme, Upstream, UpstreamHost};
pub use validated::{Config, RouteSource};
