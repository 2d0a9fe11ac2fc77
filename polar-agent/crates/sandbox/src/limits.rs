//! Memory, process and CPU limits of a sandbox, enforced by cgroups wherever
//! the host offers the controller:
//!
//! 1. cgroup v2, on the session's own cgroup (`pids.max`, `memory.max`,
//!    `cpu.max`), when the controller can be enabled down to it (pure v2
//!    hosts);
//! 2. otherwise cgroup v1 (hybrid hosts, where v2 has no controllers): a
//!    `polar-<agent pid>-<session>` group (two agents in one cgroup, such
//!    as a draining gateway and the one its sessions go back to, never
//!    share or remove each other's) is made below the agent's own group in each
//!    v1 hierarchy that has the controller (`pids.max`,
//!    `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes`,
//!    `cpu.cfs_quota_us`), and the sandboxed process joins it before it
//!    execs, next to its v2 session cgroup. Being below the agent's group,
//!    the sandbox stays inside whatever limits the agent itself runs under;
//! 3. otherwise the limit is not enforced, and [`Enforced`] says so (never
//!    `RLIMIT_NPROC`: it counts every process of the user, not of one
//!    sandbox).
//!
//! Killing is always done through cgroup v2 (`cgroup.kill` on the session
//! or step cgroup), which every process of the sandbox is in.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use polar_spec::runtime::Limits;

/// Errors of applying limits.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// A cgroup file could not be written.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Where a limit is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// The v2 session cgroup.
    CgroupV2,
    /// A v1 group next to it.
    CgroupV1,
    /// Nowhere: the host has no such controller for us.
    NotEnforced,
}

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CgroupV2 => "cgroup v2",
            Self::CgroupV1 => "cgroup v1",
            Self::NotEnforced => "not enforced",
        })
    }
}

/// What is enforced where (`None`: no limit was asked for).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Enforced {
    /// Memory.
    pub memory: Option<Via>,
    /// Processes.
    pub pids: Option<Via>,
    /// CPU.
    pub cpu: Option<Via>,
}

/// The limit groups of one session; dropping removes the v1 groups (after
/// their processes are gone).
#[derive(Debug, Default)]
pub struct LimitGroups {
    v1: Vec<PathBuf>,
    /// What is enforced where.
    pub enforced: Enforced,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Pids => "pids",
            Self::Cpu => "cpu",
        }
    }

    /// `(file, value)` pairs for v2 and v1.
    fn files(self, limits: &Limits, v2: bool) -> Vec<(&'static str, String)> {
        match (self, v2) {
            (Self::Memory, true) => limits
                .memory_bytes
                .map(|m| {
                    vec![
                        ("memory.max", m.to_string()),
                        ("memory.swap.max", "0".into()),
                    ]
                })
                .unwrap_or_default(),
            (Self::Memory, false) => limits
                .memory_bytes
                .map(|m| {
                    vec![
                        ("memory.limit_in_bytes", m.to_string()),
                        ("memory.memsw.limit_in_bytes", m.to_string()),
                    ]
                })
                .unwrap_or_default(),
            (Self::Pids, _) => limits
                .pids
                .map(|p| vec![("pids.max", p.to_string())])
                .unwrap_or_default(),
            (Self::Cpu, true) => limits
                .cpu
                .map(|c| vec![("cpu.max", format!("{} 100000", cpu_quota(c)))])
                .unwrap_or_default(),
            (Self::Cpu, false) => limits
                .cpu
                .map(|c| {
                    vec![
                        ("cpu.cfs_period_us", "100000".into()),
                        ("cpu.cfs_quota_us", cpu_quota(c).to_string()),
                    ]
                })
                .unwrap_or_default(),
        }
    }
}

/// Microseconds per 100 ms period for `cores` (at least 1 ms).
fn cpu_quota(cores: f64) -> u64 {
    // Validated: finite, positive, at most 4096 cores.
    let q = (cores * 100_000.0).round();
    if q < 1000.0 { 1000 } else { q as u64 }
}

fn write(path: &Path, value: &str) -> Result<(), LimitError> {
    fs::write(path, value).map_err(|source| LimitError::Io {
        op: "write",
        path: path.to_owned(),
        source,
    })
}

/// Tries to make `controller` available in `session` (a v2 cgroup) by
/// enabling it in the subtree control of its ancestors below the mount
/// (never in the root cgroup itself: that is the host's).
fn v2_available(mount: &Path, session: &Path, controller: &str) -> bool {
    let has = |dir: &Path| {
        fs::read_to_string(dir.join("cgroup.controllers"))
            .is_ok_and(|s| s.split_whitespace().any(|c| c == controller))
    };
    if has(session) {
        return true;
    }
    let Ok(rel) = session.strip_prefix(mount) else {
        return false;
    };
    let comps: Vec<_> = rel.components().collect();
    let mut dir = mount.to_path_buf();
    for c in &comps[..comps.len().saturating_sub(1)] {
        dir.push(c);
        if !has(&dir) {
            return false;
        }
        let _ = fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}"));
    }
    has(session)
}

/// A v1 hierarchy: its mount point and the agent's group in it.
struct V1 {
    mount: PathBuf,
    own: String,
}

/// The v1 hierarchy holding `controller`, from mountinfo and the agent's
/// `/proc/self/cgroup`.
fn v1_hierarchy(controller: &str, mountinfo: &str, self_cgroup: &str) -> Option<V1> {
    let mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        if r.next()? != "cgroup" {
            return None;
        }
        let opts = r.nth(1)?;
        if !opts.split(',').any(|o| o == controller) {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })?;
    let own = self_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let _id = parts.next()?;
        let ctrls = parts.next()?;
        let path = parts.next()?;
        ctrls
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_owned())
    })?;
    Some(V1 { mount, own })
}

impl LimitGroups {
    /// Applies `limits` for the session whose v2 cgroup is `session_v2`
    /// (below the v2 mount `v2_mount`); `name` names the v1 groups.
    pub fn apply(
        limits: &Limits,
        v2_mount: &Path,
        session_v2: &Path,
        name: &str,
    ) -> Result<Self, LimitError> {
        let mut groups = Self::default();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let self_cgroup = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        for (controller, wanted) in [
            (Controller::Memory, limits.memory_bytes.is_some()),
            (Controller::Pids, limits.pids.is_some()),
            (Controller::Cpu, limits.cpu.is_some()),
        ] {
            if !wanted {
                continue;
            }
            let via = groups.apply_one(
                controller,
                limits,
                v2_mount,
                session_v2,
                name,
                &mountinfo,
                &self_cgroup,
            )?;
            match controller {
                Controller::Memory => groups.enforced.memory = Some(via),
                Controller::Pids => groups.enforced.pids = Some(via),
                Controller::Cpu => groups.enforced.cpu = Some(via),
            }
        }
        Ok(groups)
    }

    #[expect(clippy::too_many_arguments, reason = "one call site, all distinct")]
    fn apply_one(
        &mut self,
        controller: Controller,
        limits: &Limits,
        v2_mount: &Path,
        session_v2: &Path,
        name: &str,
        mountinfo: &str,
        self_cgroup: &str,
    ) -> Result<Via, LimitError> {
        if v2_available(v2_mount, session_v2, controller.name()) {
            for (file, value) in controller.files(limits, true) {
                let p = session_v2.join(file);
                // memory.swap.max is missing without swap accounting.
                if file == "memory.swap.max" && !p.exists() {
                    continue;
                }
                write(&p, &value)?;
            }
            return Ok(Via::CgroupV2);
        }
        let Some(h) = v1_hierarchy(controller.name(), mountinfo, self_cgroup) else {
            tracing::warn!(
                controller = controller.name(),
                "no cgroup controller for this limit; it is not enforced"
            );
            return Ok(Via::NotEnforced);
        };
        let dir = h
            .mount
            .join(h.own.trim_start_matches('/'))
            .join(format!("polar-{}-{name}", std::process::id()));
        if !self.v1.contains(&dir) {
            match fs::create_dir(&dir) {
                Ok(()) => self.v1.push(dir.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    self.v1.push(dir.clone());
                }
                Err(e) => {
                    tracing::warn!(controller = controller.name(), dir = %dir.display(), error = %e,
                        "cannot create a cgroup v1 group; the limit is not enforced");
                    return Ok(Via::NotEnforced);
                }
            }
        }
        for (file, value) in controller.files(limits, false) {
            let p = dir.join(file);
            if file == "memory.memsw.limit_in_bytes" && !p.exists() {
                continue;
            }
            write(&p, &value)?;
        }
        Ok(Via::CgroupV1)
    }

    /// `cgroup.procs` of each v1 group, opened for the process to join
    /// before it execs.
    pub fn procs_files(&self) -> Result<Vec<fs::File>, LimitError> {
        self.v1
            .iter()
            .map(|d| {
                let p = d.join("cgroup.procs");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .map_err(|source| LimitError::Io {
                        op: "open",
                        path: p,
                        source,
                    })
            })
            .collect()
    }

    /// The v1 groups.
    pub fn v1_dirs(&self) -> &[PathBuf] {
        &self.v1
    }
}

impl Drop for LimitGroups {
    fn drop(&mut self) {
        for d in &self.v1 {
            // Emptied by the v2 kill just before; retry briefly while the
            // last processes are reaped.
            for _ in 0..200 {
                match fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
40 35 0:35 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
41 35 0:36 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
42 35 0:37 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
";
    const SELF: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/jobs/abc
2:cpu,cpuacct:/
0::/
";

    #[test]
    fn finds_v1_hierarchies_and_own_groups() {
        let m = v1_hierarchy("memory", MOUNTINFO, SELF).unwrap();
        assert_eq!(m.mount, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(m.own, "/jobs/abc");
        let c = v1_hierarchy("cpu", MOUNTINFO, SELF).unwrap();
        assert_eq!(c.mount, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(v1_hierarchy("pids", MOUNTINFO, SELF).is_some());
        assert!(v1_hierarchy("blkio", MOUNTINFO, SELF).is_none());
    }

    #[test]
    fn limit_files_per_version() {
        let l = Limits {
            memory_bytes: Some(1 << 30),
            pids: Some(64),
            cpu: Some(0.5),
            disk_bytes: None,
        };
        assert_eq!(
            Controller::Cpu.files(&l, true),
            vec![("cpu.max", "50000 100000".to_owned())]
        );
        assert_eq!(
            Controller::Cpu.files(&l, false)[1],
            ("cpu.cfs_quota_us", "50000".to_owned())
        );
        assert_eq!(
            Controller::Pids.files(&l, false),
            vec![("pids.max", "64".to_owned())]
        );
        assert_eq!(
            Controller::Memory.files(&l, false)[0],
            ("memory.limit_in_bytes", (1u64 << 30).to_string())
        );
        assert_eq!(cpu_quota(0.001), 1000);
        assert!(Controller::Pids.files(&Limits::default(), true).is_empty());
    }
}
