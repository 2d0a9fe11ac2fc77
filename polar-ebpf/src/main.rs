//! Polar's kernel side: cgroup socket programs attached to the agent's own
//! cgroup v2 subtree (never the root cgroup, never the host's processes).
//!
//! - `connect4`/`connect6`: TCP connections are rewritten to the session's
//!   listener and their original destination recorded by socket cookie; UDP to
//!   port 53 goes to the session's DNS responder; UDP to port 443 (QUIC) and
//!   UDP to anything but loopback are refused, so QUIC falls back to TCP and
//!   nothing leaves the sandbox unseen.
//! - `sock_ops` re-keys a redirected TCP socket's record by its client address
//!   as soon as the kernel has picked the local port, so the agent finds it
//!   from the peer address of the connection it accepted.
//! - `sendmsg4/6` + `recvmsg4/6` do the same for unconnected UDP DNS and give
//!   the answers back the source address the program asked.
//! - `getpeername4/6` show the program the address it dialled.
//! - `sock_release` forgets a socket's record when it closes.
//!
//! Sockets whose cgroup is not a registered session are refused outright
//! (fail closed): the agent registers a session before moving a process in.
#![deny(unsafe_op_in_unsafe_fn)]
#![no_std]
#![no_main]

mod addr;

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG, BPF_SOCK_OPS_TCP_CONNECT_CB},
    helpers::{bpf_get_current_ancestor_cgroup_id, bpf_get_netns_cookie, bpf_get_socket_cookie},
    macros::{cgroup_sock, cgroup_sock_addr, map, sock_ops},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::{SockAddrContext, SockContext, SockOpsContext},
};
use polar_common::{
    AF_INET, AF_INET6, ConnKey, FLAG_LOCAL_BYPASS, MAX_SESSIONS, MAX_SOCKETS, OrigDst,
    STAT_CONN_NEVER_ESTABLISHED, STAT_CONN_RECORD_FAILED, STAT_COUNT, STAT_DENIED,
    STAT_DNS_REDIRECTED, STAT_LOCAL_BYPASS, STAT_RECORD_MISSING, STAT_SOCK_RECORD_FAILED,
    STAT_TCP_REDIRECTED, SessionRedirect, SockAddr,
};

use crate::addr::{Dst, V6};

/// Cgroup level of session cgroups, set by the loader.
#[unsafe(no_mangle)]
static SESSION_LEVEL: u32 = 0;

#[map]
static SESSIONS: HashMap<u64, SessionRedirect> = HashMap::with_max_entries(MAX_SESSIONS, 0);
#[map]
static SOCKS: LruHashMap<u64, OrigDst> = LruHashMap::with_max_entries(MAX_SOCKETS, 0);
#[map]
static CONNS: LruHashMap<ConnKey, OrigDst> = LruHashMap::with_max_entries(MAX_SOCKETS, 0);
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);

/// Counts an event (`STAT_*`).
#[inline(always)]
fn count(stat: u32) {
    if let Some(p) = STATS.get_ptr_mut(stat) {
        // SAFETY: a per-CPU slot, written only by this CPU.
        unsafe { *p += 1 };
    }
}

const ALLOW: i32 = 1;
const DENY: i32 = 0;
const IPPROTO_TCP: u32 = 6;
const IPPROTO_UDP: u32 = 17;
const DNS_PORT: u16 = 53;
const QUIC_PORT: u16 = 443;
const TCP_SYN_SENT: u32 = 2;
const TCP_CLOSE: u32 = 7;

/// The session of the current task: its cgroup id and redirect settings.
#[inline(always)]
fn session() -> Option<(u64, SessionRedirect)> {
    // SAFETY: a read of a global the loader may have rewritten.
    let level = unsafe { core::ptr::read_volatile(&SESSION_LEVEL) };
    // SAFETY: helper call without pointer arguments.
    let id = unsafe { bpf_get_current_ancestor_cgroup_id(level as i32) };
    // SAFETY: the value is copied out before any other map operation.
    let cfg = unsafe { SESSIONS.get(&id) }.copied()?;
    Some((id, cfg))
}

#[inline(always)]

fn remember(ctx: &SockAddrContext, cgroup_id: u64, dst: SockAddr) {
    // SAFETY: the context is a valid sock_addr context for both helpers.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: as above.
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let rec = OrigDst {
        dst,
        cgroup_id,
        netns_cookie,
    };
    if SOCKS.insert(&cookie, &rec, 0).is_err() {
        count(STAT_SOCK_RECORD_FAILED);
    }
}

/// Decision for a connect or sendmsg of the current task to `dst`.
#[inline(always)]
fn steer(ctx: &SockAddrContext, dst: Dst, may_rewrite_udp: bool) -> i32 {
    let Some((cgroup_id, cfg)) = session() else {
        count(STAT_DENIED);
        return DENY;
    };
    // SAFETY: the context pointer is valid for the program's lifetime.
    let protocol = unsafe { (*ctx.sock_addr).protocol };
    let port = dst.port();
    if protocol == IPPROTO_TCP {
        if cfg.flags & FLAG_LOCAL_BYPASS != 0 && dst.is_loopback() && addr::has_listener(ctx, &dst)
        {
            count(STAT_LOCAL_BYPASS);
            return ALLOW;
        }
        remember(ctx, cgroup_id, dst.record());
        dst.rewrite(ctx, &cfg, cfg.tcp_port);
        count(STAT_TCP_REDIRECTED);
        return ALLOW;
    }
    if protocol == IPPROTO_UDP {
        if port == DNS_PORT && may_rewrite_udp {
            remember(ctx, cgroup_id, dst.record());
            dst.rewrite(ctx, &cfg, cfg.dns_port);
            count(STAT_DNS_REDIRECTED);
            return ALLOW;
        }
        if port == QUIC_PORT {
            count(STAT_DENIED);
            return DENY;
        }
    }
    if dst.is_loopback() {
        ALLOW
    } else {
        count(STAT_DENIED);
        DENY
    }
}

#[cgroup_sock_addr(connect4)]
pub fn polar_connect4(ctx: SockAddrContext) -> i32 {
    steer(&ctx, Dst::v4(&ctx), true)
}

#[cgroup_sock_addr(connect6)]
pub fn polar_connect6(ctx: SockAddrContext) -> i32 {
    steer(&ctx, Dst::v6(&ctx), true)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn polar_sendmsg4(ctx: SockAddrContext) -> i32 {
    steer(&ctx, Dst::v4(&ctx), true)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn polar_sendmsg6(ctx: SockAddrContext) -> i32 {
    steer(&ctx, Dst::v6(&ctx), true)
}

/// The record of the socket in `ctx`, if it was redirected.
#[inline(always)]
fn recorded(ctx: &SockAddrContext) -> Option<OrigDst> {
    // SAFETY: the context is a valid sock_addr context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    unsafe { SOCKS.get(&cookie) }.copied()
}

/// Answers from the DNS responder appear to come from the server asked.
#[inline(always)]
fn restore_source<const IS_V6: bool>(ctx: &SockAddrContext, src: Dst) -> i32 {
    let Some(rec) = recorded(ctx) else {
        return ALLOW;
    };
    let Some((_, cfg)) = session() else {
        return ALLOW;
    };
    if rec.dst.port == DNS_PORT && src.port() == cfg.dns_port && src.is_listener(&cfg) {
        addr::write::<IS_V6>(ctx, &rec.dst);
    }
    ALLOW
}

#[cgroup_sock_addr(recvmsg4)]
pub fn polar_recvmsg4(ctx: SockAddrContext) -> i32 {
    restore_source::<false>(&ctx, Dst::v4(&ctx))
}

#[cgroup_sock_addr(recvmsg6)]
pub fn polar_recvmsg6(ctx: SockAddrContext) -> i32 {
    restore_source::<true>(&ctx, Dst::v6(&ctx))
}

#[inline(always)]

fn restore_peer<const IS_V6: bool>(ctx: &SockAddrContext) -> i32 {
    if let Some(rec) = recorded(ctx) {
        addr::write::<IS_V6>(ctx, &rec.dst);
    }
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn polar_getpeername4(ctx: SockAddrContext) -> i32 {
    restore_peer::<false>(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn polar_getpeername6(ctx: SockAddrContext) -> i32 {
    restore_peer::<true>(&ctx)
}

/// The client end of a TCP socket in a sock_ops context, v4-mapped as IPv4.
#[inline(always)]
fn client_key(ctx: &SockOpsContext, netns_cookie: u64) -> ConnKey {
    // Ports in bpf_sock_ops: local_port is in host order.
    let port = ctx.local_port() as u16;
    let client = if ctx.family() == u32::from(AF_INET6) {
        V6(ctx.local_ip6()).client(port)
    } else {
        SockAddr {
            addr: addr::v4_bytes(ctx.local_ip4()),
            port,
            family: AF_INET,
            pad: 0,
        }
    };
    ConnKey {
        netns_cookie,
        client,
    }
}

#[sock_ops]
pub fn polar_sock_ops(ctx: SockOpsContext) -> u32 {
    let op = ctx.op();
    if op == BPF_SOCK_OPS_TCP_CONNECT_CB {
        // SAFETY: the context is a valid sock_ops context.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        // SAFETY: the value is copied out at once.
        match unsafe { SOCKS.get(&cookie) }.copied() {
            Some(rec) => {
                let key = client_key(&ctx, rec.netns_cookie);
                if CONNS.insert(&key, &rec, 0).is_err() {
                    count(STAT_CONN_RECORD_FAILED);
                }
                // Hear about the connection failing before it is established.
                let _ = ctx.set_cb_flags(BPF_SOCK_OPS_STATE_CB_FLAG as i32);
            }
            None => count(STAT_RECORD_MISSING),
        }
    } else if op == BPF_SOCK_OPS_STATE_CB && ctx.arg(0) == TCP_SYN_SENT && ctx.arg(1) == TCP_CLOSE {
        // Never established: the agent will never accept it, so forget it.
        // SAFETY: the context is a valid sock_ops context.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        // SAFETY: the value is copied out at once.
        if let Some(rec) = unsafe { SOCKS.get(&cookie) }.copied() {
            let _ = CONNS.remove(&client_key(&ctx, rec.netns_cookie));
            count(STAT_CONN_NEVER_ESTABLISHED);
        }
    }
    0
}

#[cgroup_sock(sock_release)]
pub fn polar_sock_release(ctx: SockContext) -> i32 {
    // SAFETY: the context is a valid cgroup sock context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let _ = SOCKS.remove(&cookie);
    ALLOW
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
