//! The host side of a session's directories: the per-session directory
//! under `<state_dir>/sandboxes/<session>/` with `workspace/`, `home/` and
//! `logs/`, files written into HOME, and uploads into the workspace. What
//! the sandbox may write is owned by the sandbox user.

use std::fs;
use std::os::unix::fs::{PermissionsExt, lchown};
use std::path::{Path, PathBuf};

use super::RuntimeError;
use polar_ids::SessionId;

/// A session's directories on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxDirs {
    /// `<state_dir>/sandboxes/<session>`.
    pub root: PathBuf,
    /// The workspace.
    pub workspace: PathBuf,
    /// HOME.
    pub home: PathBuf,
    /// Commands' stdout and stderr.
    pub logs: PathBuf,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError + use<> {
    let path = path.to_owned();
    move |source| RuntimeError::Io { op, path, source }
}

impl SandboxDirs {
    /// The directories of `session` under `state_dir` (not created).
    pub fn of(state_dir: &Path, session: &SessionId) -> Self {
        let root = state_dir.join("sandboxes").join(session.as_str());
        Self {
            workspace: root.join("workspace"),
            home: root.join("home"),
            logs: root.join("logs"),
            root,
        }
    }

    /// Creates them (the workspace and HOME owned by `user`, mode 0700; the
    /// rest root's). An existing workspace is kept (the caller may have
    /// filled it).
    pub fn create(&self, user: (u32, u32)) -> Result<(), RuntimeError> {
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
        for d in [&self.root, &self.logs] {
            fs::create_dir_all(d).map_err(io("create", d))?;
        }
        fs::set_permissions(&self.root, fs::Permissions::from_mode(0o711))
            .map_err(io("chmod", &self.root))?;
        for d in [&self.workspace, &self.home] {
            fs::create_dir_all(d).map_err(io("create", d))?;
            fs::set_permissions(d, fs::Permissions::from_mode(0o700)).map_err(io("chmod", d))?;
            chown_tree(d, user)?;
        }
        Ok(())
    }

    /// Writes `contents` at `rel` under HOME (parents created), owned by
    /// `user`.
    pub fn write_home_file(
        &self,
        rel: &Path,
        contents: &str,
        user: (u32, u32),
    ) -> Result<PathBuf, RuntimeError> {
        let path = self.home.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        fs::write(&path, contents).map_err(io("write", &path))?;
        chown_tree(&self.home, user)?;
        Ok(path)
    }
}

/// Copies `from` (a file or a directory, recursively; symbolic links are
/// copied as links) to `to` under `workspace`, owned by `user`.
pub fn upload(
    from: &Path,
    workspace: &Path,
    to: &Path,
    user: (u32, u32),
) -> Result<PathBuf, RuntimeError> {
    let meta = fs::symlink_metadata(from).map_err(io("read", from))?;
    let mut dest = workspace.join(to);
    if meta.is_file() && (to == Path::new(".") || dest.is_dir()) {
        dest = dest.join(from.file_name().unwrap_or_default());
    }
    copy(from, &dest)?;
    chown_tree(&dest, user)?;
    Ok(dest)
}

fn copy(from: &Path, to: &Path) -> Result<(), RuntimeError> {
    let meta = fs::symlink_metadata(from).map_err(io("read", from))?;
    if meta.file_type().is_symlink() {
        let target = fs::read_link(from).map_err(io("read link", from))?;
        let _ = fs::remove_file(to);
        std::os::unix::fs::symlink(&target, to).map_err(io("link", to))?;
    } else if meta.is_dir() {
        fs::create_dir_all(to).map_err(io("create", to))?;
        for e in fs::read_dir(from).map_err(io("list", from))? {
            let e = e.map_err(io("list", from))?;
            copy(&e.path(), &to.join(e.file_name()))?;
        }
    } else {
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        fs::copy(from, to).map_err(io("copy", from))?;
    }
    Ok(())
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

/// `chown -R` without following links.
pub fn chown_tree(path: &Path, (uid, gid): (u32, u32)) -> Result<(), RuntimeError> {
    lchown(path, Some(uid), Some(gid)).map_err(io("chown", path))?;
    let meta = fs::symlink_metadata(path).map_err(io("read", path))?;
    if meta.is_dir() {
        for e in fs::read_dir(path).map_err(io("list", path))? {
            let e = e.map_err(io("list", path))?;
            chown_tree(&e.path(), (uid, gid))?;
        }
    }
    Ok(())
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
        dirs.create(me).unwrap();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink("sub/a.txt", src.join("link")).unwrap();
        let d = upload(&src, &dirs.workspace, Path::new("task"), me).unwrap();
        assert_eq!(fs::read_to_string(d.join("sub/a.txt")).unwrap(), "a");
        assert_eq!(
            fs::read_link(d.join("link")).unwrap(),
            Path::new("sub/a.txt")
        );
        let f = upload(&src.join("sub/a.txt"), &dirs.workspace, Path::new("."), me).unwrap();
        assert_eq!(f, dirs.workspace.join("a.txt"));
        let p = dirs
            .write_home_file(Path::new(".gemini/settings.json"), "{}", me)
            .unwrap();
        assert_eq!(fs::metadata(&p).unwrap().uid(), me.0);
        assert_eq!(fs::metadata(&dirs.workspace).unwrap().mode() & 0o777, 0o700);
    }
}
