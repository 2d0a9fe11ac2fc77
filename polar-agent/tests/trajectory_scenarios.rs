//! Issue 5's scenario tests beyond one clean chain, through the real
//! capture path (a Qwen Code-shaped client -> the agent's pipeline -> the
//! mock backend -> the capture log on disk -> read back -> builder):
//! compaction (by a summary, and keeping the first message), two parallel
//! sub-agents sending interleaved, concurrent calls in one session (plain
//! and under a reasoning-stripping template), and calls cut by `max_tokens`
//! (vLLM and SGLang dialects, and inside reasoning under a stripping
//! template). Retries are in `trajectory_retries.rs`. Each asserts the
//! traces, segments, chains, labels, loss masks, tokens and statistics
//! exactly, and runs the invariant checker on both builders.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

mod common;

use common::traj::*;
use polar_chat::FinishReason;
use polar_mock::script::{ScriptedCall, Turn};
use polar_mock::{Dialect, tokenizer};
use polar_record::CompletionRecord;
use polar_trajectory::{
    BreakReason, ChainId, Join, Label, ReconstructionStats, RetryPolicy, SegmentKind, SegmentLink,
    SpliceCounts, SpliceShape,
};
use serde_json::json;

const SUMMARY: &str = "Summary: the user asked to port the parser to the new api; \
                       parser.rs still uses the old api in parse, the lexer is already ported.";

/// Two tool calls, a summary asked for and given, then the context rebuilt
/// by `compact` from the conversation and the summary, and two more calls.
async fn compacted(
    session: &str,
    compact: fn(&Convo, &str) -> Convo,
) -> (Vec<CompletionRecord>, Convo) {
    let turns = vec![
        shell("grep -rl parse src"),
        shell("cat src/parser.rs"),
        text(SUMMARY),
        shell("sed -i s/old/new/ src/parser.rs"),
        text("done"),
    ];
    let (mock, agent) = start(session, turns).await;
    let mut c = Convo::new("You are Qwen Code.", "Port the parser to the new api");
    c.step(&agent, session).await;
    c.step(&agent, session).await;
    c.user("Summarize the conversation so far.");
    let summary = c.send(&agent, session).await;
    let summary = summary["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert_eq!(summary, SUMMARY);
    let mut after = compact(&c, summary);
    after.step(&agent, session).await;
    after.step(&agent, session).await;
    let r = records(&agent, session, 5);
    stop(mock, agent).await;
    (r, after)
}

/// Claude Code's compaction: a fresh context of the system prompt and one
/// user message carrying the summary.
fn from_summary(_: &Convo, summary: &str) -> Convo {
    let text = format!("This session continues an earlier one.\n{summary}");
    Convo::new("You are Qwen Code.", &text)
}

/// Qwen Code's compaction: the first user message kept, the rest replaced by
/// the summary.
fn keep_first(before: &Convo, summary: &str) -> Convo {
    let mut c = before.clone();
    c.body["messages"].as_array_mut().unwrap().truncate(2);
    c.user(summary);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_starts_a_segment_linked_to_the_one_before() {
    for (session, compact) in [
        ("compact-summary", from_summary as fn(&Convo, &str) -> Convo),
        ("compact-keep-first", keep_first),
    ] {
        let (r, _) = compacted(session, compact).await;
        assert!(prompt(&r[3]).len() < seq(&r[2]).len(), "{session}: shorter");
        let traj = build(&merging(RetryPolicy::KeepAsTrace), &r, session);
        assert_eq!(traj.traces.len(), 3, "{session}");
        let (before, summarized, after) = (&traj.traces[0], &traj.traces[1], &traj.traces[2]);
        assert_merged(before, &[&r[0], &r[1]]);
        assert_eq!(before.segment_kind, SegmentKind::Start);
        // The summary call is a segment of its own, branching from the
        // conversation it summarized, labelled.
        assert_merged(summarized, &[&r[2]]);
        assert_eq!(
            summarized.segment_kind,
            SegmentKind::CompactionSummary,
            "{session}"
        );
        assert_eq!(summarized.labels, [Label::CompactionSummary], "{session}");
        assert_eq!(
            summarized.previous,
            Some(SegmentLink {
                chain: ChainId(0),
                segment: 0,
                common_prefix_len: seq(&r[1]).len(),
            }),
            "{session}"
        );
        assert_merged(after, &[&r[3], &r[4]]);
        assert_eq!((after.chain, after.segment), (ChainId(0), 2), "{session}");
        assert_eq!(
            after.segment_kind,
            SegmentKind::AfterBreak {
                reason: BreakReason::Compaction
            },
            "{session}"
        );
        // Linked to the summary's segment, after the tokens they share (the
        // system turn, and the first user message when it was kept).
        let lcp = common_prefix(prompt(&r[3]), &seq(&r[2]));
        assert!(lcp > 0 && lcp < prompt(&r[2]).len(), "{session}: {lcp}");
        assert_eq!(
            after.previous,
            Some(SegmentLink {
                chain: ChainId(0),
                segment: 1,
                common_prefix_len: lcp,
            }),
            "{session}"
        );
        assert!(before.labels.is_empty() && after.labels.is_empty());
        let want = ReconstructionStats {
            calls: 5,
            chains: 1,
            segments: 3,
            calls_merged: 2,
            breaks: 1,
            ..ReconstructionStats::default()
        };
        assert_eq!(traj.stats, with_tokens(&traj, want), "{session}");
    }
}

/// A turn that waits `ms` before its first token, so that calls sent
/// together are in flight together.
fn slow(mut turn: Turn, ms: u64) -> Turn {
    turn.delay_ms = Some(ms);
    turn
}

/// Whether two calls were in flight at the same time at the agent.
fn overlapped(a: &CompletionRecord, b: &CompletionRecord) -> bool {
    a.timings.received_ms < b.timings.finished_ms && b.timings.received_ms < a.timings.finished_ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_sub_agents_give_separate_labelled_chains() {
    sub_agents("subagents", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_sub_agents_under_a_stripping_template_are_spliced_apart() {
    sub_agents("subagents-strip", true).await;
}

/// A main agent hands two tasks to sub-agents, which run two rounds each,
/// their calls sent together; then the main agent answers. With `strip`,
/// every turn reasons and the template drops the reasoning from history.
async fn sub_agents(session: &str, strip: bool) {
    let task = |prompt: &str| ScriptedCall {
        name: Some("task".into()),
        arguments: Some(json!({"prompt": prompt})),
        shell: None,
    };
    let think = |mut turn: Turn, why: &str| {
        turn.think = strip.then(|| why.to_owned());
        turn
    };
    let spawn = Turn {
        tool_calls: vec![task("rename parse"), task("test the lexer")],
        ..Turn::default()
    };
    // The mock's turns are per session, taken in arrival order: the two
    // sub-agents' calls of each round get the same answer whichever comes
    // first.
    let turns = vec![
        think(spawn, "two independent parts"),
        think(slow(shell("ls src"), 300), "look around"),
        think(slow(shell("ls src"), 300), "look around"),
        think(slow(text("finished"), 300), "that is all"),
        think(slow(text("finished"), 300), "that is all"),
        think(text("all done"), "both finished"),
    ];
    let (mock, agent) = start(session, turns).await;
    let convo = |system: &str, user: &str| {
        let mut c = Convo::new(system, user);
        if strip {
            c.body["polar_mock"] = json!({"strip_reasoning": "all"});
        }
        c
    };
    let mut main = convo("You are Qwen Code.", "Refactor the parser and add tests");
    main.step(&agent, session).await;
    let sub = "You are a sub-agent working on one part of a larger task.";
    let mut a = convo(sub, "Rename every parse function to parse_expr in src");
    let mut b = convo(sub, "Write unit tests covering the lexer edge cases");
    for _round in 0..2 {
        let (ra, rb) = tokio::join!(a.send(&agent, session), b.send(&agent, session));
        a.answer(&ra);
        b.answer(&rb);
    }
    main.step(&agent, session).await;
    let r = records(&agent, session, 6);
    stop(mock, agent).await;

    // Calls 1-2 and 3-4 are the sub-agents' rounds, each pair concurrent.
    assert!(overlapped(&r[1], &r[2]) && overlapped(&r[3], &r[4]));
    // Which sub-agent came first in each round depends on the race; chains
    // are numbered by first calls, the second rounds follow the tokens.
    let (first, second) = (&r[1], &r[2]);
    let follows = |x: &CompletionRecord, y: &CompletionRecord| {
        let shared = common_prefix(prompt(y), &seq(x));
        shared >= prompt(x).len()
    };
    let (first_next, second_next) = if follows(first, &r[3]) {
        (&r[3], &r[4])
    } else {
        (&r[4], &r[3])
    };
    assert!(follows(second, second_next) && !follows(second, first_next));

    let traj = build(&merging(RetryPolicy::KeepAsTrace), &r, session);
    assert_eq!(traj.traces.len(), 3, "{session}");
    let spliced: &[Label] = if strip {
        &[Label::TemplateSpliced]
    } else {
        &[]
    };
    let sub_labels: Vec<Label> = [Label::SubAgent].iter().chain(spliced).copied().collect();
    let expect = [
        (0, [&r[0], &r[5]], spliced),
        (1, [first, first_next], &sub_labels[..]),
        (2, [second, second_next], &sub_labels[..]),
    ];
    for (t, (chain, calls, labels)) in traj.traces.iter().zip(expect) {
        assert_merged(t, &calls);
        let join = &t.spans[1].join;
        assert_eq!(
            matches!(join, Join::Splice { .. }),
            strip,
            "{session}: {join:?}"
        );
        assert_eq!(
            (t.chain, t.segment, t.segment_kind),
            (ChainId(chain), 0, SegmentKind::Start)
        );
        assert_eq!(t.previous, None);
        assert_eq!(t.labels, labels, "{session}");
    }
    let mismatches = if strip { 3 } else { 0 };
    let want = ReconstructionStats {
        calls: 6,
        chains: 3,
        segments: 3,
        calls_merged: 3,
        template_mismatches_detected: mismatches,
        template_mismatches_spliced: mismatches,
        template_splices_by_shape: SpliceCounts {
            stripped_reasoning: mismatches,
            ..SpliceCounts::default()
        },
        ..ReconstructionStats::default()
    };
    assert_eq!(traj.stats, with_tokens(&traj, want), "{session}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_cut_by_max_tokens_is_kept_and_extended() {
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        cut_by_max_tokens(dialect).await;
    }
}

async fn cut_by_max_tokens(dialect: Dialect) {
    let session = &format!("cut-{}", dialect.as_str());
    let long = "The answer needs many more words than the limit allows";
    let (mock, agent) = start_with(session, vec![text(long), text("done")], dialect).await;
    let mut c = Convo::new("You are Qwen Code.", "Explain the parser");
    c.body["max_tokens"] = json!(6);
    let reply = c.step(&agent, session).await;
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
    c.body.as_object_mut().unwrap().remove("max_tokens");
    c.user("continue");
    c.step(&agent, session).await;
    let r = records(&agent, session, 2);
    stop(mock, agent).await;

    // The mock really stopped at the limit, without an end-of-turn token.
    assert_eq!(r[0].finish_reason, Some(FinishReason::Length));
    assert_eq!(response(&r[0]), &tokenizer::encode(long)[..6]);
    assert_eq!(r[1].finish_reason, Some(FinishReason::Stop));
    let traj = build(&merging(RetryPolicy::KeepAsTrace), &r, session);
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    assert_merged(t, &[&r[0], &r[1]]);
    // The end-of-turn token the template closed the cut turn with is glue.
    let glue_at = t.spans[0].response_len;
    assert_eq!(t.response_ids[glue_at], tokenizer::IM_END);
    assert_eq!(t.loss_mask[glue_at], 0);
    assert!(t.spans[0].truncated && !t.spans[1].truncated);
    assert_eq!(t.labels, [Label::Truncated]);
    assert_eq!(t.finish_reason, Some(FinishReason::Stop));
    let want = ReconstructionStats {
        calls: 2,
        chains: 1,
        segments: 1,
        calls_merged: 1,
        truncated_calls: 1,
        ..ReconstructionStats::default()
    };
    assert_eq!(traj.stats, with_tokens(&traj, want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_cut_inside_reasoning_is_spliced_under_a_stripping_template() {
    let session = "cut-strip";
    let think = Turn {
        think: Some("I need to read the parser before explaining it".into()),
        text: Some("It parses expressions.".into()),
        ..Turn::default()
    };
    let (mock, agent) = start(session, vec![think, text("done")]).await;
    let mut c = Convo::new("You are Qwen Code.", "Explain the parser");
    c.body["polar_mock"] = json!({"strip_reasoning": "all"});
    c.body["max_tokens"] = json!(5);
    c.step(&agent, session).await;
    c.body.as_object_mut().unwrap().remove("max_tokens");
    c.user("continue");
    c.step(&agent, session).await;
    let r = records(&agent, session, 2);
    stop(mock, agent).await;

    let (p0, r0, p1) = (prompt(&r[0]), response(&r[0]), prompt(&r[1]));
    assert_eq!(r[0].finish_reason, Some(FinishReason::Length));
    assert_eq!(r0.len(), 5);
    assert_eq!(r0[0], tokenizer::THINK);
    assert!(!r0.contains(&tokenizer::IM_END));
    // The history turn lost its reasoning: the prompt leaves the cut
    // response at its first token, where the re-rendered (empty) turn ends.
    let d = common_prefix(p1, &seq(&r[0]));
    assert_eq!(d, p0.len());
    assert_eq!(p1[d], tokenizer::IM_END);

    let traj = build(&merging(RetryPolicy::KeepAsTrace), &r, session);
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    assert_merged(t, &[&r[0], &r[1]]);
    // The cut response as generated, then the new prompt from the token
    // closing the turn (the cut response has none of its own), then the
    // new response.
    assert_eq!(
        t.spans[1].join,
        Join::Splice {
            diverged_at: d,
            resumed_from: d,
            shape: Some(SpliceShape::StrippedReasoning),
        }
    );
    assert!(t.spans[0].truncated);
    assert_eq!(t.labels, [Label::Truncated, Label::TemplateSpliced]);
    let want = ReconstructionStats {
        calls: 2,
        chains: 1,
        segments: 1,
        calls_merged: 1,
        template_mismatches_detected: 1,
        template_mismatches_spliced: 1,
        template_splices_by_shape: SpliceCounts {
            stripped_reasoning: 1,
            ..SpliceCounts::default()
        },
        truncated_calls: 1,
        ..ReconstructionStats::default()
    };
    assert_eq!(traj.stats, with_tokens(&traj, want));
}
