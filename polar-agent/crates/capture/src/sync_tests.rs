//! Group commit over the journal: a simulated power loss at any moment,
//! replayed at the next start, keeps every record whose append returned
//! (the moment its reply's last bytes are released) exactly once; lines
//! that end together share one sync of the journal whatever their file; a
//! failed sync fails its calls; `process` mode writes without syncing.
//!
//! The power-loss simulation: the syncing thread's sync operation is
//! replaced by one that notes, by inode and birth time, how far the file
//! is written before it calls the real `fdatasync` (a log's length, the
//! end of a journal segment's frames: the zeros written ahead of them are
//! not a line). At the moment of the loss, under the same lock (no sync is
//! noted meanwhile), the test notes which calls were released and what
//! each file holds; after the run it puts back in place (same inodes) what
//! a power loss leaves: each session log cut at an arbitrary point between
//! its last sync and its end (or to zero, never synced), each journal
//! segment zeroed from the end of its frames at its last sync (none of
//! the frames written since: the journal's worst case; how torn frames
//! read is `frame`'s and `replay`'s tests' business).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::*;
use crate::frame::{FileKey, FrameReader, MAGIC};
use crate::journal::{DEFAULT_JOURNAL_BYTES, JOURNAL_DIR, SyncFn, ZERO_AHEAD, segments};
use crate::log::{Durability, LogFile};
use crate::owners::RootLock;
use crate::store::CaptureStore;
use crate::{LogError, LogProblem, Replayed, SessionRegistry};
use polar_capture_log::encode::{PartPrompt, RecordParts, encode_two_parts};
use polar_capture_log::fixture::record;
use polar_capture_log::{CALLS_FILE, read_log};
use polar_chat::Api;
use polar_ids::SessionId;

/// Per file, the longest length a returned sync covered.
static DURABLE: Mutex<BTreeMap<(u64, u64), u64>> = Mutex::new(BTreeMap::new());

fn key(file: &File) -> (u64, u64) {
    let k = FileKey::of(file).unwrap();
    (k.ino, k.birth)
}

fn recording_sync(file: &File) -> io::Result<()> {
    let mut durable = lock(&DURABLE);
    let before = written_end(file)?;
    file.sync_data()?;
    let len = durable.entry(key(file)).or_default();
    *len = (*len).max(before);
    Ok(())
}

/// How far `file` is written: the end of a journal segment's frames, a
/// log's length.
fn written_end(file: &File) -> io::Result<u64> {
    // Read through a descriptor of its own: the journal's is write-only.
    let bytes = std::fs::read(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    if !bytes.starts_with(&MAGIC) {
        return Ok(bytes.len() as u64);
    }
    Ok(frames_end(&bytes))
}

/// Where the frames at the start of `bytes` end.
fn frames_end(bytes: &[u8]) -> u64 {
    let mut frames = FrameReader::new(bytes);
    frames.by_ref().for_each(drop);
    frames.offset()
}

/// A [`Durability::Power`] store under `state` whose journal (of segments
/// of `journal_bytes`) is synced with `sync`, and its syncing thread.
fn power_store(state: &Path, journal_bytes: u64, sync: SyncFn) -> (CaptureStore, GroupCommit) {
    let (store, _) = CaptureStore::open_with(
        state,
        Durability::Power,
        journal_bytes,
        sync,
        Arc::new(SessionRegistry::new()),
    )
    .unwrap_or_else(|e| panic!("opening the store: {e}"));
    let commit = store.group_commit().unwrap().clone();
    (store, commit)
}

/// The journal directories under `state`.
fn journals(state: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(state.join(JOURNAL_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// What a power loss leaves of each file: its path and bytes.
struct Snapshot {
    released: Vec<String>,
    logs: Vec<(PathBuf, Vec<u8>)>,
    journal: Vec<(PathBuf, Vec<u8>)>,
}

/// The files as a power loss now would leave them (see the module doc).
fn power_loss(
    state: &Path,
    journal_dir: &Path,
    released: &Mutex<Vec<String>>,
    pick: &mut impl FnMut(u64, u64) -> u64,
) -> Snapshot {
    let durable = lock(&DURABLE);
    let released = lock(released).clone();
    // `None`: the file was removed meanwhile (a journal segment whose
    // logs were synced, and noted, first).
    let kept = |path: &Path, pick: &mut dyn FnMut(u64, u64) -> u64| {
        let mut file = File::open(path).ok()?;
        let d = durable.get(&key(&file)).copied().unwrap_or(0);
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut file, &mut bytes).unwrap();
        let cut = pick(d, bytes.len() as u64);
        Some((bytes, usize::try_from(cut).unwrap()))
    };
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(state.join("sessions")).unwrap() {
        let path = entry.unwrap().path().join(CALLS_FILE);
        let (mut bytes, cut) = kept(&path, pick).unwrap();
        bytes.truncate(cut);
        logs.push((path, bytes));
    }
    let mut journal = Vec::new();
    for (_, path) in segments(journal_dir).unwrap() {
        if let Some((mut bytes, cut)) = kept(&path, &mut |d, _| d) {
            bytes[cut..].fill(0);
            journal.push((path, bytes));
        }
    }
    Snapshot {
        released,
        logs,
        journal,
    }
}

/// Puts `snap` in place: the logs rewritten in their own inodes, the
/// journal's segments (in `journal_dir`) as they were.
fn restore(journal_dir: &Path, snap: &Snapshot) {
    for (path, bytes) in &snap.logs {
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_len(0).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, bytes, 0).unwrap();
    }
    for (_, path) in segments(journal_dir).unwrap() {
        std::fs::remove_file(path).unwrap();
    }
    for (path, bytes) in &snap.journal {
        std::fs::write(path, bytes).unwrap();
    }
}

/// Sessions each with writers ending calls (half as a request part and a
/// completion, half whole), a journal rotated every `journal_bytes`; a
/// power loss once `loss_after` calls were released; the restarted store
/// holds each released call exactly once.
async fn power_loss_scenario(loss_after: usize, journal_bytes: u64, seed: u64) {
    const SESSIONS: usize = 8;
    const WRITERS: usize = 3;
    const CALLS: u64 = 8;
    let dir = tempfile::tempdir().unwrap();
    let (store, commit) = power_store(dir.path(), journal_bytes, recording_sync);
    let journal_dir = commit.journal_dir().to_owned();
    let store = Arc::new(store);
    let released = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut logs = Vec::new();
    for s in 0..SESSIONS {
        let session: SessionId = format!("s-{s}").parse().unwrap();
        let log = store.session(&session).await.unwrap();
        logs.push(Arc::clone(&log));
        for w in 0..WRITERS {
            let log = Arc::clone(&log);
            let released = Arc::clone(&released);
            tasks.push(tokio::spawn(async move {
                for c in 0..CALLS {
                    let mut r = record(w as u64 * CALLS + c, Api::OpenaiChat, "x");
                    r.call_id = format!("{}-{}", log.session(), r.call_id);
                    r.session_id = log.session().to_string();
                    let call_id = r.call_id.clone();
                    let parts = if c % 2 == 0 {
                        let (part, _) = encode_two_parts(&r).unwrap();
                        log.append_request_part(&part).unwrap();
                        RecordParts::InRequestPart(PartPrompt::Same)
                    } else {
                        RecordParts::default()
                    };
                    log.append(r, parts, Default::default()).await.unwrap();
                    lock(&released).push(call_id);
                }
            }));
        }
    }
    // The power loss, at a moment of the run.
    let state = dir.path().to_owned();
    let journal = journal_dir.clone();
    let watched = Arc::clone(&released);
    let loss = std::thread::spawn(move || {
        while lock(&watched).len() < loss_after {
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut n = seed;
        let mut pick = move |d: u64, len: u64| {
            // An arbitrary point from the last sync to the end.
            n = n
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            d + (n >> 33) % (len - d + 1)
        };
        power_loss(&state, &journal, &watched, &mut pick)
    });
    for t in tasks {
        t.await.unwrap();
    }
    let snap = loss.join().unwrap();
    assert!(snap.released.len() >= loss_after);
    // The agent's process is gone: nothing more is synced or removed.
    commit.crash();
    std::mem::forget(logs);
    std::mem::forget(store);
    std::mem::forget(commit);
    restore(&journal_dir, &snap);

    let (store, replayed) = CaptureStore::open(
        dir.path(),
        Durability::Power,
        DEFAULT_JOURNAL_BYTES,
        Arc::new(SessionRegistry::new()),
    )
    .unwrap();
    assert!(!journal_dir.exists(), "the journal replayed is removed");
    assert_eq!(
        journals(dir.path()),
        [store.group_commit().unwrap().journal_dir().to_owned()],
        "only the new store's journal is left"
    );
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (path, _) in &snap.logs {
        let (records, problems) = read_log(path).unwrap();
        assert!(
            problems.iter().all(|p| matches!(
                p,
                LogProblem::TornTail { .. } | LogProblem::Unfinished { .. }
            )),
            "{problems:?} ({replayed:?})"
        );
        for r in records {
            *seen.entry(r.call_id).or_default() += 1;
        }
    }
    for call in &snap.released {
        assert_eq!(
            seen.get(call),
            Some(&1),
            "released {call} after the power loss ({replayed:?})"
        );
    }
    assert!(
        seen.values().all(|&n| n == 1),
        "a call recorded twice: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_released_record_survives_a_simulated_power_loss_mid_run() {
    // Segments of 8 KiB: rotated (logs synced, segments removed) many
    // times before and after the loss.
    power_loss_scenario(90, 8 << 10, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_released_record_survives_a_simulated_power_loss_at_the_end() {
    power_loss_scenario(8 * 3 * 8, DEFAULT_JOURNAL_BYTES, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_power_loss_right_after_the_first_calls_loses_none_of_them() {
    power_loss_scenario(5, 8 << 10, 3).await;
}

/// Syncs entered; each waits for the gate.
static ENTERED: AtomicU64 = AtomicU64::new(0);
static GATE: Mutex<()> = Mutex::new(());

fn gated_sync(file: &File) -> io::Result<()> {
    ENTERED.fetch_add(1, Ordering::SeqCst);
    drop(lock(&GATE));
    file.sync_data()
}

fn journaled(commit: &GroupCommit, session: &str) -> Option<crate::log::Journaled> {
    Some(crate::log::Journaled {
        commit: commit.clone(),
        session: session.parse().unwrap(),
    })
}

#[test]
fn lines_that_end_together_share_one_sync_of_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let gate = lock(&GATE);
    let own = RootLock::take(&dir.path().join(JOURNAL_DIR))
        .unwrap()
        .make_own()
        .unwrap();
    let commit = GroupCommit::start_with(own, DEFAULT_JOURNAL_BYTES, gated_sync).unwrap();
    let open = |name: &str| {
        let (file, _) = LogFile::open(
            &dir.path().join(format!("{name}.jsonl")),
            journaled(&commit, name),
        )
        .unwrap();
        Arc::new(file)
    };
    let logs: Vec<_> = (0..8).map(|i| open(&format!("s-{i}"))).collect();
    let line = b"{}\n";
    // A first line's sync starts and is held at the gate...
    let first = logs[0]
        .register(logs[0].append_line(line).unwrap())
        .unwrap();
    for _ in 0..10_000 {
        if ENTERED.load(Ordering::SeqCst) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ENTERED.load(Ordering::SeqCst), 1);
    // ...while 40 more lines, in eight files, end.
    let mut waiting = Vec::new();
    let mut last = None;
    for log in &logs {
        for _ in 0..5 {
            let written = log.append_line(line).unwrap();
            last = Some(written);
            waiting.push(log.register(written).unwrap());
        }
    }
    drop(gate);
    assert!(matches!(first.blocking_recv(), Ok(Ok(()))));
    for w in waiting {
        assert!(matches!(w.blocking_recv(), Ok(Ok(()))));
    }
    // One sync for the first line, one for the other 40 in eight files.
    assert_eq!(commit.syncs(), 2);
    // A line the last sync covered needs none.
    assert!(logs[3].register(last.unwrap()).is_none());
    let next = logs[3].append_line(line).unwrap();
    assert!(logs[3].register(next).is_some());
}

/// The lengths of a journal's one segment and of its frames.
fn segment_lengths(commit: &GroupCommit) -> (u64, u64) {
    let found = segments(commit.journal_dir()).unwrap();
    assert_eq!(found.len(), 1);
    let bytes = std::fs::read(&found[0].1).unwrap();
    (bytes.len() as u64, frames_end(&bytes))
}

#[test]
fn a_round_writes_zeros_ahead_that_later_rounds_write_over() {
    for limit in [DEFAULT_JOURNAL_BYTES, 8 << 10] {
        let dir = tempfile::tempdir().unwrap();
        let own = RootLock::take(&dir.path().join(JOURNAL_DIR))
            .unwrap()
            .make_own()
            .unwrap();
        let commit = GroupCommit::start_with(own, limit, File::sync_data).unwrap();
        let (log, _) =
            LogFile::open(&dir.path().join("s-1.jsonl"), journaled(&commit, "s-1")).unwrap();
        let durable = |line: &[u8]| {
            let written = log.append_line(line).unwrap();
            let rx = log.register(written).unwrap();
            assert!(matches!(rx.blocking_recv(), Ok(Ok(()))));
        };
        durable(b"{\"a\":1}\n");
        let (len, frames) = segment_lengths(&commit);
        assert_eq!(len, (frames + ZERO_AHEAD).min(limit), "limit {limit}");
        // The next rounds write within the zeros: the file keeps its size.
        for _ in 0..10 {
            durable(b"{\"b\":2}\n");
        }
        let (again, more) = segment_lengths(&commit);
        assert_eq!(again, len, "limit {limit}");
        assert!(more > frames);
        assert_eq!(commit.syncs(), 11);
    }
}

fn failing_sync(_: &File) -> io::Result<()> {
    Err(io::Error::other("injected sync failure"))
}

#[tokio::test]
async fn a_failed_sync_fails_its_calls_uncounted() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _commit) = power_store(dir.path(), DEFAULT_JOURNAL_BYTES, failing_sync);
    let log = store.session(&"s-1".parse().unwrap()).await.unwrap();
    let err = log
        .append(
            record(0, Api::OpenaiChat, "x"),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LogError::Io { source, .. } if source.to_string().contains("injected")),
        "{err}"
    );
    assert_eq!(store.stats().completed(), 0);
}

#[tokio::test]
async fn a_closed_store_syncs_its_logs_and_removes_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = CaptureStore::open(
        dir.path(),
        Durability::Power,
        DEFAULT_JOURNAL_BYTES,
        Arc::new(SessionRegistry::new()),
    )
    .unwrap();
    let s: SessionId = "s-1".parse().unwrap();
    let log = store.session(&s).await.unwrap();
    log.append(
        record(0, Api::OpenaiChat, "x"),
        Default::default(),
        Default::default(),
    )
    .await
    .unwrap();
    let journal = store.group_commit().unwrap().journal_dir().to_owned();
    assert_eq!(segments(&journal).unwrap().len(), 1);
    store.close(&s);
    // Dropping the last handle waits for the syncing thread's close.
    drop((log, store));
    assert!(
        !journal.exists(),
        "the journal and its directory are removed"
    );
    assert!(journals(dir.path()).is_empty());
    let (records, _) = read_log(&dir.path().join("sessions/s-1").join(CALLS_FILE)).unwrap();
    assert_eq!(records.len(), 1);
}

#[tokio::test]
async fn process_mode_writes_without_a_syncing_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = CaptureStore::open(
        dir.path(),
        Durability::Process,
        DEFAULT_JOURNAL_BYTES,
        Arc::new(SessionRegistry::new()),
    )
    .unwrap();
    assert!(store.group_commit().is_none());
    let s: SessionId = "s-1".parse().unwrap();
    let log = store.session(&s).await.unwrap();
    log.append(
        record(0, Api::OpenaiChat, "x"),
        Default::default(),
        Default::default(),
    )
    .await
    .unwrap();
    // In the file (the page cache outlives the agent's process); no journal.
    let (records, problems) = read_log(&store.session_dir(&s).join(CALLS_FILE)).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(records.len(), 1);
    assert_eq!(store.stats().completed(), 1);
    assert!(!dir.path().join(JOURNAL_DIR).exists());
}

#[tokio::test]
async fn agents_sharing_a_state_directory_each_keep_their_own_journal() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        CaptureStore::open(
            dir.path(),
            Durability::Power,
            DEFAULT_JOURNAL_BYTES,
            Arc::new(SessionRegistry::new()),
        )
        .unwrap()
    };
    let (first, _) = open();
    let a: SessionId = "s-a".parse().unwrap();
    let log_a = first.session(&a).await.unwrap();
    let append = |log: Arc<crate::store::SessionLog>, n: u64| async move {
        log.append(
            record(n, Api::OpenaiChat, "x"),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    };
    append(Arc::clone(&log_a), 0).await;
    let first_journal = first.group_commit().unwrap().journal_dir().to_owned();
    // A second agent starts on the same state directory: the first's
    // journal is live, neither replayed nor removed.
    let (second, replayed) = open();
    assert_eq!(replayed, Replayed::default());
    assert_eq!(segments(&first_journal).unwrap().len(), 1);
    let second_journal = second.group_commit().unwrap().journal_dir().to_owned();
    assert_ne!(first_journal, second_journal);
    let b: SessionId = "s-b".parse().unwrap();
    append(second.session(&b).await.unwrap(), 0).await;
    append(Arc::clone(&log_a), 1).await;
    // Each clean close removes its own journal only.
    first.close(&a);
    drop((log_a, first));
    assert_eq!(journals(dir.path()), [second_journal]);
    second.close(&b);
    drop(second);
    assert!(journals(dir.path()).is_empty());
    for (s, n) in [("s-a", 2), ("s-b", 1)] {
        let (records, problems) =
            read_log(&dir.path().join("sessions").join(s).join(CALLS_FILE)).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(records.len(), n, "{s}");
    }
}
