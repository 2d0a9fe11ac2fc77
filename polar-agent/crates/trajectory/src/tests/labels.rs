//! Break labels and chain starts on server-rendered sessions shaped like
//! the real CLIs' against a chat endpoint that renders with Qwen3's or
//! gpt-oss's template (Claude Code, pi, opencode): the harness resends its
//! whole history each step, moving its cache marker to the latest message,
//! and the template renders the earlier turns differently from what the
//! model generated, so no call extends the one before and, without the
//! template's ids, nothing can be spliced. Those breaks are template
//! mismatches, never compactions (no summary was asked for); opencode's
//! title call, which comes first and offers no tools, never starts the
//! main chain. A real compaction and a history the harness cut keep their
//! own labels.

use polar_chat::Tool;
use serde_json::json;

use super::kit::{Convo, Msg, Render, Sim, Turn, meta, tok};
use crate::{
    BreakReason, Builder, ChainRole, Label, PrefixMergingOptions, SegmentKind, Trajectory, build,
    check,
};

fn bash() -> Tool {
    Tool {
        name: "bash".into(),
        description: None,
        parameters: polar_json::RawJson::from_value(&json!({"type": "object"})),
    }
}

/// Without the template's ids, as on the server-rendered path.
fn run(sim: &Sim) -> Trajectory {
    let builder = Builder::PrefixMerging(PrefixMergingOptions::default());
    let traj = build(&builder, &sim.records, &meta());
    if let Err(e) = check(&traj, &sim.records) {
        panic!("invariant broken: {e}\n{traj:#?}");
    }
    traj
}

/// Call `i` offers tools and carries the harness's cache marker on its
/// latest message (an Anthropic `cache_control` kept in `extra`; the
/// harness moves it to the newest message on the next request).
fn as_harness_sends(sim: &mut Sim, i: usize) {
    let req = &mut sim.records[i].request;
    req.tools = vec![bash()];
    if let Some(last) = req.messages.last_mut() {
        last.extra
            .insert("cache_control".into(), json!({"type": "ephemeral"}));
    }
}

const TASK: &str = "append the line polar 2 to notes and run the check";

/// The four-step task as a harness runs it: each step a reply with
/// reasoning the template strips from history (the re-rendered turn no
/// longer matches the generated one), then a tool result. With `title`, a
/// title call (no tools) comes first, as opencode's does. Returns the
/// title call, the main calls and the main conversation.
fn steps(title: bool) -> (Sim, Option<usize>, Vec<usize>, Convo) {
    let mut sim = Sim::new(Render {
        strip_reasoning: true,
        ..Render::default()
    });
    let title = title.then(|| {
        let mut t = Convo::new("you write a short title for the conversation", TASK);
        t.step(&mut sim, Turn::new("", "notes and check"))
    });
    let mut main = Convo::new("you are a coding agent with a bash tool", TASK);
    let mut calls = Vec::new();
    for step in [
        "creating the notes call bash echo polar 1 into notes",
        "running the check call bash grep polar 2 in notes",
        "the check failed adding the line call bash echo polar 2",
        "running the check again call bash grep and write pass",
        "done",
    ] {
        let i = main.step(
            &mut sim,
            Turn::new(
                "the user wants the check to pass so the next command is",
                step,
            ),
        );
        as_harness_sends(&mut sim, i);
        main.tool("no output");
        calls.push(i);
    }
    (sim, title, calls, main)
}

fn call_id(i: usize) -> String {
    format!("c{i}")
}

#[test]
fn a_re_rendered_history_breaks_as_a_template_mismatch_not_a_compaction() {
    let (sim, _, main, _) = steps(false);
    let traj = run(&sim);
    assert_eq!(traj.traces.len(), main.len(), "{traj:#?}");
    for (k, t) in traj.traces.iter().enumerate() {
        assert_eq!(t.call_ids, [call_id(main[k])]);
        assert_eq!(t.role, ChainRole::Main);
        assert_eq!((t.chain.0, t.segment), (0, k as u32));
        assert!(!t.labels.contains(&Label::CompactionSummary), "{t:#?}");
        let want = if k == 0 {
            SegmentKind::Start
        } else {
            SegmentKind::AfterBreak {
                reason: BreakReason::TemplateMismatch,
            }
        };
        assert_eq!(t.segment_kind, want, "segment {k}");
        if k > 0 {
            // Each segment left the one before it, where the re-rendered
            // turn began.
            let link = t.previous.expect("a break is linked");
            assert_eq!((link.chain.0, link.segment), (0, k as u32 - 1));
        }
    }
    assert_eq!(traj.stats.breaks, main.len() - 1);
    assert_eq!(traj.stats.template_mismatches_detected, main.len() - 1);
}

#[test]
fn a_title_call_that_comes_first_never_starts_the_main_chain() {
    let (sim, title, main, _) = steps(true);
    let title = title.expect("a title call");
    let traj = run(&sim);
    let of = |i: usize| {
        traj.traces
            .iter()
            .find(|t| t.call_ids.contains(&call_id(i)))
            .expect("every call is in a trace")
    };
    let t = of(title);
    assert_eq!(t.role, ChainRole::Side);
    assert_eq!(t.segment_kind, SegmentKind::Start);
    assert_eq!(t.labels, [Label::Side]);
    let first = of(main[0]);
    assert_eq!(first.role, ChainRole::Main);
    assert_eq!((first.segment, first.segment_kind), (0, SegmentKind::Start));
    assert_ne!(first.chain, t.chain);
    assert_eq!(first.previous, None);
    for &i in &main[1..] {
        let m = of(i);
        assert_eq!((m.role, m.chain), (ChainRole::Main, first.chain));
        assert_eq!(
            m.segment_kind,
            SegmentKind::AfterBreak {
                reason: BreakReason::TemplateMismatch
            }
        );
    }
    // No trace of the session is labelled a compaction's.
    assert!(
        traj.traces
            .iter()
            .all(|t| !t.labels.contains(&Label::CompactionSummary)),
        "{traj:#?}"
    );
}

#[test]
fn a_history_cut_without_a_summary_is_rewritten_not_compacted() {
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", TASK);
    c.step(&mut sim, Turn::new("", "call bash cat a long file"));
    c.tool("line one line two line three line four line five line six");
    let b = c.step(&mut sim, Turn::new("", "call bash echo polar 2 into notes"));
    c.tool("no output");
    // The harness drops the first exchange to save context: a shorter
    // prompt of the same conversation, with no summary call.
    c.msgs.drain(2..4);
    let d = c.step(&mut sim, Turn::new("", "done"));
    assert!(sim.prompt(d).len() < sim.prompt(b).len() + sim.response(b).len());
    let traj = run(&sim);
    assert_eq!(traj.traces.len(), 2, "{traj:#?}");
    assert_eq!(traj.traces[1].call_ids, [call_id(d)]);
    assert_eq!(
        traj.traces[1].segment_kind,
        SegmentKind::AfterBreak {
            reason: BreakReason::RewrittenHistory
        }
    );
}

#[test]
fn a_summary_the_harness_asked_for_is_still_a_compaction() {
    let (mut sim, _, main, convo) = steps(false);
    // The harness asks for a summary of the whole history (no tools), then
    // starts afresh from it.
    let mut ask = convo;
    ask.msgs
        .push(Msg::User(tok("summarize the conversation so far")));
    let summary = "the notes hold polar 1 and polar 2 and the check passes so the task is done";
    let s = ask.step(&mut sim, Turn::new("", summary));
    let mut after = Convo::new("you are a coding agent with a bash tool", summary);
    let a = after.step(&mut sim, Turn::new("", "done"));
    as_harness_sends(&mut sim, a);
    let traj = run(&sim);
    let of = |i: usize| {
        traj.traces
            .iter()
            .find(|t| t.call_ids.contains(&call_id(i)))
            .expect("every call is in a trace")
    };
    assert_eq!(of(s).segment_kind, SegmentKind::CompactionSummary);
    assert!(of(s).labels.contains(&Label::CompactionSummary));
    assert_eq!(
        of(a).segment_kind,
        SegmentKind::AfterBreak {
            reason: BreakReason::Compaction
        }
    );
    assert_eq!(of(a).chain, of(main[0]).chain);
    assert_eq!(of(a).role, ChainRole::Main);
}
