//! [`IpNet`]: an address or network (`10.0.0.5`, `10.1.0.0/16`,
//! `2001:db8::/32`), the form of a pass route's `addresses`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 network: an address whose host bits are zero and a
/// prefix length (a bare address is the network of that address alone).
/// IPv4-mapped IPv6 addresses are stored as IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    network: IpAddr,
    prefix: u8,
}

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(v4) => (u128::from(v4.to_bits()), 32),
        IpAddr::V6(v6) => (v6.to_bits(), 128),
    }
}

/// The mask of a `prefix` within a `width`-bit address, as a `u128`.
fn mask(prefix: u8, width: u8) -> u128 {
    let all = if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    if prefix == 0 {
        0
    } else {
        all & !((1u128 << (width - prefix)) - 1)
    }
}

impl IpNet {
    /// The network of `ip` alone.
    pub fn addr(ip: IpAddr) -> Self {
        let ip = ip.to_canonical();
        Self {
            network: ip,
            prefix: bits(ip).1,
        }
    }

    /// Whether `ip` is in the network (an IPv4-mapped IPv6 address counts
    /// as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let (want, width) = bits(self.network);
        let (got, got_width) = bits(ip);
        width == got_width && got & mask(self.prefix, width) == want
    }
}

impl FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip: IpAddr = addr.parse().map_err(|_| {
            format!("{s:?} is not an IP address or network (10.0.0.5, 10.1.0.0/16, 2001:db8::/32)")
        })?;
        let ip = ip.to_canonical();
        let width = bits(ip).1;
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {width}"))?,
        };
        if prefix == 0 {
            return Err(format!(
                "{s:?}: a network of every address is not a list of addresses"
            ));
        }
        if bits(ip).0 & !mask(prefix, width) != 0 {
            return Err(format!("{s:?}: host bits are set after the /{prefix}"));
        }
        Ok(Self {
            network: ip,
            prefix,
        })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix == bits(self.network).1 {
            write!(f, "{}", self.network)
        } else {
            write!(f, "{}/{}", self.network, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_networks_hold_what_they_say() {
        assert!(net("10.0.0.5").contains(ip("10.0.0.5")));
        assert!(!net("10.0.0.5").contains(ip("10.0.0.6")));
        assert!(net("10.1.0.0/16").contains(ip("10.1.255.3")));
        assert!(!net("10.1.0.0/16").contains(ip("10.2.0.0")));
        assert!(net("10.1.0.0/16").contains(ip("::ffff:10.1.2.3")));
        assert!(net("::ffff:10.1.2.3").contains(ip("10.1.2.3")));
        assert!(net("2001:db8::/32").contains(ip("2001:db8:1::9")));
        assert!(!net("2001:db8::/32").contains(ip("10.1.2.3")));
        assert!(!net("0.0.0.1").contains(ip("::1")));
        assert!(net("128.0.0.0/1").contains(ip("200.1.1.1")));
        assert!(!net("128.0.0.0/1").contains(ip("100.1.1.1")));
        assert_eq!(net("10.1.0.0/16").to_string(), "10.1.0.0/16");
        assert_eq!(net("::ffff:10.1.2.3").to_string(), "10.1.2.3");
        assert_eq!(IpNet::addr(ip("::1")).to_string(), "::1");
    }

    #[test]
    fn bad_networks_are_refused_with_a_reason() {
        for (bad, why) in [
            ("example.com", "is not an IP address"),
            ("10.0.0.0/33", "0 to 32"),
            ("10.0.0.1/8", "host bits are set"),
            ("0.0.0.0/0", "every address"),
            ("::/0", "every address"),
            ("10.0.0.0/x", "0 to 32"),
            ("2001:db8::/129", "0 to 128"),
        ] {
            let e = bad.parse::<IpNet>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
