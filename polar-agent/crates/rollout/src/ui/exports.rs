//! One exported trajectory file, read for the dashboard: the file a
//! sample's result names (`trajectory_uri`, written by its gateway), taken
//! only when it is a local path beneath one of the operator's
//! `[rollout.dashboard] export_roots`, opened from that root's descriptor
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//! (`polar_io::beneath`: no symlink followed, no `..` out), a regular file
//! of at most `max_file_bytes`, decoded with the export crate's own readers
//! (Parquet or JSONL by extension), and cut to the rows of the sample's own
//! session (a batch file holds several). An `s3://bucket/key` URI is read
//! only when it is beneath one of `[rollout.dashboard] s3_roots` (same
//! bucket, the key below the root's prefix at a `/`, no empty, `.` or `..`
//! segment), with the client the operator configured (the server's own
//! credentials): a HEAD first, refused over `max_file_bytes`, then a GET
//! bounded by it (`polar_export::object::ObjectReader`). A URI that names
//! anything else (another scheme, a path or key outside the roots) is
//! refused, never fetched: the server reads no location a node or a task
//! chose.
//!
//! Local reads and decoding block: the caller runs them with
//! `spawn_blocking`; [`fetch_s3`] is async (object_store on the runtime).

use std::io::Read as _;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use polar_export::Row;
use polar_export::object::BoundedRead;
use polar_io::beneath::{Dir, STRICT, open_how};

use super::settings::S3Root;

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
    /// The URI is neither a local absolute path nor `s3://` (`sim://...`).
    #[error(
        "{0}: not a local path; the dashboard reads files beneath [rollout.dashboard] export_roots \
         and objects beneath s3_roots only"
    )]
    NotLocal(String),
    /// The path is outside every export root.
    #[error("{0}: outside [rollout.dashboard] export_roots")]
    Outside(String),
    /// An `s3://` URI, and the server has no S3 roots.
    #[error(
        "{0}: this server reads no s3:// export: set [rollout.dashboard] s3_roots to where the \
         gateways export"
    )]
    NoS3Roots(String),
    /// An `s3://` URI that is not a plain bucket and key.
    #[error("{uri}: {reason}")]
    BadS3 {
        /// The URI.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The object is outside every S3 root.
    #[error("{0}: outside [rollout.dashboard] s3_roots")]
    OutsideS3(String),
    /// The store failed or refused (unreachable, credentials, ...).
    #[error("{path}: the object store failed: {reason}")]
    Store {
        /// The object.
        path: String,
        /// Why.
        reason: String,
    },
    /// The sample's session has no exported calls file (none was written:
    /// the node's `export_calls` is off, or the session never exported).
    #[error("sample {0} has no exported calls file")]
    NoCalls(String),
    /// Neither `.parquet`, `.jsonl` nor `.calls.jsonl.zst`, or not the kind
    /// of file asked for.
    #[error(
        "{0}: not a .parquet or .jsonl export, or .calls.jsonl.zst calls file, of the kind asked for"
    )]
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
    /// `.calls.jsonl.zst`: a session's calls.
    Calls,
}

impl FileFormat {
    /// Its name in replies.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Jsonl => "jsonl",
            Self::Calls => "calls",
        }
    }

    /// The format of a file or key by its name.
    fn of(name: &str) -> Option<Self> {
        if name.ends_with(polar_export::calls::CALLS_SUFFIX) {
            return Some(Self::Calls);
        }
        match name.rsplit_once('.').map(|(_, ext)| ext) {
            Some("parquet") => Some(Self::Parquet),
            Some("jsonl") => Some(Self::Jsonl),
            _ => None,
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
    let Some(format) = FileFormat::of(uri) else {
        return Err(ExportReadError::Format(uri.to_owned()));
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
    let (format, bytes) = read_beneath(uri, roots, max_bytes)?;
    let read = bytes.len() as u64;
    let rows = decode_session_rows(uri, format, bytes::Bytes::from(bytes), session)?;
    Ok((format, read, rows))
}

/// Reads the whole file at `uri` beneath one of `roots` (see the module
/// doc), at most `max_bytes`; its format by its name.
pub fn read_beneath(
    uri: &str,
    roots: &[PathBuf],
    max_bytes: u64,
) -> Result<(FileFormat, Vec<u8>), ExportReadError> {
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
    Ok((format, bytes))
}

/// Decodes an exported file (`bytes`, from `uri`) and keeps the rows of
/// `session`. Blocks (decoding).
pub fn decode_session_rows(
    uri: &str,
    format: FileFormat,
    bytes: bytes::Bytes,
    session: &str,
) -> Result<Vec<Row<'static>>, ExportReadError> {
    let rows = match format {
        FileFormat::Parquet => polar_export::read_parquet(bytes),
        FileFormat::Jsonl => polar_export::read_jsonl(&bytes),
        FileFormat::Calls => return Err(ExportReadError::Format(uri.to_owned())),
    }
    .map_err(|e| ExportReadError::Decode {
        path: uri.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(rows
        .into_iter()
        .filter(|r| r.session_id == session)
        .collect())
}

/// Splits `bucket/key` (an `s3://` URL without its scheme) strictly: a
/// bucket of 3 to 63 lowercase letters, digits, `.` and `-` (starting and
/// ending with a letter or digit); a key of non-empty segments, none `.`
/// or `..`, without control characters. An empty key only if
/// `empty_key` (a root: the whole bucket). Pure.
pub fn split_s3(rest: &str, empty_key: bool) -> Result<(&str, &str), String> {
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !(3..=63).contains(&bucket.len())
        || !bucket
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        || !edge(bucket.chars().next())
        || !edge(bucket.chars().last())
    {
        return Err(format!(
            "{bucket:?}: not an S3 bucket name (3 to 63 of a-z, 0-9, `.`, `-`)"
        ));
    }
    if key.is_empty() {
        return if empty_key {
            Ok((bucket, key))
        } else {
            Err("no object key".into())
        };
    }
    for segment in key.split('/') {
        match segment {
            "" => return Err("an empty segment in the key".into()),
            "." | ".." => return Err(format!("a `{segment}` segment in the key")),
            s if s.chars().any(char::is_control) => {
                return Err("a control character in the key".into());
            }
            _ => {}
        }
    }
    Ok((bucket, key))
}

/// Where the `s3://` URI `uri` is: the root it is beneath, its key and its
/// format. Pure: nothing is sent.
pub fn locate_s3<'a>(
    uri: &str,
    roots: &'a [S3Root],
) -> Result<(&'a S3Root, String, FileFormat), ExportReadError> {
    let Some(rest) = uri.strip_prefix("s3://") else {
        return Err(ExportReadError::NotLocal(uri.to_owned()));
    };
    if roots.is_empty() {
        return Err(ExportReadError::NoS3Roots(uri.to_owned()));
    }
    let (bucket, key) = split_s3(rest, false).map_err(|reason| ExportReadError::BadS3 {
        uri: uri.to_owned(),
        reason,
    })?;
    let Some(format) = FileFormat::of(key) else {
        return Err(ExportReadError::Format(uri.to_owned()));
    };
    let beneath = |root: &S3Root| {
        root.bucket == bucket
            && (root.prefix.is_empty()
                || key
                    .strip_prefix(root.prefix.as_str())
                    .is_some_and(|rest| rest.starts_with('/')))
    };
    match roots.iter().find(|r| beneath(r)) {
        Some(root) => Ok((root, key.to_owned(), format)),
        None => Err(ExportReadError::OutsideS3(uri.to_owned())),
    }
}

/// Fetches the object `uri` names (see the module doc): its format and
/// its bytes, at most `max_bytes`.
pub async fn fetch_s3(
    uri: &str,
    roots: &[S3Root],
    max_bytes: u64,
) -> Result<(FileFormat, bytes::Bytes), ExportReadError> {
    let (root, key, format) = locate_s3(uri, roots)?;
    let read = root
        .reader
        .read(&key, max_bytes)
        .await
        .map_err(|e| ExportReadError::Store {
            path: uri.to_owned(),
            reason: e.to_string(),
        })?;
    match read {
        BoundedRead::Whole(bytes) => Ok((format, bytes)),
        BoundedRead::NotFound => Err(ExportReadError::Missing {
            path: uri.to_owned(),
            reason: "no such object".into(),
        }),
        BoundedRead::TooLarge(size) => Err(ExportReadError::TooLarge {
            path: uri.to_owned(),
            size,
            max: max_bytes,
        }),
    }
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
    fn only_plain_keys_beneath_an_s3_root_are_located() {
        let settings =
            crate::ui::settings::DashboardSettings::from_raw(&crate::ui::settings::RawDashboard {
                s3_roots: Some(vec!["s3://rollouts/runs".into(), "s3://whole".into()]),
                s3: Some(crate::ui::settings::RawDashboardS3 {
                    endpoint: Some("http://127.0.0.1:1".into()),
                    region: Some("us-east-1".into()),
                    allow_http: None,
                }),
                ..Default::default()
            })
            .unwrap();
        let roots = &settings.s3_roots;
        let (root, key, f) = locate_s3("s3://rollouts/runs/task=t/t-s0.parquet", roots).unwrap();
        assert_eq!(
            (root.bucket.as_str(), key.as_str()),
            ("rollouts", "runs/task=t/t-s0.parquet")
        );
        assert_eq!(f, FileFormat::Parquet);
        let (root, key, f) = locate_s3("s3://whole/a/b.jsonl", roots).unwrap();
        assert_eq!(
            (root.bucket.as_str(), key.as_str(), f),
            ("whole", "a/b.jsonl", FileFormat::Jsonl)
        );
        let err = |uri: &str| locate_s3(uri, roots).unwrap_err().to_string();
        assert!(
            err("s3://rollouts/runsX/t.jsonl").contains("outside [rollout.dashboard] s3_roots")
        );
        assert!(err("s3://rollouts/other/t.jsonl").contains("outside"));
        assert!(err("s3://rollouts/runs.jsonl").contains("outside"));
        assert!(err("s3://elsewhere/runs/t.jsonl").contains("outside"));
        assert!(err("s3://rollouts/runs/../t.jsonl").contains("`..` segment"));
        assert!(err("s3://rollouts/runs/./t.jsonl").contains("`.` segment"));
        assert!(err("s3://rollouts/runs//t.jsonl").contains("empty segment"));
        assert!(err("s3://rollouts/runs/t\n.jsonl").contains("control character"));
        assert!(err("s3://rollouts").contains("no object key"));
        assert!(err("s3://Rollouts/runs/t.jsonl").contains("bucket name"));
        assert!(err("s3://rollouts/runs/t.json").contains("not a .parquet or .jsonl"));
        assert!(
            locate_s3("s3://rollouts/runs/t.jsonl", &[])
                .unwrap_err()
                .to_string()
                .contains("reads no s3:// export")
        );
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
