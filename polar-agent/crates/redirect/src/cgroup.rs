//! Cgroup v2: finding the mount from `/proc/self/mountinfo` (hybrid hosts keep
//! it at `/sys/fs/cgroup/unified`, pure v2 hosts at `/sys/fs/cgroup`),
//! creating and removing Polar's directories, moving and killing processes.

use std::fs;
use std::io::{self, ErrorKind};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use polar_ids::CgroupId;

/// Errors of cgroup handling.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No cgroup2 file system is mounted.
    #[error(
        "no cgroup v2 hierarchy is mounted (nothing of type cgroup2 in /proc/self/mountinfo); \
         mount one, e.g. `mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 none /sys/fs/cgroup/unified`, \
         or boot with systemd.unified_cgroup_hierarchy=1"
    )]
    NoCgroup2,
    /// `/proc/self/mountinfo` could not be read.
    #[error("cannot read /proc/self/mountinfo: {0}")]
    Mountinfo(#[source] io::Error),
    /// A file system operation on a cgroup failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Processes were still in a cgroup after it was killed.
    #[error("cgroup {0} still has processes after being killed")]
    Busy(PathBuf),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + use<'a> {
    move |source| CgroupError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Where the cgroup v2 hierarchy is mounted and which part of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup2Mount {
    /// Mount point.
    pub mount_point: PathBuf,
    /// The cgroup path (within the whole hierarchy) shown at the mount point,
    /// `/` unless the mount is of a sub-tree (cgroup namespaces, bind mounts).
    pub root: String,
}

impl Cgroup2Mount {
    /// Reads `/proc/self/mountinfo`.
    pub fn find() -> Result<Self, CgroupError> {
        let text = fs::read_to_string("/proc/self/mountinfo").map_err(CgroupError::Mountinfo)?;
        parse_mountinfo(&text).ok_or(CgroupError::NoCgroup2)
    }

    /// Hierarchy level of a cgroup directory below the mount point (the root
    /// cgroup is level 0), as `bpf_get_current_ancestor_cgroup_id` counts.
    pub fn level_of(&self, dir: &Path) -> Option<u32> {
        let rel = dir.strip_prefix(&self.mount_point).ok()?;
        let below_root = self.root.split('/').filter(|c| !c.is_empty()).count();
        let below_mount = rel.components().count();
        u32::try_from(below_root + below_mount).ok()
    }
}

/// One mountinfo line's file system type, root and mount point
/// (unescaped).
fn mount_fields(line: &str) -> Option<(&str, String, PathBuf)> {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    let (left, right) = line.split_once(" - ")?;
    let fstype = right.split_whitespace().next()?;
    let mut fields = left.split_whitespace();
    let root = fields.nth(3)?;
    let mount_point = fields.next()?;
    Some((fstype, unescape(root), PathBuf::from(unescape(mount_point))))
}

/// Finds the first cgroup2 mount in a mountinfo text.
pub fn parse_mountinfo(text: &str) -> Option<Cgroup2Mount> {
    text.lines().find_map(|line| match mount_fields(line)? {
        ("cgroup2", root, mount_point) => Some(Cgroup2Mount { mount_point, root }),
        _ => None,
    })
}

/// The mount points of the cgroup v1 hierarchies mounted at their root
/// (hybrid hosts), from a mountinfo text; none on a v2-only host.
pub fn v1_mounts(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| match mount_fields(line)? {
            ("cgroup", root, mount_point) if root == "/" => Some(mount_point),
            _ => None,
        })
        .collect()
}

/// Removes the cgroup v1 groups at `rel` (relative to each hierarchy's
/// root) in every v1 hierarchy, with what is below them, then their
/// parents as long as they are empty: the groups runc makes on a hybrid
/// host for a container placed with `--cgroup-parent` at the same path as
/// its cgroup v2 directory, which it leaves behind when the container is
/// removed. Their processes are gone (killed through cgroup v2) or going:
/// a group still busy is retried for up to `wait`. Best effort: what
/// cannot be removed is logged.
pub fn remove_v1_mirrors(rel: &Path, wait: Duration) {
    let rel = rel.strip_prefix("/").unwrap_or(rel);
    if rel.as_os_str().is_empty() {
        return;
    }
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let deadline = Instant::now() + wait;
    for mount in v1_mounts(&text) {
        let dir = mount.join(rel);
        loop {
            match remove_tree(&dir) {
                Ok(()) => break,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a cgroup v1 group stays behind");
                    break;
                }
            }
        }
        // Up to the hierarchy's root (kept); a parent in use stays.
        for parent in dir.ancestors().skip(1) {
            if parent == mount || !parent.starts_with(&mount) || fs::remove_dir(parent).is_err() {
                break;
            }
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A cgroup directory Polar created.
#[derive(Debug)]
pub struct CgroupDir {
    path: PathBuf,
    id: CgroupId,
}

impl CgroupDir {
    /// Creates the directory (it must not exist yet).
    pub fn create(path: PathBuf) -> Result<Self, CgroupError> {
        fs::create_dir(&path).map_err(io_err("create cgroup", &path))?;
        Self::open(path)
    }

    /// Creates the directory, or takes it over if it exists.
    pub fn create_or_open(path: PathBuf) -> Result<Self, CgroupError> {
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("create cgroup", &path)(e)),
        }
        Self::open(path)
    }

    /// Opens an existing directory.
    pub fn open(path: PathBuf) -> Result<Self, CgroupError> {
        let meta = fs::metadata(&path).map_err(io_err("stat cgroup", &path))?;
        Ok(Self {
            id: CgroupId(meta.ino()),
            path,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cgroup id.
    pub fn id(&self) -> CgroupId {
        self.id
    }

    /// An open `cgroup.procs` for moving a process in (write "0" to move the
    /// writer, e.g. from a `pre_exec` hook, before it execs).
    pub fn procs_file(&self) -> Result<fs::File, CgroupError> {
        let p = self.path.join("cgroup.procs");
        fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(io_err("open", &p))
    }

    /// The processes directly in this cgroup.
    pub fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        read_pids(&self.path)
    }

    /// Kills everything in this cgroup and below, waits until it is empty
    /// (bounded), then removes the directory and its sub-directories.
    pub fn kill_and_remove(&self) -> Result<(), CgroupError> {
        kill_and_remove(&self.path)
    }
}

fn read_pids(dir: &Path) -> Result<Vec<i32>, CgroupError> {
    let p = dir.join("cgroup.procs");
    match fs::read_to_string(&p) {
        Ok(s) => Ok(s.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_err("read", &p)(e)),
    }
}

fn populated(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("cgroup.events")) {
        Ok(s) => s.lines().any(|l| l.trim() == "populated 1"),
        Err(_) => false,
    }
}

/// Kills all processes in `dir` and its descendants, then removes the tree.
/// A missing directory is not an error.
pub fn kill_and_remove(dir: &Path) -> Result<(), CgroupError> {
    if !dir.exists() {
        return Ok(());
    }
    // cgroup.kill (Linux 5.14) kills the whole subtree atomically; fall back
    // to signalling each process where it is missing.
    if fs::write(dir.join("cgroup.kill"), "1").is_err() {
        kill_each(dir)?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while populated(dir) {
        if Instant::now() > deadline {
            return Err(CgroupError::Busy(dir.to_owned()));
        }
        kill_each(dir)?;
        std::thread::sleep(Duration::from_millis(5));
    }
    remove_tree(dir)
}

fn kill_each(dir: &Path) -> Result<(), CgroupError> {
    for pid in read_pids(dir)? {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for child in subdirs(dir) {
        kill_each(&child)?;
    }
    Ok(())
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes a cgroup directory tree bottom-up (cgroup directories are removed
/// with rmdir, their control files go with them).
pub fn remove_tree(dir: &Path) -> Result<(), CgroupError> {
    for child in subdirs(dir) {
        remove_tree(&child)?;
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove cgroup", dir)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 31 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
35 25 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
37 35 0:32 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
";
    const PURE: &str = "\
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    #[test]
    fn finds_the_cgroup2_mount_on_hybrid_and_pure_hosts() {
        let m = parse_mountinfo(HYBRID).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(m.root, "/");
        let m = parse_mountinfo(PURE).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn finds_the_v1_hierarchies_mounted_at_their_root() {
        let text = format!(
            "{HYBRID}38 35 0:33 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
             39 35 0:34 /inner /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
        );
        assert_eq!(
            v1_mounts(&text),
            vec![
                PathBuf::from("/sys/fs/cgroup/systemd"),
                PathBuf::from("/sys/fs/cgroup/memory")
            ]
        );
        assert!(v1_mounts(PURE).is_empty());
    }

    #[test]
    fn no_cgroup2_is_none() {
        let v1_only = HYBRID
            .lines()
            .filter(|l| !l.contains("cgroup2"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(parse_mountinfo(&v1_only), None);
        assert_eq!(parse_mountinfo(""), None);
        assert_eq!(parse_mountinfo("garbage - cgroup2"), None);
    }

    #[test]
    fn levels_count_from_the_hierarchy_root() {
        let m = Cgroup2Mount {
            mount_point: "/sys/fs/cgroup".into(),
            root: "/".into(),
        };
        assert_eq!(m.level_of(Path::new("/sys/fs/cgroup")), Some(0));
        assert_eq!(m.level_of(Path::new("/sys/fs/cgroup/polar/a/s")), Some(3));
        assert_eq!(m.level_of(Path::new("/elsewhere")), None);
        let sub = Cgroup2Mount {
            mount_point: "/sys/fs/cgroup".into(),
            root: "/kubepods/pod1".into(),
        };
        assert_eq!(sub.level_of(Path::new("/sys/fs/cgroup/polar")), Some(3));
    }

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape(r"\12"), r"\12");
    }
}
