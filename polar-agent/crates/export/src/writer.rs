//! The exporter: trajectories in, files out. [`Exporter::write_session`]
//! writes one session's trajectory as one file per format
//! (`task=<task>/<session>.<ext>`); [`Exporter::open_batch`] opens a file
//! that takes several sessions of one task, one row group each. Either way
//! a file is encoded and sent one trajectory at a time, so memory is bounded
//! by one session, and it appears whole or not at all. A [`Pipeline`] lets
//! the next session be encoded while earlier files are still being made
//! durable (fsync, upload). Every file and byte written is counted
//! ([`ExportCounters`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use polar_trajectory::Trajectory;

use super::dest::{Destination, Sink, Store};
use super::error::ExportError;
use super::format::{Encoder, Format, ParquetCompression};
use super::partition::FileKey;

/// How files are written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExportOptions {
    /// The formats, one file each.
    pub formats: Vec<Format>,
    /// Parquet compression.
    pub compression: ParquetCompression,
    /// Local temporaries older than this are crash leftovers and removed.
    pub stale_temp_after: Duration,
    /// Files a [`Pipeline`] lets finish in the background while it encodes
    /// the next session. A local file in flight holds only its descriptor;
    /// an object in flight holds its unsent bytes (at most one session's,
    /// or one part).
    pub commits_in_flight: usize,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            formats: vec![Format::Parquet],
            compression: ParquetCompression::default(),
            stale_temp_after: Duration::from_secs(3600),
            commits_in_flight: 4,
        }
    }
}

/// Running totals of what an exporter wrote (for metrics).
#[derive(Debug, Default)]
pub struct ExportCounters {
    /// Files published.
    pub files: AtomicU64,
    /// Bytes of published files.
    pub bytes: AtomicU64,
    /// Rows (traces) in published files, counted once per format.
    pub rows: AtomicU64,
    /// Files abandoned after an error.
    pub failed_files: AtomicU64,
}

/// A file that was published.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WrittenFile {
    /// Path or URL.
    pub location: String,
    /// Its format.
    pub format: Format,
    /// Its size in bytes.
    pub bytes: u64,
    /// Rows in it.
    pub rows: u64,
    /// Sessions in it.
    pub sessions: u64,
}

/// Writes trajectories to a destination.
#[derive(Debug)]
pub struct Exporter {
    store: Store,
    options: ExportOptions,
    counters: Arc<ExportCounters>,
}

impl Exporter {
    /// An exporter to `dest`.
    pub fn new(dest: Destination, options: ExportOptions) -> Result<Self, ExportError> {
        if options.formats.is_empty() {
            return Err(ExportError::Usage("no export format chosen".into()));
        }
        Ok(Self {
            store: Store::new(dest, options.stale_temp_after),
            options,
            counters: Arc::new(ExportCounters::default()),
        })
    }

    /// The counters (shared, for metrics).
    pub fn counters(&self) -> Arc<ExportCounters> {
        Arc::clone(&self.counters)
    }

    /// The destination.
    pub fn destination(&self) -> &Destination {
        self.store.destination()
    }

    /// Writes `traj` as `task=<task>/<session>.<ext>`, one file per format.
    /// A trajectory without traces writes nothing.
    pub async fn write_session(&self, traj: &Trajectory) -> Result<Vec<WrittenFile>, ExportError> {
        if traj.traces.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = self
            .open_batch(traj.metadata.task_id.as_deref(), &traj.metadata.session_id)
            .await?;
        match batch.push(traj).await {
            Ok(()) => batch.commit().await,
            Err(e) => {
                batch.abort().await;
                Err(e)
            }
        }
    }

    /// Publishes session `session`'s calls file (`bytes`, from
    /// [`crate::calls::encode_calls`]) as
    /// `task=<task>/<session>.calls.jsonl.zst`; it is durable (fsynced and
    /// renamed, or uploaded whole) when this returns its location.
    pub async fn write_calls(
        &self,
        task: Option<&str>,
        session: &str,
        bytes: Vec<u8>,
    ) -> Result<String, ExportError> {
        let key = FileKey {
            partition: super::partition::partition_dir(task),
            file: super::calls::file_name(session),
        };
        let location = self.store.location(&key);
        let len = bytes.len() as u64;
        let mut sink = self.store.create(&key).await?;
        if let Err(e) = sink.write(bytes).await {
            self.counters.failed_files.fetch_add(1, Ordering::Relaxed);
            sink.abort().await;
            return Err(e);
        }
        let done = sink
            .start_commit()
            .await
            .unwrap_or(Err(ExportError::Join("commit")));
        match done {
            Ok(()) => {
                self.counters.files.fetch_add(1, Ordering::Relaxed);
                self.counters.bytes.fetch_add(len, Ordering::Relaxed);
                Ok(location)
            }
            Err(e) => {
                self.counters.failed_files.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// A pipeline writing through this exporter.
    pub fn pipeline(&self) -> Pipeline<'_> {
        Pipeline {
            exporter: self,
            in_flight: VecDeque::new(),
            done: Vec::new(),
        }
    }

    /// Opens file `name` (a session or batch id) in `task`'s partition, one
    /// per format.
    pub async fn open_batch(
        &self,
        task: Option<&str>,
        name: &str,
    ) -> Result<BatchFile<'_>, ExportError> {
        let mut files = Vec::with_capacity(self.options.formats.len());
        for &format in &self.options.formats {
            let key = FileKey::new(task, name, format);
            let sink = match self.store.create(&key).await {
                Ok(s) => s,
                Err(e) => {
                    for f in files {
                        OpenFile::abort(f).await;
                    }
                    return Err(e);
                }
            };
            files.push(OpenFile {
                location: self.store.location(&key),
                format,
                encoder: Encoder::new(format, self.options.compression)?,
                sink,
                bytes: 0,
                rows: 0,
            });
        }
        Ok(BatchFile {
            exporter: self,
            task: task.map(str::to_owned),
            files,
            sessions: 0,
        })
    }
}

struct OpenFile {
    location: String,
    format: Format,
    encoder: Encoder,
    sink: Sink,
    bytes: u64,
    rows: u64,
}

impl OpenFile {
    async fn write(&mut self, data: Vec<u8>) -> Result<(), ExportError> {
        self.bytes += data.len() as u64;
        self.sink.write(data).await
    }

    async fn abort(self) {
        self.sink.abort().await;
    }
}

/// Files (one per format) taking the sessions of one task; published by
/// [`BatchFile::commit`], abandoned (nothing visible) by
/// [`BatchFile::abort`] or when dropped.
pub struct BatchFile<'e> {
    exporter: &'e Exporter,
    task: Option<String>,
    files: Vec<OpenFile>,
    sessions: u64,
}

impl std::fmt::Debug for BatchFile<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchFile")
            .field("task", &self.task)
            .field(
                "files",
                &self.files.iter().map(|f| &f.location).collect::<Vec<_>>(),
            )
            .field("sessions", &self.sessions)
            .finish()
    }
}

impl BatchFile<'_> {
    /// Sessions pushed so far.
    pub fn sessions(&self) -> u64 {
        self.sessions
    }

    /// Appends one trajectory (one Parquet row group). It must belong to
    /// the file's task.
    pub async fn push(&mut self, traj: &Trajectory) -> Result<(), ExportError> {
        if traj.metadata.task_id != self.task {
            return Err(ExportError::WrongPartition {
                session: traj.metadata.session_id.clone(),
                task: traj.metadata.task_id.clone(),
                partition: self.task.clone(),
            });
        }
        for f in &mut self.files {
            let data = f.encoder.push(traj)?;
            f.write(data).await?;
            f.rows += traj.traces.len() as u64;
        }
        self.sessions += 1;
        Ok(())
    }

    /// Finishes and publishes every file.
    pub async fn commit(self) -> Result<Vec<WrittenFile>, ExportError> {
        self.start_commit().await?.wait().await
    }

    /// Finishes every file and starts publishing them in the background.
    pub async fn start_commit(self) -> Result<PendingCommit, ExportError> {
        let counters = Arc::clone(&self.exporter.counters);
        let sessions = self.sessions;
        let mut files = self.files.into_iter();
        let mut started = Vec::new();
        while let Some(mut f) = files.next() {
            let finished = async {
                let encoder = std::mem::replace(&mut f.encoder, Encoder::Jsonl);
                let tail = encoder.finish()?;
                f.write(tail).await
            }
            .await;
            if let Err(e) = finished {
                counters.failed_files.fetch_add(1, Ordering::Relaxed);
                f.abort().await;
                for f in files {
                    f.abort().await;
                }
                // Those already started complete: each file is atomic.
                let _ = PendingCommit {
                    files: started,
                    counters,
                }
                .wait()
                .await;
                return Err(e);
            }
            let OpenFile {
                location,
                format,
                sink,
                bytes,
                rows,
                ..
            } = f;
            let file = WrittenFile {
                location,
                format,
                bytes,
                rows,
                sessions,
            };
            started.push((file, sink.start_commit()));
        }
        Ok(PendingCommit {
            files: started,
            counters,
        })
    }

    /// Abandons every file: nothing becomes visible.
    pub async fn abort(self) {
        self.exporter
            .counters
            .failed_files
            .fetch_add(self.files.len() as u64, Ordering::Relaxed);
        for f in self.files {
            f.abort().await;
        }
    }
}

/// Files being made durable and visible in the background.
#[derive(Debug)]
pub struct PendingCommit {
    files: Vec<(
        WrittenFile,
        tokio::task::JoinHandle<Result<(), ExportError>>,
    )>,
    counters: Arc<ExportCounters>,
}

impl PendingCommit {
    /// Waits until every file is published (or failed); returns them, or
    /// the first error.
    pub async fn wait(self) -> Result<Vec<WrittenFile>, ExportError> {
        let mut out = Vec::with_capacity(self.files.len());
        let mut first_error = None;
        for (file, handle) in self.files {
            let result = handle.await.unwrap_or(Err(ExportError::Join("commit")));
            match result {
                Ok(()) => {
                    self.counters.files.fetch_add(1, Ordering::Relaxed);
                    self.counters.bytes.fetch_add(file.bytes, Ordering::Relaxed);
                    self.counters.rows.fetch_add(file.rows, Ordering::Relaxed);
                    tracing::debug!(file = %file.location, bytes = file.bytes, rows = file.rows, "exported");
                    out.push(file);
                }
                Err(e) => {
                    self.counters.failed_files.fetch_add(1, Ordering::Relaxed);
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// Writes sessions one after another, letting up to
/// [`ExportOptions::commits_in_flight`] files finish (fsync, rename,
/// upload) in the background while the next session is encoded.
#[derive(Debug)]
pub struct Pipeline<'e> {
    exporter: &'e Exporter,
    in_flight: VecDeque<PendingCommit>,
    done: Vec<WrittenFile>,
}

impl<'e> Pipeline<'e> {
    /// Writes `traj` as its own file(s) (see [`Exporter::write_session`]).
    pub async fn write_session(&mut self, traj: &Trajectory) -> Result<(), ExportError> {
        if traj.traces.is_empty() {
            return Ok(());
        }
        let mut batch = self
            .exporter
            .open_batch(traj.metadata.task_id.as_deref(), &traj.metadata.session_id)
            .await?;
        if let Err(e) = batch.push(traj).await {
            batch.abort().await;
            return Err(e);
        }
        self.commit(batch).await
    }

    /// Finishes `batch` and queues its publication.
    pub async fn commit(&mut self, batch: BatchFile<'e>) -> Result<(), ExportError> {
        let pending = batch.start_commit().await?;
        self.in_flight.push_back(pending);
        let max = self.exporter.options.commits_in_flight;
        while self.in_flight.len() > max {
            if let Some(oldest) = self.in_flight.pop_front() {
                self.done.extend(oldest.wait().await?);
            }
        }
        Ok(())
    }

    /// Files published so far (taken).
    pub fn take_done(&mut self) -> Vec<WrittenFile> {
        std::mem::take(&mut self.done)
    }

    /// Waits for every file in flight; returns those not taken yet.
    pub async fn finish(mut self) -> Result<Vec<WrittenFile>, ExportError> {
        let mut first_error = None;
        while let Some(p) = self.in_flight.pop_front() {
            match p.wait().await {
                Ok(files) => self.done.extend(files),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(self.done),
        }
    }
}
