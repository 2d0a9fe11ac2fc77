//! Harness sessions on this node: one session end to end on a runtime
//! ([`run`]) and base-URL mode from inside a sandbox ([`base_url`]). The
//! presets and `[harness.NAME]` harnesses they run are `polar-harness`'s.

pub mod base_url;
pub mod run;
