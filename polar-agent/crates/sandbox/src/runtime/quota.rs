//! The disk quota of a sandbox: its workspace, HOME and `/tmp` together
//! live on one size-limited tmpfs mounted by the agent over the session's
//! directory (`<state_dir>/sandboxes/<session>/`, mode 0711, `nosuid,
//! nodev`, `size=` the quota, `nr_inodes=` one per [`BYTES_PER_INODE`]).
//! A sandbox that fills it, with bytes or with files, gets `ENOSPC`; the
//! node's disk is not touched while the session runs. The commands' logs
//! (`logs/`, root's) are on it too, so a flood on stdout is bounded the
//! same way; a sandbox that leaves its disk full loses the rest of its own
//! output.
//!
//! Why a tmpfs and not a loop-mounted image (figures in BENCHMARKS.md,
//! "Disk quota", from `tests/benches/disk_quota.sh`): mounting
//! and unmounting a tmpfs takes well under a millisecond where an image
//! needs a file, `mkfs` and a loop device (tens of milliseconds, a loop
//! device per session, `e2fsprogs` on the node); writes go at memory speed;
//! and the pages a sandbox writes are charged to the writer's memory cgroup
//! (the session's), so a session's `memory_bytes` bounds its disk use too
//! and a full tmpfs cannot take memory from the other sessions. The cost:
//! while mounted, what the session wrote is memory (or swap).
//!
//! Lifetime: a session's directory is kept after the session, at the same
//! path, as it always was (nothing removes it; the README promises the
//! workspace after the run, the evaluator reads it during post-run or in a
//! fresh sandbox on the same directories, exports read only the capture
//! log). So the tmpfs lives only while the session does: [`release`]
//! copies its contents to a disk directory beside it, unmounts the tmpfs
//! and puts the copy at the same path. The copy is walked by descriptors,
//! never following what the sandbox planted, leaves FIFOs, sockets and
//! devices out, keeps sparse files sparse, and writes at most the tmpfs's
//! size and inodes (each entry charged at what it can cost on a block file
//! system, `polar_io::beneath::Budget`): the node's disk never holds more
//! of a session than its quota. What did not fit is left out (the
//! workspace is copied first, then the logs, HOME and the rest) and listed
//! in [`CUT_FILE`] at the top of the session's directory.
//! [`mount`] over a directory kept from an earlier attempt pulls its
//! contents into the new tmpfs first. A crashed agent's mounts are released
//! by its guardian (`polar __reap`) once the agent's processes are killed,
//! and else by the next agent that starts on the state directory
//! ([`reclaim_stale`] both): each mounted session directory records its agent
//! (pid and start time) in a root-only file, and one whose agent is gone is
//! released; a release cut short by a crash is finished. Several agents
//! may share a state directory (concurrent `polar sandbox run`s do), so a
//! release under way is never taken by another: the tmpfs keeps its owner
//! file until it is unmounted, the disk copy names its releasing agent
//! until it takes the session's path, and a tmpfs whose owner file is not
//! written yet (a mount under way) is left alone.
//!
//! Everything here blocks; async callers use `spawn_blocking`.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount as sys_mount, umount2};
use polar_io::beneath::{BLOCK, Budget, Dir};

/// One inode per this many bytes of quota (2 GiB: 262,144 files), at
/// least [`MIN_INODES`]: a sandbox cannot make unbounded empty files, whose
/// inodes cost kernel memory outside `size=`.
pub const BYTES_PER_INODE: u64 = 8192;
/// The fewest inodes of a quota.
pub const MIN_INODES: u64 = 4096;

/// The file in a mounted session directory naming its agent.
pub const OWNER_FILE: &str = ".polar-owner";

/// Errors of the quota's mounts.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// A file operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Mounting or unmounting failed.
    #[error("{op} the tmpfs at {}: {source}", path.display())]
    Mount {
        /// `mounting` or `unmounting`.
        op: &'static str,
        /// The session's directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: nix::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> QuotaError + use<> {
    let path = path.to_owned();
    move |source| QuotaError::Io { op, path, source }
}

/// Whether `path` is a mount point (its device differs from its parent's).
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    let me = fs::symlink_metadata(path)?;
    let parent = fs::metadata(path.parent().unwrap_or(Path::new("/")))?;
    Ok(me.is_dir() && me.dev() != parent.dev())
}

/// The mount points at or below `root` (this process's mount namespace).
pub fn mounts_below(root: &Path) -> io::Result<Vec<PathBuf>> {
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        // The fifth field is the mount point (octal escapes for spaces).
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(PathBuf::from)
        .filter(|m| m.starts_with(root))
        .collect())
}

/// The tmpfs options of a quota of `bytes`.
pub fn options(bytes: u64) -> String {
    let inodes = (bytes / BYTES_PER_INODE).max(MIN_INODES);
    format!("size={bytes},nr_inodes={inodes},mode=0711")
}

/// The start time (clock ticks since boot) of `pid`, if it runs.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split(' ').collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    // Field 22 of the line; `rest` starts at field 3.
    fields.get(19)?.parse().ok()
}

/// Whether `pid` runs (a zombie, or a process gone, does not).
pub fn runs(pid: u32) -> bool {
    start_time(pid).is_some()
}

fn owner_line() -> String {
    let pid = std::process::id();
    format!("{pid} {}\n", start_time(pid).unwrap_or(0))
}

/// Whether the agent named in `root`'s owner file still runs.
fn owner_alive(root: &Path) -> bool {
    let Ok(text) = fs::read_to_string(root.join(OWNER_FILE)) else {
        return false;
    };
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (Some(Ok(pid)), Some(Ok(start))) => u32::try_from(pid)
            .ok()
            .and_then(start_time)
            .is_some_and(|s| s == start),
        _ => false,
    }
}

fn write_owner(root: &Path) -> Result<(), QuotaError> {
    let dir = Dir::open_root(root).map_err(io_err("open", root))?;
    let mut replaced = Vec::new();
    let mut f = dir
        .create_file(
            OsStr::new(OWNER_FILE),
            0o600,
            (0, 0),
            Path::new(OWNER_FILE),
            &mut replaced,
        )
        .map_err(io_err("write", &root.join(OWNER_FILE)))?;
    io::Write::write_all(&mut f, owner_line().as_bytes())
        .map_err(io_err("write", &root.join(OWNER_FILE)))
}

/// Makes `root` (a session's directory; its parent exists) a tmpfs of
/// `bytes`. A tmpfs already there (this session's, prepared again for a
/// fresh evaluation sandbox, or a crashed agent's) is kept and taken over;
/// a plain directory kept from an earlier attempt has its contents moved
/// into the new tmpfs (an error if they exceed the quota: the directory is
/// then left as it was). Whether a tmpfs was mounted.
pub fn mount(root: &Path, bytes: u64) -> Result<bool, QuotaError> {
    match fs::symlink_metadata(root) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir(root).map_err(io_err("create", root))?;
            fs::set_permissions(root, fs::Permissions::from_mode(0o711))
                .map_err(io_err("chmod", root))?;
        }
        Err(e) => return Err(io_err("stat", root)(e)),
        Ok(_) if is_mount_point(root).map_err(io_err("stat", root))? => {
            write_owner(root)?;
            return Ok(false);
        }
        Ok(_) => {}
    }
    // The directory as it is, reached through this descriptor once the
    // tmpfs covers it.
    let old = Dir::open_root(root).map_err(io_err("open", root))?;
    sys_mount(
        Some("polar-sandbox"),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options(bytes).as_str()),
    )
    .map_err(|source| QuotaError::Mount {
        op: "mounting",
        path: root.to_owned(),
        source,
    })?;
    let moved = (|| -> io::Result<()> {
        let new = Dir::open_root(root)?;
        let names = old.names()?;
        if names.is_empty() {
            return Ok(());
        }
        let mut replaced = Vec::new();
        old.copy_tree(&new, None, Path::new(""), &mut replaced)?;
        for n in names {
            old.remove(&n)?;
        }
        Ok(())
    })();
    if let Err(e) = moved {
        let _ = umount2(root, MntFlags::MNT_DETACH);
        return Err(io_err("moving the kept directory into the tmpfs at", root)(
            e,
        ));
    }
    write_owner(root)?;
    tracing::debug!(dir = %root.display(), bytes, "sandbox disk quota mounted");
    Ok(true)
}

/// The file a release writes in the session's directory when its copy to
/// disk left something out (see [`cut_report`]).
pub const CUT_FILE: &str = "disk-copy-cut.txt";

/// The budget of the disk copy of the tmpfs at `root`: its size and its
/// inodes (what the sandbox could hold), less the disk copy's own top
/// directory and [`CUT_FILE`] (a block each, and their inodes). What the
/// copy writes (charged as `polar_io::beneath::copy` describes) is then at
/// most the quota.
fn release_budget(root: &Path) -> Result<Budget, QuotaError> {
    let st = nix::sys::statvfs::statvfs(root).map_err(|e| QuotaError::Io {
        op: "statvfs",
        path: root.to_owned(),
        source: io::Error::from(e),
    })?;
    let bytes = st.blocks().saturating_mul(st.fragment_size());
    let inodes = st.files();
    Ok(Budget::new(
        bytes.saturating_sub(2 * BLOCK),
        inodes.saturating_sub(2),
    ))
}

/// The order a release copies the session's top-level entries in, so
/// that what a budget cut leaves out is the least useful: the workspace
/// (what the evaluator and the operator read), the commands' logs, HOME,
/// then the rest (`tmp/`, anything else) by name. The owner file is left
/// out.
fn copy_order(mut names: Vec<OsString>) -> Vec<OsString> {
    let rank = |n: &OsString| match n.to_str() {
        Some("workspace") => 0,
        Some("logs") => 1,
        Some("home") => 2,
        _ => 3,
    };
    names.retain(|n| n != OWNER_FILE && n != CUT_FILE);
    names.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    names
}

/// The text of [`CUT_FILE`]: how much was cut and the first entries, at
/// most one block.
fn cut_report(budget: &Budget) -> String {
    use std::fmt::Write as _;
    let (bytes, inodes) = budget.charged();
    let mut out = format!(
        "The copy of this sandbox's directory to disk stopped at its quota: \
         {} entries left out or cut short; {bytes} bytes and {inodes} inodes \
         written.\n",
        budget.cut_entries()
    );
    for c in budget.cuts() {
        let mut line = format!("{}: {}", c.path.display(), c.reason);
        if c.bytes > 0 {
            let _ = write!(line, ", {} bytes not copied", c.bytes);
        }
        let mut keep = line.len().min(300);
        while !line.is_char_boundary(keep) {
            keep -= 1;
        }
        line.truncate(keep);
        if out.len() + line.len() + 40 > BLOCK as usize {
            out.push_str("(more not listed)\n");
            break;
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The disk copy of `root` during a release: `.<name>.persist` beside it.
fn persist_path(root: &Path) -> PathBuf {
    let name = root.file_name().unwrap_or_default().to_string_lossy();
    root.with_file_name(format!(".{name}.persist"))
}

/// Ends the quota of `root`: when it is a tmpfs, its contents are copied
/// to disk beside it, the tmpfs is unmounted and the copy takes its path.
/// Whether there was a tmpfs.
pub fn release(root: &Path) -> Result<bool, QuotaError> {
    match is_mount_point(root) {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err("stat", root)(e)),
    }
    let persist = persist_path(root);
    let parent = root.parent().unwrap_or(Path::new("/"));
    let parent_dir = Dir::open_root(parent).map_err(io_err("open", parent))?;
    let persist_name = persist.file_name().unwrap_or_default().to_owned();
    parent_dir
        .remove(&persist_name)
        .map_err(io_err("remove", &persist))?;
    fs::create_dir(&persist).map_err(io_err("create", &persist))?;
    fs::set_permissions(&persist, fs::Permissions::from_mode(0o711))
        .map_err(io_err("chmod", &persist))?;
    // The copy names this process until it takes the session's path, and
    // the tmpfs keeps its owner file until it is unmounted: another agent
    // starting on the same state directory (or a sibling's guardian) never
    // takes a release that is under way for one whose agent is gone.
    write_owner(&persist)?;
    let src = Dir::open_root(root).map_err(io_err("open", root))?;
    let dst = Dir::open_root(&persist).map_err(io_err("open", &persist))?;
    let mut budget = release_budget(root)?;
    let mut replaced = Vec::new();
    let mut bytes = 0;
    for name in copy_order(src.names().map_err(io_err("read", root))?) {
        bytes += src
            .copy_entry_within(
                &name,
                &dst,
                &name,
                None,
                Path::new(&name),
                &mut replaced,
                &mut budget,
            )
            .map_err(io_err("copying to disk", root))?;
    }
    if budget.cut_entries() > 0 {
        let mut f = dst
            .create_file(
                OsStr::new(CUT_FILE),
                0o644,
                (0, 0),
                Path::new(CUT_FILE),
                &mut replaced,
            )
            .map_err(io_err("write", &persist.join(CUT_FILE)))?;
        io::Write::write_all(&mut f, cut_report(&budget).as_bytes())
            .map_err(io_err("write", &persist.join(CUT_FILE)))?;
        tracing::warn!(
            dir = %root.display(),
            entries = budget.cut_entries(),
            report = %persist.join(CUT_FILE).display(),
            "the disk copy of a sandbox directory stopped at its quota"
        );
    }
    drop(src);
    umount2(root, MntFlags::MNT_DETACH).map_err(|source| QuotaError::Mount {
        op: "unmounting",
        path: root.to_owned(),
        source,
    })?;
    finish_release(root, &persist)?;
    tracing::debug!(dir = %root.display(), bytes, "sandbox disk quota released");
    Ok(true)
}

/// The last step of a release: the (empty) mount point replaced by the
/// disk copy.
fn finish_release(root: &Path, persist: &Path) -> Result<(), QuotaError> {
    match fs::remove_dir(root) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove", root)(e)),
    }
    fs::rename(persist, root).map_err(io_err("rename", persist))?;
    match fs::remove_file(root.join(OWNER_FILE)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove", &root.join(OWNER_FILE))(e)),
    }
}

/// What [`reclaim_stale`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Session directories whose tmpfs was released.
    pub released: Vec<PathBuf>,
    /// Releases cut short by a crash, finished.
    pub finished: Vec<PathBuf>,
    /// What could not be done, as text.
    pub failed: Vec<String>,
}

/// At start-up: the tmpfs of every session directory under `sandboxes`
/// whose agent is gone is released (its contents kept on disk), and
/// releases a crash cut short are finished. Mounts of running agents are
/// left alone.
pub fn reclaim_stale(sandboxes: &Path) -> Reclaimed {
    let mut out = Reclaimed::default();
    let Ok(rd) = fs::read_dir(sandboxes) else {
        return out;
    };
    let mut names: Vec<OsString> = rd.filter_map(Result::ok).map(|e| e.file_name()).collect();
    names.sort();
    for name in &names {
        let text = name.to_string_lossy();
        if let Some(session) = text
            .strip_prefix('.')
            .and_then(|t| t.strip_suffix(".persist"))
        {
            let root = sandboxes.join(session);
            let persist = sandboxes.join(name);
            if is_mount_point(&root).unwrap_or(false) {
                // The copy was cut short: the release below starts over.
                continue;
            }
            if owner_alive(&persist) {
                // A running agent's release, between its unmount and its
                // rename.
                continue;
            }
            let empty = fs::read_dir(&root).map_or(true, |mut d| d.next().is_none());
            if empty {
                match finish_release(&root, &persist) {
                    Ok(()) => out.finished.push(root),
                    Err(e) => out.failed.push(e.to_string()),
                }
            } else {
                out.failed.push(format!(
                    "{} and {} both hold a session's files; left for the operator",
                    root.display(),
                    persist.display()
                ));
            }
            continue;
        }
        let root = sandboxes.join(name);
        // A tmpfs without an owner file is a mount under way (its agent
        // writes the file right after mounting): left alone.
        let owner_known = root.join(OWNER_FILE).exists();
        if !is_mount_point(&root).unwrap_or(false) || !owner_known || owner_alive(&root) {
            continue;
        }
        match release(&root) {
            Ok(_) => out.released.push(root),
            Err(e) => out.failed.push(e.to_string()),
        }
    }
    for r in &out.released {
        tracing::warn!(dir = %r.display(), "released the disk quota of a session whose agent is gone");
    }
    for f in &out.failed {
        tracing::warn!(error = %f, "a stale sandbox directory could not be released");
    }
    out
}

/// Unmounts the tmpfs at `root`, if there is one, without keeping its
/// contents. Whether one was unmounted.
pub fn discard(root: &Path) -> bool {
    is_mount_point(root).unwrap_or(false) && umount2(root, MntFlags::MNT_DETACH).is_ok()
}

/// [`discard`] of every session directory under `sandboxes` (for a purge
/// that removes the state directory). How many were unmounted.
pub fn discard_all(sandboxes: &Path) -> usize {
    let Ok(rd) = fs::read_dir(sandboxes) else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .filter(|e| discard(&e.path()))
        .count()
}

/// Mounting, releasing and start-up reclaim need root: tested end to end
/// in `tests/tests/sandbox_paths.rs`.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_bound_bytes_and_inodes() {
        assert_eq!(
            options(2 << 30),
            "size=2147483648,nr_inodes=262144,mode=0711"
        );
        assert_eq!(options(1 << 20), "size=1048576,nr_inodes=4096,mode=0711");
    }

    #[test]
    fn the_workspace_is_copied_first_and_the_owner_file_never() {
        let names = [
            "tmp",
            OWNER_FILE,
            "home",
            "logs",
            "extra",
            "workspace",
            CUT_FILE,
        ]
        .map(OsString::from)
        .to_vec();
        assert_eq!(
            copy_order(names),
            ["workspace", "logs", "home", "extra", "tmp"].map(OsString::from)
        );
    }

    #[test]
    fn the_cut_report_fits_a_block_and_names_the_first_cuts() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir(&src).unwrap();
        for i in 0..200 {
            fs::write(src.join(format!("{}-{i}", "é".repeat(120))), "").unwrap();
        }
        fs::create_dir(dir.path().join("dst")).unwrap();
        let mut budget = Budget::new(1 << 20, 3);
        Dir::open_root(&src)
            .unwrap()
            .copy_tree_within(
                &Dir::open_root(&dir.path().join("dst")).unwrap(),
                None,
                Path::new(""),
                &mut Vec::new(),
                &mut budget,
            )
            .unwrap();
        let text = cut_report(&budget);
        assert!(text.len() <= BLOCK as usize, "{}", text.len());
        assert!(
            text.starts_with(
                "The copy of this sandbox's directory to disk stopped at its quota: 197 entries"
            ),
            "{text}"
        );
        assert!(text.contains(": no inodes left\n"), "{text}");
        assert!(text.ends_with("(more not listed)\n"), "{text}");
    }
}
