//! The `upstream` of a model route: an `http://` or `https://` base URL that
//! the model pipeline forwards to, parsed into [`Upstream`].

use std::fmt;
use std::net::IpAddr;

use super::host::{DnsName, parse_ip_literal};

/// The scheme of an [`Upstream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTP over TLS.
    Https,
}

impl Scheme {
    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }

    /// 80 or 443.
    pub fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// The host of an [`Upstream`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UpstreamHost {
    /// A DNS name, lower case.
    Name(DnsName),
    /// An IP address.
    Ip(IpAddr),
}

impl fmt::Display for UpstreamHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => write!(f, "{name}"),
            Self::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Self::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
        }
    }
}

/// A base URL without credentials, query or fragment:
/// `scheme://host[:port][/path]`. The path keeps no trailing slash.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Upstream {
    scheme: Scheme,
    host: UpstreamHost,
    port: u16,
    path: String,
}

impl Upstream {
    /// Parses an upstream URL; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = |why: &str| format!("{text:?} is not a valid upstream URL: {why}");
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("contains whitespace or control characters"));
        }
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (Scheme::Http, rest),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (Scheme::Https, rest),
            _ => return Err(invalid("must start with http:// or https://")),
        };
        if rest.contains(['?', '#']) {
            return Err(invalid("a query or fragment is not allowed"));
        }
        let (authority, path) = match rest.find('/') {
            Some(slash) => rest.split_at(slash),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(invalid("credentials in the URL are not allowed"));
        }
        let (host, port) = split_host_port(authority).map_err(|why| invalid(&why))?;
        let port = match port {
            None => scheme.default_port(),
            Some(port) => match port.parse::<u16>() {
                Ok(0) | Err(_) => return Err(invalid("the port must be a number from 1 to 65535")),
                Ok(port) => port,
            },
        };
        let host = if let Some(ip) = parse_ip_literal(host) {
            UpstreamHost::Ip(ip)
        } else if host.starts_with('[') {
            return Err(invalid("not a valid IPv6 address in brackets"));
        } else {
            UpstreamHost::Name(DnsName::parse(host).map_err(|why| invalid(&why))?)
        };
        if path.contains("//") {
            return Err(invalid("empty path segment (\"//\")"));
        }
        Ok(Self {
            scheme,
            host,
            port,
            path: path.trim_end_matches('/').to_owned(),
        })
    }

    /// `http://127.0.0.1:<port>` (tests).
    #[cfg(test)]
    pub(crate) fn local_http(port: u16) -> Self {
        Self {
            scheme: Scheme::Http,
            host: UpstreamHost::Ip(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
            port,
            path: String::new(),
        }
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host to connect to.
    pub fn host(&self) -> &UpstreamHost {
        &self.host
    }

    /// The port, explicit or the scheme's default.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path prefix, empty or starting with `/`, without trailing slash.
    pub fn path(&self) -> &str {
        &self.path
    }
}

fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    if authority.is_empty() {
        return Err("no host".into());
    }
    if authority.starts_with('[') {
        let Some(end) = authority.find(']') else {
            return Err("unclosed '['".into());
        };
        let (host, rest) = authority.split_at(end + 1);
        return match rest {
            "" => Ok((host, None)),
            _ => match rest.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err("unexpected text after ']'".into()),
            },
        };
    }
    match authority.split_once(':') {
        Some((_, port)) if port.contains(':') => {
            Err("IPv6 addresses must be written in brackets".into())
        }
        Some((host, port)) => Ok((host, Some(port))),
        None => Ok((authority, None)),
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.host)?;
        if self.port != self.scheme.default_port() {
            write!(f, ":{}", self.port)?;
        }
        f.write_str(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    fn ok(text: &str) -> Upstream {
        match Upstream::parse(text) {
            Ok(upstream) => upstream,
            Err(why) => panic!("{text:?} should parse: {why}"),
        }
    }

    #[test]
    fn parses_and_normalises() {
        let local = ok("http://127.0.0.1:8000");
        assert_eq!(local, Upstream::local_http(8000));
        assert_eq!(local.to_string(), "http://127.0.0.1:8000");

        let named = ok("HTTPS://Inference.Example:443/v1/");
        assert_eq!(named.scheme(), Scheme::Https);
        assert_eq!(named.port(), 443);
        assert_eq!(named.path(), "/v1");
        assert_eq!(named.to_string(), "https://inference.example/v1");

        let v6 = ok("http://[::1]:9000/");
        assert_eq!(
            v6.host(),
            &UpstreamHost::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST))
        );
        assert_eq!(v6.to_string(), "http://[::1]:9000");
        assert_eq!(ok("http://localhost").port(), 80);
    }

    #[test]
    fn refuses_what_it_cannot_forward_to() {
        for bad in [
            "",
            "127.0.0.1:8000",
            "ftp://a.example",
            "http://",
            "http://:80",
            "http://a.example:0",
            "http://a.example:65536",
            "http://a.example:",
            "http://a.example:x",
            "http://user:pw@a.example",
            "http://a.example/?q=1",
            "http://a.example/#f",
            "http://a b.example",
            "http://a_b.example",
            "http://::1/",
            "http://[::1",
            "http://[1.2.3.4]/",
            "http://[::1]x/",
            "http://a.example//v1",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
