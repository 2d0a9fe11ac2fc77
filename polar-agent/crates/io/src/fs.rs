//! Atomic file writes, the one copy of them in Polar: a file is written
//! under a temporary name of its own in the target's directory
//! ([`tempfile::NamedTempFile`], so concurrent writers never share one),
//! given its mode, fsynced, renamed over the target and the directory
//! fsynced, so a reader (or a crash) sees the old file or the new one,
//! whole, never a mix. A write that fails leaves no temporary behind.
//!
//! [`write_atomic`] writes bytes in one call; [`AtomicFile`] is the same
//! for a file written piece by piece.

use std::fs::{File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// Which step of an atomic write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The temporary file could not be created next to the target.
    #[error("creating a temporary file: {source}")]
    Create {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Writing the temporary file, setting its mode or syncing it failed.
    #[error("writing the temporary file: {source}")]
    Write {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The temporary file could not be renamed over the target.
    #[error("renaming the temporary file into place: {source}")]
    Persist {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The directory could not be synced after the rename (the new file
    /// is in place but may not survive a crash).
    #[error("syncing the directory: {source}")]
    SyncDir {
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl WriteError {
    fn source_ref(&self) -> &io::Error {
        match self {
            Self::Create { source }
            | Self::Write { source }
            | Self::Persist { source }
            | Self::SyncDir { source } => source,
        }
    }
}

/// For callers whose errors hold an [`io::Error`]: the kind of the cause,
/// the step in the message.
impl From<WriteError> for io::Error {
    fn from(e: WriteError) -> Self {
        io::Error::new(e.source_ref().kind(), e.to_string())
    }
}

/// How to write: the file's mode, whether to fsync, the temporary's name.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    mode: Option<u32>,
    sync: bool,
    temp_name: Option<(String, String)>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl WriteOptions {
    /// Durable (file and directory fsynced), with the mode a new file gets
    /// from `File::create` (0666 less the umask).
    pub fn new() -> Self {
        Self {
            mode: None,
            sync: true,
            temp_name: None,
        }
    }

    /// The file gets exactly `mode` (the umask does not apply), from the
    /// moment its temporary is created (which is never more open than
    /// `mode`).
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = Some(mode);
        self
    }

    /// No fsync of the file or the directory: atomic for readers, not
    /// durable across a crash.
    pub fn no_sync(mut self) -> Self {
        self.sync = false;
        self
    }

    /// Temporary names of `prefix`, random characters and `suffix` (by
    /// default `.{name}.` and `.tmp`, hidden next to the target `name`).
    pub fn temp_name(mut self, prefix: impl Into<String>, suffix: impl Into<String>) -> Self {
        self.temp_name = Some((prefix.into(), suffix.into()));
        self
    }
}

/// Writes `bytes` to `path` atomically (see the module doc).
pub fn write_atomic(path: &Path, bytes: &[u8], opts: &WriteOptions) -> Result<(), WriteError> {
    let mut file = AtomicFile::create(path, opts)?;
    file.write_all(bytes)
        .map_err(|source| WriteError::Write { source })?;
    file.commit()
}

/// A file being written under its temporary name; [`AtomicFile::commit`]
/// gives it the target's name. Dropped uncommitted, the temporary is
/// removed.
#[derive(Debug)]
pub struct AtomicFile {
    temp: NamedTempFile,
    dest: PathBuf,
    sync: bool,
}

impl AtomicFile {
    /// Starts a file that will replace `dest` (whose directory must exist).
    pub fn create(dest: impl Into<PathBuf>, opts: &WriteOptions) -> Result<Self, WriteError> {
        let dest = dest.into();
        let dir = dir_of(&dest);
        let (prefix, suffix) = match &opts.temp_name {
            Some((p, s)) => (p.clone(), s.clone()),
            None => {
                let name = dest
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                (format!(".{name}."), ".tmp".to_owned())
            }
        };
        let temp = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(&suffix)
            .permissions(Permissions::from_mode(opts.mode.unwrap_or(0o666)))
            .tempfile_in(dir)
            .map_err(|source| WriteError::Create { source })?;
        if let Some(mode) = opts.mode {
            // Created with `mode` less the umask; now exactly `mode`.
            temp.as_file()
                .set_permissions(Permissions::from_mode(mode))
                .map_err(|source| WriteError::Write { source })?;
        }
        Ok(Self {
            temp,
            dest,
            sync: opts.sync,
        })
    }

    /// The temporary's path.
    pub fn temp_path(&self) -> &Path {
        self.temp.path()
    }

    /// Syncs the file (unless told not to), renames it over the target and
    /// syncs the directory.
    pub fn commit(self) -> Result<(), WriteError> {
        if self.sync {
            self.temp
                .as_file()
                .sync_all()
                .map_err(|source| WriteError::Write { source })?;
        }
        // On failure the temporary comes back in the error and is removed
        // when that is dropped.
        self.temp
            .persist(&self.dest)
            .map_err(|e| WriteError::Persist { source: e.error })?;
        if self.sync {
            sync_dir(dir_of(&self.dest)).map_err(|source| WriteError::SyncDir { source })?;
        }
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.temp.as_file_mut().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.temp.as_file_mut().write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.temp.as_file_mut().flush()
    }
}

/// fsyncs a directory, so the entries created or renamed in it survive a
/// crash (on NFS this commits them to the server).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directory a path's entry lives in.
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn writes_replace_the_file_with_the_mode_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.key");
        write_atomic(&path, b"one", &WriteOptions::new().mode(0o600)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        assert_eq!(mode_of(&path), 0o600);
        // The mode is the one asked for, not the old file's nor the umask's.
        write_atomic(&path, b"two", &WriteOptions::new().mode(0o644)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(mode_of(&path), 0o644);
        write_atomic(&path, b"three", &WriteOptions::new().mode(0o755).no_sync()).unwrap();
        assert_eq!(mode_of(&path), 0o755);
        // Without a mode: what File::create would give a new file.
        let plain = dir.path().join("plain");
        std::fs::File::create(&plain).unwrap();
        let expected = mode_of(&plain);
        std::fs::remove_file(&plain).unwrap();
        write_atomic(&plain, b"x", &WriteOptions::new()).unwrap();
        assert_eq!(mode_of(&plain), expected);
        assert_eq!(names(dir.path()), ["ca.key", "plain"]);
    }

    #[test]
    fn a_failed_write_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // The rename fails: the target is a directory that is not empty.
        let target = dir.path().join("busy");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("inside"), b"").unwrap();
        let err = write_atomic(&target, b"data", &WriteOptions::new().mode(0o600)).unwrap_err();
        assert!(matches!(err, WriteError::Persist { .. }), "{err}");
        assert_eq!(names(dir.path()), ["busy"]);
        // A file dropped before its commit goes too.
        let mut f = AtomicFile::create(dir.path().join("f"), &WriteOptions::new()).unwrap();
        f.write_all(b"half").unwrap();
        let temp = f.temp_path().to_owned();
        assert!(temp.exists());
        drop(f);
        assert!(!temp.exists());
        assert_eq!(names(dir.path()), ["busy"]);
        // No directory: nothing is created, the error says which step.
        let err = write_atomic(&dir.path().join("none/x"), b"", &WriteOptions::new()).unwrap_err();
        assert!(matches!(err, WriteError::Create { .. }), "{err}");
        let io: io::Error = err.into();
        assert_eq!(io.kind(), io::ErrorKind::NotFound);
        assert!(
            io.to_string().starts_with("creating a temporary file"),
            "{io}"
        );
    }

    #[test]
    fn temporaries_have_the_names_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let f = AtomicFile::create(dir.path().join("s.parquet"), &WriteOptions::new()).unwrap();
        let name = f
            .temp_path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with(".s.parquet.") && name.ends_with(".tmp"),
            "{name}"
        );
        drop(f);
        let opts = WriteOptions::new().temp_name(".tmp-", "-s.parquet.partial");
        let f = AtomicFile::create(dir.path().join("s.parquet"), &opts).unwrap();
        let name = f
            .temp_path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with(".tmp-") && name.ends_with("-s.parquet.partial"),
            "{name}"
        );
        f.commit().unwrap();
        assert_eq!(names(dir.path()), ["s.parquet"]);
    }

    #[test]
    fn concurrent_writers_of_one_path_each_leave_a_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = Arc::new(dir.path().join("shared"));
        let writers = 8;
        let size = 256 * 1024;
        let start = Arc::new(Barrier::new(writers));
        let handles: Vec<_> = (0..writers)
            .map(|i| {
                let path = Arc::clone(&path);
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    let byte = b'a' + u8::try_from(i).unwrap();
                    let bytes = vec![byte; size];
                    start.wait();
                    for _ in 0..5 {
                        write_atomic(&path, &bytes, &WriteOptions::new().mode(0o640)).unwrap();
                        // Whatever is there is one writer's whole file.
                        let seen = std::fs::read(&*path).unwrap();
                        assert_eq!(seen.len(), size);
                        assert!(seen.iter().all(|&b| b == seen[0]));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let last = std::fs::read(&*path).unwrap();
        assert_eq!(last.len(), size);
        assert!(last.iter().all(|&b| b == last[0]));
        assert_eq!(mode_of(&path), 0o640);
        assert_eq!(names(dir.path()), ["shared"]);
    }
}
