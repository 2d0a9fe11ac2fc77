//! [`Ipv4Cidr`]: an IPv4 network written `a.b.c.d/len`, used for the range
//! of fake DNS answers.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// An IPv4 network: an address whose host bits are zero, and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Cidr {
    /// The network `network/prefix`; `None` when the prefix exceeds 32 or
    /// host bits are set.
    pub const fn new(network: Ipv4Addr, prefix: u8) -> Option<Self> {
        if prefix > 32 {
            return None;
        }
        let bits = network.to_bits();
        if bits & !mask(prefix) != 0 {
            return None;
        }
        Some(Self { network, prefix })
    }

    /// The first address.
    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    /// The prefix length, 0 to 32.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// How many addresses the network holds.
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.prefix))
    }

    /// Whether `ip` is inside.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        ip.to_bits() & mask(self.prefix) == self.network.to_bits()
    }

    /// Whether all of `self` lies inside `outer`.
    pub fn is_within(&self, outer: &Self) -> bool {
        self.prefix >= outer.prefix && outer.contains(self.network)
    }
}

const fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix as u32)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let Some((addr, prefix)) = text.split_once('/') else {
            return Err(format!(
                "{text:?} is not an IPv4 CIDR (expected \"a.b.c.d/len\")"
            ));
        };
        let network: Ipv4Addr = addr.parse().map_err(|_| {
            format!("{text:?} is not an IPv4 CIDR: {addr:?} is not an IPv4 address")
        })?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32 && !prefix.starts_with('+'))
            .ok_or_else(|| {
                format!("{text:?} is not an IPv4 CIDR: the prefix length must be 0 to 32")
            })?;
        Self::new(network, prefix).ok_or_else(|| {
            format!(
                "{text:?} has host bits set (did you mean \"{}/{prefix}\"?)",
                Ipv4Addr::from_bits(network.to_bits() & mask(prefix))
            )
        })
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Ipv4Cidr {
        match text.parse() {
            Ok(cidr) => cidr,
            Err(why) => panic!("{text:?}: {why}"),
        }
    }

    #[test]
    fn parses_and_contains() {
        let range = cidr("127.100.0.0/16");
        assert_eq!(range.to_string(), "127.100.0.0/16");
        assert_eq!(range.size(), 65536);
        assert!(range.contains(Ipv4Addr::new(127, 100, 255, 1)));
        assert!(!range.contains(Ipv4Addr::new(127, 101, 0, 0)));
        assert!(range.is_within(&cidr("127.0.0.0/8")));
        assert!(!cidr("126.0.0.0/7").is_within(&cidr("127.0.0.0/8")));
        assert_eq!(cidr("0.0.0.0/0").size(), 1 << 32);
        assert!(cidr("1.2.3.4/32").contains(Ipv4Addr::new(1, 2, 3, 4)));
    }

    #[test]
    fn refuses_malformed_ranges() {
        for bad in [
            "127.100.0.0",
            "127.100.0.0/33",
            "127.100.0.0/+8",
            "127.100.0/16",
            "x/8",
            "127.100.0.0/",
        ] {
            assert!(bad.parse::<Ipv4Cidr>().is_err(), "{bad:?}");
        }
        let Err(why) = "127.100.0.1/16".parse::<Ipv4Cidr>() else {
            panic!("host bits must be refused");
        };
        assert!(why.contains("127.100.0.0/16"), "{why}");
    }
}
