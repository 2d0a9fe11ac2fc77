//! The writers against what a hostile sandbox plants: symlinks at the
//! target and on the way, FIFOs, hard links. Each time the file outside is
//! unchanged and the write lands inside.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, symlink};

use super::*;

struct Case {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

/// A root directory and, beside it, an outside directory with `secret`.
fn case() -> Case {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    fs::create_dir(&root).unwrap();
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), "host").unwrap();
    Case {
        _tmp: tmp,
        root,
        outside,
    }
}

fn me() -> Owner {
    (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    )
}

/// Writes `rel` under `root` the way every writer does.
fn write(root: &Path, rel: &str, text: &str) -> Vec<PathBuf> {
    let mut replaced = Vec::new();
    let rel = Path::new(rel);
    let dir = Dir::open_root(root).unwrap();
    let parent = dir
        .make_dirs(rel.parent().unwrap(), me(), &mut replaced)
        .unwrap();
    let mut f = parent
        .create_file(rel.file_name().unwrap(), 0o644, me(), rel, &mut replaced)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    replaced
}

#[test]
fn a_symlink_at_the_target_is_replaced_not_followed() {
    let c = case();
    symlink(c.outside.join("secret"), c.root.join("f")).unwrap();
    let replaced = write(&c.root, "f", "mine");
    assert_eq!(
        fs::read_to_string(c.outside.join("secret")).unwrap(),
        "host"
    );
    assert_eq!(fs::read_to_string(c.root.join("f")).unwrap(), "mine");
    assert!(fs::symlink_metadata(c.root.join("f")).unwrap().is_file());
    assert_eq!(replaced, vec![PathBuf::from("f")]);
}

#[test]
fn a_symlinked_directory_on_the_way_is_replaced() {
    let c = case();
    // `tests -> outside`: the upload of tests/secret must not land there.
    symlink(&c.outside, c.root.join("tests")).unwrap();
    let replaced = write(&c.root, "tests/secret", "mine");
    assert_eq!(
        fs::read_to_string(c.outside.join("secret")).unwrap(),
        "host"
    );
    assert_eq!(fs::read_dir(&c.outside).unwrap().count(), 1);
    assert!(fs::symlink_metadata(c.root.join("tests")).unwrap().is_dir());
    assert_eq!(
        fs::read_to_string(c.root.join("tests/secret")).unwrap(),
        "mine"
    );
    assert_eq!(replaced, vec![PathBuf::from("tests")]);
    // A relative link leading up is refused the same way.
    let c = case();
    symlink("../outside", c.root.join("up")).unwrap();
    write(&c.root, "up/secret", "mine");
    assert_eq!(
        fs::read_to_string(c.outside.join("secret")).unwrap(),
        "host"
    );
}

#[test]
fn a_file_where_a_directory_is_wanted_is_replaced() {
    let c = case();
    fs::write(c.root.join("d"), "planted").unwrap();
    let replaced = write(&c.root, "d/e/f", "mine");
    assert_eq!(fs::read_to_string(c.root.join("d/e/f")).unwrap(), "mine");
    assert_eq!(replaced, vec![PathBuf::from("d")]);
}

#[test]
fn a_fifo_at_the_target_is_replaced_without_blocking() {
    let c = case();
    nix::unistd::mkfifo(&c.root.join("f"), Mode::from_bits_truncate(0o666)).unwrap();
    let replaced = write(&c.root, "f", "mine");
    assert!(fs::symlink_metadata(c.root.join("f")).unwrap().is_file());
    assert_eq!(fs::read_to_string(c.root.join("f")).unwrap(), "mine");
    assert_eq!(replaced, vec![PathBuf::from("f")]);
}

#[test]
fn a_hard_link_at_the_target_is_unlinked_not_written_through() {
    let c = case();
    fs::hard_link(c.outside.join("secret"), c.root.join("f")).unwrap();
    let replaced = write(&c.root, "f", "mine");
    assert_eq!(
        fs::read_to_string(c.outside.join("secret")).unwrap(),
        "host"
    );
    assert_eq!(fs::read_to_string(c.root.join("f")).unwrap(), "mine");
    assert_eq!(fs::metadata(c.outside.join("secret")).unwrap().nlink(), 1);
    assert_eq!(replaced, vec![PathBuf::from("f")]);
}

#[test]
fn a_directory_where_a_file_is_wanted_is_removed_with_its_contents() {
    let c = case();
    fs::create_dir_all(c.root.join("f/sub")).unwrap();
    symlink(&c.outside, c.root.join("f/sub/out")).unwrap();
    write(&c.root, "f", "mine");
    assert_eq!(fs::read_to_string(c.root.join("f")).unwrap(), "mine");
    assert_eq!(
        fs::read_to_string(c.outside.join("secret")).unwrap(),
        "host"
    );
}

#[test]
fn the_root_itself_may_not_be_a_symlink_and_paths_may_not_climb() {
    let c = case();
    let link = c.root.with_file_name("link");
    symlink(&c.outside, &link).unwrap();
    assert!(Dir::open_root(&link).is_err());
    let dir = Dir::open_root(&c.root).unwrap();
    let mut replaced = Vec::new();
    assert!(
        dir.make_dirs(Path::new("../outside"), me(), &mut replaced)
            .is_err()
    );
    assert!(
        dir.make_dirs(Path::new("/etc"), me(), &mut replaced)
            .is_err()
    );
    assert!(dir.open_dir(Path::new("../outside")).is_err());
}

#[test]
fn chown_tree_changes_links_not_their_targets_and_skips_hard_links() {
    let c = case();
    let owner = (65534, 65534);
    fs::create_dir_all(c.root.join("a/b")).unwrap();
    fs::write(c.root.join("a/b/f"), "x").unwrap();
    symlink(c.outside.join("secret"), c.root.join("a/l")).unwrap();
    symlink(&c.outside, c.root.join("dirlink")).unwrap();
    fs::hard_link(c.outside.join("secret"), c.root.join("hard")).unwrap();
    let before = fs::metadata(c.outside.join("secret")).unwrap();
    let skipped = Dir::open_root(&c.root).unwrap().chown_tree(owner).unwrap();
    assert_eq!(skipped, vec![PathBuf::from("hard")]);
    for p in ["", "a", "a/b", "a/b/f", "a/l", "dirlink"] {
        let m = fs::symlink_metadata(c.root.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), owner, "{p}");
    }
    let after = fs::metadata(c.outside.join("secret")).unwrap();
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    let out = fs::metadata(&c.outside).unwrap();
    assert_eq!(out.uid(), me().0);
}

#[test]
fn copy_tree_reads_a_hostile_tree_without_following_it() {
    let c = case();
    fs::create_dir_all(c.root.join("d")).unwrap();
    fs::write(c.root.join("d/f"), "data").unwrap();
    fs::set_permissions(
        c.root.join("d/f"),
        std::os::unix::fs::PermissionsExt::from_mode(0o4755),
    )
    .unwrap();
    symlink(c.outside.join("secret"), c.root.join("l")).unwrap();
    symlink(&c.outside, c.root.join("d/up")).unwrap();
    nix::unistd::mkfifo(&c.root.join("fifo"), Mode::from_bits_truncate(0o666)).unwrap();
    let dest = c.root.with_file_name("dest");
    fs::create_dir(&dest).unwrap();
    let mut replaced = Vec::new();
    let n = Dir::open_root(&c.root)
        .unwrap()
        .copy_tree(
            &Dir::open_root(&dest).unwrap(),
            None,
            Path::new(""),
            &mut replaced,
        )
        .unwrap();
    assert_eq!(n, 4);
    assert_eq!(fs::read_to_string(dest.join("d/f")).unwrap(), "data");
    assert_eq!(
        fs::metadata(dest.join("d/f")).unwrap().mode() & 0o7777,
        0o755
    );
    assert_eq!(
        fs::read_link(dest.join("l")).unwrap(),
        c.outside.join("secret")
    );
    assert_eq!(fs::read_link(dest.join("d/up")).unwrap(), c.outside);
    assert!(!dest.join("fifo").exists());
    assert!(replaced.is_empty());
}

#[test]
fn remove_takes_a_whole_tree_and_never_follows() {
    let c = case();
    fs::create_dir_all(c.root.join("t/a/b")).unwrap();
    fs::write(c.root.join("t/a/b/f"), "x").unwrap();
    symlink(&c.outside, c.root.join("t/a/out")).unwrap();
    let dir = Dir::open_root(&c.root).unwrap();
    assert!(dir.remove(OsStr::new("t")).unwrap());
    assert!(!dir.remove(OsStr::new("t")).unwrap());
    assert!(!c.root.join("t").exists());
    assert_eq!(
        fs::read_to_string(c.outside.join("secret")).unwrap(),
        "host"
    );
}

#[test]
fn link_into_links_regular_files_only_and_replaces_what_is_in_the_way() {
    let c = case();
    fs::create_dir(c.root.join("from")).unwrap();
    fs::create_dir(c.root.join("to")).unwrap();
    fs::write(c.root.join("from/pack"), "objects").unwrap();
    symlink(c.outside.join("secret"), c.root.join("from/link")).unwrap();
    // Planted where the link goes: a symlink to the outside file.
    symlink(c.outside.join("secret"), c.root.join("to/pack")).unwrap();
    let root = Dir::open_root(&c.root).unwrap();
    let (from, to) = (
        root.open_dir(Path::new("from")).unwrap(),
        root.open_dir(Path::new("to")).unwrap(),
    );
    let mut replaced = Vec::new();
    from.link_into(
        OsStr::new("pack"),
        &to,
        OsStr::new("pack"),
        Path::new("to/pack"),
        &mut replaced,
    )
    .unwrap();
    assert_eq!(replaced, vec![PathBuf::from("to/pack")]);
    let (a, b) = (
        fs::symlink_metadata(c.root.join("from/pack")).unwrap(),
        fs::symlink_metadata(c.root.join("to/pack")).unwrap(),
    );
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    assert_eq!(
        fs::read_to_string(c.outside.join("secret")).unwrap(),
        "host"
    );
    // A symlink is never linked (its target would be what the link names).
    let e = from
        .link_into(
            OsStr::new("link"),
            &to,
            OsStr::new("link"),
            Path::new("to/link"),
            &mut replaced,
        )
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(fs::symlink_metadata(c.root.join("to/link")).is_err());
}
