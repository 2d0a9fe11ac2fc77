//! The CA's name constraints: the spec given by the routing rules (exact
//! hosts, `*.suffix` patterns, IP ranges), its normalised form (the permitted
//! subtrees written in the certificate), the check the leaf issuer applies
//! before issuing, and the parsing of those constraints back out of a CA
//! certificate.
//!
//! Subtree semantics follow RFC 5280: a DNS subtree `x.com` permits `x.com`
//! and every name below it, so both `x.com` and `*.x.com` become the subtree
//! `x.com`. When no IP range is given, every IPv4 and IPv6 address is
//! excluded, since a certificate with only DNS subtrees leaves IP SANs
//! unconstrained.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rcgen::{CidrSubnet, GeneralSubtree, NameConstraints};
use time::OffsetDateTime;
use x509_parser::extensions::GeneralName;

use polar_wire::peek::normalize_dns_name;

/// Errors in a name-constraints spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintsError {
    /// A host pattern is neither an exact DNS name nor `*.` followed by one.
    #[error("invalid host pattern {0:?}: expected `host.example` or `*.example`")]
    InvalidDnsPattern(String),
    /// An IP range has a prefix longer than its address.
    #[error("invalid IP range {addr}/{prefix}")]
    InvalidIpRange { addr: IpAddr, prefix: u8 },
    /// Without a DNS subtree, DNS names would be unconstrained.
    #[error("name constraints need at least one DNS host")]
    NoDnsHost,
}

/// The names a CA may vouch for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NameConstraintsSpec {
    /// Exact hosts (`api.x.com`) or `*.suffix` patterns; both permit the
    /// name and its subdomains. Normalised form: lower-case subtree bases.
    pub dns: Vec<String>,
    /// Permitted IP ranges as (address, prefix length), e.g. `(127.0.0.0, 8)`.
    pub ip_ranges: Vec<(IpAddr, u8)>,
}

impl NameConstraintsSpec {
    /// Validates and normalises: DNS patterns become lower-case subtree
    /// bases, IP addresses are masked to their prefix; both sorted, deduped.
    pub fn normalized(&self) -> Result<Self, ConstraintsError> {
        let mut dns = Vec::with_capacity(self.dns.len());
        for pattern in &self.dns {
            let trimmed = pattern.trim();
            let base = trimmed.strip_prefix("*.").unwrap_or(trimmed);
            let base = base.strip_suffix('.').unwrap_or(base);
            let base = normalize_dns_name(base)
                .ok_or_else(|| ConstraintsError::InvalidDnsPattern(pattern.clone()))?;
            dns.push(base);
        }
        if dns.is_empty() {
            return Err(ConstraintsError::NoDnsHost);
        }
        dns.sort();
        dns.dedup();
        let mut ip_ranges = Vec::with_capacity(self.ip_ranges.len());
        for &(addr, prefix) in &self.ip_ranges {
            let masked =
                mask(addr, prefix).ok_or(ConstraintsError::InvalidIpRange { addr, prefix })?;
            ip_ranges.push((masked, prefix));
        }
        ip_ranges.sort();
        ip_ranges.dedup();
        Ok(Self { dns, ip_ranges })
    }

    /// Whether a DNS name falls in a permitted subtree (on a normalised spec).
    pub fn permits_dns(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        self.dns.iter().any(|base| {
            name == *base
                || name
                    .strip_suffix(base.as_str())
                    .is_some_and(|head| head.ends_with('.'))
        })
    }

    /// Whether an IP address falls in a permitted range (on a normalised spec).
    pub fn permits_ip(&self, ip: IpAddr) -> bool {
        self.ip_ranges
            .iter()
            .any(|&(net, prefix)| mask(ip, prefix) == Some(net))
    }

    /// The extension rcgen writes (critical) into the CA certificate.
    pub(crate) fn to_rcgen(&self) -> NameConstraints {
        let mut permitted: Vec<GeneralSubtree> = self
            .dns
            .iter()
            .map(|base| GeneralSubtree::DnsName(base.clone()))
            .collect();
        permitted.extend(self.ip_ranges.iter().map(|&(addr, prefix)| {
            GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(addr, prefix))
        }));
        let excluded = if self.ip_ranges.is_empty() {
            vec![
                GeneralSubtree::IpAddress(CidrSubnet::from_v4_prefix([0; 4], 0)),
                GeneralSubtree::IpAddress(CidrSubnet::from_v6_prefix([0; 16], 0)),
            ]
        } else {
            Vec::new()
        };
        NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: excluded,
        }
    }
}

/// `addr` with the bits past `prefix` cleared; `None` if the prefix is too long.
fn mask(addr: IpAddr, prefix: u8) -> Option<IpAddr> {
    match addr {
        IpAddr::V4(v4) => {
            let bits = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            (prefix <= 32).then(|| IpAddr::V4(Ipv4Addr::from(u32::from(v4) & bits)))
        }
        IpAddr::V6(v6) => {
            let bits = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            (prefix <= 128).then(|| IpAddr::V6(Ipv6Addr::from(u128::from(v6) & bits)))
        }
    }
}

/// Prefix length of a contiguous network mask; `None` if not contiguous.
fn prefix_len(mask: &[u8]) -> Option<u8> {
    let bits = mask
        .iter()
        .flat_map(|byte| (0..8).rev().map(move |i| byte >> i & 1 == 1));
    let leading = bits.take_while(|&bit| bit).count();
    let total: usize = mask.iter().map(|byte| byte.count_ones() as usize).sum();
    if leading == total {
        u8::try_from(leading).ok()
    } else {
        None
    }
}

/// What the CA needs from its certificate.
pub(crate) struct ParsedCaCert {
    pub(crate) spki: Vec<u8>,
    pub(crate) constraints: NameConstraintsSpec,
    pub(crate) subject: String,
    pub(crate) not_before: OffsetDateTime,
    pub(crate) not_after: OffsetDateTime,
}

/// Parses a CA certificate, refusing one that is not a CA or carries no
/// name constraints. The error is a reason for the caller to wrap.
pub(crate) fn parse_ca_cert(der: &[u8]) -> Result<ParsedCaCert, String> {
    let (_, x509) =
        x509_parser::parse_x509_certificate(der).map_err(|e| format!("not X.509: {e}"))?;
    if !x509.is_ca() {
        return Err("not a CA certificate".to_owned());
    }
    let nc = x509
        .name_constraints()
        .map_err(|e| format!("bad name constraints: {e}"))?
        .ok_or("no name constraints: refusing an unconstrained CA")?;
    let mut constraints = NameConstraintsSpec::default();
    for subtree in nc.value.permitted_subtrees.iter().flatten() {
        match &subtree.base {
            GeneralName::DNSName(name) => constraints.dns.push(name.to_ascii_lowercase()),
            GeneralName::IPAddress(bytes) => {
                let (addr, mask) = match bytes.len() {
                    8 => {
                        let (a, m) = bytes.split_at(4);
                        let a: [u8; 4] = a.try_into().map_err(|_| "bad IP subtree")?;
                        (IpAddr::from(a), m)
                    }
                    32 => {
                        let (a, m) = bytes.split_at(16);
                        let a: [u8; 16] = a.try_into().map_err(|_| "bad IP subtree")?;
                        (IpAddr::from(a), m)
                    }
                    _ => return Err("bad IP subtree length".to_owned()),
                };
                let prefix = prefix_len(mask).ok_or("non-contiguous IP subtree mask")?;
                constraints.ip_ranges.push((addr, prefix));
            }
            _ => {}
        }
    }
    if constraints.dns.is_empty() {
        return Err("no permitted DNS subtree: refusing an unconstrained CA".to_owned());
    }
    Ok(ParsedCaCert {
        spki: x509.public_key().raw.to_vec(),
        constraints,
        subject: x509.subject().to_string(),
        not_before: x509.validity().not_before.to_datetime(),
        not_after: x509.validity().not_after.to_datetime(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn patterns_normalise_to_subtrees() {
        let spec = NameConstraintsSpec {
            dns: vec![
                "*.OpenAI.com".into(),
                "api.anthropic.com.".into(),
                "openai.com".into(),
            ],
            ip_ranges: vec![(ip("127.1.2.3"), 8), (ip("fd00::1"), 64)],
        }
        .normalized()
        .unwrap();
        assert_eq!(spec.dns, vec!["api.anthropic.com", "openai.com"]);
        assert_eq!(
            spec.ip_ranges,
            vec![(ip("127.0.0.0"), 8), (ip("fd00::"), 64)]
        );
    }

    #[test]
    fn invalid_specs_are_refused() {
        let bad = |dns: &[&str], ip_ranges| {
            NameConstraintsSpec {
                dns: dns.iter().map(|s| (*s).to_owned()).collect(),
                ip_ranges,
            }
            .normalized()
            .unwrap_err()
        };
        assert_eq!(bad(&[], vec![]), ConstraintsError::NoDnsHost);
        assert!(matches!(
            bad(&["a.*.com"], vec![]),
            ConstraintsError::InvalidDnsPattern(_)
        ));
        assert!(matches!(
            bad(&["10.0.0.1"], vec![]),
            ConstraintsError::InvalidDnsPattern(_)
        ));
        assert!(matches!(
            bad(&["x.com"], vec![(ip("10.0.0.0"), 33)]),
            ConstraintsError::InvalidIpRange { .. }
        ));
    }

    #[test]
    fn permits_follows_subtree_semantics() {
        let spec = NameConstraintsSpec {
            dns: vec!["api.anthropic.com".into(), "*.googleapis.com".into()],
            ip_ranges: vec![(ip("127.0.0.0"), 8)],
        }
        .normalized()
        .unwrap();
        assert!(spec.permits_dns("api.anthropic.com"));
        assert!(spec.permits_dns("API.Anthropic.com"));
        assert!(spec.permits_dns("eu.api.anthropic.com"));
        assert!(spec.permits_dns("generativelanguage.googleapis.com"));
        assert!(!spec.permits_dns("anthropic.com"));
        assert!(!spec.permits_dns("evilapi.anthropic.com.example"));
        assert!(!spec.permits_dns("xapi.anthropic.com"));
        assert!(spec.permits_ip(ip("127.0.0.1")));
        assert!(!spec.permits_ip(ip("10.0.0.1")));
        assert!(!spec.permits_ip(ip("::1")));
    }

    #[test]
    fn prefix_len_needs_contiguous_mask() {
        assert_eq!(prefix_len(&[255, 0, 0, 0]), Some(8));
        assert_eq!(prefix_len(&[255, 255, 240, 0]), Some(20));
        assert_eq!(prefix_len(&[0; 16]), Some(0));
        assert_eq!(prefix_len(&[255; 16]), Some(128));
        assert_eq!(prefix_len(&[255, 0, 255, 0]), None);
        assert_eq!(prefix_len(&[0b1011_0000, 0, 0, 0]), None);
    }
}
