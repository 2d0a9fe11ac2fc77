//! The proxy's verdict on a connection's first bytes
//! (`polar_wire::sniff::verdict`) and the `Host` of a plain HTTP head: never
//! a panic; a verdict at `MAX_PEEK_LEN` bytes; waiting for the `Host` never
//! gives a verdict where not waiting gives none; hosts are lower-case and
//! not empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polar_wire::peek::MAX_PEEK_LEN;
use polar_wire::sniff::{Sniffed, http_host, verdict};

fuzz_target!(|data: &[u8]| {
    let waiting = verdict(data, true);
    let eager = verdict(data, false);
    if data.len() >= MAX_PEEK_LEN {
        assert!(waiting.is_some() && eager.is_some());
    }
    if waiting.is_some() {
        assert!(eager.is_some());
    }
    assert_ne!(waiting, Some(Sniffed::Silent));
    if let Some(host) = http_host(data) {
        assert!(!host.is_empty());
        assert_eq!(host, host.to_ascii_lowercase());
    }
});
