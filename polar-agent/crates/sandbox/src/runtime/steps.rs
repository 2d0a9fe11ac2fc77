//! The host side of a session's directories: the per-session directory
//! under `<state_dir>/sandboxes/<session>/` with `workspace/`, `home/`,
//! `tmp/` (the sandbox's `/tmp`), `logs/` and `etc/` (the session's
//! `passwd` and `group`, naming its user), files written into HOME, and
//! uploads into the workspace. What the sandbox may write is owned by the
//! sandbox user.
//!
//! Everything in `workspace/`, `home/` and `tmp/` is hostile: the sandbox
//! may have planted symlinks, FIFOs or hard links there, during this run or
//! an earlier attempt of the same session. So every write the agent makes
//! below the session's directory goes through [`polar_io::beneath`]: a
//! descriptor of the directory, every name resolved beneath it without
//! symlinks, planted entries removed and replaced by fresh ones (logged),
//! ownership set on descriptors. The session's directory itself (root's,
//! mode 0711) and `logs/` are never visible to the sandbox. With a disk
//! quota the session's directory is a size-limited tmpfs ([`super::quota`]).
//!
//! These functions block; async callers run them with `spawn_blocking`.

use std::ffi::OsStr;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::quota;
use super::{RuntimeError, io};
use polar_ids::SessionId;
use polar_io::beneath::Dir;

/// A session's directories on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxDirs {
    /// The session.
    pub session: SessionId,
    /// `<state_dir>/sandboxes/<session>`.
    pub root: PathBuf,
    /// The workspace.
    pub workspace: PathBuf,
    /// HOME.
    pub home: PathBuf,
    /// The sandbox's `/tmp`.
    pub tmp: PathBuf,
    /// Commands' stdout and stderr.
    pub logs: PathBuf,
    /// The session's `passwd` and `group` (root's, read-only to the
    /// sandbox: bound over its `/etc/passwd` and `/etc/group`).
    pub identity: PathBuf,
}

/// Logs what a writer replaced: entries the sandbox planted.
pub(super) fn log_replaced(session: &SessionId, under: &Path, replaced: &[PathBuf], what: &str) {
    for r in replaced {
        tracing::warn!(
            session = %session,
            path = %under.join(r).display(),
            "replaced an entry the sandbox planted where {what} was written"
        );
    }
}

/// The names of the sandbox-writable directories below the session's.
const WRITABLE: [(&str, u32); 3] = [("workspace", 0o700), ("home", 0o700), ("tmp", 0o1777)];

/// Where the sessions' directories are, under a state directory.
pub fn sandboxes_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("sandboxes")
}

impl SandboxDirs {
    /// The directories of `session` under `state_dir` (not created).
    pub fn of(state_dir: &Path, session: &SessionId) -> Self {
        let root = sandboxes_dir(state_dir).join(session.as_str());
        Self {
            session: session.clone(),
            workspace: root.join("workspace"),
            home: root.join("home"),
            tmp: root.join("tmp"),
            logs: root.join("logs"),
            identity: root.join("etc"),
            root,
        }
    }

    /// Creates them (the workspace, HOME and tmp owned by `user`; the rest
    /// root's). With `disk_bytes`, the session's directory is first made a
    /// tmpfs of that size ([`quota::mount`]; one already there is kept).
    /// An existing workspace is kept (the caller may have filled it, or an
    /// earlier attempt did): its entries are handed to `user` without
    /// following links.
    pub fn create(&self, user: (u32, u32), disk_bytes: Option<u64>) -> Result<(), RuntimeError> {
        // bwrap binds the workspace and HOME as the sandbox user: it must
        // be able to pass through the state directory (search only; its
        // files keep their modes, and the sandbox never sees the directory).
        if let Some(sandboxes) = self.root.parent() {
            fs::create_dir_all(sandboxes).map_err(io("create", sandboxes))?;
            for d in [sandboxes.parent(), Some(sandboxes)].into_iter().flatten() {
                let meta = fs::metadata(d).map_err(io("stat", d))?;
                let mode = meta.permissions().mode() & 0o7777;
                if mode & 0o001 == 0 {
                    fs::set_permissions(d, fs::Permissions::from_mode(mode | 0o011))
                        .map_err(io("chmod", d))?;
                }
            }
        }
        match disk_bytes {
            Some(bytes) => {
                quota::mount(&self.root, bytes)?;
            }
            None => fs::create_dir_all(&self.root).map_err(io("create", &self.root))?,
        }
        fs::set_permissions(&self.root, fs::Permissions::from_mode(0o711))
            .map_err(io("chmod", &self.root))?;
        let root = Dir::open_root(&self.root).map_err(io("open", &self.root))?;
        let mut replaced = Vec::new();
        let logs = root
            .make_dirs(Path::new("logs"), (0, 0), &mut replaced)
            .map_err(io("create", &self.logs))?;
        logs.chown((0, 0)).map_err(io("chown", &self.logs))?;
        let etc = root
            .make_dirs(Path::new("etc"), (0, 0), &mut replaced)
            .map_err(io("create", &self.identity))?;
        etc.set_mode_and_owner(0o755, (0, 0))
            .map_err(io("chmod", &self.identity))?;
        for (name, text) in [
            ("passwd", super::view::passwd(user)),
            ("group", super::view::group(user)),
        ] {
            let path = self.identity.join(name);
            let mut f = etc
                .create_file(
                    OsStr::new(name),
                    0o644,
                    (0, 0),
                    &Path::new("etc").join(name),
                    &mut replaced,
                )
                .map_err(io("create", &path))?;
            f.write_all(text.as_bytes()).map_err(io("write", &path))?;
        }
        for (name, mode) in WRITABLE {
            let path = self.root.join(name);
            // Made (or taken back, from an earlier attempt) as root's, its
            // mode set, then handed to the sandbox user: the agent's unit
            // has CAP_CHOWN but not CAP_FOWNER, so it may not chmod what
            // it does not own.
            let d = root
                .make_dirs(Path::new(name), (0, 0), &mut replaced)
                .map_err(io("create", &path))?;
            d.set_mode_and_owner(mode, (0, 0))
                .map_err(io("chmod", &path))?;
            let skipped = d.chown_tree(user).map_err(io("chown", &path))?;
            for s in skipped {
                tracing::warn!(
                    session = %self.session,
                    path = %path.join(s).display(),
                    "a hard-linked file in the sandbox's directories keeps its owner"
                );
            }
        }
        log_replaced(&self.session, &self.root, &replaced, "a session directory");
        Ok(())
    }

    /// Writes `contents` at `rel` under HOME (parents created), owned by
    /// `user`, beneath HOME: a symlink or anything else planted at `rel` or
    /// on the way is replaced, never followed.
    pub fn write_home_file(
        &self,
        rel: &Path,
        contents: &str,
        user: (u32, u32),
    ) -> Result<PathBuf, RuntimeError> {
        let path = self.home.join(rel);
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Err(io("write", &path)(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a file name",
            )));
        };
        let home = Dir::open_root(&self.root)
            .and_then(|r| r.open_dir(Path::new("home")))
            .map_err(io("open", &self.home))?;
        let mut replaced = Vec::new();
        let dir = home
            .make_dirs(parent, user, &mut replaced)
            .map_err(io("create", &path))?;
        let mut f = dir
            .create_file(name, 0o644, user, rel, &mut replaced)
            .map_err(io("create", &path))?;
        f.write_all(contents.as_bytes())
            .map_err(io("write", &path))?;
        log_replaced(&self.session, &self.home, &replaced, "a HOME file");
        Ok(path)
    }

    /// Ends the session's disk quota: a tmpfs session directory is copied
    /// to disk at the same path and unmounted ([`quota::release`]), so
    /// what the session left stays where it was. Nothing to do without a
    /// quota. Call it once nothing reads or writes the directories through
    /// the sandbox any more.
    pub fn release(&self) -> Result<(), RuntimeError> {
        quota::release(&self.root)?;
        Ok(())
    }

    /// Removes the session's directories, their disk quota's tmpfs first
    /// (discarded, not copied to disk), walked by descriptors: nothing the
    /// sandbox planted is followed, and a mount left beneath them is an
    /// error, not crossed. Blocks.
    pub fn remove(&self) -> Result<(), RuntimeError> {
        quota::discard(&self.root);
        let parent = self.root.parent().unwrap_or(Path::new("/"));
        let dir = match Dir::open_root(parent) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("open", parent)(e)),
        };
        dir.remove_on_this_fs(self.root.file_name().unwrap_or_default())
            .map_err(io("remove", &self.root))?;
        Ok(())
    }
}

/// Copies `from` (a host file or directory, recursively; symbolic links
/// are copied as links) to `to` under `workspace`, owned by `user`. A file
/// goes into `to` when `to` is `.` or a directory already there (a real
/// one: a symlink there is replaced), else it becomes `to`. Written beneath
/// the workspace: what the sandbox planted in the way is replaced, never
/// followed, and logged for `session`. With `replace`, whatever is at `to`
/// (a tree the sandbox filled, a symlink, a file) is removed first, walked
/// by descriptors, so that `to` holds exactly what `from` holds: hidden
/// tests uploaded that way have no `conftest.py` or module of the
/// sandbox's beside them. The source is the node's (the task spec's upload
/// policy is checked before). Returns where it went.
pub fn upload(
    from: &Path,
    workspace: &Path,
    to: &Path,
    replace: bool,
    user: (u32, u32),
    session: &SessionId,
) -> Result<PathBuf, RuntimeError> {
    let meta = fs::symlink_metadata(from).map_err(io("read", from))?;
    let ws = Dir::open_root(workspace).map_err(io("open", workspace))?;
    let mut replaced = Vec::new();
    if replace && let Some(name) = to.file_name() {
        let parent = to.parent().unwrap_or(Path::new("."));
        let d = ws
            .make_dirs(parent, user, &mut replaced)
            .map_err(io("create", &workspace.join(parent)))?;
        if d.remove(name).map_err(io("remove", &workspace.join(to)))? {
            replaced.push(to.to_owned());
        }
    }
    let into_dir = to.components().all(|c| c == std::path::Component::CurDir)
        || (!meta.is_dir() && ws.open_dir(to).is_ok());
    let dest = if meta.is_dir() {
        let d = ws
            .make_dirs(to, user, &mut replaced)
            .map_err(io("create", &workspace.join(to)))?;
        let src = Dir::open_root(from).map_err(io("open", from))?;
        src.copy_tree(&d, Some(user), to, &mut replaced)
            .map_err(io("copy", from))?;
        workspace.join(to)
    } else {
        let (parent, name): (&Path, &OsStr) = if into_dir {
            (to, from.file_name().unwrap_or_default())
        } else {
            (
                to.parent().unwrap_or(Path::new(".")),
                to.file_name().unwrap_or_default(),
            )
        };
        let d = ws
            .make_dirs(parent, user, &mut replaced)
            .map_err(io("create", &workspace.join(parent)))?;
        let src_dir = from.parent().unwrap_or(Path::new("/"));
        let src = Dir::open_root(src_dir).map_err(io("open", src_dir))?;
        let at = parent.join(name);
        src.copy_entry(
            from.file_name().unwrap_or_default(),
            &d,
            name,
            Some(user),
            &at,
            &mut replaced,
        )
        .map_err(io("copy", from))?;
        workspace.join(at)
    };
    log_replaced(session, workspace, &replaced, "an upload");
    Ok(dest)
}

/// Whether `uid`/`gid` (no supplementary groups) may pass through every
/// directory from `/` down to `path` (search permission), as bubblewrap,
/// running as the sandbox user, must to bind it.
pub fn traversable(path: &Path, (uid, gid): (u32, u32)) -> bool {
    use std::os::unix::fs::MetadataExt;
    path.ancestors().all(|a| {
        fs::metadata(a).is_ok_and(|m| {
            let mode = m.mode();
            mode & 0o001 != 0
                || (m.uid() == uid && mode & 0o100 != 0)
                || (m.gid() == gid && mode & 0o010 != 0)
        })
    })
}

/// Staging for read-only directories the sandbox user cannot reach: for
/// each such directory, an empty directory `<root>/ro-<n>` the agent's
/// child binds it on (in its private mount namespace, as root, before it
/// drops privileges), and the `(source, staging)` pair for that bind.
/// Returns `(reachable, staged as (staging, target), pre-exec binds)`.
pub fn stage(dirs: &[PathBuf], root: &Path, user: (u32, u32)) -> Result<StagedDirs, RuntimeError> {
    let mut out = StagedDirs::default();
    for d in dirs {
        if traversable(d, user) {
            out.reachable.push(d.clone());
            continue;
        }
        let staging = root.join(format!("ro-{}", out.staged.len()));
        fs::create_dir_all(&staging).map_err(io("create", &staging))?;
        fs::set_permissions(&staging, fs::Permissions::from_mode(0o755))
            .map_err(io("chmod", &staging))?;
        out.binds.push((d.clone(), staging.clone()));
        out.staged.push((staging, d.clone()));
    }
    Ok(out)
}

/// What [`stage`] decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StagedDirs {
    /// Directories bwrap can bind directly.
    pub reachable: Vec<PathBuf>,
    /// `(staging, target)` for the others.
    pub staged: Vec<(PathBuf, PathBuf)>,
    /// `(source, staging)` binds for the agent's child to make.
    pub binds: Vec<(PathBuf, PathBuf)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn directories_behind_a_closed_parent_are_staged() {
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let open = tmp.path().join("open/nm");
        let closed = tmp.path().join("closed/nm");
        fs::create_dir_all(&open).unwrap();
        fs::create_dir_all(&closed).unwrap();
        fs::set_permissions(tmp.path().join("closed"), fs::Permissions::from_mode(0o700)).unwrap();
        let nobody = (65534, 65534);
        assert!(traversable(&open, nobody));
        assert!(!traversable(&closed, nobody));
        let root = tmp.path().join("sandbox");
        let s = stage(&[open.clone(), closed.clone()], &root, nobody).unwrap();
        assert_eq!(s.reachable, vec![open]);
        assert_eq!(s.staged, vec![(root.join("ro-0"), closed.clone())]);
        assert_eq!(s.binds, vec![(closed, root.join("ro-0"))]);
        assert!(root.join("ro-0").is_dir());
    }

    #[test]
    fn uploads_files_and_trees_into_the_workspace() {
        let tmp = tempfile::tempdir().unwrap();
        let me = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let dirs = SandboxDirs::of(tmp.path(), &"s-1".parse().unwrap());
        dirs.create(me, None).unwrap();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink("sub/a.txt", src.join("link")).unwrap();
        let d = upload(
            &src,
            &dirs.workspace,
            Path::new("task"),
            false,
            me,
            &dirs.session,
        )
        .unwrap();
        assert_eq!(fs::read_to_string(d.join("sub/a.txt")).unwrap(), "a");
        assert_eq!(
            fs::read_link(d.join("link")).unwrap(),
            Path::new("sub/a.txt")
        );
        let f = upload(
            &src.join("sub/a.txt"),
            &dirs.workspace,
            Path::new("."),
            false,
            me,
            &dirs.session,
        )
        .unwrap();
        assert_eq!(f, dirs.workspace.join("a.txt"));
        let p = dirs
            .write_home_file(Path::new(".gemini/settings.json"), "{}", me)
            .unwrap();
        assert_eq!(fs::metadata(&p).unwrap().uid(), me.0);
        assert_eq!(fs::metadata(&dirs.workspace).unwrap().mode() & 0o777, 0o700);
        // The session's passwd and group name its user, root's, read-only
        // to it.
        let passwd = dirs.identity.join("passwd");
        let text = fs::read_to_string(&passwd).unwrap();
        assert!(
            text.contains(&format!("polar:x:{}:{}:", me.0, me.1)),
            "{text}"
        );
        let m = fs::metadata(&passwd).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o644));
        assert!(dirs.identity.join("group").is_file());
    }

    /// A session's directories after a hostile run: `tests -> outside`,
    /// `task.txt -> outside/secret`, a FIFO and a hard link where uploads
    /// go, and HOME's `.gemini -> outside`.
    fn planted() -> (tempfile::TempDir, SandboxDirs, PathBuf, (u32, u32)) {
        let tmp = tempfile::tempdir().unwrap();
        let me = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let dirs = SandboxDirs::of(&tmp.path().join("state"), &"s-2".parse().unwrap());
        dirs.create(me, None).unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret"), "host").unwrap();
        fs::write(outside.join("settings.json"), "host").unwrap();
        let ws = &dirs.workspace;
        std::os::unix::fs::symlink(&outside, ws.join("tests")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), ws.join("task.txt")).unwrap();
        nix::unistd::mkfifo(
            &ws.join("fifo.txt"),
            nix::sys::stat::Mode::from_bits_truncate(0o666),
        )
        .unwrap();
        fs::hard_link(outside.join("secret"), ws.join("hard.txt")).unwrap();
        std::os::unix::fs::symlink(&outside, dirs.home.join(".gemini")).unwrap();
        (tmp, dirs, outside, me)
    }

    #[test]
    fn uploads_replace_what_the_sandbox_planted_and_never_write_outside() {
        let (tmp, dirs, outside, me) = planted();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("tests")).unwrap();
        fs::write(src.join("tests/secret"), "hidden test").unwrap();
        fs::write(src.join("task.txt"), "task").unwrap();
        let ws = &dirs.workspace;
        upload(
            &src.join("tests"),
            ws,
            Path::new("tests"),
            false,
            me,
            &dirs.session,
        )
        .unwrap();
        for name in ["task.txt", "fifo.txt", "hard.txt"] {
            upload(
                &src.join("task.txt"),
                ws,
                Path::new(name),
                false,
                me,
                &dirs.session,
            )
            .unwrap();
            assert_eq!(fs::read_to_string(ws.join(name)).unwrap(), "task", "{name}");
            assert!(fs::symlink_metadata(ws.join(name)).unwrap().is_file());
        }
        assert_eq!(
            fs::read_to_string(ws.join("tests/secret")).unwrap(),
            "hidden test"
        );
        assert!(fs::symlink_metadata(ws.join("tests")).unwrap().is_dir());
        assert_eq!(fs::read_to_string(outside.join("secret")).unwrap(), "host");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 2);
        // A file uploaded into a directory path that is a planted link
        // does not go through it either.
        std::os::unix::fs::symlink(&outside, ws.join("into")).unwrap();
        upload(
            &src.join("task.txt"),
            ws,
            Path::new("into"),
            false,
            me,
            &dirs.session,
        )
        .unwrap();
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 2);
    }

    #[test]
    fn a_replacing_upload_leaves_only_what_it_copied() {
        let (tmp, dirs, outside, me) = planted();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("test_a.py"), "hidden test").unwrap();
        fs::write(src.join("sub/test_b.py"), "hidden test").unwrap();
        let ws = &dirs.workspace;
        // A tree the sandbox filled: its conftest and a module beside the
        // tests, a nested directory, a FIFO, a link out.
        fs::create_dir_all(ws.join("hidden/sub/deep")).unwrap();
        fs::write(ws.join("hidden/conftest.py"), "planted").unwrap();
        fs::write(ws.join("hidden/sub/deep/pytest.py"), "planted").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("hidden/sub/out")).unwrap();
        nix::unistd::mkfifo(
            &ws.join("hidden/fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o666),
        )
        .unwrap();
        let d = upload(&src, ws, Path::new("hidden"), true, me, &dirs.session).unwrap();
        let mut names: Vec<_> = walk(&d);
        names.sort();
        assert_eq!(names, ["sub", "sub/test_b.py", "test_a.py"]);
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 2);
        // A planted link where the tree goes is removed, never followed;
        // so is a file; a missing destination is made.
        for planted in ["tests", "task.txt"] {
            upload(&src, ws, Path::new(planted), true, me, &dirs.session).unwrap();
            assert!(fs::symlink_metadata(ws.join(planted)).unwrap().is_dir());
            assert_eq!(walk(&ws.join(planted)).len(), 3, "{planted}");
        }
        upload(&src, ws, Path::new("new/tests"), true, me, &dirs.session).unwrap();
        assert_eq!(walk(&ws.join("new/tests")).len(), 3);
        assert_eq!(fs::read_to_string(outside.join("secret")).unwrap(), "host");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 2);
    }

    /// The paths beneath `dir`, relative to it.
    fn walk(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut todo = vec![dir.to_owned()];
        while let Some(d) = todo.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
                if fs::symlink_metadata(&p).unwrap().is_dir() {
                    todo.push(p);
                }
            }
        }
        out
    }

    #[test]
    fn home_files_replace_a_planted_symlink() {
        let (_tmp, dirs, outside, me) = planted();
        let p = dirs
            .write_home_file(Path::new(".gemini/settings.json"), "{}", me)
            .unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "{}");
        assert_eq!(
            fs::read_to_string(outside.join("settings.json")).unwrap(),
            "host"
        );
        std::os::unix::fs::symlink(outside.join("settings.json"), dirs.home.join("f.json"))
            .unwrap();
        dirs.write_home_file(Path::new("f.json"), "{}", me).unwrap();
        assert_eq!(
            fs::read_to_string(outside.join("settings.json")).unwrap(),
            "host"
        );
        // Creating the directories again (a retried attempt) hands the
        // tree to the user without following the links in it.
        dirs.create((65534, 65534), None).unwrap();
        let m = fs::metadata(outside.join("secret")).unwrap();
        assert_eq!(m.uid(), me.0);
        assert_eq!(fs::metadata(&outside).unwrap().uid(), me.0);
    }
}
