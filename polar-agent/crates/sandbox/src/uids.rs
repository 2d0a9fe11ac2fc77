//! One uid per concurrent session, from the node's range
//! (`sandbox.uid_first`, `sandbox.uid_count`): the kernel counts some
//! limits per user (inotify instances and watches, pipe buffer pages,
//! message queues, keys), so sessions sharing a uid share them, and one
//! that exhausts them breaks its siblings. Each session runs as its own
//! uid (gid the same number), leased here for as long as its sandbox lives.
//!
//! The lease is a `flock` on `/run/polar/uids/<uid>` ([`LEASE_DIR`]: one
//! directory for the node, whatever state directory each agent uses, so
//! two agents on a node never lease the same uid), held by the agent
//! through an open descriptor: released when the lease is dropped, or by
//! the kernel when the agent dies, so a crash leaks no uid. A uid is never
//! leased while a process still runs as it (a sandbox a crashed agent
//! left, a container the engine still runs): [`UidPool::lease`] skips
//! uids that own processes. Files a session left stay in its own
//! directories, which no other sandbox is shown ([`crate::runtime::view`]);
//! leases rotate through the range, so a uid comes back only after every
//! other free one was used.
//!
//! [`RangeCheck::check`] is what the agent checks at start: a range holding
//! root, `nobody`, or any user or group of the node is refused, and so is
//! one smaller than the sessions the node holds at once.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use polar_ids::SessionId;

/// Errors of the uid range and its leases.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    /// The range holds a uid or gid the node uses.
    #[error(
        "sandbox.uid_first/uid_count: the range {first}..={last} holds {what} {id} ({name} in {file})"
    )]
    Overlap {
        /// The range's first id.
        first: u32,
        /// Its last.
        last: u32,
        /// `uid` or `gid`.
        what: &'static str,
        /// The id.
        id: u32,
        /// Its name.
        name: String,
        /// `/etc/passwd` or `/etc/group`.
        file: &'static str,
    },
    /// The range is smaller than the sessions the node holds at once.
    #[error(
        "sandbox.uid_count = {count} is below the {sessions} sessions this node holds at once (gateway.max_sessions): each needs a uid of its own"
    )]
    TooSmall {
        /// The range's size.
        count: u32,
        /// Sessions at once.
        sessions: u32,
    },
    /// Every uid of the range is leased or still owns processes.
    #[error(
        "no free sandbox uid in {first}..={last}: {leased} leased, {busy} still running processes"
    )]
    Exhausted {
        /// The range's first id.
        first: u32,
        /// Its last.
        last: u32,
        /// Leased by a running agent.
        leased: u32,
        /// Not leased but owning processes.
        busy: u32,
    },
    /// A lease file could not be used.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

pub use polar_config::{DEFAULT_COUNT, DEFAULT_FIRST, MAX_UID, UidRange};

/// Where the leases' lock files are: one directory for the node.
pub const LEASE_DIR: &str = "/run/polar/uids";

/// The checks of a [`UidRange`] against the node (the range's own checks,
/// without I/O, are `UidRange::problem`).
pub trait RangeCheck {
    /// Checks the range against the node's users and groups (the text of
    /// `/etc/passwd` and `/etc/group`) and the sessions it holds at once.
    /// Pure.
    fn check(&self, passwd: &str, group: &str, sessions: u32) -> Result<(), UidError>;
    /// [`RangeCheck::check`] against this node's `/etc/passwd` and
    /// `/etc/group`. Blocks.
    fn check_node(&self, sessions: u32) -> Result<(), UidError>;
}

impl RangeCheck for UidRange {
    /// Checks the range against the node's users and groups (the text of
    /// `/etc/passwd` and `/etc/group`) and the sessions it holds at once.
    /// Pure.
    fn check(&self, passwd: &str, group: &str, sessions: u32) -> Result<(), UidError> {
        for (text, what, file) in [(passwd, "uid", "/etc/passwd"), (group, "gid", "/etc/group")] {
            for line in text.lines() {
                let mut f = line.split(':');
                let (Some(name), _, Some(id)) = (f.next(), f.next(), f.next()) else {
                    continue;
                };
                let Ok(id) = id.trim().parse::<u32>() else {
                    continue;
                };
                if self.contains(id) {
                    return Err(UidError::Overlap {
                        first: self.first,
                        last: self.last(),
                        what,
                        id,
                        name: name.to_owned(),
                        file,
                    });
                }
            }
        }
        if self.count < sessions {
            return Err(UidError::TooSmall {
                count: self.count,
                sessions,
            });
        }
        Ok(())
    }

    /// [`UidRange::check`] against this node's `/etc/passwd` and
    /// `/etc/group`. Blocks.
    fn check_node(&self, sessions: u32) -> Result<(), UidError> {
        let read = |p: &str| {
            std::fs::read_to_string(p).map_err(|source| UidError::Io {
                op: "read",
                path: p.into(),
                source,
            })
        };
        self.check(&read("/etc/passwd")?, &read("/etc/group")?, sessions)
    }
}

/// Where leases are taken: the range and the lock files' directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UidPool {
    range: UidRange,
    dir: PathBuf,
}

/// A leased uid: the session's user until dropped.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    _lock: File,
}

impl UidLease {
    /// The session's `(uid, gid)`.
    pub fn user(&self) -> (u32, u32) {
        (self.uid, self.uid)
    }
}

/// Where the next search starts: leases rotate through the range.
static CURSOR: AtomicU32 = AtomicU32::new(0);

/// The uids of every process on the node (their `/proc/<pid>` owner).
fn process_uids() -> HashSet<u32> {
    let mut out = HashSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        if let Ok(m) = std::fs::symlink_metadata(e.path()) {
            out.insert(m.uid());
        }
    }
    out
}

impl UidPool {
    /// The node's pool of `range`, its leases in [`LEASE_DIR`].
    pub fn new(range: UidRange) -> Self {
        Self::in_dir(Path::new(LEASE_DIR), range)
    }

    /// A pool whose leases are in `dir` (tests).
    pub fn in_dir(dir: &Path, range: UidRange) -> Self {
        Self {
            range,
            dir: dir.to_owned(),
        }
    }

    /// Its range.
    pub fn range(&self) -> UidRange {
        self.range
    }

    /// Leases a uid for `session`: the next one in the range (after the
    /// last leased) that no agent holds and no process runs as. Blocks
    /// (a scan of `/proc`, a lock file per uid tried).
    pub fn lease(&self, session: &SessionId) -> Result<UidLease, UidError> {
        let io = |op, path: &Path| {
            let path = path.to_owned();
            move |source| UidError::Io { op, path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io("create", &self.dir))?;
        let running = process_uids();
        let count = self.range.count;
        // A process's first lease starts somewhere in the range (its
        // clock's nanoseconds), its next ones after the last it took.
        let _ = CURSOR.compare_exchange(
            0,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.subsec_nanos() | 1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let start = CURSOR.fetch_add(1, Ordering::Relaxed) % count;
        let (mut leased, mut busy) = (0, 0);
        for i in 0..count {
            let uid = self.range.first + (start + i) % count;
            if running.contains(&uid) {
                busy += 1;
                continue;
            }
            let path = self.dir.join(uid.to_string());
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(io("open", &path))?;
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    leased += 1;
                    continue;
                }
                return Err(io("lock", &path)(e));
            }
            // Which session holds it, for whoever looks.
            f.set_len(0).map_err(io("write", &path))?;
            writeln!(f, "{session}").map_err(io("write", &path))?;
            CURSOR.store(start + i + 1, Ordering::Relaxed);
            return Ok(UidLease { uid, _lock: f });
        }
        Err(UidError::Exhausted {
            first: self.range.first,
            last: self.range.last(),
            leased,
            busy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        daemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n\
        nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
        alice:x:200010:200010::/home/alice:/bin/bash\n\
        # a comment\n\
        broken line\n";
    const GROUP: &str = "root:x:0:\nnogroup:x:65534:\nbuilders:x:300005:\n";

    #[test]
    fn ranges_holding_the_nodes_users_or_too_few_ids_are_refused() {
        let r = |first, count| UidRange { first, count };
        r(100_000, 10).check(PASSWD, GROUP, 10).unwrap();
        let e = r(200_000, 100).check(PASSWD, GROUP, 10).unwrap_err();
        assert!(
            matches!(
                &e,
                UidError::Overlap {
                    id: 200_010,
                    what: "uid",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("alice"), "{e}");
        let e = r(300_000, 10).check(PASSWD, GROUP, 10).unwrap_err();
        assert!(matches!(e, UidError::Overlap { what: "gid", .. }), "{e}");
        let e = r(100_000, 8).check(PASSWD, GROUP, 64).unwrap_err();
        assert!(matches!(
            e,
            UidError::TooSmall {
                count: 8,
                sessions: 64
            }
        ));
        assert!(r(0, 5).problem().is_some());
        assert!(r(65_000, 1000).problem().is_some());
        assert!(r(10, 0).problem().is_some());
        assert!(r(MAX_UID, 2).problem().is_some());
        assert_eq!(r(MAX_UID, 1).problem(), None);
        assert_eq!(UidRange::default().problem(), None);
        UidRange::default().check(PASSWD, GROUP, 64).unwrap();
    }

    #[test]
    fn leases_are_distinct_until_dropped_and_rotate() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = UidPool::in_dir(
            tmp.path(),
            UidRange {
                first: 1_700_000_000,
                count: 3,
            },
        );
        let s: SessionId = "s-1".parse().unwrap();
        let a = pool.lease(&s).unwrap();
        let b = pool.lease(&s).unwrap();
        let c = pool.lease(&s).unwrap();
        let mut got = [a.user().0, b.user().0, c.user().0];
        got.sort_unstable();
        assert_eq!(got, [1_700_000_000, 1_700_000_001, 1_700_000_002]);
        assert_eq!(a.user().0, a.user().1);
        let e = pool.lease(&s).unwrap_err();
        assert!(
            matches!(
                e,
                UidError::Exhausted {
                    leased: 3,
                    busy: 0,
                    ..
                }
            ),
            "{e}"
        );
        let freed = b.user().0;
        drop(b);
        assert_eq!(pool.lease(&s).unwrap().user().0, freed);
        let text = std::fs::read_to_string(tmp.path().join(freed.to_string()));
        assert_eq!(text.unwrap(), "s-1\n");
    }

    #[test]
    fn a_uid_that_owns_processes_is_not_leased() {
        // This test runs as some uid with processes: a range of that uid
        // alone has nothing to lease.
        let me = nix::unistd::getuid().as_raw();
        let tmp = tempfile::tempdir().unwrap();
        let pool = UidPool::in_dir(
            tmp.path(),
            UidRange {
                first: me,
                count: 1,
            },
        );
        let e = pool.lease(&"s-1".parse().unwrap()).unwrap_err();
        assert!(
            matches!(
                e,
                UidError::Exhausted {
                    leased: 0,
                    busy: 1,
                    ..
                }
            ),
            "{e}"
        );
    }
}
