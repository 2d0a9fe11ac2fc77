//! DNS questions a sandbox sends (`polar_wire::dns`): parsing never
//! panics; an answer built for a parsed question is a response (not read
//! as a question again) with the question's id and the rcode asked for; a
//! FORMERR reply to any message is a response too.
#![no_main]

use std::net::{Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use polar_wire::dns::{Rcode, Records, build_response, formerr, parse_query};

fuzz_target!(|data: &[u8]| {
    if let Some(reply) = formerr(data) {
        assert!(reply.len() >= 12);
        assert!(parse_query(&reply).is_none());
        assert_eq!(reply[..2], data[..2]);
    }
    let Some(q) = parse_query(data) else {
        return;
    };
    let v4 = data
        .chunks_exact(4)
        .take(4)
        .map(|c| Ipv4Addr::new(c[0], c[1], c[2], c[3]));
    let v6 = data.chunks_exact(16).take(2).map(|c| {
        let mut b = [0u8; 16];
        b.copy_from_slice(c);
        Ipv6Addr::from(b)
    });
    for (rcode, records) in [
        (Rcode::NoError, Records::V4(v4.collect())),
        (Rcode::NoError, Records::V6(v6.collect())),
        (Rcode::NoError, Records::None),
        (Rcode::NxDomain, Records::None),
        (Rcode::ServFail, Records::None),
    ] {
        let reply = build_response(&q, rcode, &records, 5);
        assert!(reply.len() >= 12);
        assert_eq!(u16::from_be_bytes([reply[0], reply[1]]), q.id);
        assert_eq!(reply[3] & 0xf, rcode as u8);
        assert!(
            parse_query(&reply).is_none(),
            "an answer read as a question"
        );
    }
});
