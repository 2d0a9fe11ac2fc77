//! Exported calls files read back for `polar export --from`: the calls
//! files (`task=<task>/<session>.calls.jsonl.zst`) under an export root, a
//! local directory or `s3://bucket/prefix`, listed (all, or those of the
//! given tasks), each read whole and decoded ([`crate::calls`]), selected
//! by time range on its header, and turned into the [`SessionLog`] the
//! builders take, with the `session.json` the node exported in it. No
//! node is involved: the export root is the whole input.

use std::path::PathBuf;

use futures_util::StreamExt as _;
use object_store::ObjectStoreExt as _;
use object_store::path::Path as ObjectPath;

use super::calls::{CALLS_SUFFIX, decode_calls, decode_header};
use super::dest::Destination;
use super::error::ExportError;
use super::partition::partition_dir;
use super::source::{SESSIONS_DIR, SessionLog, session_log};

/// One calls file found under an export root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallsFile {
    /// A local file.
    Local(PathBuf),
    /// An object (its key).
    Object(String),
}

impl CallsFile {
    /// Its path or key, for messages.
    pub fn name(&self) -> String {
        match self {
            Self::Local(p) => p.display().to_string(),
            Self::Object(k) => k.clone(),
        }
    }
}

/// Whether `name` (a file name) is a published calls file (temporaries
/// start with a dot).
fn is_calls(name: &str) -> bool {
    name.ends_with(CALLS_SUFFIX) && !name.starts_with('.')
}

/// The calls files under `root`, of `tasks` only when some are given,
/// sorted by partition and name.
pub async fn list_calls(
    root: &Destination,
    tasks: &[String],
) -> Result<Vec<CallsFile>, ExportError> {
    let partitions: Vec<String> = tasks.iter().map(|t| partition_dir(Some(t))).collect();
    let wanted = |p: &str| partitions.is_empty() || partitions.iter().any(|w| w == p);
    match root {
        Destination::Local { root } => {
            let root = root.clone();
            let partitions = partitions.clone();
            tokio::task::spawn_blocking(move || list_local(&root, &partitions))
                .await
                .map_err(|_| ExportError::Join("listing"))?
        }
        Destination::Object { store, prefix, url } => {
            let base = (!prefix.is_empty())
                .then(|| ObjectPath::parse(prefix))
                .transpose()
                .map_err(|e| ExportError::Destination {
                    destination: url.clone(),
                    why: e.to_string(),
                })?;
            let mut listing = store.list(base.as_ref());
            let mut out = Vec::new();
            while let Some(meta) = listing.next().await {
                let meta = meta.map_err(|e| ExportError::store("listing", url, e))?;
                let key = meta.location.to_string();
                let rel = key
                    .strip_prefix(prefix.as_str())
                    .unwrap_or(&key)
                    .trim_start_matches('/');
                let mut parts = rel.split('/');
                let (Some(part), Some(file), None) = (parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                if part.starts_with("task=") && wanted(part) && is_calls(file) {
                    out.push(CallsFile::Object(key));
                }
            }
            out.sort_by_key(CallsFile::name);
            Ok(out)
        }
    }
}

fn list_local(
    root: &std::path::Path,
    partitions: &[String],
) -> Result<Vec<CallsFile>, ExportError> {
    let io = |p: &std::path::Path, e| ExportError::io("listing", p, e);
    let not_root = |why| ExportError::NotExportRoot {
        dir: root.to_owned(),
        why,
        state_dir: root.join(SESSIONS_DIR).is_dir(),
    };
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_root("it does not exist"));
        }
        Err(e) => return Err(io(root, e)),
    };
    let mut dirs = Vec::new();
    let mut other = false;
    let mut any_partition = false;
    for entry in entries {
        let entry = entry.map_err(|e| io(root, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        any_partition |= name.starts_with("task=");
        other |= !name.starts_with("task=") && !name.starts_with('.');
        let wanted = partitions.is_empty() || partitions.contains(&name);
        if name.starts_with("task=") && wanted && entry.path().is_dir() {
            dirs.push(entry.path());
        }
    }
    // An empty directory is an export root nothing was exported to yet.
    if other && !any_partition {
        return Err(not_root("it has no task=*/ directory"));
    }
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
            let entry = entry.map_err(|e| io(&dir, e))?;
            if is_calls(&entry.file_name().to_string_lossy()) && entry.path().is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
        out.extend(files.into_iter().map(CallsFile::Local));
    }
    Ok(out)
}

/// What to take of the calls files: sessions whose calls overlap
/// `[since, until)` (Unix ms; open when left out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeRange {
    /// Sessions whose last call ended at or after this.
    pub since: Option<u64>,
    /// Sessions whose first call arrived before this.
    pub until: Option<u64>,
}

/// Reads and decodes `file`; `None` when its session is outside `range`.
pub async fn read_calls(
    root: &Destination,
    file: &CallsFile,
    range: TimeRange,
) -> Result<Option<SessionLog>, ExportError> {
    let (name, bytes) = match (root, file) {
        (_, CallsFile::Local(path)) => {
            let p = path.clone();
            let bytes = tokio::task::spawn_blocking(move || std::fs::read(&p))
                .await
                .map_err(|_| ExportError::Join("reading"))?
                .map_err(|e| ExportError::io("reading", path, e))?;
            (path.display().to_string(), bytes::Bytes::from(bytes))
        }
        (Destination::Object { store, url, .. }, CallsFile::Object(key)) => {
            let location = format!(
                "{}/{key}",
                url.split('/').take(3).collect::<Vec<_>>().join("/")
            );
            let path = ObjectPath::parse(key).map_err(|e| ExportError::Destination {
                destination: location.clone(),
                why: e.to_string(),
            })?;
            let got = store
                .get(&path)
                .await
                .map_err(|e| ExportError::store("GET", &location, e))?;
            let bytes = got
                .bytes()
                .await
                .map_err(|e| ExportError::store("GET", &location, e))?;
            (location, bytes)
        }
        (Destination::Local { root }, CallsFile::Object(key)) => {
            return Err(ExportError::Destination {
                destination: root.display().to_string(),
                why: format!("{key}: an object key under a local root"),
            });
        }
    };
    tokio::task::spawn_blocking(move || {
        // A range is checked on the header alone before the records are
        // decoded.
        if range != TimeRange::default()
            && !decode_header(&name, &bytes)?.in_range(range.since, range.until)
        {
            return Ok(None);
        }
        let calls = decode_calls(&name, &bytes)?;
        let h = calls.header;
        // A session exported without `session.json` is still named by its
        // header.
        let session = match h.session {
            serde_json::Value::Null => serde_json::json!({
                "session_id": h.session_id,
                "task_id": h.task_id,
            }),
            v => v,
        };
        let log = session_log(
            PathBuf::from(&name),
            Some(session),
            calls.records,
            Vec::new(),
        )?;
        Ok(Some(log))
    })
    .await
    .map_err(|_| ExportError::Join("decoding"))?
}
