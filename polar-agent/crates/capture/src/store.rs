//! [`CaptureStore`]: the capture logs of all sessions under
//! `<state_dir>/sessions/`, one directory per session holding `calls.jsonl`
//! (the records, whole or in two parts, see [`super::log`]) and
//! `session.json` (session id, task, metadata). A session's log is opened
//! on its first call and, when it already exists (an agent restart), read
//! back to continue its `seq` numbering and to rebuild its Responses-API
//! history (from the records, a completion joined with its request part).
//!
//! A [`CallHook`] set on the store sees each record as its call ends
//! (the gateway's live timeline).
//!
//! The history ([`SessionLog::conversation`]) maps the public id of each
//! completed OpenAI Responses reply (`resp_...`) to the conversation that
//! reply ends, for `previous_response_id`. It holds the
//! [`RESPONSE_HISTORY`] most recent replies of the session.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use serde_json::json;
use tokio::sync::{OnceCell, oneshot};

use super::build::now_ms;
use super::dir::sync_dir;
use super::journal::{JOURNAL_DIR, SyncFn};
use super::log::{Durability, Journaled, LogFile};
use super::owners::RootLock;
use super::replay::{Replayed, recover};
use super::session::{SessionInfo, SessionRegistry};
use super::stats::{CaptureStats, Tally};
use super::sync::GroupCommit;
use super::writer::LogWriter;
use polar_capture_log::encode::{RecordParts, encode_end};
use polar_capture_log::{
    CALLS_FILE, LogError, ReplyTokensJson, SESSION_FILE, SESSIONS_DIR, parse_log,
};
use polar_chat::Api;
use polar_chat::Message;
use polar_chat::provider::{conversation_after, openai_responses};
use polar_ids::SessionId;
use polar_record::{CallStatus, CompletionRecord, RECORD_VERSION};

/// The directory of `session`'s capture log and `session.json` under
/// `state_dir`.
pub fn session_dir(state_dir: &Path, session: &SessionId) -> PathBuf {
    state_dir.join(SESSIONS_DIR).join(session.as_str())
}
/// Responses-API replies remembered per session for `previous_response_id`.
pub const RESPONSE_HISTORY: usize = 256;

type Conversation = Arc<Vec<Message>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Default)]
struct ResponseIndex {
    by_id: HashMap<String, Conversation>,
    order: VecDeque<String>,
}

impl ResponseIndex {
    fn insert(&mut self, id: String, conversation: Conversation) {
        if self.by_id.insert(id.clone(), conversation).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > RESPONSE_HISTORY {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }
}

/// The history entry a record adds: completed Responses-API calls only.
fn history_entry(record: &CompletionRecord) -> Option<(String, Conversation)> {
    if record.native_request.api != Api::OpenaiResponses || record.status != CallStatus::Completed {
        return None;
    }
    let resp = record.response.as_ref()?;
    Some((
        openai_responses::response_id(&resp.id),
        Arc::new(conversation_after(&record.request, resp)),
    ))
}

/// What sees each record once its call's last line is written (before
/// the sync), on the store's writing thread: it must be quick and
/// must not block.
#[derive(Clone)]
pub struct CallHook(Arc<CallFn>);

/// What a [`CallHook`] calls.
type CallFn = dyn Fn(&SessionId, &CompletionRecord) + Send + Sync;

impl CallHook {
    /// A hook calling `f`.
    pub fn new(f: impl Fn(&SessionId, &CompletionRecord) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
}

impl std::fmt::Debug for CallHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallHook")
    }
}

/// One session's open log.
#[derive(Debug)]
pub(crate) struct SessionLog {
    session: SessionId,
    file: Arc<LogFile>,
    next_seq: AtomicU64,
    responses: Mutex<ResponseIndex>,
    stats: Arc<CaptureStats>,
    hook: Arc<OnceLock<CallHook>>,
    writer: LogWriter,
}

impl SessionLog {
    /// The session.
    pub fn session(&self) -> &SessionId {
        &self.session
    }

    /// The path of `calls.jsonl`.
    #[cfg(test)]
    pub(crate) fn calls_path(&self) -> &Path {
        self.file.path()
    }

    /// Takes the next call position of the session.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The store's counters.
    pub fn stats(&self) -> &CaptureStats {
        &self.stats
    }

    /// The conversation a Responses reply `response_id` ended, if known.
    pub fn conversation(&self, response_id: &str) -> Option<Conversation> {
        lock(&self.responses).by_id.get(response_id).cloned()
    }

    /// Appends the line that ends `record`'s call and waits until it is
    /// durable per the store's [`Durability`] (the syncs shared with the
    /// calls ending meanwhile, [`super::sync`]): its completion when `parts`
    /// says its request part is in the log, else the whole record (using the
    /// parts serialized ahead, and the reply's token data as `tokens`
    /// serialized it while the reply streamed). Only then is the record
    /// counted and added to the Responses history. Serialization and the
    /// write run on the store's writing thread ([`super::writer`]), which
    /// hands the line to the syncing thread itself and lets go of the
    /// record after (freeing its requests and prompt ids takes microseconds
    /// the reply's last bytes need not wait for); the caller is woken once,
    /// when the line is durable, and no thread is held while the sync runs.
    pub async fn append(
        &self,
        record: CompletionRecord,
        parts: RecordParts,
        tokens: ReplyTokensJson,
    ) -> Result<(), LogError> {
        let file = Arc::clone(&self.file);
        let hook = self.hook.get().cloned();
        let session = self.session.clone();
        let (done, durable) = oneshot::channel();
        self.writer.submit(move || {
            let written =
                encode_end(&record, &parts, &tokens).and_then(|line| file.append_line(&line));
            match written {
                Ok(written) => {
                    if let Some(hook) = hook {
                        (hook.0)(&session, &record);
                    }
                    let counted = (Tally::of(&record), history_entry(&record));
                    // The caller may have gone (its task cancelled): nothing
                    // to tell.
                    file.when_durable(written, move |result| {
                        let _ = done.send(result.map(|()| counted));
                    });
                }
                Err(e) => {
                    let _ = done.send(Err(e));
                }
            }
            drop((record, parts, tokens));
        });
        // A dropped answer: the job panicked, or the syncing thread did.
        let (tally, entry) = durable.await.map_err(|_| {
            LogError::Task("the capture log's writer or syncing thread failed".into())
        })??;
        self.stats.add(tally);
        if let Some((id, conversation)) = entry {
            lock(&self.responses).insert(id, conversation);
        }
        Ok(())
    }

    /// Appends a call's request part ([`super::part`]), written, not
    /// synced: the sync of the call's completion, later in the same file,
    /// covers it (a part whose call never ends needs no durability). Its
    /// record is not complete until the completion follows. Blocking.
    pub fn append_request_part(&self, line: &[u8]) -> Result<(), LogError> {
        self.file.append_line(line).map(drop)
    }
}

/// The capture logs of all sessions.
#[derive(Debug)]
pub struct CaptureStore {
    root: PathBuf,
    durability: Durability,
    /// The syncing thread and its journal ([`Durability::Power`]).
    commit: Option<GroupCommit>,
    registry: Arc<SessionRegistry>,
    open: Mutex<HashMap<SessionId, Arc<OnceCell<Arc<SessionLog>>>>>,
    stats: Arc<CaptureStats>,
    hook: Arc<OnceLock<CallHook>>,
    /// The thread that writes the calls' last lines.
    writer: LogWriter,
}

impl CaptureStore {
    /// The store under `<state_dir>/sessions`, after replaying into the
    /// logs what the journals left by agents gone hold (`replay`;
    /// in either mode: an earlier run may have used the other); in
    /// [`Durability::Power`], with its own journal (segments of
    /// `journal_bytes`) and syncing thread. Blocking: waits while another
    /// agent on `state_dir` replays.
    pub fn open(
        state_dir: &Path,
        durability: Durability,
        journal_bytes: u64,
        registry: Arc<SessionRegistry>,
    ) -> Result<(Self, Replayed), LogError> {
        Self::open_with(
            state_dir,
            durability,
            journal_bytes,
            File::sync_data,
            registry,
        )
    }

    /// [`CaptureStore::open`] with `sync` as the journal's sync operation.
    pub(crate) fn open_with(
        state_dir: &Path,
        durability: Durability,
        journal_bytes: u64,
        sync: SyncFn,
        registry: Arc<SessionRegistry>,
    ) -> Result<(Self, Replayed), LogError> {
        let journals = state_dir.join(JOURNAL_DIR);
        // The replay and the making of this store's journal under one hold
        // of the journals' lock.
        let root = match durability {
            Durability::Power => Some(RootLock::take(&journals)?),
            Durability::Process => RootLock::take_existing(&journals)?,
        };
        let replayed = match &root {
            Some(root) => recover(state_dir, root)?,
            None => Replayed::default(),
        };
        let commit = match (&root, durability) {
            (Some(root), Durability::Power) => Some(GroupCommit::start_with(
                root.make_own()?,
                journal_bytes,
                sync,
            )?),
            _ => None,
        };
        drop(root);
        let store = Self {
            root: state_dir.join(SESSIONS_DIR),
            durability,
            commit,
            registry,
            open: Mutex::new(HashMap::new()),
            stats: Arc::default(),
            hook: Arc::default(),
            writer: LogWriter::start()?,
        };
        Ok((store, replayed))
    }

    /// Sets the hook that sees every session's records as their calls end
    /// (once; a second hook is refused and returned).
    pub fn set_call_hook(&self, hook: CallHook) -> Result<(), CallHook> {
        self.hook.set(hook)
    }

    /// What the store's records survive once their replies are released.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The syncing thread; `None` in [`Durability::Process`].
    pub fn group_commit(&self) -> Option<&GroupCommit> {
        self.commit.as_ref()
    }

    /// Counters of the records appended since the store was made.
    pub fn stats(&self) -> &Arc<CaptureStats> {
        &self.stats
    }

    /// The directory holding the session directories.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of `session`.
    pub fn session_dir(&self, session: &SessionId) -> PathBuf {
        self.root.join(session.as_str())
    }

    /// The session registry.
    pub fn registry(&self) -> &Arc<SessionRegistry> {
        &self.registry
    }

    /// `session`'s log, opened (and rebuilt from disk) on first use.
    pub(crate) async fn session(&self, session: &SessionId) -> Result<Arc<SessionLog>, LogError> {
        let cell = Arc::clone(lock(&self.open).entry(session.clone()).or_default());
        cell.get_or_try_init(|| async {
            let root = self.root.clone();
            let commit = self.commit.clone();
            let id = session.clone();
            let info = self.registry.get(session).unwrap_or_default();
            let shared = Shared {
                stats: Arc::clone(&self.stats),
                hook: Arc::clone(&self.hook),
                writer: self.writer.clone(),
            };
            tokio::task::spawn_blocking(move || open_session(&root, id, &info, commit, shared))
                .await
                .map_err(|e| LogError::Task(e.to_string()))?
                .map(Arc::new)
        })
        .await
        .cloned()
    }

    /// Closes `session`'s log (the next call reopens and rebuilds it); in
    /// [`Durability::Power`] the syncing thread syncs it, off the calls'
    /// path, so the journal need not keep its lines.
    pub fn close(&self, session: &SessionId) {
        let cell = lock(&self.open).remove(session);
        if let Some(log) = cell.as_ref().and_then(|c| c.get()) {
            log.file.retire();
        }
    }
}

/// What every session's log shares with the store.
struct Shared {
    stats: Arc<CaptureStats>,
    hook: Arc<OnceLock<CallHook>>,
    writer: LogWriter,
}

fn open_session(
    root: &Path,
    session: SessionId,
    info: &SessionInfo,
    commit: Option<GroupCommit>,
    Shared {
        stats,
        hook,
        writer,
    }: Shared,
) -> Result<SessionLog, LogError> {
    let dir = root.join(session.as_str());
    let fresh = !dir.exists();
    std::fs::create_dir_all(&dir).map_err(|e| LogError::io("creating", &dir, e))?;
    write_session_file(&dir, &session, info)?;
    let path = dir.join(CALLS_FILE);
    let journal = commit.map(|commit| Journaled {
        commit,
        session: session.clone(),
    });
    let (file, bytes) = LogFile::open(&path, journal)?;
    sync_dir(&dir)?;
    if fresh {
        sync_dir(root)?;
    }
    let (records, problems) = parse_log(&bytes);
    for p in &problems {
        tracing::warn!(log = %path.display(), problem = %p, "capture log");
    }
    let mut index = ResponseIndex::default();
    let mut next = 0;
    for r in &records {
        next = next.max(r.seq.saturating_add(1));
        if let Some((id, conversation)) = history_entry(r) {
            index.insert(id, conversation);
        }
    }
    if !records.is_empty() {
        tracing::info!(session = %session, records = records.len(), next_seq = next, "capture log reopened");
    }
    Ok(SessionLog {
        session,
        file: Arc::new(file),
        next_seq: AtomicU64::new(next),
        responses: Mutex::new(index),
        stats,
        hook,
        writer,
    })
}

/// Writes `session.json` atomically (a temporary of its own, fsync, rename,
/// directory fsync).
fn write_session_file(dir: &Path, session: &SessionId, info: &SessionInfo) -> Result<(), LogError> {
    let value = json!({
        "session_id": session.as_str(),
        "task_id": info.task_id,
        "metadata": info.metadata,
        "record_version": RECORD_VERSION,
        "opened_ms": now_ms(),
    });
    write_json(dir, &value)
}

fn write_json(dir: &Path, value: &serde_json::Value) -> Result<(), LogError> {
    let path = dir.join(SESSION_FILE);
    let text = serde_json::to_vec_pretty(value)?;
    polar_io::fs::write_atomic(&path, &text, &polar_io::fs::WriteOptions::new())
        .map_err(|e| LogError::io("writing", &path, e.into()))
}

/// Adds `fields` (the session's outcome, reward, evaluation...) to the
/// closed session's `session.json` in `dir`, atomically; creates the
/// directory and the file for a session that made no call.
pub fn record_session_fields(
    dir: &Path,
    session: &SessionId,
    fields: serde_json::Map<String, serde_json::Value>,
) -> Result<(), LogError> {
    std::fs::create_dir_all(dir).map_err(|e| LogError::io("creating", dir, e))?;
    let path = dir.join(SESSION_FILE);
    let mut value = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({
            "session_id": session.as_str(),
            "record_version": RECORD_VERSION,
        }),
        Err(e) => return Err(LogError::io("reading", &path, e)),
    };
    if let serde_json::Value::Object(map) = &mut value {
        map.extend(fields);
    }
    write_json(dir, &value)
}
