//! One exported trajectory file, read for the dashboard: the file a
//! sample's result names (`trajectory_uri`, written by its gateway), taken
//! only when it is a local path beneath one of the operator's
//! `[rollout.dashboard] export_roots`, opened from that root's descriptor
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//! (`polar_io::beneath`: no symlink followed, no `..` out), a regular file
//! of at most `max_file_bytes`, decoded with the export crate's own readers
//! (Parquet or JSONL by extension), and cut to the rows of the sample's own
//! session (a batch file holds several). A URI that names anything else
//! (`s3://`, a path outside the roots) is refused, never fetched: the
//! server reads no location a node or a task chose.
//!
//! Everything here blocks (file I/O, decoding): the caller runs it with
//! `spawn_blocking`.

use std::io::Read as _;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use polar_export::Row;
use polar_io::beneath::{Dir, STRICT, open_how};

/// Why an exported file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ExportReadError {
    /// The sample has no exported file (yet, or none was written).
    #[error("sample {0} has no exported trajectory")]
    NoFile(String),
    /// The server has no export roots: it reads no exported file.
    #[error(
        "this server reads no exported file: set [rollout.dashboard] export_roots to the \
         directories the gateways export to"
    )]
    NoRoots,
    /// The URI is not a local absolute path (`s3://...`, `sim://...`).
    #[error(
        "{0}: not a local path; the dashboard reads files beneath [rollout.dashboard] export_roots only"
    )]
    NotLocal(String),
    /// The path is outside every export root.
    #[error("{0}: outside [rollout.dashboard] export_roots")]
    Outside(String),
    /// Neither `.parquet` nor `.jsonl`.
    #[error("{0}: not a .parquet or .jsonl export")]
    Format(String),
    /// Larger than `max_file_bytes`.
    #[error("{path}: {size} bytes, over [rollout.dashboard] max_file_bytes ({max})")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// Missing, a symlink on the way, not a regular file.
    #[error("{path}: {reason}")]
    Missing {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file does not decode as an export of this schema version.
    #[error("{path}: {reason}")]
    Decode {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// The two file formats the export writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// `.parquet`.
    Parquet,
    /// `.jsonl`.
    Jsonl,
}

impl FileFormat {
    /// Its name in replies.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Jsonl => "jsonl",
        }
    }
}

/// Where `uri` is: the root it is beneath, the path below that root, and
/// its format. Pure: nothing is opened.
pub fn locate(
    uri: &str,
    roots: &[PathBuf],
) -> Result<(PathBuf, PathBuf, FileFormat), ExportReadError> {
    if roots.is_empty() {
        return Err(ExportReadError::NoRoots);
    }
    let path = Path::new(uri);
    if !path.is_absolute() || uri.contains("://") {
        return Err(ExportReadError::NotLocal(uri.to_owned()));
    }
    // `Path::components` drops `.`; a `..` is refused here (openat2 would
    // refuse one leading out anyway).
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(ExportReadError::Outside(uri.to_owned()));
    }
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("parquet") => FileFormat::Parquet,
        Some("jsonl") => FileFormat::Jsonl,
        _ => return Err(ExportReadError::Format(uri.to_owned())),
    };
    for root in roots {
        if let Ok(rel) = path.strip_prefix(root)
            && rel.components().next().is_some()
        {
            return Ok((root.clone(), rel.to_owned(), format));
        }
    }
    Err(ExportReadError::Outside(uri.to_owned()))
}

/// Reads the rows of `session` from the file at `uri` (see the module
/// doc); at most `max_bytes` are read.
pub fn read_session_rows(
    uri: &str,
    session: &str,
    roots: &[PathBuf],
    max_bytes: u64,
) -> Result<(FileFormat, u64, Vec<Row<'static>>), ExportReadError> {
    let (root, rel, format) = locate(uri, roots)?;
    let missing = |reason: String| ExportReadError::Missing {
        path: uri.to_owned(),
        reason,
    };
    let dir = Dir::open_root(&root)
        .map_err(|e| missing(format!("export root {}: {e}", root.display())))?;
    let how = open_how(
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
        Mode::empty(),
        STRICT,
    );
    let fd = dir.open_with(&rel, how).map_err(|e| {
        missing(format!(
            "not opened beneath {} without symlinks: {e}",
            root.display()
        ))
    })?;
    let mut file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| missing(e.to_string()))?;
    if !meta.file_type().is_file() {
        return Err(missing("not a regular file".into()));
    }
    let size = meta.len();
    if size > max_bytes {
        return Err(ExportReadError::TooLarge {
            path: uri.to_owned(),
            size,
            max: max_bytes,
        });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // The file may grow after the check: never more than the limit.
    (&mut file)
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| missing(e.to_string()))?;
    if bytes.len() as u64 > max_bytes {
        return Err(ExportReadError::TooLarge {
            path: uri.to_owned(),
            size: bytes.len() as u64,
            max: max_bytes,
        });
    }
    let read = bytes.len() as u64;
    let rows = match format {
        FileFormat::Parquet => polar_export::read_parquet(bytes::Bytes::from(bytes)),
        FileFormat::Jsonl => polar_export::read_jsonl(&bytes),
    }
    .map_err(|e| ExportReadError::Decode {
        path: uri.to_owned(),
        reason: e.to_string(),
    })?;
    let rows = rows
        .into_iter()
        .filter(|r| r.session_id == session)
        .collect();
    Ok((format, read, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_files_beneath_a_root_are_located() {
        let roots = [PathBuf::from("/srv/exports"), PathBuf::from("/mnt/b")];
        let (root, rel, f) = locate("/srv/exports/task=t/t-s0.parquet", &roots).unwrap();
        assert_eq!(root, PathBuf::from("/srv/exports"));
        assert_eq!(rel, PathBuf::from("task=t/t-s0.parquet"));
        assert_eq!(f, FileFormat::Parquet);
        assert_eq!(
            locate("/mnt/b/x.jsonl", &roots).unwrap().2,
            FileFormat::Jsonl
        );
        let err = |uri: &str, roots: &[PathBuf]| locate(uri, roots).unwrap_err().to_string();
        assert!(err("/srv/exports/t.parquet", &[]).contains("reads no exported file"));
        assert!(err("s3://bucket/t.parquet", &roots).contains("not a local path"));
        assert!(err("sim://node/t.json", &roots).contains("not a local path"));
        assert!(err("task=t/t.parquet", &roots).contains("not a local path"));
        assert!(err("/srv/exports/../etc/x.jsonl", &roots).contains("outside"));
        assert!(err("/srv/exportsX/t.jsonl", &roots).contains("outside"));
        assert!(err("/etc/shadow.jsonl", &roots).contains("outside"));
        assert!(err("/srv/exports/t.json", &roots).contains("not a .parquet or .jsonl"));
        assert!(err("/srv/exports.jsonl", &roots).contains("outside"));
    }

    #[test]
    fn symlinks_large_files_and_other_sessions_are_refused_or_cut() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("exports");
        std::fs::create_dir_all(root.join("task=t")).unwrap();
        let line = |s: &str| crate::tests::export_line(s, "t");
        let file = root.join("task=t/batch-t-s0.jsonl");
        std::fs::write(&file, format!("{}\n{}\n", line("t-s0"), line("t-s1"))).unwrap();
        let roots = [root.clone()];
        let uri = file.display().to_string();
        let (f, _, rows) =
            read_session_rows(&uri, "t-s1", &roots, 1 << 20).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f, FileFormat::Jsonl);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].session_id, "t-s1");
        let e = read_session_rows(&uri, "t-s1", &roots, 1024).unwrap_err();
        assert!(matches!(e, ExportReadError::TooLarge { .. }), "{e}");
        // A symlink beneath the root (to a file outside) is not followed.
        let outside = dir.path().join("secret.jsonl");
        std::fs::write(&outside, line("t-s0")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("task=t/link.jsonl")).unwrap();
        let uri = root.join("task=t/link.jsonl").display().to_string();
        let e = read_session_rows(&uri, "t-s0", &roots, 1 << 20).unwrap_err();
        assert!(matches!(e, ExportReadError::Missing { .. }), "{e}");
        // A directory symlink on the way neither.
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        let uri = root.join("up/secret.jsonl").display().to_string();
        let e = read_session_rows(&uri, "t-s0", &roots, 1 << 20).unwrap_err();
        assert!(matches!(e, ExportReadError::Missing { .. }), "{e}");
        // Garbage does not decode.
        std::fs::write(root.join("task=t/bad.jsonl"), "{not json\n").unwrap();
        let uri = root.join("task=t/bad.jsonl").display().to_string();
        let e = read_session_rows(&uri, "t-s0", &roots, 1 << 20).unwrap_err();
        assert!(matches!(e, ExportReadError::Decode { .. }), "{e}");
    }
}
