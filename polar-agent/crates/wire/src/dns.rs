//! DNS messages, as much as a stub resolver's questions need: parse one
//! question, build an answer with A/AAAA records, NODATA or an error code.
//! Pure and I/O-free; never panics on any input.

/// A parsed question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    /// Query id.
    pub id: u16,
    /// Recursion desired bit, echoed back.
    pub rd: bool,
    /// The name, lower-case, without the trailing dot.
    pub name: String,
    /// QTYPE.
    pub qtype: u16,
    /// QCLASS.
    pub qclass: u16,
    /// The question section as received, echoed in the answer.
    raw_question: Vec<u8>,
}

/// QTYPE A.
pub const TYPE_A: u16 = 1;
/// QTYPE AAAA.
pub const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;

/// Response codes used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rcode {
    /// Success (possibly with no records: NODATA).
    NoError = 0,
    /// Malformed query.
    FormErr = 1,
    /// Resolution failed.
    ServFail = 2,
    /// The name does not exist.
    NxDomain = 3,
    /// Not supported.
    NotImp = 4,
    /// Refused by policy.
    Refused = 5,
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

/// Parses a standard query with exactly one question. `None` for anything
/// that is not one (responses, truncated or malformed messages).
pub fn parse_query(msg: &[u8]) -> Option<Question> {
    let id = u16_at(msg, 0)?;
    let flags = u16_at(msg, 2)?;
    let qdcount = u16_at(msg, 4)?;
    let is_response = flags & 0x8000 != 0;
    let opcode = (flags >> 11) & 0xf;
    if is_response || opcode != 0 || qdcount != 1 {
        return None;
    }
    let mut i = 12;
    let mut labels: Vec<String> = Vec::new();
    let mut total = 0usize;
    loop {
        let len = usize::from(*msg.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        // Compression pointers and extended labels do not occur in questions.
        if len > 63 {
            return None;
        }
        let label = msg.get(i..i + len)?;
        total += len + 1;
        if total > 255 {
            return None;
        }
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16_at(msg, i)?;
    let qclass = u16_at(msg, i + 2)?;
    let raw_question = msg.get(12..i + 4)?.to_vec();
    Some(Question {
        id,
        rd: flags & 0x0100 != 0,
        name: labels.join("."),
        qtype,
        qclass,
        raw_question,
    })
}

/// Records of an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Records {
    /// IPv4 addresses (for A questions).
    V4(Vec<std::net::Ipv4Addr>),
    /// IPv6 addresses (for AAAA questions).
    V6(Vec<std::net::Ipv6Addr>),
    /// No records.
    None,
}

/// Builds the response to `q`.
pub fn build_response(q: &Question, rcode: Rcode, records: &Records, ttl: u32) -> Vec<u8> {
    let rdatas: Vec<Vec<u8>> = if q.qclass != CLASS_IN {
        Vec::new()
    } else {
        match records {
            Records::V4(ips) if q.qtype == TYPE_A => {
                ips.iter().map(|ip| ip.octets().to_vec()).collect()
            }
            Records::V6(ips) if q.qtype == TYPE_AAAA => {
                ips.iter().map(|ip| ip.octets().to_vec()).collect()
            }
            _ => Vec::new(),
        }
    };
    let mut out = Vec::with_capacity(12 + q.raw_question.len() + rdatas.len() * 28);
    out.extend_from_slice(&q.id.to_be_bytes());
    // QR, AA, RD echoed, RA.
    let flags: u16 = 0x8000 | 0x0400 | if q.rd { 0x0100 } else { 0 } | 0x0080 | rcode as u16;
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    let ancount = u16::try_from(rdatas.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&ancount.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&q.raw_question);
    for rdata in rdatas.iter().take(usize::from(ancount)) {
        // Name: a pointer to the question's name at offset 12.
        out.extend_from_slice(&0xc00cu16.to_be_bytes());
        out.extend_from_slice(&q.qtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(rdata);
    }
    out
}

/// A FORMERR reply for a message that has at least an id, else nothing.
pub fn formerr(msg: &[u8]) -> Option<Vec<u8>> {
    let id = msg.get(0..2)?;
    let mut out = id.to_vec();
    out.extend_from_slice(&(0x8000u16 | Rcode::FormErr as u16).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            m.push(label.len() as u8);
            m.extend_from_slice(label.as_bytes());
        }
        m.push(0);
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&1u16.to_be_bytes());
        m
    }

    #[test]
    fn parses_and_answers_a() {
        let q = parse_query(&query("API.Anthropic.com", TYPE_A)).unwrap();
        assert_eq!(q.name, "api.anthropic.com");
        assert_eq!(q.id, 0x1234);
        let r = build_response(
            &q,
            Rcode::NoError,
            &Records::V4(vec!["127.100.0.1".parse().unwrap()]),
            5,
        );
        assert_eq!(&r[0..2], &[0x12, 0x34]);
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "one answer");
        assert_eq!(&r[r.len() - 4..], &[127, 100, 0, 1]);
    }

    #[test]
    fn aaaa_for_v4_only_records_is_nodata() {
        let q = parse_query(&query("x.com", TYPE_AAAA)).unwrap();
        let r = build_response(
            &q,
            Rcode::NoError,
            &Records::V4(vec!["127.0.0.1".parse().unwrap()]),
            5,
        );
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 0);
        assert_eq!(r[3] & 0xf, 0);
    }

    #[test]
    fn nxdomain_code() {
        let q = parse_query(&query("denied.example", TYPE_A)).unwrap();
        let r = build_response(&q, Rcode::NxDomain, &Records::None, 5);
        assert_eq!(r[3] & 0xf, 3);
    }

    #[test]
    fn never_panics_on_garbage_or_truncation() {
        let full = query("api.openai.com", TYPE_A);
        for n in 0..full.len() {
            assert!(parse_query(&full[..n]).is_none(), "truncated at {n}");
        }
        let mut seed = 0x9e37_79b9_u32;
        for len in 0..300 {
            let msg: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed as u8
                })
                .collect();
            let _ = parse_query(&msg);
            let _ = formerr(&msg);
        }
    }
}
