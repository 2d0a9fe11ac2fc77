//! The state directory's safety check, made before the agent creates or
//! loads anything in it: the directory holds the CA key and the capture
//! logs, so one that another user could write to (group/other-writable, or
//! owned by someone else) is refused with the command that fixes it.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// Why a state directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// Group or others may write to it.
    #[error(
        "state directory {dir} is writable by group or others (mode {mode:04o}); \
         fix it with `chmod 700 {dir}`"
    )]
    Writable {
        /// The directory.
        dir: String,
        /// Its permission bits.
        mode: u32,
    },
    /// Another user owns it.
    #[error(
        "state directory {dir} is owned by uid {owner}, not by the agent's uid {uid}; \
         fix it with `chown {uid} {dir}` (or point agent.state_dir elsewhere)"
    )]
    Owner {
        /// The directory.
        dir: String,
        /// Its owner.
        owner: u32,
        /// The agent's effective uid.
        uid: u32,
    },
    /// It exists but is not a directory.
    #[error("state directory {dir} exists but is not a directory")]
    NotADirectory {
        /// The path.
        dir: String,
    },
    /// Its metadata cannot be read.
    #[error("cannot inspect state directory {dir}: {source}")]
    Io {
        /// The directory.
        dir: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Checks the state directory if it exists (a missing one is created later
/// with mode 0700).
pub fn check_state_dir(dir: &Path) -> Result<(), StateDirError> {
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(StateDirError::Io {
                dir: dir.display().to_string(),
                source,
            });
        }
    };
    check_meta(
        dir,
        meta.is_dir(),
        meta.mode(),
        meta.uid(),
        nix::unistd::geteuid().as_raw(),
    )
}

fn check_meta(
    dir: &Path,
    is_dir: bool,
    mode: u32,
    owner: u32,
    uid: u32,
) -> Result<(), StateDirError> {
    let name = || dir.display().to_string();
    if !is_dir {
        return Err(StateDirError::NotADirectory { dir: name() });
    }
    if mode & 0o022 != 0 {
        return Err(StateDirError::Writable {
            dir: name(),
            mode: mode & 0o7777,
        });
    }
    if owner != uid {
        return Err(StateDirError::Owner {
            dir: name(),
            owner,
            uid,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn writable_or_foreign_directories_are_refused_with_the_fix() {
        let d = Path::new("/var/lib/polar");
        assert!(check_meta(d, true, 0o40700, 0, 0).is_ok());
        assert!(check_meta(d, true, 0o40755, 0, 0).is_ok());
        let e = check_meta(d, true, 0o40777, 0, 0).unwrap_err().to_string();
        assert!(
            e.contains("mode 0777") && e.contains("chmod 700 /var/lib/polar"),
            "{e}"
        );
        let e = check_meta(d, true, 0o40770, 0, 0).unwrap_err().to_string();
        assert!(e.contains("writable by group or others"), "{e}");
        let e = check_meta(d, true, 0o40700, 1000, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("uid 1000") && e.contains("chown 0 /var/lib/polar"),
            "{e}"
        );
        assert!(matches!(
            check_meta(d, false, 0o100600, 0, 0),
            Err(StateDirError::NotADirectory { .. })
        ));
    }

    #[test]
    fn a_real_directory_is_checked_and_a_missing_one_passes() {
        let t = tempfile::tempdir().unwrap();
        assert!(check_state_dir(t.path()).is_ok());
        assert!(check_state_dir(&t.path().join("absent")).is_ok());
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            check_state_dir(t.path()),
            Err(StateDirError::Writable { mode: 0o777, .. })
        ));
    }
}
