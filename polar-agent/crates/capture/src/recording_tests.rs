//! A recording through the API the proxy drives, without a backend: a call
//! that fails before any reply (refused, or its backend not configured) is
//! recorded with what it was started and fed with, at its position in the
//! session, in both durability modes; a call whose session log cannot be
//! opened is not started; a reply streamed by a mock vLLM is recorded with
//! its token data, its request part written ahead when the request is big.
//! Replies through the proxy, failed mid-stream and failed over are
//! recorded in the agent's `capture_e2e`, `capture_failures` and
//! `capture_resume`.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::{DEFAULT_JOURNAL_BYTES, Durability, SessionInfo, SessionRegistry};
use polar_chat::{Api, Role};
use polar_json::RawJson;
use polar_record::{CallStatus, CompletionRecord};

fn native(n: u64) -> NativeRequest {
    NativeRequest {
        api: Api::OpenaiChat,
        method: "POST".into(),
        host: "api.example".into(),
        path: "/v1/chat/completions".into(),
        body: RawJson::from_value(&json!({"n": n})),
    }
}

fn request(text: &str) -> ChatRequest {
    let mut r = empty_request();
    r.model = "m".into();
    r.messages = vec![Message::text(Role::User, text)];
    r
}

fn store(dir: &std::path::Path, durability: Durability) -> (CaptureStore, SessionId) {
    let registry = Arc::new(SessionRegistry::new());
    let s: SessionId = "s-1".parse().unwrap();
    registry.register(
        &s,
        SessionInfo::task("t-1").with_policy_version(Some("w-3".into())),
    );
    let store = CaptureStore::open(dir, durability, DEFAULT_JOURNAL_BYTES, registry)
        .unwrap()
        .0;
    (store, s)
}

#[tokio::test]
async fn calls_failed_before_a_reply_are_recorded_in_order() {
    for durability in [Durability::Power, Durability::Process] {
        let dir = tempfile::tempdir().unwrap();
        let (store, s) = store(dir.path(), durability);

        let mut refused = Recording::start(&store, &s, native(0)).await.unwrap();
        let mut unrouted = Recording::start(&store, &s, native(1)).await.unwrap();
        assert_eq!((refused.seq(), unrouted.seq()), (0, 1));
        assert!(refused.call_id().starts_with("call_"));
        assert_ne!(refused.call_id(), unrouted.call_id());
        assert_eq!(refused.session(), &s);
        assert!(refused.request().messages.is_empty());

        refused.set_request(request("a"));
        unrouted.set_request(request("b"));
        assert_eq!(unrouted.request().messages.len(), 1);
        unrouted.backend("gpu".into(), None);
        // Finished out of order: each keeps its own position.
        unrouted
            .finish(Outcome::Failed {
                side: Side::Agent,
                error: "no backend".into(),
            })
            .await
            .unwrap();
        let cut = refused
            .finish_with(
                Outcome::Failed {
                    side: Side::Harness,
                    error: "bad request".into(),
                },
                |r| r.call_id.clone(),
            )
            .await
            .unwrap();

        let (records, problems) =
            polar_capture_log::read_log(&store.session_dir(&s).join(polar_capture_log::CALLS_FILE))
                .unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        let [b, a] = &records[..] else {
            panic!("{records:?}")
        };
        assert_eq!(a.call_id, cut);
        assert_eq!((a.seq, b.seq), (0, 1));
        assert_eq!(a.native_request, native(0));
        assert_eq!(b.request, request("b"));
        assert_eq!(a.task_id.as_deref(), Some("t-1"));
        assert_eq!(a.policy_version.as_deref(), Some("w-3"));
        assert_eq!(
            a.status,
            CallStatus::Failed {
                side: "harness".into(),
                error: "bad request".into()
            }
        );
        assert_eq!(b.backend.name, "gpu");
        assert!(a.response.is_none() && a.token_ids_missing);
        assert!(a.timings.received_ms <= a.timings.finished_ms);
        assert_eq!(store.stats().completed(), 0);
    }
}

#[tokio::test]
async fn a_call_whose_log_cannot_be_opened_is_not_started() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path(), Durability::Process);
    let s: SessionId = "s-2".parse().unwrap();
    // A file where the session's directory should be.
    let blocked = store.session_dir(&s);
    std::fs::create_dir_all(blocked.parent().unwrap()).unwrap();
    std::fs::write(&blocked, b"").unwrap();
    let err = Recording::start(&store, &s, native(0)).await.unwrap_err();
    assert!(matches!(err, LogError::Io { .. }), "{err:?}");
}

/// Drives a recording as the proxy's streamed reply does, against a mock
/// vLLM on loopback: returns the kinds of the log's lines and its records.
async fn streamed_call(native_bytes: usize) -> (Vec<String>, Vec<CompletionRecord>) {
    let mock = polar_mock::start(polar_mock::MockConfig {
        token_latency: std::time::Duration::from_millis(5),
        ..polar_mock::MockConfig::default()
    })
    .await
    .unwrap();
    let client = polar_inference::Client::new(polar_inference::BackendConfig::new(
        "mock",
        polar_inference::Dialect::Vllm,
        vec![mock.url()],
        "polar-mock",
    ))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (store, s) = store(dir.path(), Durability::Power);
    let mut native = native(0);
    native.body = RawJson::from_value(&json!({"system": "x".repeat(native_bytes)}));
    let mut rec = Recording::start(&store, &s, native).await.unwrap();
    let mut req = request("make the demo file");
    req.stream = true;
    rec.set_request(req.clone());
    let mut stream = client.chat(s.as_str(), rec.request()).await.unwrap();
    rec.sent(false);
    while let Some(ev) = stream.next().await {
        let ev = ev.unwrap();
        let finish = matches!(ev, StreamEvent::Finish { .. });
        rec.event(ev);
        if finish {
            break;
        }
        rec.stream_tokens(&stream);
        rec.first_output(&stream);
    }
    rec.stream_tokens(&stream);
    rec.stream_done(&mut stream);
    drop(stream);
    let answered = rec
        .finish_with(Outcome::Completed, |r| r.response.is_some())
        .await
        .unwrap();
    assert!(answered);
    mock.stop().await;
    let path = store.session_dir(&s).join(polar_capture_log::CALLS_FILE);
    let kinds = std::fs::read(&path)
        .unwrap()
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(l).unwrap();
            v["part"].as_str().unwrap_or("whole").to_owned()
        })
        .collect();
    let (records, problems) = polar_capture_log::read_log(&path).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let [r] = &records[..] else {
        panic!("{records:?}")
    };
    assert_eq!(r.request, req, "the normalized request is given back");
    assert_eq!(r.status, CallStatus::Completed);
    assert!(!r.token_ids_missing);
    let (prompt, reply) = (
        r.prompt_token_ids.as_ref().unwrap(),
        r.response_token_ids.as_ref().unwrap(),
    );
    assert!(!prompt.is_empty() && !reply.is_empty());
    assert_eq!(
        r.response_logprobs.as_ref().map(Vec::len),
        Some(reply.len())
    );
    assert_eq!(
        r.response.as_ref().unwrap().usage.completion_tokens as usize,
        reply.len()
    );
    (kinds, records)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_call_writes_its_request_part_ahead_when_it_is_big() {
    let (kinds, records) = streamed_call(2 * crate::INLINE_REQUEST_BYTES).await;
    assert_eq!(kinds, ["request", "completion"]);
    assert!(records[0].native_request.body.as_bytes().len() > crate::INLINE_REQUEST_BYTES);
    let (kinds, _) = streamed_call(16).await;
    assert_eq!(kinds, ["whole"], "a small request is written whole, once");
}
