//! Types and constants shared by Polar's eBPF programs (`polar-ebpf`) and its
//! agent (`polar-agent`): the records the kernel side writes and the agent
//! reads, and the per-session settings the agent writes and the kernel reads.
//!
//! Every type is `#[repr(C)]`, `Copy`, built from explicit-width integers with
//! explicit padding fields, so both sides agree on the layout byte for byte. A
//! size assertion per type keeps it so. With the `user` feature the types
//! implement `aya::Pod` so the agent can use them as map keys and values.
#![deny(unsafe_op_in_unsafe_fn)]
#![no_std]

/// `AF_INET`, as stored in [`SockAddr::family`].
pub const AF_INET: u16 = 2;
/// `AF_INET6`, as stored in [`SockAddr::family`].
pub const AF_INET6: u16 = 10;

/// Name of the map from session cgroup id to [`SessionRedirect`].
pub const MAP_SESSIONS: &str = "SESSIONS";
/// Name of the map from socket cookie to the [`OrigDst`] of a redirected socket.
pub const MAP_SOCKS: &str = "SOCKS";
/// Name of the map from [`ConnKey`] (the client end of a redirected TCP
/// connection, as the agent sees it in `accept`) to its [`OrigDst`].
pub const MAP_CONNS: &str = "CONNS";
/// Name of the read-only global holding the cgroup level of session cgroups
/// (the level passed to `bpf_get_current_ancestor_cgroup_id`).
pub const GLOBAL_SESSION_LEVEL: &str = "SESSION_LEVEL";

/// Name of the per-CPU array of event counters, indexed by `STAT_*`.
pub const MAP_STATS: &str = "STATS";
/// TCP connections redirected to a session's listener.
pub const STAT_TCP_REDIRECTED: u32 = 0;
/// DNS datagrams or connections steered to a session's responder.
pub const STAT_DNS_REDIRECTED: u32 = 1;
/// Connections or datagrams refused (QUIC, non-loopback UDP, no session).
pub const STAT_DENIED: u32 = 2;
/// Connections left alone because a listener inside the sandbox took them.
pub const STAT_LOCAL_BYPASS: u32 = 3;
/// Socket records that could not be stored.
pub const STAT_SOCK_RECORD_FAILED: u32 = 4;
/// TCP connects in a session without a redirect record when `sock_ops`
/// sees them (local-bypass connections, or a lost record).
pub const STAT_RECORD_MISSING: u32 = 5;
/// Connection records that could not be stored.
pub const STAT_CONN_RECORD_FAILED: u32 = 6;
/// Connection records removed because the connection failed to establish.
pub const STAT_CONN_NEVER_ESTABLISHED: u32 = 7;
/// Number of counters in [`MAP_STATS`].
pub const STAT_COUNT: u32 = 8;

/// Capacity of [`MAP_SESSIONS`].
pub const MAX_SESSIONS: u32 = 4096;
/// Capacity of [`MAP_SOCKS`] and [`MAP_CONNS`] (LRU maps).
pub const MAX_SOCKETS: u32 = 65536;

/// [`SessionRedirect::flags`]: connections to a loopback address that has a
/// listener inside the sandbox's own network namespace are left alone, so
/// servers a task starts inside an isolated sandbox keep working.
pub const FLAG_LOCAL_BYPASS: u32 = 1;

/// A socket address: IPv4 in the first 4 bytes of `addr`, or IPv6 (possibly
/// v4-mapped, kept exactly as the program dialled it).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockAddr {
    /// Address bytes in network order.
    pub addr: [u8; 16],
    /// Port in host order.
    pub port: u16,
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u16,
    /// Explicit padding, always zero.
    pub pad: u32,
}

/// What the kernel side recorded about a redirected socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrigDst {
    /// The destination the sandboxed program asked for.
    pub dst: SockAddr,
    /// The cgroup id of the session the socket belongs to.
    pub cgroup_id: u64,
    /// The network namespace cookie of the socket.
    pub netns_cookie: u64,
}

/// The client end of a redirected TCP connection, as the agent sees it as the
/// peer of the socket it accepted, qualified by the network namespace.
/// v4-mapped IPv6 client addresses are stored as IPv4.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// Network namespace cookie (`SO_NETNS_COOKIE` of the accepted socket).
    pub netns_cookie: u64,
    /// The client's local address and port.
    pub client: SockAddr,
}

/// Where a session's traffic is sent, written by the agent per session cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionRedirect {
    /// IPv6 address of the agent's listener (network order), usually `::1`.
    pub listen_v6: [u8; 16],
    /// IPv4 address of the agent's listener (network order), usually 127.0.0.1.
    pub listen_v4: [u8; 4],
    /// TCP port of the agent's listener (host order).
    pub tcp_port: u16,
    /// UDP port of the agent's DNS responder (host order).
    pub dns_port: u16,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Explicit padding, always zero.
    pub pad: u32,
}

const _: () = assert!(core::mem::size_of::<SockAddr>() == 24);
const _: () = assert!(core::mem::size_of::<OrigDst>() == 40);
const _: () = assert!(core::mem::size_of::<ConnKey>() == 32);
const _: () = assert!(core::mem::size_of::<SessionRedirect>() == 32);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integer aggregates with explicit padding.
    unsafe impl aya::Pod for super::SockAddr {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::OrigDst {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ConnKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SessionRedirect {}
}
