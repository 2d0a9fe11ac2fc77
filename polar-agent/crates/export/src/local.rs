//! Atomic files in a local directory (which may be an NFS or Lustre mount).
//! A file is written under a hidden temporary name in its final directory
//! (`.tmp-<random>-<name>.partial`: readers that skip dot-files or glob
//! `*.parquet` never see it), fsynced, renamed over the final name, and
//! the directory is fsynced, so a reader sees the whole file or none and a
//! crash leaves at most a stale temporary, which [`clean_stale_temps`]
//! removes later. The file itself is a [`polar_io::fs::AtomicFile`].
//! Blocking calls run on tokio's blocking pool.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use polar_io::fs::{AtomicFile, WriteError, WriteOptions};

use super::error::ExportError;

/// Prefix of temporary files.
pub const TEMP_PREFIX: &str = ".tmp-";
/// Suffix of temporary files.
pub const TEMP_SUFFIX: &str = ".partial";

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ExportError> + Send + 'static,
) -> Result<T, ExportError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| ExportError::Join("file"))?
}

/// Creates `dir` (and parents) and makes the new entries durable.
pub async fn create_dir(dir: PathBuf) -> Result<(), ExportError> {
    blocking(move || {
        if dir.is_dir() {
            return Ok(());
        }
        fs::create_dir_all(&dir).map_err(|e| ExportError::io("creating", &dir, e))?;
        // The new directory's entry lives in its parent.
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        Ok(())
    })
    .await
}

/// fsyncs a directory, so the entries created or renamed in it survive a
/// crash (on NFS this commits them to the server).
pub fn sync_dir(dir: &Path) -> Result<(), ExportError> {
    polar_io::fs::sync_dir(dir).map_err(|e| ExportError::io("syncing directory", dir, e))
}

/// Removes temporary files in `dir` last modified more than `older_than`
/// ago (left by a crashed writer; a live writer's temporary is newer).
/// Returns how many were removed. A missing directory has none.
pub fn clean_stale_temps(dir: &Path, older_than: Duration) -> Result<usize, ExportError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(ExportError::io("listing", dir, e)),
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| ExportError::io("listing", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX)) {
            continue;
        }
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|m| now.duration_since(m).is_ok_and(|age| age >= older_than));
        if stale {
            let path = entry.path();
            match fs::remove_file(&path) {
                Ok(()) => {
                    tracing::warn!(file = %path.display(), "removed a stale temporary export file");
                    removed += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ExportError::io("removing", path, e)),
            }
        }
    }
    Ok(removed)
}

/// A file being written under its temporary name; dropped uncommitted, the
/// temporary is removed (it never gets its final name).
#[derive(Debug)]
pub struct LocalFile {
    /// `None` only while a blocking call has it.
    file: Option<AtomicFile>,
    temp: PathBuf,
    dest: PathBuf,
}

impl LocalFile {
    /// Starts `dest` (its directory must exist).
    pub async fn create(dest: PathBuf) -> Result<Self, ExportError> {
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let opts = WriteOptions::new().temp_name(TEMP_PREFIX, format!("-{name}{TEMP_SUFFIX}"));
        let d = dest.clone();
        let file = blocking(move || {
            AtomicFile::create(&d, &opts).map_err(|e| ExportError::io("creating", &d, e.into()))
        })
        .await?;
        Ok(Self {
            temp: file.temp_path().to_owned(),
            file: Some(file),
            dest,
        })
    }

    /// Appends `data`.
    pub async fn write(&mut self, data: Vec<u8>) -> Result<(), ExportError> {
        let mut file = self.file.take().ok_or(ExportError::Join("file"))?;
        let temp = self.temp.clone();
        let file = blocking(move || {
            file.write_all(&data)
                .map_err(|e| ExportError::io("writing", &temp, e))?;
            Ok(file)
        })
        .await?;
        self.file = Some(file);
        Ok(())
    }

    /// Makes the file durable and visible under its final name (tests; the
    /// exporter publishes through [`LocalFile::commit_blocking`]).
    #[cfg(test)]
    pub async fn commit(self) -> Result<(), ExportError> {
        blocking(move || self.commit_blocking()).await
    }

    /// [`LocalFile::commit`] on the calling thread: fsync the file, rename
    /// it over its final name, fsync the directory.
    pub fn commit_blocking(mut self) -> Result<(), ExportError> {
        let file = self.file.take().ok_or(ExportError::Join("file"))?;
        file.commit().map_err(|e| match e {
            WriteError::SyncDir { source } => {
                let dir = self.dest.parent().unwrap_or(Path::new("."));
                ExportError::io("syncing directory", dir, source)
            }
            WriteError::Persist { source } => ExportError::io("renaming", &self.temp, source),
            other => ExportError::io("syncing", &self.temp, other.into()),
        })
    }

    /// The temporary name (tests).
    #[cfg(test)]
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }
}
