//! Files of a session's workspace, read and written from the host (as root)
//! without ever leaving the workspace: every path is resolved by the kernel
//! under the workspace directory (`openat2` with `RESOLVE_BENEATH`), so a
//! symlink the harness planted that leads outside is refused, atomically,
//! rather than followed. Non-regular files (FIFOs, devices) are refused
//! too, and reads are bounded.
//!
//! The functions block; [`blocking`] runs one on a blocking thread.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};
use polar_io::beneath::{Dir, open_how};

use super::Broken;

/// Why a workspace file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The workspace directory itself could not be opened.
    #[error("opening the workspace {}: {source}", workspace.display())]
    Workspace {
        /// The workspace.
        workspace: PathBuf,
        /// Why.
        #[source]
        source: Errno,
    },
    /// The file does not exist.
    #[error("{}: not found in the workspace", path.display())]
    NotFound {
        /// The path, relative to the workspace.
        path: PathBuf,
    },
    /// The path leads outside the workspace (a symlink, most likely).
    #[error("{}: resolves outside the workspace{}; refused", path.display(),
        target.as_ref().map(|t| format!(" (to {})", t.display())).unwrap_or_default())]
    Escapes {
        /// The path, relative to the workspace.
        path: PathBuf,
        /// Where it leads, when that could be found.
        target: Option<PathBuf>,
    },
    /// The path is a directory, FIFO, device...
    #[error("{}: not a regular file", path.display())]
    NotRegular {
        /// The path, relative to the workspace.
        path: PathBuf,
    },
    /// The file is larger than the limit.
    #[error("{}: larger than {limit} bytes", path.display())]
    TooLarge {
        /// The path, relative to the workspace.
        path: PathBuf,
        /// The limit.
        limit: u64,
    },
    /// Any other failure.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path, relative to the workspace.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn open_dir(workspace: &Path) -> Result<Dir, WorkspaceError> {
    Dir::open_root(workspace).map_err(|e| WorkspaceError::Workspace {
        workspace: workspace.to_owned(),
        source: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
    })
}

/// Beneath the workspace, following symlinks that stay inside (a reward
/// file may be one); writes use [`polar_io::beneath::STRICT`] instead.
fn beneath(flags: OFlag, mode: Mode) -> OpenHow {
    open_how(
        flags,
        mode,
        ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    )
}

fn open_error(workspace: &Path, rel: &Path, errno: Errno) -> WorkspaceError {
    let path = rel.to_owned();
    match errno {
        Errno::ENOENT => WorkspaceError::NotFound { path },
        // RESOLVE_BENEATH refuses a path leading out with EXDEV.
        Errno::EXDEV => WorkspaceError::Escapes {
            target: std::fs::canonicalize(workspace.join(rel)).ok(),
            path,
        },
        other => WorkspaceError::Io {
            path,
            source: std::io::Error::from(other),
        },
    }
}

/// Reads `rel` (relative to `workspace`), at most `limit` bytes.
pub fn read(workspace: &Path, rel: &Path, limit: u64) -> Result<Vec<u8>, WorkspaceError> {
    let dir = open_dir(workspace)?;
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    let how = beneath(OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty());
    let fd = dir
        .open_with(rel, how)
        .map_err(|e| open_error(workspace, rel, e))?;
    let file = File::from(fd);
    let io = |source| WorkspaceError::Io {
        path: rel.to_owned(),
        source,
    };
    if !file.metadata().map_err(io)?.is_file() {
        return Err(WorkspaceError::NotRegular {
            path: rel.to_owned(),
        });
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > limit {
        return Err(WorkspaceError::TooLarge {
            path: rel.to_owned(),
            limit,
        });
    }
    Ok(bytes)
}

/// Whether `rel` (relative to `workspace`, resolved beneath it) is a
/// regular file; anything missing, unreachable or of another type is not.
pub fn is_file(workspace: &Path, rel: &Path) -> bool {
    let Ok(dir) = open_dir(workspace) else {
        return false;
    };
    let how = beneath(OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty());
    dir.open_with(rel, how)
        .ok()
        .and_then(|fd| File::from(fd).metadata().ok())
        .is_some_and(|m| m.is_file())
}

/// Creates the new file `name` at the top of `workspace` (mode 0644,
/// readable by the sandbox's user); fails if anything exists there.
pub fn create(workspace: &Path, name: &str, contents: &[u8]) -> Result<(), WorkspaceError> {
    let dir = open_dir(workspace)?;
    let rel = Path::new(name);
    let how = beneath(
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW,
        Mode::from_bits_truncate(0o644),
    );
    let fd = dir
        .open_with(rel, how)
        .map_err(|e| open_error(workspace, rel, e))?;
    File::from(fd)
        .write_all(contents)
        .map_err(|source| WorkspaceError::Io {
            path: rel.to_owned(),
            source,
        })
}

/// Removes the file `name` at the top of `workspace` (a symlink there is
/// removed, never followed).
pub fn remove(workspace: &Path, name: &str) -> Result<(), WorkspaceError> {
    let dir = open_dir(workspace)?;
    unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir)
        .map_err(|e| open_error(workspace, Path::new(name), e))
}

/// Fewer free blocks or inodes than this on the quota count as none (what
/// a filled quota has left once the evaluation's own files came and went).
const NEARLY_FULL: u64 = 16;

/// Whether `workspace` is on a session's disk quota (a tmpfs) that has
/// (almost) no bytes or inodes left: what the sandbox wrote filled it. A
/// workspace on the node's own disk is never "full" here (a full node disk
/// is the node's).
pub fn quota_full(workspace: &Path) -> Result<bool, WorkspaceError> {
    let st = nix::sys::statfs::statfs(workspace).map_err(|e| WorkspaceError::Workspace {
        workspace: workspace.to_owned(),
        source: e,
    })?;
    if st.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return Ok(false);
    }
    // A tmpfs without an inode limit reports no files at all.
    let inodes_out = st.files() > 0 && st.files_free() < NEARLY_FULL;
    Ok(st.blocks_available() < NEARLY_FULL || inodes_out)
}

impl WorkspaceError {
    /// Its cause: what the sandbox left (a file gone, unreadable or
    /// leading out, a full quota) or the node's I/O.
    pub fn cause(&self) -> Broken {
        match self {
            Self::NotFound { .. } | Self::NotRegular { .. } | Self::TooLarge { .. } => {
                Broken::Unreadable
            }
            Self::Escapes { .. } => Broken::Escapes,
            Self::Workspace { source, .. } => Broken::of_errno(*source).unwrap_or(Broken::NodeIo),
            Self::Io { source, .. } => source
                .raw_os_error()
                .and_then(|n| Broken::of_errno(Errno::from_raw(n)))
                .unwrap_or(Broken::NodeIo),
        }
    }
}

/// Runs a workspace function on a blocking thread; the error's cause and
/// text.
pub(super) async fn blocking<T, F>(f: F) -> Result<T, (Broken, String)>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, WorkspaceError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(|e| (e.cause(), e.to_string())),
        Err(e) => Err((Broken::Bug, format!("workspace access failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn reads_a_file_inside_and_follows_symlinks_that_stay_inside() {
        let w = ws();
        std::fs::create_dir(w.path().join("d")).unwrap();
        std::fs::write(w.path().join("d/f"), "0.5").unwrap();
        std::os::unix::fs::symlink("d/f", w.path().join("link")).unwrap();
        assert_eq!(read(w.path(), Path::new("d/f"), 10).unwrap(), b"0.5");
        assert_eq!(read(w.path(), Path::new("link"), 10).unwrap(), b"0.5");
    }

    #[test]
    fn refuses_symlinks_leading_outside() {
        let w = ws();
        let outside = ws();
        std::fs::write(outside.path().join("secret"), "1.0").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), w.path().join("abs")).unwrap();
        std::os::unix::fs::symlink(outside.path(), w.path().join("dir")).unwrap();
        let rel_up = format!(
            "../{}/secret",
            outside.path().file_name().unwrap().to_str().unwrap()
        );
        std::os::unix::fs::symlink(&rel_up, w.path().join("up")).unwrap();
        for name in ["abs", "dir/secret", "up"] {
            let err = read(w.path(), Path::new(name), 10).unwrap_err();
            assert!(
                matches!(err, WorkspaceError::Escapes { .. }),
                "{name}: {err}"
            );
            assert!(
                err.to_string().contains("resolves outside the workspace"),
                "{err}"
            );
        }
    }

    #[test]
    fn missing_large_and_special_files_are_errors() {
        let w = ws();
        let err = read(w.path(), Path::new("nope"), 10).unwrap_err();
        assert!(matches!(err, WorkspaceError::NotFound { .. }), "{err}");
        std::fs::write(w.path().join("big"), "x".repeat(11)).unwrap();
        let err = read(w.path(), Path::new("big"), 10).unwrap_err();
        assert!(
            matches!(err, WorkspaceError::TooLarge { limit: 10, .. }),
            "{err}"
        );
        nix::unistd::mkfifo(&w.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let err = read(w.path(), Path::new("fifo"), 10).unwrap_err();
        assert!(matches!(err, WorkspaceError::NotRegular { .. }), "{err}");
        let err = read(w.path(), Path::new("."), 10).unwrap_err();
        assert!(matches!(err, WorkspaceError::NotRegular { .. }), "{err}");
        std::os::unix::fs::symlink("loop", w.path().join("loop")).unwrap();
        let err = read(w.path(), Path::new("loop"), 10).unwrap_err();
        assert!(matches!(err, WorkspaceError::Io { .. }), "{err}");
    }

    #[test]
    fn a_workspace_on_the_nodes_disk_is_never_a_full_quota() {
        let w = ws();
        let on_tmpfs = nix::sys::statfs::statfs(w.path())
            .unwrap()
            .filesystem_type()
            == nix::sys::statfs::TMPFS_MAGIC;
        if !on_tmpfs {
            assert!(!quota_full(w.path()).unwrap());
        }
        assert!(matches!(
            quota_full(&w.path().join("gone")),
            Err(WorkspaceError::Workspace { .. })
        ));
    }

    #[test]
    fn create_never_overwrites_nor_follows_and_remove_unlinks() {
        let w = ws();
        let outside = ws();
        create(w.path(), "p.diff", b"diff").unwrap();
        assert_eq!(std::fs::read(w.path().join("p.diff")).unwrap(), b"diff");
        assert!(create(w.path(), "p.diff", b"again").is_err());
        std::os::unix::fs::symlink(outside.path().join("x"), w.path().join("s")).unwrap();
        assert!(create(w.path(), "s", b"x").is_err());
        assert!(!outside.path().join("x").exists());
        remove(w.path(), "p.diff").unwrap();
        remove(w.path(), "s").unwrap();
        assert!(!w.path().join("p.diff").exists());
        assert!(std::fs::symlink_metadata(w.path().join("s")).is_err());
    }
}
