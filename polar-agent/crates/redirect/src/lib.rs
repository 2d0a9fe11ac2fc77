//! The transparent redirect: Polar's cgroup v2 subtree with the eBPF programs
//! attached, a child cgroup per session, and the answer to "where was this
//! accepted connection going, and for which session?".
//!
//! Layout: `<cgroup2>/polar/agent-<pid>-<n>/` carries the programs (so they apply
//! to every session below it and to nothing else); each session is
//! `<cgroup2>/polar/agent-<pid>-<n>/<session id>/`. A guardian process (the
//! reaper) removes the subtree, killing what is left in it, if the agent dies
//! without cleaning up; the programs themselves are held by BPF links of the
//! agent process and detach when it exits.
//!
//! With the redirect live here the two other ends of the path it sets up: the
//! DNS responder that answers a sandbox's queries with fake addresses
//! ([`dns`]) and the accept loop that asks the redirect where each connection
//! was going and hands it to a [`listener::Handler`] ([`listener`]).
//!
//! This crate owns `aya` and the build script that embeds the eBPF object. It
//! knows nothing of what a handler does with a connection (TLS, the proxy),
//! of sandboxes beyond their cgroup directories, or of the configuration file.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cgroup;
pub mod dns;
pub mod listener;
pub mod loader;
pub mod preflight;
pub mod reaper;

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use aya::Ebpf;
use aya::maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray};
use polar_common::{ConnKey, FLAG_LOCAL_BYPASS, OrigDst as RawOrigDst, SessionRedirect};

pub use cgroup::{Cgroup2Mount, CgroupDir, CgroupError};
pub use loader::LoadError;
use polar_ids::{CgroupId, OrigDst, SessionId, to_client_key_addr};
pub use preflight::PreflightError;

/// Errors of the redirect.
#[derive(Debug, thiserror::Error)]
pub enum RedirectError {
    /// A precondition is missing (capabilities, kernel).
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// Cgroup handling failed.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Loading or attaching the programs failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A map operation failed.
    #[error("eBPF map {map}: {source}")]
    Map {
        /// The map.
        map: &'static str,
        /// The cause.
        #[source]
        source: MapError,
    },
    /// A session with this id exists already.
    #[error("session {0} exists already")]
    DuplicateSession(SessionId),
    /// Reading the network namespace cookie of a socket failed.
    #[error("SO_NETNS_COOKIE: {0}")]
    NetnsCookie(#[source] nix::Error),
    /// The guardian process could not be started.
    #[error("starting the cleanup guardian {path}: {source}")]
    Reaper {
        /// The executable.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// How the redirect is set up.
#[derive(Clone, Debug)]
pub struct RedirectOptions {
    /// The `polar` executable, started as the cleanup guardian
    /// (`polar __reap DIR`). `None` runs without a guardian (a crash then
    /// leaves the cgroup directories behind, never programs).
    pub reaper_exe: Option<PathBuf>,
    /// The state's `sandboxes/` directory: after a crash the guardian also
    /// releases the disk quotas (tmpfs mounts) of the agent's sessions,
    /// keeping their files (`polar __reap DIR --sandboxes PATH`).
    pub sandboxes: Option<PathBuf>,
}

/// Where a session's connections go: the agent's listener and DNS responder,
/// as seen from inside the session's network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionTarget {
    /// IPv4 listener address (usually 127.0.0.1).
    pub listen_v4: Ipv4Addr,
    /// IPv6 listener address (usually ::1).
    pub listen_v6: Ipv6Addr,
    /// TCP listener port.
    pub tcp_port: u16,
    /// DNS responder UDP port.
    pub dns_port: u16,
    /// Leave connections to listeners inside the sandbox's own network
    /// namespace alone (isolated sandboxes only).
    pub local_bypass: bool,
}

impl SessionTarget {
    fn to_raw(self) -> SessionRedirect {
        SessionRedirect {
            listen_v6: self.listen_v6.octets(),
            listen_v4: self.listen_v4.octets(),
            tcp_port: self.tcp_port,
            dns_port: self.dns_port,
            flags: if self.local_bypass {
                FLAG_LOCAL_BYPASS
            } else {
                0
            },
            pad: 0,
        }
    }
}

/// Entry counts of the kernel-side maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MapCounts {
    /// Registered sessions.
    pub sessions: usize,
    /// Open redirected sockets.
    pub sockets: usize,
    /// Redirected connections not yet looked up by the agent.
    pub connections: usize,
}

/// Counters kept by the kernel side (summed over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RedirectStats {
    /// TCP connections redirected to a listener.
    pub tcp_redirected: u64,
    /// DNS packets or connections steered to a responder.
    pub dns_redirected: u64,
    /// Connections or datagrams refused.
    pub denied: u64,
    /// Connections a listener inside the sandbox took.
    pub local_bypass: u64,
    /// Socket records that could not be stored.
    pub sock_record_failed: u64,
    /// TCP connects without a redirect record at `sock_ops`.
    pub record_missing: u64,
    /// Connection records that could not be stored.
    pub conn_record_failed: u64,
    /// Connections that failed before being established.
    pub conn_never_established: u64,
}

struct Maps {
    stats: PerCpuArray<MapData, u64>,
    sessions: BpfHashMap<MapData, u64, SessionRedirect>,
    socks: BpfHashMap<MapData, u64, RawOrigDst>,
    conns: BpfHashMap<MapData, ConnKey, RawOrigDst>,
}

struct Inner {
    mount: Cgroup2Mount,
    root: CgroupDir,
    maps: Mutex<Maps>,
    sessions: Mutex<HashMap<CgroupId, SessionId>>,
    // Dropped last: the links detach when the object goes.
    _ebpf: Mutex<Ebpf>,
    _reaper: Option<reaper::Guardian>,
}

/// The attached redirect. Cloning shares it.
#[derive(Clone)]
pub struct Redirect {
    inner: Arc<Inner>,
}

fn take_map<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<BpfHashMap<MapData, K, V>, RedirectError> {
    let map = ebpf.take_map(name).ok_or(RedirectError::Map {
        map: name,
        source: MapError::InvalidName {
            name: name.to_owned(),
        },
    })?;
    BpfHashMap::try_from(map).map_err(|source| RedirectError::Map { map: name, source })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Redirect {
    /// Checks preconditions, creates the agent's cgroup, loads and attaches
    /// the programs. Nothing is left behind if any step fails.
    pub fn start(opts: &RedirectOptions) -> Result<Self, RedirectError> {
        preflight::check()?;
        let mount = Cgroup2Mount::find()?;
        raise_memlock_limit();
        let root = create_instance_dir(&mount)?;
        let guard = RemoveOnError(Some(root.path().to_owned()));
        let session_level = mount
            .level_of(root.path())
            .map(|l| l + 1)
            .ok_or(CgroupError::NoCgroup2)?;
        let reaper = match &opts.reaper_exe {
            Some(exe) => Some(
                reaper::Guardian::spawn(exe, root.path(), opts.sandboxes.as_deref()).map_err(
                    |source| RedirectError::Reaper {
                        path: exe.clone(),
                        source,
                    },
                )?,
            ),
            None => None,
        };
        let mut ebpf = loader::load_and_attach(root.path(), session_level)?;
        let stats = ebpf
            .take_map(polar_common::MAP_STATS)
            .ok_or(RedirectError::Map {
                map: polar_common::MAP_STATS,
                source: MapError::InvalidName {
                    name: polar_common::MAP_STATS.to_owned(),
                },
            })?;
        let maps = Maps {
            stats: PerCpuArray::try_from(stats).map_err(|source| RedirectError::Map {
                map: polar_common::MAP_STATS,
                source,
            })?,
            sessions: take_map(&mut ebpf, polar_common::MAP_SESSIONS)?,
            socks: take_map(&mut ebpf, polar_common::MAP_SOCKS)?,
            conns: take_map(&mut ebpf, polar_common::MAP_CONNS)?,
        };
        guard.disarm();
        Ok(Self {
            inner: Arc::new(Inner {
                mount,
                root,
                maps: Mutex::new(maps),
                sessions: Mutex::new(HashMap::new()),
                _ebpf: Mutex::new(ebpf),
                _reaper: reaper,
            }),
        })
    }

    /// The agent's cgroup (where the programs are attached).
    pub fn cgroup(&self) -> &Path {
        self.inner.root.path()
    }

    /// The cgroup v2 mount in use.
    pub fn mount(&self) -> &Cgroup2Mount {
        &self.inner.mount
    }

    /// Creates the session's cgroup and registers where its traffic goes.
    /// Processes moved into the returned cgroup are redirected from then on.
    pub fn create_session(
        &self,
        id: &SessionId,
        target: SessionTarget,
    ) -> Result<SessionCgroup, RedirectError> {
        let path = self.inner.root.path().join(id.as_str());
        if path.exists() {
            return Err(RedirectError::DuplicateSession(id.clone()));
        }
        let dir = CgroupDir::create(path)?;
        let cg = dir.id();
        let insert = lock(&self.inner.maps)
            .sessions
            .insert(cg.0, target.to_raw(), 0)
            .map_err(|source| RedirectError::Map {
                map: polar_common::MAP_SESSIONS,
                source,
            });
        if let Err(e) = insert {
            let _ = dir.kill_and_remove();
            return Err(e);
        }
        lock(&self.inner.sessions).insert(cg, id.clone());
        Ok(SessionCgroup {
            redirect: self.clone(),
            dir: Some(dir),
            id: id.clone(),
        })
    }

    /// Points a session's traffic at another listener and DNS port (the
    /// session moved into a container's network namespace).
    pub fn retarget(
        &self,
        session: &SessionCgroup,
        target: SessionTarget,
    ) -> Result<(), RedirectError> {
        let Some(dir) = session.dir() else {
            return Ok(());
        };
        lock(&self.inner.maps)
            .sessions
            .insert(dir.id().0, target.to_raw(), 0)
            .map_err(|source| RedirectError::Map {
                map: polar_common::MAP_SESSIONS,
                source,
            })
    }

    /// The original destination and session of a connection the agent
    /// accepted, given the accepted socket and its peer address. `None` when
    /// the connection was not redirected (someone dialled the listener
    /// directly). The record is consumed: a second call returns `None`.
    pub fn original_destination(
        &self,
        sock: &impl AsFd,
        peer: SocketAddr,
    ) -> Result<Option<(OrigDst, SessionId)>, RedirectError> {
        let netns_cookie = netns_cookie(sock)?;
        let key = ConnKey {
            netns_cookie,
            client: to_client_key_addr(peer),
        };
        let rec = {
            let mut maps = lock(&self.inner.maps);
            match maps.conns.get(&key, 0) {
                Ok(rec) => {
                    let _ = maps.conns.remove(&key);
                    rec
                }
                Err(MapError::KeyNotFound) => {
                    tracing::debug!(?key, "no redirect record for this connection");
                    return Ok(None);
                }
                Err(source) => {
                    return Err(RedirectError::Map {
                        map: polar_common::MAP_CONNS,
                        source,
                    });
                }
            }
        };
        let session = lock(&self.inner.sessions)
            .get(&CgroupId(rec.cgroup_id))
            .cloned();
        if session.is_none() {
            tracing::debug!(?rec, "redirect record of an unknown session");
        }
        Ok(session.map(|s| (OrigDst::from(rec.dst), s)))
    }

    /// Entry counts of the kernel maps (for tests and status).
    pub fn map_counts(&self) -> MapCounts {
        let maps = lock(&self.inner.maps);
        MapCounts {
            sessions: maps.sessions.keys().filter(Result::is_ok).count(),
            sockets: maps.socks.keys().filter(Result::is_ok).count(),
            connections: maps.conns.keys().filter(Result::is_ok).count(),
        }
    }

    /// The kernel side's counters.
    pub fn stats(&self) -> RedirectStats {
        let maps = lock(&self.inner.maps);
        let get = |i: u32| {
            maps.stats
                .get(&i, 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "reading redirect counters failed");
                    0
                })
        };
        RedirectStats {
            tcp_redirected: get(polar_common::STAT_TCP_REDIRECTED),
            dns_redirected: get(polar_common::STAT_DNS_REDIRECTED),
            denied: get(polar_common::STAT_DENIED),
            local_bypass: get(polar_common::STAT_LOCAL_BYPASS),
            sock_record_failed: get(polar_common::STAT_SOCK_RECORD_FAILED),
            record_missing: get(polar_common::STAT_RECORD_MISSING),
            conn_record_failed: get(polar_common::STAT_CONN_RECORD_FAILED),
            conn_never_established: get(polar_common::STAT_CONN_NEVER_ESTABLISHED),
        }
    }

    fn end_session(&self, id: &SessionId, dir: &CgroupDir) -> Result<(), RedirectError> {
        let killed = dir.kill_and_remove();
        let _ = lock(&self.inner.maps).sessions.remove(&dir.id().0);
        lock(&self.inner.sessions).remove(&dir.id());
        tracing::debug!(session = %id, "session cgroup removed");
        killed.map_err(RedirectError::from)
    }

    /// Detaches everything and removes the agent's cgroups, killing any
    /// process still in them. Waits for other clones to go first.
    pub fn shutdown(self) -> Result<(), RedirectError> {
        let root = self.inner.root.path().to_owned();
        // Dropping the last reference detaches the programs.
        drop(self);
        cgroup::kill_and_remove(&root)?;
        remove_parent_if_empty(&root);
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Best effort when `shutdown` was not called (an error path).
        let _ = cgroup::kill_and_remove(self.root.path());
        remove_parent_if_empty(self.root.path());
    }
}

/// Creates `<cgroup2>/polar/agent-<pid>-<n>`. Another agent may remove an
/// empty `polar` between the two steps, so a vanished parent is retried.
fn create_instance_dir(mount: &Cgroup2Mount) -> Result<CgroupDir, CgroupError> {
    let name = instance_name();
    let mut attempt = 0;
    loop {
        let parent = CgroupDir::create_or_open(mount.mount_point.join("polar"))?;
        match CgroupDir::create(parent.path().join(&name)) {
            Err(CgroupError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && attempt < 5 =>
            {
                attempt += 1;
            }
            r => return r,
        }
    }
}

/// `agent-<pid>-<n>`: unique per redirect, also when one process (a test)
/// starts several.
fn instance_name() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("agent-{}-{n}", std::process::id())
}

/// Removes `<cgroup2>/polar` when no other agent uses it.
pub fn remove_parent_if_empty(root: &Path) {
    if let Some(parent) = root.parent() {
        // rmdir of a cgroup with children fails with EBUSY: that is fine.
        let _ = std::fs::remove_dir(parent);
    }
}

/// A session's cgroup; ending the session (or dropping this) kills what runs
/// in it and removes it.
pub struct SessionCgroup {
    redirect: Redirect,
    dir: Option<CgroupDir>,
    id: SessionId,
}

impl SessionCgroup {
    /// The session id.
    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// The cgroup directory.
    pub fn dir(&self) -> Option<&CgroupDir> {
        self.dir.as_ref()
    }

    /// Kills what is left in the session and removes its cgroup.
    pub fn end(mut self) -> Result<(), RedirectError> {
        match self.dir.take() {
            Some(dir) => self.redirect.end_session(&self.id, &dir),
            None => Ok(()),
        }
    }
}

impl Drop for SessionCgroup {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take()
            && let Err(e) = self.redirect.end_session(&self.id, &dir)
        {
            tracing::warn!(session = %self.id, error = %e, "session cleanup failed");
        }
    }
}

/// Removes a freshly created cgroup if start-up fails half-way.
struct RemoveOnError(Option<PathBuf>);

impl RemoveOnError {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnError {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = cgroup::kill_and_remove(&p);
            remove_parent_if_empty(&p);
        }
    }
}

/// `SO_NETNS_COOKIE` of a socket (Linux 5.14).
pub fn netns_cookie(sock: &impl AsFd) -> Result<u64, RedirectError> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid fd, a u64 out-buffer and its length.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock.as_fd()),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc == 0 {
        Ok(cookie)
    } else {
        Err(RedirectError::NetnsCookie(nix::Error::last()))
    }
}

fn raise_memlock_limit() {
    // Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK.
    let r = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid struct.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) };
    if rc != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK; fine on Linux 5.11 and later");
    }
}
