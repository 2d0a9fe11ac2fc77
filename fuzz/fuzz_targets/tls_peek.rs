//! TLS ClientHello peeking (`polar_wire::peek::classify`), on any bytes a
//! sandbox sends first: it never panics, gives a verdict from
//! `MAX_PEEK_LEN` bytes on, returns only normalized SNI names, and keeps
//! its verdict when more bytes arrive (the proxy decides on the first one:
//! a ClientHello split across reads must read as it does whole).
#![no_main]

use libfuzzer_sys::fuzz_target;
use polar_wire::peek::{MAX_PEEK_LEN, Peek, classify, normalize_dns_name};

fuzz_target!(|data: &[u8]| {
    let whole = classify(data);
    if data.len() >= MAX_PEEK_LEN {
        assert_ne!(whole, Peek::NeedMore);
    }
    if let Peek::Tls(info) = &whole
        && let Some(sni) = &info.sni
    {
        assert_eq!(normalize_dns_name(sni).as_deref(), Some(sni.as_str()));
    }
    // Every prefix that already has a verdict has this one.
    let step = (data.len() / 64).max(1);
    for cut in (0..data.len()).step_by(step) {
        let early = classify(&data[..cut]);
        if early != Peek::NeedMore {
            assert_eq!(early, whole, "a verdict at {cut} bytes changed");
        }
    }
});
