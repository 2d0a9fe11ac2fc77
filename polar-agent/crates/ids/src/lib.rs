//! Newtypes for the identifiers and addresses that cross module boundaries:
//! a session's id, a cgroup's id, the original destination of a connection.
//!
//! Pure, with `polar-common` (the kernel's address layout) as its only Polar
//! dependency. Tests: the unit tests below.
#![forbid(unsafe_code)]

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use polar_common::{AF_INET, SockAddr};

/// The id of a sandbox session: 1 to 64 characters from `[A-Za-z0-9._-]`,
/// not starting with a dot, so it is safe in paths and cgroup names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(String);

/// Why a string is not a valid [`SessionId`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "invalid session id {0:?}: use 1 to 64 characters from [A-Za-z0-9._-], not starting with '.'"
)]
pub struct InvalidSessionId(pub String);

impl SessionId {
    /// A fresh random id (`s-` and 16 hex digits).
    pub fn random() -> Self {
        Self(format!("s-{:016x}", rand::random::<u64>()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SessionId {
    type Err = InvalidSessionId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidSessionId(s.to_owned()))
        }
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A cgroup v2 id (the inode number of its directory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CgroupId(pub u64);

impl fmt::Display for CgroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The destination a sandboxed program dialled before the redirect, exactly
/// as it gave it (a v4-mapped IPv6 address stays v4-mapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OrigDst(pub SocketAddr);

impl fmt::Display for OrigDst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<SockAddr> for OrigDst {
    fn from(a: SockAddr) -> Self {
        Self(to_socket_addr(&a))
    }
}

/// Converts a kernel-side address record into a `SocketAddr`.
pub fn to_socket_addr(a: &SockAddr) -> SocketAddr {
    let ip = if a.family == AF_INET {
        IpAddr::V4(Ipv4Addr::new(a.addr[0], a.addr[1], a.addr[2], a.addr[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(a.addr))
    };
    SocketAddr::new(ip, a.port)
}

/// Converts a `SocketAddr` into a kernel-side record, v4-mapped IPv6 as IPv4
/// (the form of the client end of a connection in the `CONNS` map).
pub fn to_client_key_addr(addr: SocketAddr) -> SockAddr {
    let ip = match addr.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let (family, bytes) = match ip {
        IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&v4.octets());
            (AF_INET, b)
        }
        IpAddr::V6(v6) => (polar_common::AF_INET6, v6.octets()),
    };
    SockAddr {
        addr: bytes,
        port: addr.port(),
        family,
        pad: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_path_safe() {
        assert!("s-0123".parse::<SessionId>().is_ok());
        assert!("task_1.sample-3".parse::<SessionId>().is_ok());
        for bad in ["", ".hidden", "a/b", "a b", "..", &"x".repeat(65)] {
            assert!(bad.parse::<SessionId>().is_err(), "{bad:?} accepted");
        }
        let r = SessionId::random();
        assert_eq!(r.as_str().parse::<SessionId>(), Ok(r.clone()));
    }

    #[test]
    fn addresses_round_trip() {
        for s in ["127.10.0.1:443", "[::1]:8080", "[::ffff:127.0.0.1]:80"] {
            let addr: SocketAddr = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            let rec = to_client_key_addr(addr);
            let back = to_socket_addr(&rec);
            match addr.ip() {
                IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
                    assert_eq!(back.to_string(), "127.0.0.1:80");
                }
                _ => assert_eq!(back, addr),
            }
        }
    }
}
