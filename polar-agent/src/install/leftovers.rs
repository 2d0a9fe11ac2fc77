//! What a Polar agent leaves in the kernel, looked for after an uninstall:
//! agent cgroups (`<cgroup2>/polar/agent-<pid>-<n>`, see `redirect`) and BPF
//! programs of Polar (named `polar_*`, see `polar-ebpf`). An agent cgroup
//! whose agent is gone is removed (killing what is left in it); a live
//! agent's cgroup and programs are reported with its pid, never touched.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use polar_redirect::Cgroup2Mount;
use polar_redirect::cgroup::kill_and_remove;

/// Prefix of the names of Polar's programs (kernel names are cut at 15
/// bytes, so the full names are not compared).
pub const PROGRAM_PREFIX: &str = "polar_";

/// Something Polar left in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leftover {
    /// An agent cgroup of a running agent.
    LiveCgroup {
        /// The directory.
        dir: PathBuf,
        /// The agent's pid.
        pid: i32,
    },
    /// An agent cgroup whose agent is gone and that could not be removed.
    StaleCgroup {
        /// The directory.
        dir: PathBuf,
        /// Why it stayed.
        error: String,
    },
    /// A loaded BPF program of Polar.
    Program {
        /// Its id.
        id: u32,
        /// Its (kernel-truncated) name.
        name: String,
        /// Processes holding it open.
        holders: Vec<i32>,
    },
    /// The check itself could not be made.
    Unchecked {
        /// What was not checked and why.
        what: String,
    },
}

impl Leftover {
    /// Whether this stays because a Polar process still runs (as opposed
    /// to something uninstall should have removed).
    pub fn is_live(&self) -> bool {
        match self {
            Self::LiveCgroup { .. } => true,
            Self::Program { holders, .. } => !holders.is_empty(),
            Self::StaleCgroup { .. } | Self::Unchecked { .. } => false,
        }
    }
}

impl fmt::Display for Leftover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LiveCgroup { dir, pid } => write!(
                f,
                "cgroup {} belongs to Polar agent pid {pid}, still running (stop it to remove it)",
                dir.display()
            ),
            Self::StaleCgroup { dir, error } => {
                write!(f, "cgroup {} could not be removed: {error}", dir.display())
            }
            Self::Program { id, name, holders } if holders.is_empty() => {
                write!(f, "BPF program {id} ({name}) is loaded without a holder")
            }
            Self::Program { id, name, holders } => write!(
                f,
                "BPF program {id} ({name}) is held by pid {} (stop it to unload the program)",
                holders
                    .iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Self::Unchecked { what } => write!(f, "not checked: {what}"),
        }
    }
}

/// The agent pid in a cgroup name `agent-<pid>-<n>`.
pub fn agent_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("agent-")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, r)| !r.starts_with('Z'))
    })
}

/// Agent cgroups: stale ones removed, what stays reported.
pub fn cgroups() -> Vec<Leftover> {
    let mount = match Cgroup2Mount::find() {
        Ok(m) => m,
        Err(e) => {
            return vec![Leftover::Unchecked {
                what: format!("agent cgroups ({e})"),
            }];
        }
    };
    cgroups_in(&mount.mount_point.join("polar"))
}

/// Agent cgroups below `parent` (`<cgroup2>/polar`).
pub fn cgroups_in(parent: &Path) -> Vec<Leftover> {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut names: Vec<String> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let Some(pid) = agent_pid(&name) else {
            continue;
        };
        let dir = parent.join(&name);
        if !dir.join("cgroup.procs").exists() {
            continue;
        }
        if alive(pid) {
            out.push(Leftover::LiveCgroup { dir, pid });
        } else if let Err(e) = kill_and_remove(&dir) {
            out.push(Leftover::StaleCgroup {
                dir,
                error: e.to_string(),
            });
        } else {
            tracing::info!(dir = %dir.display(), "removed a stale agent cgroup");
        }
    }
    // The parent goes when no agent uses it (EBUSY otherwise: fine).
    let _ = std::fs::remove_dir(parent);
    out
}

/// Loaded BPF programs of Polar, with the processes holding them.
pub fn programs() -> Vec<Leftover> {
    let found = match polar_redirect::loader::loaded_programs_named(PROGRAM_PREFIX) {
        Ok(found) => found,
        Err(e) => {
            return vec![Leftover::Unchecked {
                what: format!("BPF programs ({e})"),
            }];
        }
    };
    if found.is_empty() {
        return Vec::new();
    }
    let ids: BTreeSet<u32> = found.iter().map(|(id, _)| *id).collect();
    let holders = holders_of(&ids);
    found
        .into_iter()
        .map(|(id, name)| Leftover::Program {
            id,
            holders: holders
                .iter()
                .filter(|(_, p)| *p == id)
                .map(|(pid, _)| *pid)
                .collect(),
            name,
        })
        .collect()
}

/// `(pid, program id)` for every process holding one of `ids` (the
/// `prog_id:` lines of its descriptors' fdinfo).
fn holders_of(ids: &BTreeSet<u32>) -> BTreeSet<(i32, u32)> {
    let mut out = BTreeSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.filter_map(Result::ok) {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            let Ok(text) = std::fs::read_to_string(fd.path()) else {
                continue;
            };
            for line in text.lines() {
                if let Some(id) = line.strip_prefix("prog_id:")
                    && let Ok(id) = id.trim().parse::<u32>()
                    && ids.contains(&id)
                {
                    out.insert((pid, id));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_cgroup_names() {
        assert_eq!(agent_pid("agent-123-0"), Some(123));
        assert_eq!(agent_pid("agent-123"), None);
        assert_eq!(agent_pid("agent-x-1"), None);
        assert_eq!(agent_pid("other"), None);
    }

    #[test]
    fn only_agent_cgroups_are_looked_at() {
        // Directories that are not cgroups (no cgroup.procs) are left alone.
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("agent-99999999-0")).unwrap();
        std::fs::create_dir(t.path().join("unrelated")).unwrap();
        assert!(cgroups_in(t.path()).is_empty());
        assert!(t.path().join("agent-99999999-0").exists());
        let live = Leftover::LiveCgroup {
            dir: "/sys/fs/cgroup/polar/agent-7-0".into(),
            pid: 7,
        };
        assert!(live.is_live());
        assert!(live.to_string().contains("pid 7, still running"), "{live}");
    }
}
