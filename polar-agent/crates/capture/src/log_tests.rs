//! The log reader (torn tails, malformed lines with positions), appending,
//! a request part written ahead and its completion, the store's rebuild
//! after a restart, and its call hook. The join of two-part records is tested in
//! `lines_tests.rs`.

use std::sync::Arc;

use super::*;
use crate::store::CaptureStore;
use crate::{SessionInfo, SessionRegistry};
use polar_capture_log::fixture::{record, two_parts};
use polar_capture_log::{CALLS_FILE, LogProblem, encode_line, read_log};
use polar_chat::Api;
use polar_ids::SessionId;
use polar_record::CompletionRecord;

fn lines(records: &[CompletionRecord]) -> Vec<u8> {
    records
        .iter()
        .flat_map(|r| encode_line(r).unwrap())
        .collect()
}

#[test]
fn open_cuts_a_torn_tail_and_appends_on_a_fresh_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CALLS_FILE);
    let mut bytes = lines(&[record(0, Api::OpenaiChat, "a")]);
    bytes.extend_from_slice(b"{\"version\": 1, \"call_");
    std::fs::write(&path, &bytes).unwrap();
    let (log, before) = LogFile::open(&path, None).unwrap();
    assert!(before.ends_with(b"\n"));
    let _written = log
        .append_line(&encode_line(&record(1, Api::OpenaiChat, "b")).unwrap())
        .unwrap();
    let (back, problems) = read_log(&path).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(back.iter().map(|r| r.seq).collect::<Vec<_>>(), [0, 1]);
}

#[tokio::test]
async fn store_continues_seq_and_rebuilds_responses_history() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(SessionRegistry::new());
    let s: SessionId = "s-1".parse().unwrap();
    registry.register(&s, SessionInfo::task("t-1"));
    let store = CaptureStore::open(
        dir.path(),
        Durability::Power,
        crate::DEFAULT_JOURNAL_BYTES,
        Arc::clone(&registry),
    )
    .unwrap()
    .0;
    let log = store.session(&s).await.unwrap();
    assert_eq!(log.next_seq(), 0);
    assert_eq!(log.next_seq(), 1);
    log.append(
        record(0, Api::OpenaiResponses, "first"),
        Default::default(),
        Default::default(),
    )
    .await
    .unwrap();
    log.append(
        record(1, Api::OpenaiChat, "chat"),
        Default::default(),
        Default::default(),
    )
    .await
    .unwrap();
    let conv = log.conversation("resp_r0").unwrap();
    assert_eq!(conv.len(), 2);
    assert_eq!(conv[1].joined_text(), "first");
    assert!(
        log.conversation("resp_r1").is_none(),
        "chat calls have none"
    );

    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(log.calls_path().with_file_name("session.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["task_id"], "t-1");
    assert_eq!(meta["session_id"], "s-1");

    // A new store (an agent restart) with a torn record at the end.
    let calls = log.calls_path().to_owned();
    drop(log);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&calls)
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"torn").unwrap();
    let store = CaptureStore::open(
        dir.path(),
        Durability::Power,
        crate::DEFAULT_JOURNAL_BYTES,
        registry,
    )
    .unwrap()
    .0;
    let log = store.session(&s).await.unwrap();
    assert_eq!(log.next_seq(), 2);
    assert_eq!(log.conversation("resp_r0").unwrap(), conv);
    let (records, problems) = read_log(&calls).unwrap();
    assert_eq!(records.len(), 2);
    assert!(problems.is_empty());
}

#[tokio::test]
async fn a_request_part_written_ahead_joins_its_completion_also_after_a_restart() {
    use crate::build::Draft;
    use crate::part::RequestPartWrite;
    use polar_capture_log::ReplyTokensJson;
    use polar_capture_log::encode::{PartPrompt, RecordParts};

    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(SessionRegistry::new());
    let s: SessionId = "s-1".parse().unwrap();
    let store = CaptureStore::open(
        dir.path(),
        Durability::Power,
        crate::DEFAULT_JOURNAL_BYTES,
        Arc::clone(&registry),
    )
    .unwrap()
    .0;
    let log = store.session(&s).await.unwrap();
    let want = record(log.next_seq(), Api::OpenaiResponses, "first");
    let mut draft = Draft {
        call_id: want.call_id.clone(),
        seq: want.seq,
        session_id: want.session_id.clone(),
        task_id: want.task_id.clone(),
        policy_version: want.policy_version.clone(),
        native: want.native_request.clone(),
        request: want.request.clone(),
        received_ms: 0,
    };
    let early = draft.encode_early(false);
    let part = RequestPartWrite::start(
        Arc::clone(&log),
        &draft,
        early,
        want.prompt_token_ids.clone(),
    );
    let parts = part.finish(&mut draft).await;
    assert!(
        matches!(parts, RecordParts::InRequestPart(PartPrompt::Ids(_))),
        "{parts:?}"
    );
    assert_eq!(draft.request, want.request);
    assert_eq!(draft.native.path, want.native_request.path);
    // The part is in the log; the call is not a record until it ends.
    let (records, problems) = read_log(log.calls_path()).unwrap();
    assert!(records.is_empty());
    assert!(
        matches!(&problems[..], [LogProblem::Unfinished { line: 1, offset: 0, call_id }] if *call_id == want.call_id),
        "{problems:?}"
    );
    // The reply's token data serialized as it streamed, the prompt ids
    // known to be the part's.
    let mut tokens = ReplyTokensJson::default();
    let (ids, lps) = (
        want.response_token_ids.as_deref().unwrap(),
        want.response_logprobs.as_deref().unwrap(),
    );
    for n in 0..=ids.len() {
        tokens.catch_up(&ids[..n], &lps[..n]);
    }
    log.append(want.clone(), parts.prompt_unchanged(), tokens)
        .await
        .unwrap();
    let (records, problems) = read_log(log.calls_path()).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(records, std::slice::from_ref(&want));
    assert_eq!(
        log.conversation("resp_r0").unwrap()[1].joined_text(),
        "first"
    );
    // A call whose part was written but which never ended (a crash).
    let cut_short = record(log.next_seq(), Api::OpenaiChat, "never");
    let (line, _) = two_parts(&cut_short, None);
    log.append_request_part(&line).unwrap();

    // A restart rebuilds the history from the joined record.
    drop(log);
    let store = CaptureStore::open(
        dir.path(),
        Durability::Power,
        crate::DEFAULT_JOURNAL_BYTES,
        registry,
    )
    .unwrap()
    .0;
    let log = store.session(&s).await.unwrap();
    assert_eq!(log.next_seq(), 1, "the unfinished call is not a record");
    assert_eq!(
        log.conversation("resp_r0").unwrap()[1].joined_text(),
        "first"
    );
    let (records, problems) = read_log(log.calls_path()).unwrap();
    assert_eq!(records, [want]);
    assert!(matches!(
        &problems[..],
        [LogProblem::Unfinished { line: 3, .. }]
    ));
}

#[tokio::test]
async fn the_call_hook_sees_each_record_once_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = CaptureStore::open(
        dir.path(),
        Durability::Process,
        crate::DEFAULT_JOURNAL_BYTES,
        Arc::new(SessionRegistry::new()),
    )
    .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    let hook = crate::CallHook::new(move |session, record| {
        s2.lock()
            .unwrap()
            .push((session.to_string(), record.seq, record.call_id.clone()));
    });
    store.set_call_hook(hook.clone()).unwrap();
    assert!(store.set_call_hook(hook).is_err(), "one hook only");
    for (sid, seq) in [("s-a", 0), ("s-b", 0), ("s-a", 1)] {
        let log = store.session(&sid.parse().unwrap()).await.unwrap();
        log.append(
            record(seq, Api::OpenaiChat, "x"),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
        // By the time the append returns, the hook saw the record.
        assert_eq!(seen.lock().unwrap().last().unwrap().0, sid);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.iter()
            .map(|(s, q, _)| (s.as_str(), *q))
            .collect::<Vec<_>>(),
        [("s-a", 0), ("s-b", 0), ("s-a", 1)]
    );
    assert_eq!(seen[0].2, record(0, Api::OpenaiChat, "x").call_id);
}
