//! What a command leaves running in a container. The docker runtime runs
//! each command of a session with `docker exec` in a container that lives
//! as long as the session, so a process a command started and left behind
//! (`setsid`, a double fork: orphans are adopted by the container's init)
//! would outlive it and run during the next steps: the post-run uploads,
//! the evaluation, which it could tamper with. The native runtime ends
//! each command's cgroup; here, once a command ended, every process of the
//! container's cgroup is killed but the container's init and the init's
//! first child (the container's `sleep infinity`, the oldest: anything a
//! command left was started after it).
//!
//! [`leftovers`] is the choice, pure; [`reap`] reads the container's
//! cgroup and `/proc` (blocking) and kills, again until nothing is left
//! (a process may fork while it is being killed), a bounded number of
//! times.

use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How many rounds of killing before giving up.
const ROUNDS: usize = 50;

/// Reaping a container's leftovers failed.
#[derive(Debug, thiserror::Error)]
pub enum LeftoverError {
    /// A file of `/proc` or the cgroup could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The init's cgroup line could not be understood.
    #[error("no cgroup v2 line in {0}")]
    NoCgroup(PathBuf),
    /// The cgroup v2 hierarchy was not found.
    #[error(transparent)]
    Mount(#[from] polar_redirect::cgroup::CgroupError),
    /// Processes kept coming back.
    #[error("{0} processes still left after {ROUNDS} rounds of killing")]
    KeptComing(usize),
}

/// A process of the container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc {
    /// Its pid (the host's).
    pub pid: u32,
    /// Its parent's.
    pub ppid: u32,
    /// When it started (clock ticks since boot).
    pub start: u64,
}

/// The processes to kill among `procs`, the container's, whose init is
/// `init`: all but `init` and its oldest child.
pub fn leftovers(init: u32, procs: &[Proc]) -> Vec<u32> {
    let keep = procs
        .iter()
        .filter(|p| p.ppid == init && p.pid != init)
        .min_by_key(|p| (p.start, p.pid))
        .map(|p| p.pid);
    procs
        .iter()
        .map(|p| p.pid)
        .filter(|&pid| pid != init && Some(pid) != keep)
        .collect()
}

/// `ppid` and start time from the text of `/proc/<pid>/stat` (the command
/// name, in parentheses, may hold anything: read after its last `)`).
pub fn parse_stat(pid: u32, text: &str) -> Option<Proc> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state (3), ppid (4), ..., starttime (22).
    Some(Proc {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// The cgroup v2 directory of a process from the text of its
/// `/proc/<pid>/cgroup`, with the hierarchy mounted at `mount` showing
/// the cgroup `root` there.
fn cgroup_dir(text: &str, mount: &Path, root: &str) -> Option<PathBuf> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let rel = path
        .strip_prefix(root.trim_end_matches('/'))
        .unwrap_or(path);
    Some(mount.join(rel.trim_start_matches('/')))
}

fn read(path: &Path) -> Result<String, LeftoverError> {
    std::fs::read_to_string(path).map_err(|source| LeftoverError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The pids of `dir` and of the groups below it.
fn procs_below(dir: &Path, out: &mut Vec<u32>) -> Result<(), LeftoverError> {
    let text = read(&dir.join("cgroup.procs"))?;
    out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    let entries = std::fs::read_dir(dir).map_err(|source| LeftoverError::Read {
        path: dir.to_owned(),
        source,
    })?;
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            procs_below(&e.path(), out)?;
        }
    }
    Ok(())
}

/// Kills what commands left in the container whose init has the host pid
/// `init`. Blocks. How many processes were killed.
pub fn reap(init: u32) -> Result<usize, LeftoverError> {
    let mount = polar_redirect::cgroup::Cgroup2Mount::find()?;
    let cgroup_file = PathBuf::from(format!("/proc/{init}/cgroup"));
    let dir = cgroup_dir(&read(&cgroup_file)?, &mount.mount_point, &mount.root)
        .ok_or(LeftoverError::NoCgroup(cgroup_file))?;
    let mut killed = 0;
    let mut left = 0;
    for _ in 0..ROUNDS {
        let mut pids = Vec::new();
        procs_below(&dir, &mut pids)?;
        // A process gone meanwhile has no stat: it needs no killing.
        let procs: Vec<Proc> = pids
            .iter()
            .filter_map(|&pid| {
                let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                parse_stat(pid, &text)
            })
            .collect();
        let targets = leftovers(init, &procs);
        left = targets.len();
        if targets.is_empty() {
            return Ok(killed);
        }
        for pid in targets {
            let Ok(raw) = i32::try_from(pid) else {
                continue;
            };
            if kill(Pid::from_raw(raw), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(LeftoverError::KeptComing(left))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, ppid: u32, start: u64) -> Proc {
        Proc { pid, ppid, start }
    }

    #[test]
    fn the_init_and_its_first_child_stay_and_the_rest_go() {
        // init 10, its sleep 11; a command's daemon adopted by init (12),
        // and its child (13); an exec'd command still there (20).
        let procs = [
            p(10, 1, 100),
            p(12, 10, 500),
            p(11, 10, 101),
            p(13, 12, 501),
            p(20, 5, 400),
        ];
        let mut got = leftovers(10, &procs);
        got.sort_unstable();
        assert_eq!(got, [12, 13, 20]);
        // Nothing left: nothing to kill.
        assert!(leftovers(10, &procs[..1]).is_empty());
        assert!(leftovers(10, &[p(10, 1, 100), p(11, 10, 101)]).is_empty());
    }

    #[test]
    fn stat_lines_are_read_after_the_name() {
        let line = "42 (sle) ep (x)) S 7 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 2273280 131 18446744073709551615";
        assert_eq!(parse_stat(42, line), Some(p(42, 7, 98765)));
        assert_eq!(parse_stat(42, "42 (x) S"), None);
        assert_eq!(parse_stat(42, "garbage"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        let me = parse_stat(std::process::id(), &own).unwrap();
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
    }

    #[test]
    fn the_cgroup_is_the_v2_line() {
        let mount = Path::new("/sys/fs/cgroup/unified");
        assert_eq!(
            cgroup_dir("12:pids:/docker/x\n0::/polar/s-1/abc\n", mount, "/"),
            Some(PathBuf::from("/sys/fs/cgroup/unified/polar/s-1/abc"))
        );
        assert_eq!(
            cgroup_dir("0::/sub/polar/s-1\n", mount, "/sub"),
            Some(PathBuf::from("/sys/fs/cgroup/unified/polar/s-1"))
        );
        assert_eq!(cgroup_dir("1:cpu:/x\n", mount, "/"), None);
    }
}
