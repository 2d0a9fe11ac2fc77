//! Compaction and retries judged by what the harness did next: a call
//! whose reply a later request holds is never a superseded retry, and a
//! compaction's summary call (the harness's own, or the one Polar made for
//! a server-side compaction) is its own labelled segment.

use serde_json::json;

use super::kit::{Convo, Msg, Render, Sim, Turn, meta, tok};
use crate::{
    BreakReason, Builder, ChainId, Label, PrefixMergingOptions, SegmentKind, SegmentLink,
    Trajectory, build, check,
};
use polar_chat::{Api, Role, ToolCall};

fn run(sim: &Sim) -> Trajectory {
    let traj = build(
        &Builder::PrefixMerging(PrefixMergingOptions::default()),
        &sim.records,
        &meta(),
    );
    if let Err(e) = check(&traj, &sim.records) {
        panic!("invariant broken: {e}\n{traj:#?}");
    }
    traj
}

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "Bash".into(),
        arguments: "{}".into(),
    }
}

/// Gives call `i`'s reply the tool call `id`.
fn reply_calls(sim: &mut Sim, i: usize, id: &str) {
    if let Some(r) = sim.records[i].response.as_mut() {
        r.message.tool_calls = vec![call(id)];
    }
}

/// Makes the `n`th message of call `i`'s request carry the tool call `id`
/// (an assistant turn) or answer it (a tool result).
fn history_holds(sim: &mut Sim, i: usize, n: usize, id: &str) {
    let m = &mut sim.records[i].request.messages[n];
    match m.role {
        Role::Assistant => m.tool_calls = vec![call(id)],
        _ => m.tool_call_id = Some(id.into()),
    }
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Claude Code compacting before step 3: its summary request re-serializes
/// step 2's turn, so it extends step 1 like step 2 does. Step 2 was served
/// once and its tool call ran: it continues the trace, and the summary call
/// is a labelled segment of its own.
#[test]
fn the_step_before_a_summary_request_is_not_a_retry() {
    let mut sim = Sim::new(Render::default());
    let system = "you are a coding agent";
    let mut c = Convo::new(system, "make the tests pass");
    let step1 = c.step(&mut sim, Turn::new("", "call write notes"));
    reply_calls(&mut sim, step1, "toolu_1");
    c.tool("written");
    let step2 = c.step(&mut sim, Turn::new("", "call run the check"));
    reply_calls(&mut sim, step2, "toolu_2");
    // The summary request: the history up to step 1 as before, then step
    // 1's result and step 2's turn rendered anew, then the instructions.
    let mut ask = c.msgs[..3].to_vec();
    ask.push(Msg::Tool(tok("written (output kept short)")));
    ask.push(Msg::Assistant(Turn::new("", "call run the check again")));
    ask.push(Msg::Tool(tok("exit 1 one test fails")));
    ask.push(Msg::User(tok("summarize the conversation so far")));
    let summary = "summary notes are written and the check fails on one test which needs the edit to the notes file next";
    let s = sim.call(&ask, &Turn::new("", summary));
    history_holds(&mut sim, s, 3, "toolu_1");
    history_holds(&mut sim, s, 4, "toolu_2");
    history_holds(&mut sim, s, 5, "toolu_2");
    let seq1 = [sim.prompt(step1), sim.response(step1)].concat();
    assert!(sim.prompt(s).starts_with(&seq1));
    assert!(lcp(sim.prompt(s), sim.prompt(step2)) < sim.prompt(step2).len());
    // The new conversation starts from the summary.
    let mut context = tok("this session continues an earlier one");
    context.extend(tok(summary));
    c.msgs = vec![Msg::System(tok(system)), Msg::User(context)];
    let step3 = c.step(&mut sim, Turn::new("", "call edit notes"));
    c.tool("edited");
    let done = c.step(&mut sim, Turn::new("", "done"));

    let traj = run(&sim);
    let id = |i: usize| sim.records[i].call_id.clone();
    let kinds: Vec<_> = traj
        .traces
        .iter()
        .map(|t| (t.call_ids.clone(), t.segment_kind, t.labels.clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            (vec![id(step1), id(step2)], SegmentKind::Start, vec![]),
            (
                vec![id(s)],
                SegmentKind::CompactionSummary,
                vec![Label::CompactionSummary]
            ),
            (
                vec![id(step3), id(done)],
                SegmentKind::AfterBreak {
                    reason: BreakReason::Compaction
                },
                vec![]
            ),
        ]
    );
    assert_eq!(
        traj.traces[1].previous,
        Some(SegmentLink {
            chain: ChainId(0),
            segment: 0,
            common_prefix_len: seq1.len(),
        })
    );
    assert_eq!(traj.traces[2].previous.map(|l| l.segment), Some(1));
    assert!(traj.traces.iter().all(|t| t.chain == ChainId(0)));
    assert_eq!(traj.stats.retries_superseded, 0);
    assert_eq!(traj.stats.breaks, 1);
}

/// The same, but the session ends right after the summary request: there
/// is no later conversation to tell it is a summary, yet it holds step 2's
/// reply, so neither is a retry: step 2 continues the trace, the request
/// after it forks.
#[test]
fn a_sibling_holding_the_others_reply_is_a_later_request_not_a_retry() {
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", "make the tests pass");
    let step1 = c.step(&mut sim, Turn::new("", "call write notes"));
    reply_calls(&mut sim, step1, "toolu_1");
    c.tool("written");
    let step2 = c.step(&mut sim, Turn::new("", "call run the check"));
    reply_calls(&mut sim, step2, "toolu_2");
    let mut ask = c.msgs[..3].to_vec();
    ask.push(Msg::Tool(tok("written (output kept short)")));
    ask.push(Msg::Assistant(Turn::new("", "call run the check again")));
    ask.push(Msg::User(tok("summarize the conversation so far")));
    let later = sim.call(&ask, &Turn::new("", "a short summary"));
    history_holds(&mut sim, later, 4, "toolu_2");

    let traj = run(&sim);
    let id = |i: usize| sim.records[i].call_id.clone();
    assert_eq!(traj.traces.len(), 2);
    let main = &traj.traces[0];
    assert_eq!(main.call_ids, [id(step1), id(step2)]);
    assert!(main.labels.is_empty());
    let other = &traj.traces[1];
    assert_eq!(other.call_ids, [id(later)]);
    assert!(other.has_label(Label::Forked), "{:?}", other.labels);
    assert!(!other.has_label(Label::SupersededRetry));
    assert_eq!(traj.stats.retries_superseded, 0);
    assert_eq!(traj.stats.forks, 1);
}

/// A true retry (the first reply is discarded: nothing later holds it) is
/// still one, even when the kept reply was never extended either.
#[test]
fn a_reply_nothing_later_holds_is_still_a_retry() {
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", "make the tests pass");
    let step1 = c.step(&mut sim, Turn::new("", "call write notes"));
    reply_calls(&mut sim, step1, "toolu_1");
    c.tool("written");
    let lost = sim.call(&c.msgs, &Turn::new("", "call run the"));
    reply_calls(&mut sim, lost, "toolu_2");
    let kept = c.step(&mut sim, Turn::new("", "call run the check"));
    reply_calls(&mut sim, kept, "toolu_3");
    c.tool("exit 1");
    let after = sim.call(&c.msgs, &Turn::new("", "done"));
    history_holds(&mut sim, after, 4, "toolu_3");

    let traj = run(&sim);
    let id = |i: usize| sim.records[i].call_id.clone();
    assert_eq!(traj.traces[0].call_ids, [id(step1), id(kept), id(after)]);
    assert_eq!(traj.traces[1].call_ids, [id(lost)]);
    assert_eq!(traj.traces[1].segment_kind, SegmentKind::SupersededRetry);
    assert_eq!(traj.stats.retries_superseded, 1);
}

/// Codex's server-side compaction: the summary Polar asked the backend for
/// (its request ends with a `compaction_trigger` item) extends the
/// conversation exactly, yet is its own segment, labelled; the conversation
/// rebuilt around the summary continues after a compaction break.
#[test]
fn a_server_side_compaction_summary_is_its_own_labelled_segment() {
    let mut sim = Sim::new(Render::default());
    let system = "you are codex";
    let mut c = Convo::new(system, "make the tests pass");
    let step1 = c.step(&mut sim, Turn::new("", "call write notes"));
    c.tool("written");
    let step2 = c.step(&mut sim, Turn::new("", "call run the check"));
    c.tool("exit 1");
    let mut ask = c.msgs.clone();
    ask.push(Msg::User(tok("write a handoff summary for another model")));
    let summary = "handoff summary notes written the check fails so edit the notes file then run the check again";
    let s = sim.call(&ask, &Turn::new("", summary));
    let native = &mut sim.records[s].native_request;
    native.api = Api::OpenaiResponses;
    native.path = "/v1/responses".into();
    native.body = polar_json::RawJson::from_value(&json!({
        "model": "gpt-5",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "make the tests pass"}]},
                  {"type": "compaction_trigger"}],
    }));
    // Codex keeps the user's messages and puts the summary after them.
    c.msgs = vec![
        Msg::System(tok(system)),
        Msg::User(tok("make the tests pass")),
        Msg::User(tok(summary)),
    ];
    let step3 = c.step(&mut sim, Turn::new("", "call edit notes"));

    let traj = run(&sim);
    let id = |i: usize| sim.records[i].call_id.clone();
    let kinds: Vec<_> = traj
        .traces
        .iter()
        .map(|t| (t.call_ids.clone(), t.segment_kind, t.labels.clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            (vec![id(step1), id(step2)], SegmentKind::Start, vec![]),
            (
                vec![id(s)],
                SegmentKind::CompactionSummary,
                vec![Label::CompactionSummary]
            ),
            (
                vec![id(step3)],
                SegmentKind::AfterBreak {
                    reason: BreakReason::Compaction
                },
                vec![]
            ),
        ]
    );
    assert_eq!(traj.traces[2].previous.map(|l| l.segment), Some(1));
    assert_eq!(traj.stats.retries_superseded, 0);
}
