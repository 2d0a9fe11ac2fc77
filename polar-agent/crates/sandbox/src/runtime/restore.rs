//! Workspace paths an evaluation wants as the task left them (the
//! evaluators' `restore` option): a test runner's dependencies
//! (`node_modules`, a vendored package), its configuration (`package.json`,
//! `jest.config.js`, `go.mod`), the task's own checker. The policy may
//! change them during its run; the evaluation must not read its changes.
//!
//! [`keep`] copies each path of the workspace, after the prepare steps and
//! before the harness runs, to `polar-kept/<n>` at the top of the session's
//! directory (root's, mode 0700: in no bind, no sandbox sees it; on the
//! session's quota, and copied to disk with it when the session's quota
//! ends, for a fresh evaluation sandbox). A path that is not there is kept
//! as absent. [`restore`] puts them back before the evaluation's first
//! command: whatever the workspace holds at the path (a file, a tree, a
//! symlink the policy planted) is removed, parents replaced where the
//! policy put something else in their way, and the kept copy written in
//! its place with its modes (set-id bits dropped), owned by the sandbox's
//! user as everything in the workspace is; a path kept as absent is
//! removed.
//!
//! Both walk descriptors beneath the session's directory
//! ([`polar_io::beneath`]): nothing is followed, so a planted symlink is
//! replaced, never written through.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use super::steps::{SandboxDirs, log_replaced};
use super::{RuntimeError, io};
use polar_io::beneath::Dir;

/// The node's copies, under the session's directory.
const KEPT: &str = "polar-kept";

/// The paths [`keep`] kept, each with whether it was there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    paths: Vec<(PathBuf, bool)>,
}

impl Kept {
    /// Each path, relative to the workspace, and whether it was there.
    pub fn paths(&self) -> &[(PathBuf, bool)] {
        &self.paths
    }
}

/// The parent directory (`.` for the workspace itself) and the name of
/// `path` (relative, normal, checked by the evaluator's options).
fn split(path: &Path) -> Result<(&Path, &OsStr), RuntimeError> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if parent.as_os_str().is_empty() => Ok((Path::new("."), name)),
        (Some(parent), Some(name)) => Ok((parent, name)),
        _ => Err(io("restore", path)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a path beneath the workspace",
        ))),
    }
}

/// The session's directory and the workspace, opened (as the post-run
/// uploads open it: its parents are root's).
fn open(dirs: &SandboxDirs) -> Result<(Dir, Dir), RuntimeError> {
    let root = Dir::open_root(&dirs.root).map_err(io("open", &dirs.root))?;
    let ws = Dir::open_root(&dirs.workspace).map_err(io("open", &dirs.workspace))?;
    Ok((root, ws))
}

/// The name of path `n`'s copy in the store.
fn stored(n: usize) -> OsString {
    OsString::from(n.to_string())
}

/// Keeps `paths` of the workspace (see the module doc); what was kept
/// before is dropped. A path below a missing directory or a file is
/// absent; one below a symlink is an error (the task's workspace must
/// name it by its real path). Blocks.
pub fn keep(dirs: &SandboxDirs, paths: &[PathBuf]) -> Result<Kept, RuntimeError> {
    let (root, ws) = open(dirs)?;
    let kept_path = dirs.root.join(KEPT);
    root.remove(KEPT.as_ref())
        .map_err(io("remove", &kept_path))?;
    let mut replaced = Vec::new();
    let store = root
        .make_dirs(Path::new(KEPT), (0, 0), &mut replaced)
        .map_err(io("create", &kept_path))?;
    store
        .set_mode_and_owner(0o700, (0, 0))
        .map_err(io("chmod", &kept_path))?;
    let mut out = Vec::with_capacity(paths.len());
    for (n, path) in paths.iter().enumerate() {
        let (parent, name) = split(path)?;
        let at = dirs.workspace.join(path);
        let parent = match ws.open_dir(parent) {
            Ok(d) => Some(d),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                None
            }
            Err(e) => return Err(io("open the parent of", &at)(e)),
        };
        let there = match parent {
            Some(parent) => match parent.stat_at(name) {
                Ok(_) => {
                    parent
                        .copy_entry(name, &store, &stored(n), Some((0, 0)), path, &mut replaced)
                        .map_err(io("keep", &at))?;
                    true
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => return Err(io("stat", &at)(e)),
            },
            None => false,
        };
        out.push((path.clone(), there));
    }
    if !replaced.is_empty() {
        return Err(io("keep", &kept_path)(std::io::Error::other(format!(
            "entries were in the way in the node's own directory: {replaced:?}"
        ))));
    }
    Ok(Kept { paths: out })
}

/// Puts `kept` back in the workspace (see the module doc): each path's
/// parents made directories (owned by `user` where made; a symlink or
/// file in their way replaced), whatever is at the path removed, and the
/// kept copy written there, owned by `user`, when the path was there.
/// What the sandbox had put in the way of a parent is logged and returned
/// (relative to the workspace). Blocks.
pub fn restore(
    dirs: &SandboxDirs,
    kept: &Kept,
    user: (u32, u32),
) -> Result<Vec<PathBuf>, RuntimeError> {
    let (root, ws) = open(dirs)?;
    let kept_path = dirs.root.join(KEPT);
    let store = root
        .open_dir(Path::new(KEPT))
        .map_err(io("open", &kept_path))?;
    let mut replaced = Vec::new();
    for (n, (path, there)) in kept.paths.iter().enumerate() {
        let (parent, name) = split(path)?;
        let at = dirs.workspace.join(path);
        let dir = ws
            .make_dirs(parent, user, &mut replaced)
            .map_err(io("create the parent of", &at))?;
        dir.remove(name).map_err(io("remove", &at))?;
        if *there {
            store
                .copy_entry(&stored(n), &dir, name, Some(user), path, &mut replaced)
                .map_err(io("restore", &at))?;
        }
    }
    log_replaced(
        &dirs.session,
        &dirs.workspace,
        &replaced,
        "a `restore` path",
    );
    Ok(replaced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    const USER: (u32, u32) = (65534, 65534);

    fn dirs(state: &Path) -> SandboxDirs {
        let d = SandboxDirs::of(state, &"s-restore".parse().unwrap());
        d.create(USER, None).unwrap();
        d
    }

    fn write(path: &Path, text: &str, mode: u32) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(path, Some(USER.0), Some(USER.1)).unwrap();
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    /// The task's workspace: a dependency tree with a link the runner
    /// uses, its configuration, and a nested checker.
    fn task_workspace(ws: &Path) {
        write(&ws.join("node_modules/checker/index.js"), "real", 0o644);
        write(&ws.join("node_modules/.bin/run"), "#!/bin/sh", 0o755);
        symlink("../checker/index.js", ws.join("node_modules/.bin/check")).unwrap();
        write(&ws.join("package.json"), "{}", 0o600);
        write(&ws.join("tools/ci/check.sh"), "exit 1", 0o755);
    }

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn what_the_policy_changed_is_put_back_as_the_task_left_it() {
        let state = tempfile::tempdir().unwrap();
        let d = dirs(state.path());
        let ws = d.workspace.clone();
        task_workspace(&ws);
        let kept = keep(
            &d,
            &paths(&[
                "node_modules",
                "package.json",
                "tools/ci/check.sh",
                "jest.config.js",
                "cfg/x.json",
            ]),
        )
        .unwrap();
        assert_eq!(
            kept.paths().iter().map(|(_, t)| *t).collect::<Vec<_>>(),
            [true, true, true, false, false]
        );
        // Root's, where no sandbox sees it.
        let store = d.root.join(KEPT);
        let m = std::fs::metadata(&store).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o700));

        // The policy's run: a dependency rewritten, the configuration made
        // a symlink to its own, the checker's directory made a symlink
        // (so that a write through it would land outside), files planted
        // where the task had none.
        std::fs::write(ws.join("node_modules/checker/index.js"), "always pass").unwrap();
        write(&ws.join("node_modules/checker/extra.js"), "planted", 0o644);
        std::fs::remove_file(ws.join("package.json")).unwrap();
        let outside = state.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        write(&outside.join("package.json"), "{\"jest\": {}}", 0o644);
        symlink(outside.join("package.json"), ws.join("package.json")).unwrap();
        std::fs::remove_dir_all(ws.join("tools/ci")).unwrap();
        symlink(&outside, ws.join("tools/ci")).unwrap();
        write(&ws.join("jest.config.js"), "module.exports = {}", 0o644);
        write(&ws.join("cfg/x.json"), "{}", 0o644);

        let replaced = restore(&d, &kept, USER).unwrap();
        assert_eq!(replaced, paths(&["tools/ci"]));
        assert_eq!(read(&ws.join("node_modules/checker/index.js")), "real");
        assert!(!ws.join("node_modules/checker/extra.js").exists());
        assert_eq!(
            std::fs::read_link(ws.join("node_modules/.bin/check")).unwrap(),
            Path::new("../checker/index.js")
        );
        let run = std::fs::metadata(ws.join("node_modules/.bin/run")).unwrap();
        assert_eq!((run.uid(), run.mode() & 0o7777), (USER.0, 0o755));
        let pkg = std::fs::symlink_metadata(ws.join("package.json")).unwrap();
        assert!(pkg.is_file());
        assert_eq!((pkg.uid(), pkg.mode() & 0o7777), (USER.0, 0o600));
        assert_eq!(read(&ws.join("package.json")), "{}");
        assert!(
            std::fs::symlink_metadata(ws.join("tools/ci"))
                .unwrap()
                .is_dir()
        );
        assert_eq!(read(&ws.join("tools/ci/check.sh")), "exit 1");
        assert!(!ws.join("jest.config.js").exists());
        assert!(!ws.join("cfg/x.json").exists());
        // Nothing was written through the planted symlinks.
        assert_eq!(read(&outside.join("package.json")), "{\"jest\": {}}");
        assert!(!outside.join("check.sh").exists());

        // The store is root's throughout.
        let stored = std::fs::metadata(store.join("0/checker/index.js")).unwrap();
        assert_eq!(stored.uid(), 0);

        // Each evaluation gets them back again, owned by its sandbox's
        // user (a fresh sandbox may run as another).
        std::fs::write(ws.join("node_modules/checker/index.js"), "again").unwrap();
        restore(&d, &kept, (65533, 65533)).unwrap();
        let again = std::fs::metadata(ws.join("node_modules/checker/index.js")).unwrap();
        assert_eq!(read(&ws.join("node_modules/checker/index.js")), "real");
        assert_eq!((again.uid(), again.gid()), (65533, 65533));
    }

    #[test]
    fn parents_in_the_way_are_replaced_and_absent_paths_stay_absent() {
        let state = tempfile::tempdir().unwrap();
        let d = dirs(state.path());
        let ws = d.workspace.clone();
        task_workspace(&ws);
        let kept = keep(&d, &paths(&["tools/ci/check.sh", "conf/jest.config.js"])).unwrap();
        assert_eq!(
            kept.paths()[1],
            (PathBuf::from("conf/jest.config.js"), false)
        );
        // `tools` a file, `conf` a symlink to a directory holding the
        // absent path.
        std::fs::remove_dir_all(ws.join("tools")).unwrap();
        write(&ws.join("tools"), "a file", 0o644);
        let elsewhere = ws.join("elsewhere");
        write(&elsewhere.join("jest.config.js"), "evil", 0o644);
        symlink("elsewhere", ws.join("conf")).unwrap();
        let mut replaced = restore(&d, &kept, USER).unwrap();
        replaced.sort();
        assert_eq!(replaced, paths(&["conf", "tools"]));
        assert_eq!(read(&ws.join("tools/ci/check.sh")), "exit 1");
        let made = std::fs::metadata(ws.join("conf")).unwrap();
        assert!(made.is_dir() && made.uid() == USER.0);
        assert!(!ws.join("conf/jest.config.js").exists());
        assert_eq!(read(&elsewhere.join("jest.config.js")), "evil");
    }

    #[test]
    fn a_task_path_through_a_symlink_is_refused_and_keeping_again_starts_over() {
        let state = tempfile::tempdir().unwrap();
        let d = dirs(state.path());
        let ws = d.workspace.clone();
        task_workspace(&ws);
        symlink("tools", ws.join("link")).unwrap();
        let e = keep(&d, &paths(&["link/ci/check.sh"])).unwrap_err();
        assert!(e.to_string().contains("link/ci/check.sh"), "{e}");
        // A kept store from before is dropped.
        let first = keep(&d, &paths(&["package.json"])).unwrap();
        std::fs::write(ws.join("package.json"), "{\"changed\": 1}").unwrap();
        let second = keep(&d, &paths(&["tools"])).unwrap();
        assert_eq!(
            std::fs::read_dir(d.root.join(KEPT)).unwrap().count(),
            1,
            "{first:?} {second:?}"
        );
        assert!(d.root.join(KEPT).join("0/ci/check.sh").is_file());
    }
}
