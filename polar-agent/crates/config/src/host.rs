//! Host names and host patterns of routing rules: [`DnsName`] (a checked,
//! lower-cased DNS name) and [`HostPattern`] (exact name, `*.suffix`, or IP
//! literal), with the normalisation shared by config and routing.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// A DNS name in lower case, checked: ASCII letters, digits and hyphens,
/// labels of 1 to 63 characters that neither start nor end with a hyphen,
/// at most 253 characters, no trailing dot, a last label that is not all
/// digits (so it cannot be mistaken for an IPv4 address).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsName(Arc<str>);

impl DnsName {
    /// Checks and lower-cases `name`; the error says what is wrong.
    pub fn parse(name: &str) -> Result<Self, String> {
        check_dns_name(name)?;
        Ok(Self(Arc::from(name.to_ascii_lowercase())))
    }

    /// A name known to be valid (the built-in routes); checked by a test.
    pub(crate) fn from_static(name: &'static str) -> Self {
        Self(Arc::from(name))
    }

    /// The name, lower case.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn check_dns_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if !name.is_ascii() {
        return Err(
            "non-ASCII characters (write internationalized names in their xn-- form)".into(),
        );
    }
    if name.ends_with('.') {
        return Err("trailing dot (write the name without it)".into());
    }
    if name.len() > 253 {
        return Err("longer than 253 characters".into());
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label (two dots in a row, or a leading dot)".into());
        }
        if label.len() > 63 {
            return Err(format!("label \"{label}\" is longer than 63 characters"));
        }
        if let Some(bad) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(format!(
                "character {bad:?} is not allowed (letters, digits, '-' and '.' only)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label \"{label}\" starts or ends with a hyphen"));
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("the last label is all digits (not a valid IP address either)".into());
    }
    Ok(())
}

/// What a routing rule's `host` matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this name (`api.anthropic.com`), case-insensitively.
    Exact(DnsName),
    /// Any name strictly below this suffix: `*.example.com` holds
    /// `example.com` here and matches `a.example.com` and `a.b.example.com`,
    /// not `example.com`.
    Suffix(DnsName),
    /// Connections to this address (IPv4-mapped IPv6 addresses are stored as
    /// IPv4).
    Ip(IpAddr),
}

impl HostPattern {
    /// Parses a `host` value: `name.example`, `*.example`, an IPv4 address,
    /// or an IPv6 address with or without brackets.
    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = |why: &str| format!("{text:?} is not a valid host pattern: {why}");
        if text.is_empty() {
            return Err("must not be empty".into());
        }
        if text.chars().any(char::is_whitespace) {
            return Err(invalid("contains whitespace"));
        }
        if let Some(ip) = parse_ip_literal(text) {
            return Ok(Self::Ip(ip));
        }
        if let Some(suffix) = text.strip_prefix("*.") {
            if suffix.is_empty() {
                return Err(invalid("nothing follows \"*.\""));
            }
            if suffix.contains('*') {
                return Err(invalid(
                    "'*' is only allowed once, as the whole first label",
                ));
            }
            if parse_ip_literal(suffix).is_some() {
                return Err(invalid("a wildcard cannot apply to an IP address"));
            }
            return DnsName::parse(suffix)
                .map(Self::Suffix)
                .map_err(|why| invalid(&why));
        }
        if text.contains('*') {
            return Err(invalid(
                "'*' is only allowed as the whole first label, as in \"*.example.com\"",
            ));
        }
        if text.starts_with('[') || text.contains(':') {
            return Err(invalid("not a valid IP address (ports go in `ports`)"));
        }
        DnsName::parse(text)
            .map(Self::Exact)
            .map_err(|why| invalid(&why))
    }

    /// Whether the pattern is a name or suffix (not an IP literal).
    pub fn dns_name(&self) -> Option<&DnsName> {
        match self {
            Self::Exact(name) | Self::Suffix(name) => Some(name),
            Self::Ip(_) => None,
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(name) => write!(f, "{name}"),
            Self::Suffix(name) => write!(f, "*.{name}"),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// An IP address written bare or, for IPv6, in brackets; IPv4-mapped IPv6
/// addresses come back as IPv4.
pub(crate) fn parse_ip_literal(text: &str) -> Option<IpAddr> {
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    let ip: IpAddr = bare.parse().ok()?;
    if text.starts_with('[') && ip.is_ipv4() {
        return None;
    }
    Some(ip.to_canonical())
}

/// A host as seen on a connection (SNI, `Host` header, DNS question),
/// normalised for matching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeenHost<'a> {
    /// A name, lower case, without its trailing dot.
    Name(Cow<'a, str>),
    /// An IP literal.
    Ip(IpAddr),
}

/// Normalises a host seen on the wire (without port): strips one trailing
/// dot, recognises IP literals (bare or bracketed), lower-cases names;
/// `None` when nothing is left.
pub fn normalize_seen(host: &str) -> Option<SeenHost<'_>> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    if let Some(ip) = parse_ip_literal(host) {
        return Some(SeenHost::Ip(ip));
    }
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Some(SeenHost::Name(Cow::Owned(host.to_ascii_lowercase())))
    } else {
        Some(SeenHost::Name(Cow::Borrowed(host)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ok(text: &str) -> HostPattern {
        match HostPattern::parse(text) {
            Ok(pattern) => pattern,
            Err(why) => panic!("{text:?} should parse: {why}"),
        }
    }

    fn err(text: &str) -> String {
        match HostPattern::parse(text) {
            Ok(pattern) => panic!("{text:?} should fail, got {pattern:?}"),
            Err(why) => why,
        }
    }

    #[test]
    fn exact_names_are_lower_cased() {
        assert_eq!(
            ok("API.Anthropic.com"),
            HostPattern::Exact(DnsName::from_static("api.anthropic.com"))
        );
        assert_eq!(ok("localhost").to_string(), "localhost");
        assert_eq!(
            ok("xn--bcher-kva.example").to_string(),
            "xn--bcher-kva.example"
        );
    }

    #[test]
    fn wildcards_hold_their_suffix() {
        assert_eq!(
            ok("*.AliyunCS.com"),
            HostPattern::Suffix(DnsName::from_static("aliyuncs.com"))
        );
        assert_eq!(ok("*.com").to_string(), "*.com");
    }

    #[test]
    fn ip_literals() {
        assert_eq!(
            ok("10.1.2.3"),
            HostPattern::Ip(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)))
        );
        assert_eq!(ok("::1"), HostPattern::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(
            ok("[::1]"),
            HostPattern::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST))
        );
        assert_eq!(
            ok("::ffff:10.0.0.1"),
            HostPattern::Ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))
        );
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!(err(""), "must not be empty");
        assert_eq!(
            err("*."),
            "\"*.\" is not a valid host pattern: nothing follows \"*.\""
        );
        for bad in [
            "*",
            "*.",
            "a.*.b",
            "*.*.com",
            "a*.com",
            "*com",
            "a b.com",
            " a.com",
            "a.com ",
            "a..com",
            ".a.com",
            "a.com.",
            "-a.com",
            "a-.com",
            "a_b.com",
            "bücher.de",
            "1.2.3.256",
            "1.2.3",
            "[1.2.3.4]",
            "[::1",
            "::g",
            "*.1.2.3.4",
            "a.com:443",
            "https://a.com",
        ] {
            let why = err(bad);
            assert!(!why.is_empty(), "{bad:?}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        err(&long_label);
        let long_name = vec!["a".repeat(63); 5].join(".");
        err(&long_name);
    }

    #[test]
    fn seen_hosts_are_normalised() {
        assert_eq!(
            normalize_seen("API.example.COM."),
            Some(SeenHost::Name(Cow::Borrowed("api.example.com")))
        );
        assert_eq!(
            normalize_seen("[::ffff:127.0.0.1]"),
            Some(SeenHost::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)))
        );
        assert_eq!(normalize_seen("."), None);
        assert_eq!(normalize_seen(""), None);
    }
}
