//! Network namespaces for isolated sandboxes: the agent creates the namespace
//! itself (on a short-lived thread that unshares its network namespace), brings
//! its loopback up and binds the session's listener and DNS sockets inside it.
//! The sockets stay in that namespace wherever the agent uses them, and the
//! sandbox joins it with `setns` before it execs. Nothing is named or mounted:
//! the namespace disappears with its last socket, process or handle, so a
//! crashed agent leaves none behind.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};

/// Errors of namespace set-up.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// `unshare(CLONE_NEWNET)` failed (needs CAP_SYS_ADMIN).
    #[error("creating a network namespace: {0}")]
    Unshare(#[source] nix::Error),
    /// Bringing `lo` up failed.
    #[error("bringing up loopback in the sandbox network namespace: {0}")]
    Loopback(#[source] io::Error),
    /// Binding a socket failed.
    #[error("binding {what} in the sandbox network namespace: {source}")]
    Bind {
        /// Which socket.
        what: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The set-up thread could not run.
    #[error("network namespace thread: {0}")]
    Thread(String),
}

/// The loopback sockets a session's traffic is steered to: a TCP listener
/// and a DNS socket on 127.0.0.1, and the same ports on ::1 when IPv6 is up.
#[derive(Debug)]
pub struct Sockets {
    /// TCP listener on 127.0.0.1.
    pub tcp_v4: TcpListener,
    /// TCP listener on ::1, same port.
    pub tcp_v6: Option<TcpListener>,
    /// DNS socket on 127.0.0.1.
    pub dns_v4: UdpSocket,
    /// DNS socket on ::1, same port.
    pub dns_v6: Option<UdpSocket>,
}

impl Sockets {
    /// Binds fresh ports on the loopback of the caller's network namespace.
    pub fn bind_loopback() -> Result<Self, NetnsError> {
        let tcp_v4 = bind("TCP listener", TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))?;
        bind("TCP listener", deep_backlog(&tcp_v4))?;
        let port = bind("TCP listener", tcp_v4.local_addr())?.port();
        let tcp_v6 = TcpListener::bind((Ipv6Addr::LOCALHOST, port))
            .and_then(|l| deep_backlog(&l).map(|()| l))
            .ok();
        let dns_v4 = bind("DNS socket", UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)))?;
        let dns_port = bind("DNS socket", dns_v4.local_addr())?.port();
        let dns_v6 = UdpSocket::bind(SocketAddr::from((Ipv6Addr::LOCALHOST, dns_port))).ok();
        Ok(Self {
            tcp_v4,
            tcp_v6,
            dns_v4,
            dns_v6,
        })
    }

    /// The TCP listener port.
    pub fn tcp_port(&self) -> u16 {
        self.tcp_v4.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// The DNS port.
    pub fn dns_port(&self) -> u16 {
        self.dns_v4.local_addr().map(|a| a.port()).unwrap_or(0)
    }
}

/// A network namespace of one session, with its sockets inside.
#[derive(Debug)]
pub struct IsolatedNet {
    /// A handle on the namespace (`/proc/thread-self/ns/net`), for `setns`.
    pub ns: OwnedFd,
    /// The sockets, bound inside the namespace.
    pub sockets: Sockets,
}

impl IsolatedNet {
    /// Creates a namespace and binds the sockets in it.
    pub fn create() -> Result<Self, NetnsError> {
        std::thread::Builder::new()
            .name("polar-netns".into())
            .spawn(create_on_this_thread)
            .map_err(|e| NetnsError::Thread(e.to_string()))?
            .join()
            .map_err(|_| NetnsError::Thread("panicked".into()))?
    }
}

impl IsolatedNet {
    /// Joins an existing network namespace (`/proc/<pid>/ns/net` of a
    /// container's init) and binds the sockets in it, as [`Self::create`]
    /// does in a namespace of its own.
    pub fn join(ns_path: &std::path::Path) -> Result<Self, NetnsError> {
        let path = ns_path.to_owned();
        std::thread::Builder::new()
            .name("polar-netns".into())
            .spawn(move || join_on_this_thread(&path))
            .map_err(|e| NetnsError::Thread(e.to_string()))?
            .join()
            .map_err(|_| NetnsError::Thread("panicked".into()))?
    }
}

fn join_on_this_thread(path: &std::path::Path) -> Result<IsolatedNet, NetnsError> {
    let target = File::open(path).map_err(|source| NetnsError::Bind {
        what: "namespace to join",
        source,
    })?;
    // Only this thread moves; it ends right after.
    nix::sched::setns(&target, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(NetnsError::Unshare)?;
    loopback_up().map_err(NetnsError::Loopback)?;
    Ok(IsolatedNet {
        ns: target.into(),
        sockets: Sockets::bind_loopback()?,
    })
}

fn create_on_this_thread() -> Result<IsolatedNet, NetnsError> {
    // Only this thread moves; it ends right after.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(NetnsError::Unshare)?;
    loopback_up().map_err(NetnsError::Loopback)?;
    let ns = File::open("/proc/thread-self/ns/net").map_err(|source| NetnsError::Bind {
        what: "namespace handle",
        source,
    })?;
    Ok(IsolatedNet {
        ns: ns.into(),
        sockets: Sockets::bind_loopback()?,
    })
}

/// Accept queue length of the agent's listeners: bursts of connections (a
/// harness opening many at once, or a flood) queue instead of having their
/// SYNs dropped and retried a second later. The kernel caps it at
/// `net.core.somaxconn`.
pub const LISTEN_BACKLOG: i32 = 4096;

/// Sets a listening socket's accept queue to [`LISTEN_BACKLOG`] (`listen`
/// may be called again on a listening socket to change it).
pub fn deep_backlog(l: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: listen on a valid socket descriptor.
    if unsafe { libc::listen(l.as_raw_fd(), LISTEN_BACKLOG) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn bind<T>(what: &'static str, r: io::Result<T>) -> Result<T, NetnsError> {
    r.map_err(|source| NetnsError::Bind { what, source })
}

/// `ip link set lo up` through the SIOCSIFFLAGS ioctl.
fn loopback_up() -> io::Result<()> {
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    // SAFETY: an all-zero ifreq is valid; the name fits with its NUL.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: valid socket fd and ifreq for these requests.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
