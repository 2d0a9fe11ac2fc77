//! Issue 5's retry scenarios through the real capture path (a Qwen
//! Code-shaped client -> the agent's pipeline -> the mock backend -> the
//! capture log on disk -> read back -> builder): the same prompt sent again
//! with a new reply, with the same reply, after a failed call, and under a
//! reasoning-stripping template with either reply kept. The chain keeps the
//! call later calls extend; the other is delivered as a superseded retry
//! (or dropped, per the retry policy) and counted; a failed call is dropped
//! with its reason. Exact traces and statistics, and the invariant checker
//! on both builders.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

mod common;

use common::traj::*;
use common::{Harness, send};
use http::StatusCode;
use polar_mock::script::{ScriptedError, Turn};
use polar_record::{CallStatus, CompletionRecord};
use polar_trajectory::{
    ChainId, DropReason, DroppedCall, Join, Label, ReconstructionStats, RetryPolicy, SegmentKind,
    SegmentLink, SpliceCounts,
};
use serde_json::json;

/// The retried call is `r[1]`; `r[2]` is the retry the harness went on
/// with; `r[3]` extends it.
async fn retried(session: &str, same_reply: bool) -> Vec<CompletionRecord> {
    let second = if same_reply { "cat a.rs" } else { "cat b.rs" };
    let turns = vec![shell("ls"), shell("cat a.rs"), shell(second), text("done")];
    let (mock, agent) = start(session, turns).await;
    let mut c = Convo::new("You are Qwen Code.", "Read the sources");
    c.step(&agent, session).await;
    // The harness gave up on the first answer (a client timeout) and sent
    // the same request again; it goes on with the second answer.
    c.send(&agent, session).await;
    c.step(&agent, session).await;
    c.step(&agent, session).await;
    let r = records(&agent, session, 4);
    stop(mock, agent).await;
    assert_eq!(prompt(&r[1]), prompt(&r[2]), "a retry of the same prompt");
    assert_eq!(response(&r[1]) == response(&r[2]), same_reply);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_retry_keeps_the_call_the_harness_went_on_with() {
    let session = "retry-new";
    let r = retried(session, false).await;
    let traj = build(&merging(RetryPolicy::KeepAsTrace), &r, session);
    assert_eq!(traj.traces.len(), 2);
    let (main, retry) = (&traj.traces[0], &traj.traces[1]);
    assert_merged(main, &[&r[0], &r[2], &r[3]]);
    assert_eq!((main.chain, main.segment), (ChainId(0), 0));
    assert_eq!(main.segment_kind, SegmentKind::Start);
    assert!(main.labels.is_empty() && main.previous.is_none());
    assert_merged(retry, &[&r[1]]);
    assert_eq!((retry.chain, retry.segment), (ChainId(0), 1));
    assert_eq!(retry.segment_kind, SegmentKind::SupersededRetry);
    assert_eq!(retry.labels, [Label::SupersededRetry]);
    assert_eq!(
        retry.previous,
        Some(SegmentLink {
            chain: ChainId(0),
            segment: 0,
            common_prefix_len: seq(&r[0]).len(),
        })
    );
    let want = ReconstructionStats {
        calls: 4,
        chains: 1,
        segments: 2,
        calls_merged: 2,
        retries_superseded: 1,
        ..ReconstructionStats::default()
    };
    assert_eq!(traj.stats, with_tokens(&traj, want.clone()));

    // Dropping superseded retries: the same chain, the retry listed.
    let traj = build(&merging(RetryPolicy::Drop), &r, session);
    assert_eq!(traj.traces.len(), 1);
    assert_merged(&traj.traces[0], &[&r[0], &r[2], &r[3]]);
    let dropped = vec![DroppedCall {
        call_id: r[1].call_id.clone(),
        reason: DropReason::SupersededRetry,
    }];
    let want = ReconstructionStats {
        segments: 1,
        calls_dropped: dropped,
        ..want
    };
    assert_eq!(traj.stats, with_tokens(&traj, want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_retry_with_the_same_reply_keeps_the_first() {
    let session = "retry-same";
    let r = retried(session, true).await;
    let traj = build(&merging(RetryPolicy::KeepAsTrace), &r, session);
    assert_eq!(traj.traces.len(), 2);
    // The replies are identical, so either call is the one the harness went
    // on with: the earliest stays in the chain.
    assert_merged(&traj.traces[0], &[&r[0], &r[1], &r[3]]);
    let retry = &traj.traces[1];
    assert_merged(retry, &[&r[2]]);
    assert_eq!(retry.segment_kind, SegmentKind::SupersededRetry);
    assert_eq!(retry.labels, [Label::SupersededRetry]);
    assert_eq!(
        retry.previous.map(|l| (l.chain, l.segment)),
        Some((ChainId(0), 0))
    );
    let want = ReconstructionStats {
        calls: 4,
        chains: 1,
        segments: 2,
        calls_merged: 2,
        retries_superseded: 1,
        ..ReconstructionStats::default()
    };
    assert_eq!(traj.stats, with_tokens(&traj, want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_a_failed_call_drops_it_with_the_reason() {
    let session = "retry-failed";
    let failed = Turn {
        error: Some(ScriptedError {
            status: 500,
            message: Some("injected".into()),
        }),
        ..Turn::default()
    };
    let turns = vec![shell("ls"), failed, shell("cat a.rs"), text("done")];
    let (mock, agent) = start(session, turns).await;
    let mut c = Convo::new("You are Qwen Code.", "Read the sources");
    c.step(&agent, session).await;
    let reply = send(Harness::Qwen.request(agent.addr, session, c.body.clone(), false)).await;
    assert_ne!(reply.status, StatusCode::OK, "{}", reply.text());
    c.step(&agent, session).await;
    c.step(&agent, session).await;
    let r = records(&agent, session, 4);
    stop(mock, agent).await;
    assert_eq!(r[1].request, r[2].request, "the same request, sent again");

    let traj = build(&merging(RetryPolicy::KeepAsTrace), &r, session);
    assert_eq!(traj.traces.len(), 1);
    assert_merged(&traj.traces[0], &[&r[0], &r[2], &r[3]]);
    assert!(traj.traces[0].labels.is_empty());
    let CallStatus::Failed { side, error } = &r[1].status else {
        panic!("{:?}", r[1].status);
    };
    assert_eq!(side, "backend");
    assert!(error.contains("HTTP 500"), "{error}");
    let dropped = vec![DroppedCall {
        call_id: r[1].call_id.clone(),
        reason: DropReason::CallFailed {
            side: side.clone(),
            error: error.clone(),
        },
    }];
    let want = ReconstructionStats {
        calls: 4,
        chains: 1,
        segments: 1,
        calls_merged: 2,
        calls_dropped: dropped,
        ..ReconstructionStats::default()
    };
    assert_eq!(traj.stats, with_tokens(&traj, want));
}

/// A retry under a reasoning-stripping template: the history turn the next
/// call re-renders has lost its reasoning, so neither retried reply is a
/// prefix of it; the chain must keep the reply the harness went on with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_under_a_stripping_template_keeps_the_reply_the_harness_used() {
    let thinking = |think: &str, command: &str| Turn {
        think: Some(think.into()),
        ..shell(command)
    };
    for (session, used) in [("retry-strip-first", 1), ("retry-strip-second", 2)] {
        let turns = vec![
            thinking("list the files first", "ls"),
            thinking("read the first one", "cat a.rs"),
            thinking("read the other one", "cat b.rs"),
            Turn {
                think: Some("both read".into()),
                ..text("done")
            },
        ];
        let (mock, agent) = start(session, turns).await;
        let mut c = Convo::new("You are Qwen Code.", "Read the sources");
        c.body["polar_mock"] = json!({"strip_reasoning": "all"});
        c.step(&agent, session).await;
        let replies = [c.send(&agent, session).await, c.send(&agent, session).await];
        c.answer(&replies[used - 1]);
        c.step(&agent, session).await;
        let r = records(&agent, session, 4);
        stop(mock, agent).await;
        assert_eq!(prompt(&r[1]), prompt(&r[2]), "{session}");
        let other = 3 - used;

        let traj = build(&merging(RetryPolicy::KeepAsTrace), &r, session);
        assert_eq!(traj.traces.len(), 2, "{session}");
        let (main, retry) = (&traj.traces[0], &traj.traces[1]);
        assert_eq!((main.chain, main.segment), (ChainId(0), 0));
        assert_merged(main, &[&r[0], &r[used], &r[3]]);
        assert!(
            main.spans[1..]
                .iter()
                .all(|s| matches!(s.join, Join::Splice { .. })),
            "{session}"
        );
        assert_eq!(main.labels, [Label::TemplateSpliced], "{session}");
        assert_merged(retry, &[&r[other]]);
        assert_eq!(retry.segment_kind, SegmentKind::SupersededRetry);
        let Join::Splice { diverged_at, .. } = join_of(&r[0], &r[other]) else {
            panic!("{session}: the retry re-renders the first turn");
        };
        assert_eq!(
            retry.previous,
            Some(SegmentLink {
                chain: ChainId(0),
                segment: 0,
                common_prefix_len: diverged_at,
            }),
            "{session}"
        );
        let want = ReconstructionStats {
            calls: 4,
            chains: 1,
            segments: 2,
            calls_merged: 2,
            retries_superseded: 1,
            template_mismatches_detected: 3,
            template_mismatches_spliced: 2,
            template_splices_by_shape: SpliceCounts {
                stripped_reasoning: 2,
                ..SpliceCounts::default()
            },
            ..ReconstructionStats::default()
        };
        assert_eq!(traj.stats, with_tokens(&traj, want), "{session}");
    }
}
