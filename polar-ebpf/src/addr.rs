//! Reading and rewriting the address in a `bpf_sock_addr` context, and the
//! address arithmetic the programs need (loopback, v4-mapped IPv6).
//!
//! Addresses are kept in network order as the kernel hands them over; ports
//! are converted to host order once, on the way in.

use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_F_CURRENT_NETNS, bpf_sock_tuple, bpf_sock_tuple__bindgen_ty_1,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2,
    },
    helpers::{bpf_sk_lookup_tcp, bpf_sk_release},
    programs::SockAddrContext,
};
use core::ptr::write_volatile;

use aya_ebpf::bindings::bpf_sock_addr;
use polar_common::{AF_INET, AF_INET6, SessionRedirect, SockAddr};

/// The third 32-bit word of a v4-mapped IPv6 address (`::ffff:0:0/96`).
const MAPPED: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// An IPv6 address as four network-order words.
pub struct V6(pub [u32; 4]);

impl V6 {
    #[inline(always)]
    fn is_mapped(&self) -> bool {
        self.0[0] == 0 && self.0[1] == 0 && self.0[2] == MAPPED
    }

    #[inline(always)]

    fn bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        let mut i = 0;
        while i < 4 {
            let w = self.0[i].to_ne_bytes();
            out[i * 4] = w[0];
            out[i * 4 + 1] = w[1];
            out[i * 4 + 2] = w[2];
            out[i * 4 + 3] = w[3];
            i += 1;
        }
        out
    }

    /// The client end of a connection as the agent's accept sees it:
    /// v4-mapped addresses become IPv4.
    #[inline(always)]
    pub fn client(&self, port: u16) -> SockAddr {
        if self.is_mapped() {
            SockAddr {
                addr: v4_bytes(self.0[3]),
                port,
                family: AF_INET,
                pad: 0,
            }
        } else {
            SockAddr {
                addr: self.bytes(),
                port,
                family: AF_INET6,
                pad: 0,
            }
        }
    }
}

/// A network-order IPv4 word as the first 4 of 16 address bytes.
#[inline(always)]
pub fn v4_bytes(ip: u32) -> [u8; 16] {
    let b = ip.to_ne_bytes();
    let mut out = [0u8; 16];
    out[0] = b[0];
    out[1] = b[1];
    out[2] = b[2];
    out[3] = b[3];
    out
}

#[inline(always)]

fn v4_word(addr: &[u8; 16]) -> u32 {
    u32::from_ne_bytes([addr[0], addr[1], addr[2], addr[3]])
}

#[inline(always)]

fn v6_words(addr: &[u8; 16]) -> [u32; 4] {
    [
        u32::from_ne_bytes([addr[0], addr[1], addr[2], addr[3]]),
        u32::from_ne_bytes([addr[4], addr[5], addr[6], addr[7]]),
        u32::from_ne_bytes([addr[8], addr[9], addr[10], addr[11]]),
        u32::from_ne_bytes([addr[12], addr[13], addr[14], addr[15]]),
    ]
}

/// The user address of a sock_addr context (destination for connect and
/// sendmsg, source for recvmsg, peer for getpeername).
pub enum Dst {
    V4 { ip: u32, port: u16 },
    V6 { ip: V6, port: u16 },
}

impl Dst {
    #[inline(always)]
    pub fn v4(ctx: &SockAddrContext) -> Self {
        // SAFETY: the context pointer is valid; these are 4-byte loads.
        let (ip, port) = unsafe { ((*ctx.sock_addr).user_ip4, (*ctx.sock_addr).user_port) };
        Dst::V4 {
            ip,
            port: u16::from_be(port as u16),
        }
    }

    #[inline(always)]

    pub fn v6(ctx: &SockAddrContext) -> Self {
        // SAFETY: the context pointer is valid; these are 4-byte loads.
        let (ip, port) = unsafe {
            let sa = &*ctx.sock_addr;
            (
                [
                    sa.user_ip6[0],
                    sa.user_ip6[1],
                    sa.user_ip6[2],
                    sa.user_ip6[3],
                ],
                sa.user_port,
            )
        };
        Dst::V6 {
            ip: V6(ip),
            port: u16::from_be(port as u16),
        }
    }

    #[inline(always)]

    pub fn port(&self) -> u16 {
        match self {
            Dst::V4 { port, .. } | Dst::V6 { port, .. } => *port,
        }
    }

    /// 127.0.0.0/8, `::1`, or a v4-mapped 127.0.0.0/8.
    #[inline(always)]
    pub fn is_loopback(&self) -> bool {
        match self {
            Dst::V4 { ip, .. } => ip.to_ne_bytes()[0] == 127,
            Dst::V6 { ip, .. } => {
                (ip.is_mapped() && ip.0[3].to_ne_bytes()[0] == 127)
                    || (ip.0[0] == 0
                        && ip.0[1] == 0
                        && ip.0[2] == 0
                        && ip.0[3] == u32::from_ne_bytes([0, 0, 0, 1]))
            }
        }
    }

    /// Whether this is the session's listener address (either family).
    #[inline(always)]
    pub fn is_listener(&self, cfg: &SessionRedirect) -> bool {
        let v4 = u32::from_ne_bytes(cfg.listen_v4);
        match self {
            Dst::V4 { ip, .. } => *ip == v4,
            Dst::V6 { ip, .. } => {
                (ip.is_mapped() && ip.0[3] == v4) || ip.0 == v6_words(&cfg.listen_v6)
            }
        }
    }

    /// The address exactly as the program gave it.
    #[inline(always)]
    pub fn record(&self) -> SockAddr {
        match self {
            Dst::V4 { ip, port } => SockAddr {
                addr: v4_bytes(*ip),
                port: *port,
                family: AF_INET,
                pad: 0,
            },
            Dst::V6 { ip, port } => SockAddr {
                addr: ip.bytes(),
                port: *port,
                family: AF_INET6,
                pad: 0,
            },
        }
    }

    /// Points the socket at the session's listener on `port`; a v4-mapped
    /// destination stays v4-mapped so the socket keeps its address family.
    #[inline(always)]
    pub fn rewrite(&self, ctx: &SockAddrContext, cfg: &SessionRedirect, port: u16) {
        let v4 = u32::from_ne_bytes(cfg.listen_v4);
        // SAFETY: the context pointer is valid; these are 4-byte stores to
        // fields the verifier allows connect/sendmsg programs to write.
        unsafe {
            let sa = &mut *ctx.sock_addr;
            match self {
                Dst::V4 { .. } => write_volatile(&raw mut sa.user_ip4, v4),
                Dst::V6 { ip, .. } => {
                    let w = if ip.is_mapped() {
                        [0, 0, MAPPED, v4]
                    } else {
                        v6_words(&cfg.listen_v6)
                    };
                    set_ip6(sa, w);
                }
            }
            write_volatile(&raw mut sa.user_port, u32::from(port.to_be()));
        }
    }
}

/// Stores the four words of an IPv6 address, one 4-byte store each, so the
/// compiler never turns them into stores through a computed context pointer
/// (which the verifier rejects).
///
/// # Safety
///
/// `sa` must be the context of a program whose hook may write
/// `user_ip6` (connect6, sendmsg6, getpeername6, recvmsg6).
#[inline(always)]
unsafe fn set_ip6(sa: &mut bpf_sock_addr, w: [u32; 4]) {
    // SAFETY: the caller holds a valid context.
    unsafe {
        write_volatile(&raw mut sa.user_ip6[0], w[0]);
        write_volatile(&raw mut sa.user_ip6[1], w[1]);
        write_volatile(&raw mut sa.user_ip6[2], w[2]);
        write_volatile(&raw mut sa.user_ip6[3], w[3]);
    }
}

/// Writes a recorded address back into the context (getpeername, recvmsg).
/// `IS_V6` says which family the program's hook has: only that family's
/// fields may be touched, and a record of the other family is left alone.
#[inline(always)]
pub fn write<const IS_V6: bool>(ctx: &SockAddrContext, a: &SockAddr) {
    // SAFETY: as in `Dst::rewrite`.
    unsafe {
        let sa = &mut *ctx.sock_addr;
        if IS_V6 {
            if a.family != AF_INET6 {
                return;
            }
            set_ip6(sa, v6_words(&a.addr));
        } else {
            if a.family != AF_INET {
                return;
            }
            write_volatile(&raw mut sa.user_ip4, v4_word(&a.addr));
        }
        write_volatile(&raw mut sa.user_port, u32::from(a.port.to_be()));
    }
}

/// Whether a TCP listener for `dst` exists in the caller's own network
/// namespace (a server the sandboxed task started itself).
#[inline(always)]
pub fn has_listener(ctx: &SockAddrContext, dst: &Dst) -> bool {
    let (mut tuple, size) = match dst {
        Dst::V6 { ip, port } if !ip.is_mapped() => (
            bpf_sock_tuple {
                __bindgen_anon_1: bpf_sock_tuple__bindgen_ty_1 {
                    ipv6: bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2 {
                        saddr: [0; 4],
                        daddr: ip.0,
                        sport: 0,
                        dport: port.to_be(),
                    },
                },
            },
            core::mem::size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2>(),
        ),
        _ => {
            let (ip, port) = match dst {
                Dst::V4 { ip, port } => (*ip, *port),
                Dst::V6 { ip, port } => (ip.0[3], *port),
            };
            (
                bpf_sock_tuple {
                    __bindgen_anon_1: bpf_sock_tuple__bindgen_ty_1 {
                        ipv4: bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 {
                            saddr: 0,
                            daddr: ip,
                            sport: 0,
                            dport: port.to_be(),
                        },
                    },
                },
                core::mem::size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1>(),
            )
        }
    };
    // SAFETY: the tuple lives on the stack for the call; a found socket is
    // released at once, as the verifier requires.
    unsafe {
        let sk = bpf_sk_lookup_tcp(
            ctx.as_ptr(),
            &mut tuple,
            size as u32,
            BPF_F_CURRENT_NETNS as u64,
            0,
        );
        if sk.is_null() {
            return false;
        }
        bpf_sk_release(sk.cast());
    }
    true
}
