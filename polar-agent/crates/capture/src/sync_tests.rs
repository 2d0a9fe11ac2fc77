//! Group commit: a simulated power loss keeps every record whose append
//! returned (the moment its reply's last bytes are released), lines that
//! end together share their syncs, a failed sync fails its calls, and
//! `process` mode writes without syncing.
//!
//! The power-loss simulation: the syncing thread's sync operation is
//! replaced by one that notes the file's length before it calls the real
//! `fdatasync`; what a power loss leaves of a file is its bytes up to the
//! longest length noted by a sync that returned (the page cache holding the
//! rest is lost).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::*;
use crate::log::Written;
use crate::log::tests::record;
use crate::log::{CALLS_FILE, Durability, read_log};
use crate::store::CaptureStore;
use crate::{LogError, SessionRegistry, parse_log};
use polar_chat::Api;
use polar_ids::SessionId;

/// Per inode, the longest length a returned sync covered.
static DURABLE: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

fn recording_sync(file: &File) -> io::Result<()> {
    let before = file.metadata()?;
    file.sync_data()?;
    let mut durable = lock(&DURABLE);
    let len = durable.entry(before.ino()).or_default();
    *len = (*len).max(before.len());
    Ok(())
}

/// What a power loss now would leave of the file at `path`.
fn after_power_loss(path: &Path) -> Vec<u8> {
    let ino = std::fs::metadata(path).unwrap().ino();
    let len = lock(&DURABLE).get(&ino).copied().unwrap_or(0);
    let mut bytes = std::fs::read(path).unwrap();
    bytes.truncate(usize::try_from(len).unwrap());
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_released_record_survives_a_simulated_power_loss() {
    const SESSIONS: usize = 8;
    const WRITERS: usize = 4;
    const CALLS: u64 = 6;
    let dir = tempfile::tempdir().unwrap();
    let commit = GroupCommit::start_with(recording_sync).unwrap();
    let store = Arc::new(CaptureStore::with_commit(
        dir.path(),
        commit.clone(),
        Arc::new(SessionRegistry::new()),
    ));
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let session: SessionId = format!("s-{s}").parse().unwrap();
        let log = store.session(&session).await.unwrap();
        for w in 0..WRITERS {
            let log = Arc::clone(&log);
            tasks.push(tokio::spawn(async move {
                for c in 0..CALLS {
                    let r = record(w as u64 * CALLS + c, Api::OpenaiChat, "x");
                    let call_id = r.call_id.clone();
                    log.append(r, Default::default(), Default::default())
                        .await
                        .unwrap();
                    // Released: a power loss now must keep it.
                    let (kept, _) = parse_log(&after_power_loss(&log.calls_path()));
                    assert!(
                        kept.iter().any(|k| k.call_id == call_id),
                        "{call_id} of {} released before it was durable",
                        log.session()
                    );
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let appends = (SESSIONS * WRITERS) as u64 * CALLS;
    assert_eq!(store.stats().completed(), appends);
    assert!(commit.syncs() <= appends, "{} syncs", commit.syncs());
}

/// Syncs entered; each waits for the gate.
static ENTERED: AtomicU64 = AtomicU64::new(0);
static GATE: Mutex<()> = Mutex::new(());

fn gated_sync(file: &File) -> io::Result<()> {
    ENTERED.fetch_add(1, Ordering::SeqCst);
    drop(lock(&GATE));
    file.sync_data()
}

#[test]
fn lines_that_end_together_share_their_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let gate = lock(&GATE);
    let commit = GroupCommit::start_with(gated_sync).unwrap();
    let open = |name: &str| {
        let (file, _) = LogFile::open(&dir.path().join(name), Some(commit.clone())).unwrap();
        Arc::new(file)
    };
    let (x, y) = (open("x.jsonl"), open("y.jsonl"));
    let line = b"{}\n";
    // A first line's sync starts and is held at the gate...
    let first = x.register(x.append_line(line).unwrap()).unwrap();
    for _ in 0..10_000 {
        if ENTERED.load(Ordering::SeqCst) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ENTERED.load(Ordering::SeqCst), 1);
    // ...while 20 more lines, in two files, end.
    let mut waiting = Vec::new();
    for file in [&x, &y] {
        for _ in 0..10 {
            waiting.push(file.register(file.append_line(line).unwrap()).unwrap());
        }
    }
    drop(gate);
    assert!(matches!(first.blocking_recv(), Ok(Ok(()))));
    for w in waiting {
        assert!(matches!(w.blocking_recv(), Ok(Ok(()))));
    }
    // One sync for the first line, then one per file for the other 20.
    assert_eq!(commit.syncs(), 3);
    // A line the last syncs covered needs none.
    assert!(x.register(Written(11)).is_none());
    assert!(x.register(Written(12)).is_some());
}

fn failing_sync(_: &File) -> io::Result<()> {
    Err(io::Error::other("injected sync failure"))
}

#[tokio::test]
async fn a_failed_sync_fails_its_calls_uncounted() {
    let dir = tempfile::tempdir().unwrap();
    let commit = GroupCommit::start_with(failing_sync).unwrap();
    let store = CaptureStore::with_commit(dir.path(), commit, Arc::new(SessionRegistry::new()));
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
        matches!(&err, LogError::Io { action: "syncing", source, .. } if source.to_string().contains("injected")),
        "{err}"
    );
    assert_eq!(store.stats().completed(), 0);
}

#[tokio::test]
async fn process_mode_writes_without_a_syncing_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = CaptureStore::new(
        dir.path(),
        Durability::Process,
        Arc::new(SessionRegistry::new()),
    );
    assert!(store.group_commit().unwrap().is_none());
    let s: SessionId = "s-1".parse().unwrap();
    let log = store.session(&s).await.unwrap();
    log.append(
        record(0, Api::OpenaiChat, "x"),
        Default::default(),
        Default::default(),
    )
    .await
    .unwrap();
    // In the file (the page cache outlives the agent's process).
    let (records, problems) = read_log(&store.session_dir(&s).join(CALLS_FILE)).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(records.len(), 1);
    assert_eq!(store.stats().completed(), 1);
}
