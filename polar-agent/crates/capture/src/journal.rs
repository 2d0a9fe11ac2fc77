//! The agent's capture journal (`agent.capture_durability = "power"`):
//! every line written to a session's log is also appended, as a
//! [`super::frame`], to one journal file, and a syncing round
//! ([`super::sync`]) makes a round's lines durable with ONE `fdatasync`
//! of the journal, whatever the number of sessions. The session logs are
//! written, not synced, on the call's path; they are synced off it: at a
//! session's end ([`super::sync::GroupCommit::retire`]), when the journal
//! rotates, and when the store closes. After a power loss the start-up
//! replay ([`super::replay`]) restores from the journal every line a log
//! lacks.
//!
//! Layout: `<state_dir>/capture-journal/<owner>/<segment number, 16 hex
//! digits>.pcj`, where `<owner>` is the store's own directory, locked for
//! its life ([`super::owners`]: agents sharing a state directory each
//! journal apart, and replay only what a gone agent left). The journal is
//! a list of segments; frames go to the newest. Positions are counted in
//! bytes across segments since the journal was opened ([`Journal::append`]
//! returns the position after a frame).
//!
//! The calls never write the journal's file: [`Journal::append`] copies the
//! frame into a buffer, and the syncing thread, at each round, writes the
//! whole buffer with one `write` and then syncs ([`Journal::sync`]): every
//! position buffered before the round is durable once it returns. (Calls
//! that appended to the file themselves waited for the file's last page
//! while a sync wrote it back: measured, that made a round as slow as
//! the disk's write-back of the tail and halved the throughput.) A buffer
//! past [`FLUSH_BYTES`] wakes the thread without a waiter.
//!
//! A segment is written at its own offsets, not appended to: a round that
//! writes past what the segment holds also writes zeros up to
//! [`ZERO_AHEAD`] further (not past `agent.capture_journal_bytes`), so
//! the next rounds write over blocks the file already has. Their
//! `fdatasync` then writes the data alone, not the file's size and block
//! map too (on ext4 one device write fewer per sync: measured here, 30 to
//! 40% off the sync's time, BENCHMARKS.md). The reader takes zeros where a
//! frame's header would be for the end of the frames ([`super::frame`]).
//!
//! Rotation ([`Journal::rotate`], on the syncing thread, once the segment
//! holds `agent.capture_journal_bytes`): a new segment is created (its
//! directory entry synced), the buffer written to the old one and the old
//! one synced, then the thread writes to the new one; the session logs the
//! old segment holds lines of are synced, side by side, and only then is
//! the old segment removed. A segment whose logs could not all be synced
//! is kept, and tried again at the next rotation.
//!
//! A write of the buffer that fails part way is cut back (`ftruncate` to
//! where it began, the zeros ahead with it; the round's calls fail); when
//! even that fails, the segment is broken and the thread rotates to a
//! fresh one. Zeros that cannot be written are left for a later round.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::dir::sync_dir;
use super::frame::MAX_FRAME;
use super::owners::OwnJournal;
use polar_capture_log::LogError;

/// The journal's directory, under the state directory.
pub const JOURNAL_DIR: &str = "capture-journal";
/// A segment's file name extension.
pub const SEGMENT_EXT: &str = "pcj";
/// Buffered frames past which the syncing thread writes them without
/// waiting for a call to end.
pub const FLUSH_BYTES: usize = 4 << 20;
/// The default size at which a segment is rotated
/// (`agent.capture_journal_bytes`).
pub const DEFAULT_JOURNAL_BYTES: u64 = 64 << 20;
/// How far past a round's end, at most, a segment is written with zeros
/// when the round writes past what it holds.
pub const ZERO_AHEAD: u64 = 1 << 20;
/// A buffer of zeros, written in chunks of this.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// The sync operation: `File::sync_data` (tests put a recording one in).
pub(crate) type SyncFn = fn(&File) -> io::Result<()>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The path of segment `seq` in `dir`.
pub fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.{SEGMENT_EXT}"))
}

/// The segments in `dir`, oldest first (other names are ignored).
pub fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let seq = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(&format!(".{SEGMENT_EXT}")))
            .filter(|hex| hex.len() == 16)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok());
        if let Some(seq) = seq {
            out.push((seq, path));
        }
    }
    out.sort();
    Ok(out)
}

/// Session logs with lines in a segment, by log id: their files, to sync.
pub(crate) type Touched = HashMap<u64, Arc<File>>;

struct Segment {
    seq: u64,
    file: Arc<File>,
    /// Position of its first byte.
    start: u64,
    /// Position after its last byte written.
    end: u64,
    /// Bytes of the file, from its start, written (frames or zeros): a
    /// round that writes below it changes neither the file's size nor
    /// its blocks, and its sync writes the data alone.
    filled: u64,
    touched: Touched,
    /// A failed write could not be cut back: rotate before writing again.
    broken: bool,
}

/// Frames appended since the syncing thread last wrote.
#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    touched: Touched,
    /// Position after the last frame.
    written: u64,
}

/// A segment the writers left, to remove once its logs are synced.
pub(crate) struct Retired {
    pub(crate) path: PathBuf,
    pub(crate) touched: Touched,
}

/// The journal: the frames buffered, its current segment (the syncing
/// thread's) and how far it is durable.
pub(crate) struct Journal {
    dir: PathBuf,
    /// The directory's ownership, until the clean close removes it.
    own: Mutex<Option<OwnJournal>>,
    limit: u64,
    buffer: Mutex<Buffer>,
    current: Mutex<Segment>,
    /// Every position up to this is covered by a sync that returned.
    durable: AtomicU64,
}

impl Journal {
    /// Opens the first segment in the store's own, new, directory.
    /// Blocking.
    pub(crate) fn open(own: OwnJournal, limit: u64) -> Result<Self, LogError> {
        let dir = own.dir().to_owned();
        let seq = 0;
        let file = create_segment(&dir, seq)?;
        Ok(Self {
            dir,
            own: Mutex::new(Some(own)),
            limit: limit.max(1),
            buffer: Mutex::default(),
            current: Mutex::new(Segment {
                seq,
                file: Arc::new(file),
                start: 0,
                end: 0,
                filled: 0,
                touched: Touched::new(),
                broken: false,
            }),
            durable: AtomicU64::new(0),
        })
    }

    /// Buffers a frame (`prefix`, then `line`) for the log `log_id` whose
    /// file is `log`; the position after it, and whether the buffer is
    /// past [`FLUSH_BYTES`].
    pub(crate) fn append(
        &self,
        log_id: u64,
        log: &Arc<File>,
        prefix: &[u8],
        line: &[u8],
    ) -> io::Result<(u64, bool)> {
        if prefix.len() + line.len() > MAX_FRAME as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a capture log line longer than the journal's frame limit (1 GiB)",
            ));
        }
        let mut buf = lock(&self.buffer);
        buf.bytes.extend_from_slice(prefix);
        buf.bytes.extend_from_slice(line);
        buf.touched.entry(log_id).or_insert_with(|| Arc::clone(log));
        buf.written += (prefix.len() + line.len()) as u64;
        Ok((buf.written, buf.bytes.len() > FLUSH_BYTES))
    }

    /// Whether position `pos` is durable.
    pub(crate) fn is_durable(&self, pos: u64) -> bool {
        self.durable.load(Ordering::Acquire) >= pos
    }

    /// Writes the buffered frames to the current segment; the position
    /// they reach. The syncing thread's.
    fn write_buffered(&self, seg: &mut Segment) -> io::Result<u64> {
        let (bytes, touched, upto) = {
            let mut buf = lock(&self.buffer);
            let bytes = std::mem::take(&mut buf.bytes);
            (bytes, std::mem::take(&mut buf.touched), buf.written)
        };
        for (id, file) in touched {
            seg.touched.entry(id).or_insert(file);
        }
        if bytes.is_empty() {
            return Ok(upto);
        }
        if seg.broken {
            return Err(io::Error::other(
                "the capture journal's segment is broken by a failed write; rotating",
            ));
        }
        let at = seg.end - seg.start;
        let to = at + bytes.len() as u64;
        if let Err(e) = seg.file.write_all_at(&bytes, at) {
            if seg.file.set_len(at).is_err() {
                seg.broken = true;
            }
            seg.filled = seg.filled.min(at);
            return Err(e);
        }
        if to >= seg.filled {
            seg.filled = to;
            // Best effort: the frames are written; without the zeros the
            // next rounds' syncs write the file's size too.
            let ahead = (to + ZERO_AHEAD).min(self.limit.max(to));
            match write_zeros(&seg.file, to, ahead) {
                Ok(()) => seg.filled = ahead,
                Err(e) => {
                    tracing::debug!(error = %e, "capture journal: writing zeros ahead failed")
                }
            }
        }
        seg.end = upto;
        Ok(upto)
    }

    /// Writes the buffered frames and syncs the current segment: every
    /// position buffered before it began is durable once it returns `Ok`.
    /// `Ok(false)`: nothing new to sync. The syncing thread's.
    pub(crate) fn sync(&self, sync: SyncFn) -> io::Result<bool> {
        let mut seg = lock(&self.current);
        let upto = self.write_buffered(&mut seg)?;
        if self.is_durable(upto) {
            return Ok(false);
        }
        sync(&seg.file)?;
        self.durable.fetch_max(upto, Ordering::AcqRel);
        Ok(true)
    }

    /// Whether the current segment should be rotated: full, or broken.
    pub(crate) fn wants_rotation(&self) -> bool {
        let seg = lock(&self.current);
        seg.broken || seg.end - seg.start >= self.limit
    }

    /// Moves the thread to a new segment, the old one written and synced
    /// first (unless broken). Returns the old segment, whose logs must be
    /// synced before it is removed.
    pub(crate) fn rotate(&self, sync: SyncFn) -> Result<Retired, LogError> {
        let next = lock(&self.current).seq + 1;
        let file = create_segment(&self.dir, next)?;
        let mut seg = lock(&self.current);
        let old_path = segment_path(&self.dir, seg.seq);
        if !seg.broken {
            let done = self
                .write_buffered(&mut seg)
                .and_then(|upto| sync(&seg.file).map(|()| upto));
            match done {
                Ok(upto) => {
                    self.durable.fetch_max(upto, Ordering::AcqRel);
                }
                Err(e) => {
                    drop(seg);
                    let _ = std::fs::remove_file(segment_path(&self.dir, next));
                    return Err(LogError::io("syncing", &old_path, e));
                }
            }
        }
        let start = seg.end;
        let old = std::mem::replace(
            &mut *seg,
            Segment {
                seq: next,
                file: Arc::new(file),
                start,
                end: start,
                filled: 0,
                touched: Touched::new(),
                broken: false,
            },
        );
        Ok(Retired {
            path: old_path,
            touched: old.touched,
        })
    }

    /// Takes the logs `ids` out of the lists of logs to sync (their files
    /// are about to be synced: the journal need not keep their lines).
    pub(crate) fn take_touched(&self, ids: &[u64]) -> Touched {
        let mut taken: Touched = {
            let mut buf = lock(&self.buffer);
            ids.iter()
                .filter_map(|id| buf.touched.remove_entry(id))
                .collect()
        };
        let mut seg = lock(&self.current);
        for id in ids {
            if let Some((id, f)) = seg.touched.remove_entry(id) {
                taken.insert(id, f);
            }
        }
        taken
    }

    /// Puts logs back in the current segment's list (their sync failed).
    pub(crate) fn put_back(&self, touched: Touched) {
        let mut seg = lock(&self.current);
        for (id, file) in touched {
            seg.touched.entry(id).or_insert(file);
        }
    }

    /// The current segment as retired, with every log the buffer names:
    /// for the store's close, when no writer is left.
    pub(crate) fn close(&self) -> Retired {
        let pending = std::mem::take(&mut lock(&self.buffer).touched);
        let mut seg = lock(&self.current);
        let mut touched = std::mem::take(&mut seg.touched);
        for (id, file) in pending {
            touched.entry(id).or_insert(file);
        }
        Retired {
            path: segment_path(&self.dir, seg.seq),
            touched,
        }
    }

    /// Removes the journal's directory, every segment removed: the end
    /// of a clean close.
    pub(crate) fn remove_dir(&self) -> Result<(), LogError> {
        match lock(&self.own).take() {
            Some(own) => own.remove(),
            None => Ok(()),
        }
    }

    /// Lets go of the directory's lock, as the process's end would (tests:
    /// a crash, the journal left for the next store to replay).
    #[cfg(test)]
    pub(crate) fn abandon(&self) {
        if let Some(own) = lock(&self.own).as_mut() {
            own.abandon();
        }
    }

    /// The directory of the segments.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes a retired segment whose logs are synced.
    pub(crate) fn remove(&self, path: &Path) -> Result<(), LogError> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io("removing", path, e)),
        }
        sync_dir(&self.dir)
    }
}

/// Creates segment `seq` (never reusing a file) and makes its entry
/// durable.
fn create_segment(dir: &Path, seq: u64) -> Result<File, LogError> {
    let path = segment_path(dir, seq);
    let file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .map_err(|e| LogError::io("creating", &path, e))?;
    sync_dir(dir)?;
    Ok(file)
}

/// Writes zeros over bytes `from..to` of `file`.
fn write_zeros(file: &File, from: u64, to: u64) -> io::Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}
