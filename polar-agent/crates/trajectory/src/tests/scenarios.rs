//! One test per situation a real session produces, each asserting the exact
//! traces (ids, masks, logprobs, joins, labels, links) and statistics.

use super::kit::{
    ASSISTANT, Convo, END_THINK, END_TOOL_RESP, Expect, GLUE, IM_END, IM_START, Msg, NL, Render,
    Sim, TOOL_RESP, Turn, USER, meta, template, tok,
};
use crate::{
    BreakReason, Builder, ChainId, DropReason, DroppedCall, Join, Label, PrefixMergingOptions,
    ReconstructionStats, RetryPolicy, SegmentKind, SegmentLink, SpliceCounts, SpliceShape, Trace,
    Trajectory, build, check,
};

fn merging(template: bool) -> Builder {
    Builder::PrefixMerging(PrefixMergingOptions {
        template: template.then(super::kit::template),
        ..PrefixMergingOptions::default()
    })
}

fn run(builder: &Builder, sim: &Sim) -> Trajectory {
    let traj = build(builder, &sim.records, &meta());
    if let Err(e) = check(&traj, &sim.records) {
        panic!("invariant broken: {e}\n{traj:#?}");
    }
    traj
}

fn seq_len(sim: &Sim, i: usize) -> usize {
    sim.prompt(i).len() + sim.response(i).len()
}

fn assert_content(trace: &Trace, prompt: &[u32], want: &Expect) {
    assert_eq!(trace.prompt_ids, prompt, "prompt_ids");
    assert_eq!(trace.response_ids, want.ids, "response_ids");
    assert_eq!(trace.loss_mask, want.mask, "loss_mask");
    assert_eq!(
        trace.response_logprobs.as_deref(),
        Some(&want.logprobs[..]),
        "logprobs"
    );
}

fn joins(trace: &Trace) -> Vec<Join> {
    trace.spans.iter().map(|s| s.join).collect()
}

/// Statistics with the token totals of `traj`'s traces.
fn stats(traj: &Trajectory, base: ReconstructionStats) -> ReconstructionStats {
    ReconstructionStats {
        prompt_tokens: traj.traces.iter().map(|t| t.prompt_ids.len()).sum(),
        response_tokens: traj.traces.iter().map(|t| t.response_ids.len()).sum(),
        loss_tokens: traj.traces.iter().map(Trace::loss_tokens).sum(),
        ..base
    }
}

#[test]
fn plain_multi_turn_tool_use_is_one_trace() {
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", "fix the failing test");
    let a = c.step(
        &mut sim,
        Turn::new("look at the tests first", "call read_file tests"),
    );
    c.tool("test output shows an off by one error");
    let b = c.step(
        &mut sim,
        Turn::new("the loop bound is wrong", "call edit_file src"),
    );
    c.tool("edit applied");
    let d = c.step(&mut sim, Turn::new("", "done the test passes"));

    let traj = run(&merging(false), &sim);
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    let glue_ab = &sim.prompt(b)[seq_len(&sim, a)..];
    let mut tool_turn = vec![NL, IM_START, USER, NL, TOOL_RESP];
    tool_turn.extend(tok("test output shows an off by one error"));
    tool_turn.extend([END_TOOL_RESP, IM_END, NL, IM_START, ASSISTANT, NL]);
    assert_eq!(
        glue_ab, tool_turn,
        "glue is the tool turn and the generation prompt"
    );
    let want = Expect::default()
        .generated(&sim, a)
        .glue(glue_ab)
        .generated(&sim, b)
        .glue(&sim.prompt(d)[seq_len(&sim, b)..])
        .generated(&sim, d);
    assert_content(t, sim.prompt(a), &want);
    assert_eq!(t.call_ids, ["c0", "c1", "c2"]);
    assert_eq!(joins(t), [Join::First, Join::Extend, Join::Extend]);
    assert_eq!(
        (t.chain, t.segment, t.segment_kind),
        (ChainId(0), 0, SegmentKind::Start)
    );
    assert_eq!(t.previous, None);
    assert!(t.labels.is_empty());
    assert_eq!(t.metadata.policy_versions, ["v1"]);
    assert_eq!(
        traj.stats,
        stats(
            &traj,
            ReconstructionStats {
                calls: 3,
                chains: 1,
                segments: 1,
                calls_merged: 2,
                ..ReconstructionStats::default()
            }
        )
    );

    let per = run(&Builder::PerRequest, &sim);
    assert_eq!(per.traces.len(), 3);
    for (t, i) in per.traces.iter().zip([a, b, d]) {
        let want = Expect::default().generated(&sim, i);
        assert_content(t, sim.prompt(i), &want);
    }
    assert_eq!(per.stats.loss_tokens, traj.stats.loss_tokens);
    assert!(per.stats.total_tokens() > traj.stats.total_tokens());
}

/// A conversation where the second call was retried with the same prompt;
/// `same_reply` makes the retry answer identically (greedy decoding).
fn retried(same_reply: bool) -> (Sim, [usize; 4]) {
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", "list the files");
    let a = c.step(&mut sim, Turn::new("start", "call ls"));
    c.tool("a.rs b.rs");
    let first = Turn::new("read one", "call cat a.rs");
    let b1 = sim.call(&c.msgs, &first);
    let second = if same_reply {
        first
    } else {
        Turn::new("read the other", "call cat b.rs")
    };
    let b2 = c.step(&mut sim, second);
    c.tool("fn main");
    let d = c.step(&mut sim, Turn::new("", "done"));
    (sim, [a, b1, b2, d])
}

#[test]
fn identical_retry_keeps_the_call_later_calls_extend() {
    let (sim, [a, b1, b2, d]) = retried(false);
    let traj = run(&merging(false), &sim);
    assert_eq!(traj.traces.len(), 2);
    let (main, retry) = (&traj.traces[0], &traj.traces[1]);
    let want = Expect::default()
        .generated(&sim, a)
        .glue(&sim.prompt(b2)[seq_len(&sim, a)..])
        .generated(&sim, b2)
        .glue(&sim.prompt(d)[seq_len(&sim, b2)..])
        .generated(&sim, d);
    assert_content(main, sim.prompt(a), &want);
    assert_eq!(main.call_ids, ["c0", "c2", "c3"]);
    assert!(main.labels.is_empty());
    assert_content(
        retry,
        sim.prompt(b1),
        &Expect::default().generated(&sim, b1),
    );
    assert_eq!(retry.call_ids, ["c1"]);
    assert_eq!((retry.chain, retry.segment), (ChainId(0), 1));
    assert_eq!(retry.segment_kind, SegmentKind::SupersededRetry);
    assert_eq!(retry.labels, [Label::SupersededRetry]);
    assert_eq!(
        retry.previous,
        Some(SegmentLink {
            chain: ChainId(0),
            segment: 0,
            common_prefix_len: seq_len(&sim, a),
        })
    );
    assert_eq!(
        traj.stats,
        stats(
            &traj,
            ReconstructionStats {
                calls: 4,
                chains: 1,
                segments: 2,
                calls_merged: 2,
                retries_superseded: 1,
                ..ReconstructionStats::default()
            }
        )
    );

    // Dropping superseded retries instead: counted and listed.
    let drop = Builder::PrefixMerging(PrefixMergingOptions {
        retries: RetryPolicy::Drop,
        ..PrefixMergingOptions::default()
    });
    let traj = run(&drop, &sim);
    assert_eq!(traj.traces.len(), 1);
    assert_content(&traj.traces[0], sim.prompt(a), &want);
    assert_eq!(
        traj.stats.calls_dropped,
        [DroppedCall {
            call_id: "c1".into(),
            reason: DropReason::SupersededRetry
        }]
    );
    assert_eq!(traj.stats.retries_superseded, 1);
}

#[test]
fn identical_retry_with_identical_reply_keeps_the_first() {
    let (sim, [a, b1, b2, d]) = retried(true);
    let traj = run(&merging(false), &sim);
    assert_eq!(traj.traces.len(), 2);
    assert_eq!(traj.traces[0].call_ids, ["c0", "c1", "c3"]);
    assert_eq!(traj.traces[1].call_ids, ["c2"]);
    assert_eq!(traj.traces[1].segment_kind, SegmentKind::SupersededRetry);
    let want = Expect::default()
        .generated(&sim, a)
        .glue(&sim.prompt(b1)[seq_len(&sim, a)..])
        .generated(&sim, b1)
        .glue(&sim.prompt(d)[seq_len(&sim, b1)..])
        .generated(&sim, d);
    assert_content(&traj.traces[0], sim.prompt(a), &want);
    assert_content(
        &traj.traces[1],
        sim.prompt(b2),
        &Expect::default().generated(&sim, b2),
    );
}

#[test]
fn retry_with_a_new_tool_result_extending_the_same_call() {
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", "run the tests");
    let a = c.step(&mut sim, Turn::new("", "call run_tests"));
    c.tool("timeout");
    let b1 = sim.call(&c.msgs, &Turn::new("", "call run_tests again"));
    c.msgs.pop();
    c.tool("3 passed");
    let b2 = c.step(&mut sim, Turn::new("", "all good"));
    let traj = run(&merging(false), &sim);
    assert_eq!(traj.traces.len(), 2);
    assert_eq!(traj.traces[0].call_ids, ["c0", "c2"]);
    assert_eq!(traj.traces[1].call_ids, ["c1"]);
    assert_eq!(traj.traces[1].labels, [Label::SupersededRetry]);
    assert_eq!(traj.stats.retries_superseded, 1);
    let _ = (a, b1, b2);
}

#[test]
fn compaction_by_summary_starts_a_linked_segment() {
    let mut sim = Sim::new(Render::default());
    let system = "you are a coding agent";
    let mut c = Convo::new(system, "port the parser to the new api");
    let a = c.step(&mut sim, Turn::new("plan", "call grep parser"));
    c.tool("parser.rs lexer.rs");
    let b = c.step(&mut sim, Turn::new("", "call read parser.rs"));
    c.tool("fn parse with the old api everywhere");
    let summary = "summary the parser uses the old api in parse and lex and the lexer is already ported so only parse remains";
    let mut ask = c.msgs.clone();
    ask.push(Msg::User(tok("summarize the conversation so far")));
    let s = sim.call(&ask, &Turn::new("", summary));
    let mut context = tok("this session continues an earlier one");
    context.extend(tok(summary));
    c.msgs = vec![Msg::System(tok(system)), Msg::User(context)];
    let d = c.step(&mut sim, Turn::new("", "call edit parse"));
    c.tool("edited");
    let e = c.step(&mut sim, Turn::new("", "done"));

    let traj = run(&merging(false), &sim);
    assert_eq!(traj.traces.len(), 3);
    let (before, summarized, after) = (&traj.traces[0], &traj.traces[1], &traj.traces[2]);
    assert_eq!(before.call_ids, ["c0", "c1"]);
    let want = Expect::default()
        .generated(&sim, a)
        .glue(&sim.prompt(b)[seq_len(&sim, a)..])
        .generated(&sim, b);
    assert_content(before, sim.prompt(a), &want);
    // The summary call is its own segment, branching from the trace it
    // summarized, never merged into it.
    assert_eq!(summarized.call_ids, ["c2"]);
    assert_content(
        summarized,
        sim.prompt(s),
        &Expect::default().generated(&sim, s),
    );
    assert_eq!(summarized.segment_kind, SegmentKind::CompactionSummary);
    assert_eq!(summarized.labels, [Label::CompactionSummary]);
    assert_eq!(
        summarized.previous,
        Some(SegmentLink {
            chain: ChainId(0),
            segment: 0,
            common_prefix_len: seq_len(&sim, b),
        })
    );
    assert_eq!((summarized.chain, summarized.segment), (ChainId(0), 1));
    assert_eq!(after.call_ids, ["c3", "c4"]);
    let want = Expect::default()
        .generated(&sim, d)
        .glue(&sim.prompt(e)[seq_len(&sim, d)..])
        .generated(&sim, e);
    assert_content(after, sim.prompt(d), &want);
    assert_eq!(
        after.segment_kind,
        SegmentKind::AfterBreak {
            reason: BreakReason::Compaction
        }
    );
    let lcp = sim
        .prompt(d)
        .iter()
        .zip(sim.prompt(s))
        .take_while(|(x, y)| x == y)
        .count();
    assert_eq!(
        lcp,
        tok(system).len() + 8,
        "system turn and the user header"
    );
    assert_eq!(
        after.previous,
        Some(SegmentLink {
            chain: ChainId(0),
            segment: 1,
            common_prefix_len: lcp,
        })
    );
    assert_eq!((after.chain, after.segment), (ChainId(0), 2));
    assert!(after.labels.is_empty());
    assert_eq!(
        traj.stats,
        stats(
            &traj,
            ReconstructionStats {
                calls: 5,
                chains: 1,
                segments: 3,
                calls_merged: 2,
                breaks: 1,
                ..ReconstructionStats::default()
            }
        )
    );
}

#[test]
fn rewritten_history_starts_a_linked_segment() {
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", "update the changelog");
    c.step(&mut sim, Turn::new("", "call read changelog"));
    c.tool("old entries");
    let b = c.step(&mut sim, Turn::new("", "call write changelog"));
    // The harness rewrites the first tool result (e.g. clears stale output
    // with a longer notice) and goes on.
    c.msgs[3] = Msg::Tool(tok(
        "output cleared to save context it was a long listing of old entries",
    ));
    c.tool("written");
    let d = c.step(&mut sim, Turn::new("", "done"));
    let traj = run(&merging(false), &sim);
    assert_eq!(traj.traces.len(), 2);
    assert_eq!(traj.traces[0].call_ids, ["c0", "c1"]);
    assert_eq!(traj.traces[1].call_ids, ["c2"]);
    assert_eq!(
        traj.traces[1].segment_kind,
        SegmentKind::AfterBreak {
            reason: BreakReason::RewrittenHistory
        }
    );
    let lcp = sim
        .prompt(d)
        .iter()
        .zip(sim.prompt(b))
        .take_while(|(x, y)| x == y)
        .count();
    assert_eq!(
        traj.traces[1].previous.map(|l| l.common_prefix_len),
        Some(lcp)
    );
    assert_eq!(traj.stats.breaks, 1);
}

#[test]
fn parallel_sub_agents_form_separate_chains() {
    let mut sim = Sim::new(Render::default());
    let mut main = Convo::new(
        "you are the main agent",
        "refactor the parser and add tests",
    );
    let m0 = main.step(
        &mut sim,
        Turn::new("split the work", "call task rename; call task tests"),
    );
    let sub = "you are a sub agent working on one part of a larger task";
    let mut sa = Convo::new(sub, "rename every parse function to parse_expr in src");
    let mut sb = Convo::new(sub, "write unit tests covering the lexer edge cases");
    let a0 = sa.step(&mut sim, Turn::new("", "call grep parse"));
    let b0 = sb.step(&mut sim, Turn::new("", "call read lexer"));
    sa.tool("three hits");
    sb.tool("fn lex");
    let a1 = sa.step(&mut sim, Turn::new("", "renamed"));
    let b1 = sb.step(&mut sim, Turn::new("", "tests written"));
    main.tool("renamed");
    main.tool("tests written");
    let m1 = main.step(&mut sim, Turn::new("", "all done"));

    for template in [false, true] {
        let traj = run(&merging(template), &sim);
        assert_eq!(traj.traces.len(), 3);
        for (t, (chain, [x, y], labels)) in traj.traces.iter().zip([
            (0, [m0, m1], &[][..]),
            (1, [a0, a1], &[Label::SubAgent][..]),
            (2, [b0, b1], &[Label::SubAgent][..]),
        ]) {
            let want = Expect::default()
                .generated(&sim, x)
                .glue(&sim.prompt(y)[seq_len(&sim, x)..])
                .generated(&sim, y);
            assert_content(t, sim.prompt(x), &want);
            assert_eq!(
                (t.chain, t.segment, t.segment_kind),
                (ChainId(chain), 0, SegmentKind::Start)
            );
            assert_eq!(t.previous, None);
            assert_eq!(t.labels, labels);
        }
        assert_eq!(
            traj.stats,
            stats(
                &traj,
                ReconstructionStats {
                    calls: 6,
                    chains: 3,
                    segments: 3,
                    calls_merged: 3,
                    ..ReconstructionStats::default()
                }
            )
        );
    }
}

#[test]
fn sequential_sub_agents_of_one_kind_are_separate_chains() {
    let mut sim = Sim::new(Render::default());
    let mut main = Convo::new("you are the main agent", "two independent fixes");
    main.step(&mut sim, Turn::new("", "call task one"));
    let sub = "you are a sub agent working on one part of a larger task";
    let mut s1 = Convo::new(sub, "fix the flaky network test");
    s1.step(&mut sim, Turn::new("", "call run"));
    s1.tool("ok");
    s1.step(&mut sim, Turn::new("", "fixed"));
    main.tool("fixed");
    main.step(&mut sim, Turn::new("", "call task two"));
    let mut s2 = Convo::new(sub, "update the readme badges");
    s2.step(&mut sim, Turn::new("", "call edit"));
    let traj = run(&merging(false), &sim);
    let chains: Vec<_> = traj
        .traces
        .iter()
        .map(|t| (t.chain.0, t.call_ids.clone()))
        .collect();
    assert_eq!(
        chains,
        [
            (0, vec!["c0".to_owned(), "c3".to_owned()]),
            (1, vec!["c1".to_owned(), "c2".to_owned()]),
            (2, vec!["c4".to_owned()]),
        ]
    );
    assert!(
        traj.traces
            .iter()
            .all(|t| t.segment_kind == SegmentKind::Start)
    );
    assert_eq!(traj.stats.breaks, 0);
}

#[test]
fn forked_sub_agent_is_its_own_chain() {
    let mut sim = Sim::new(Render::default());
    let mut main = Convo::new("you are the main agent", "investigate the crash");
    let m0 = main.step(&mut sim, Turn::new("", "call fork investigate"));
    // The fork inherits the whole context plus its own instruction.
    let mut fork = main.clone();
    fork.msgs
        .push(Msg::User(tok("you are a fork: find the root cause")));
    let f0 = fork.step(&mut sim, Turn::new("", "call read log"));
    fork.tool("panic at line 3");
    let f1 = fork.step(&mut sim, Turn::new("", "root cause found"));
    main.tool("root cause found");
    let m1 = main.step(&mut sim, Turn::new("", "call fix"));
    main.tool("fixed");
    let m2 = main.step(&mut sim, Turn::new("", "done"));
    let traj = run(&merging(false), &sim);
    assert_eq!(traj.traces.len(), 2);
    let (t0, t1) = (&traj.traces[0], &traj.traces[1]);
    assert_eq!(t0.call_ids, ["c0", "c3", "c4"]);
    assert!(t0.labels.is_empty());
    assert_eq!(t1.call_ids, ["c1", "c2"]);
    assert_eq!(
        (t1.chain, t1.segment_kind),
        (ChainId(1), SegmentKind::Start)
    );
    assert_eq!(t1.labels, [Label::SubAgent, Label::Forked]);
    assert_eq!(
        t1.previous,
        Some(SegmentLink {
            chain: ChainId(0),
            segment: 0,
            common_prefix_len: seq_len(&sim, m0),
        })
    );
    let want = Expect::default()
        .generated(&sim, f0)
        .glue(&sim.prompt(f1)[seq_len(&sim, f0)..])
        .generated(&sim, f1);
    assert_content(t1, sim.prompt(f0), &want);
    assert_eq!(traj.stats.forks, 1);
    assert_eq!(traj.stats.chains, 2);
    let _ = (m1, m2);
}

/// Three turns with reasoning under `render`.
fn reasoning_session(render: Render) -> (Sim, [usize; 3]) {
    let mut sim = Sim::new(render);
    let mut c = Convo::new("you are a coding agent", "find the bug");
    let reasoning = |r: &str| {
        if render.generation_glue {
            String::new()
        } else {
            r.to_owned()
        }
    };
    let a = c.step(
        &mut sim,
        Turn::new(&reasoning("where could it be"), "call grep bug"),
    );
    c.tool("src/lib.rs line 9");
    let b = c.step(
        &mut sim,
        Turn::new(&reasoning("line 9 then"), "call read src/lib.rs"),
    );
    c.tool("let x = y / 0");
    let d = c.step(
        &mut sim,
        Turn::new(&reasoning("division by zero"), "found it"),
    );
    (sim, [a, b, d])
}

/// Index of the first IM_END in `prompt` at or after `from`.
fn eot_after(prompt: &[u32], from: usize) -> usize {
    from + prompt[from..]
        .iter()
        .position(|&t| t == IM_END)
        .unwrap_or(usize::MAX - from)
}

fn assert_spliced(sim: &Sim, [a, b, d]: [usize; 3], glue_len: usize) {
    let traj = run(&merging(true), sim);
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    let mut want = Expect::default().generated(sim, a);
    let mut want_joins = vec![Join::First];
    let mut want_off_policy = vec![0];
    let (shape, shapes) = if glue_len > 0 {
        (
            SpliceShape::GenerationGlue,
            SpliceCounts {
                generation_glue: 2,
                ..SpliceCounts::default()
            },
        )
    } else {
        (
            SpliceShape::StrippedReasoning,
            SpliceCounts {
                stripped_reasoning: 2,
                ..SpliceCounts::default()
            },
        )
    };
    for (prev, cur) in [(a, b), (b, d)] {
        let diverged_at = sim.prompt(prev).len() - glue_len;
        // The new prompt re-renders the previous turn up to its IM_END.
        let k = eot_after(sim.prompt(cur), diverged_at);
        want = want.glue(&sim.prompt(cur)[k + 1..]).generated(sim, cur);
        want_joins.push(Join::Splice {
            diverged_at,
            resumed_from: k + 1,
            shape: Some(shape),
        });
        // What the model saw differently: the glue its generation prompt
        // had, or the think block and the two newlines after it.
        let drift = match glue_len {
            0 => {
                3 + sim
                    .response(prev)
                    .iter()
                    .position(|&t| t == END_THINK)
                    .unwrap()
            }
            g => g,
        };
        want_off_policy.push(want_off_policy.last().unwrap() + drift);
    }
    assert_content(t, sim.prompt(a), &want);
    assert_eq!(joins(t), want_joins);
    assert_eq!(
        t.spans
            .iter()
            .map(|s| s.off_policy_context_tokens)
            .collect::<Vec<_>>(),
        want_off_policy
    );
    let off_policy: usize = want_off_policy.iter().sum();
    assert_eq!(t.metadata.off_policy_context_tokens, off_policy);
    assert_eq!(t.labels, [Label::TemplateSpliced]);
    assert_eq!(
        traj.stats,
        stats(
            &traj,
            ReconstructionStats {
                calls: 3,
                chains: 1,
                segments: 1,
                calls_merged: 2,
                template_mismatches_detected: 2,
                template_mismatches_spliced: 2,
                template_splices_by_shape: shapes,
                off_policy_joins: 2,
                off_policy_context_tokens: off_policy,
                ..ReconstructionStats::default()
            }
        )
    );

    // Without template ids, or with splicing off: one segment per call.
    let no_splice = Builder::PrefixMerging(PrefixMergingOptions {
        template: Some(template()),
        splice: false,
        ..PrefixMergingOptions::default()
    });
    for builder in [merging(false), no_splice] {
        let traj = run(&builder, sim);
        assert_eq!(traj.traces.len(), 3);
        for (s, (t, i)) in traj.traces.iter().zip([a, b, d]).enumerate() {
            assert_content(t, sim.prompt(i), &Expect::default().generated(sim, i));
            assert_eq!((t.chain, t.segment), (ChainId(0), s as u32));
            if s > 0 {
                assert_eq!(
                    t.segment_kind,
                    SegmentKind::AfterBreak {
                        reason: BreakReason::TemplateMismatch
                    }
                );
                let prev = [a, b, d][s - 1];
                assert_eq!(
                    t.previous,
                    Some(SegmentLink {
                        chain: ChainId(0),
                        segment: s as u32 - 1,
                        common_prefix_len: sim.prompt(prev).len() - glue_len,
                    })
                );
            }
        }
        assert_eq!(traj.stats.template_mismatches_detected, 2);
        assert_eq!(traj.stats.template_mismatches_spliced, 0);
        assert_eq!(traj.stats.breaks, 2);
    }
}

#[test]
fn reasoning_stripping_template_is_spliced() {
    let render = Render {
        strip_reasoning: true,
        ..Render::default()
    };
    let (sim, calls) = reasoning_session(render);
    // The history shows "call grep bug" where the model generated
    // "<think> where could it be </think> call grep bug".
    let [a, b, _] = calls;
    assert_eq!(
        sim.prompt(b)[..sim.prompt(a).len() + 3],
        [sim.prompt(a), &tok("call grep bug")].concat()[..]
    );
    assert_spliced(&sim, calls, 0);
}

#[test]
fn generation_only_glue_is_spliced() {
    let render = Render {
        generation_glue: true,
        ..Render::default()
    };
    let (sim, calls) = reasoning_session(render);
    let [a, ..] = calls;
    assert!(sim.prompt(a).ends_with(&GLUE));
    assert_spliced(&sim, calls, GLUE.len());
}

#[test]
fn call_cut_by_max_tokens_is_kept_and_extended() {
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", "write the docs");
    let a = c.step(&mut sim, Turn::new("", "call read api"));
    c.tool("the api");
    let cut = Turn {
        cut: Some(4),
        ..Turn::new("long thoughts about the docs", "the docs are")
    };
    let b = c.step(&mut sim, cut);
    assert_eq!(sim.response(b).len(), 4);
    c.msgs.push(Msg::User(tok("continue")));
    let d = c.step(&mut sim, Turn::new("", "the docs are done"));
    let traj = run(&merging(true), &sim);
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    let glue = &sim.prompt(d)[seq_len(&sim, b)..];
    assert_eq!(glue[..2], [IM_END, NL], "the template closed the cut turn");
    let want = Expect::default()
        .generated(&sim, a)
        .glue(&sim.prompt(b)[seq_len(&sim, a)..])
        .generated(&sim, b)
        .glue(glue)
        .generated(&sim, d);
    assert_content(t, sim.prompt(a), &want);
    assert_eq!(t.labels, [Label::Truncated]);
    let truncated: Vec<bool> = t.spans.iter().map(|s| s.truncated).collect();
    assert_eq!(truncated, [false, true, false]);
    assert_eq!(
        traj.stats,
        stats(
            &traj,
            ReconstructionStats {
                calls: 3,
                chains: 1,
                segments: 1,
                calls_merged: 2,
                truncated_calls: 1,
                ..ReconstructionStats::default()
            }
        )
    );
}

#[test]
fn cut_call_under_a_stripping_template_keeps_the_closing_token_as_glue() {
    let render = Render {
        strip_reasoning: true,
        ..Render::default()
    };
    let mut sim = Sim::new(render);
    let mut c = Convo::new("you are a coding agent", "explain");
    let cut = Turn {
        cut: Some(9),
        ..Turn::new("some reasoning here", "the answer is long")
    };
    let a = c.step(&mut sim, cut);
    c.msgs.push(Msg::User(tok("go on")));
    let b = c.step(&mut sim, Turn::new("more", "rest of the answer"));
    let traj = run(&merging(true), &sim);
    assert_eq!(traj.traces.len(), 1);
    let k = eot_after(sim.prompt(b), sim.prompt(a).len());
    assert_eq!(
        joins(&traj.traces[0]),
        [
            Join::First,
            Join::Splice {
                diverged_at: sim.prompt(a).len(),
                resumed_from: k,
                shape: Some(SpliceShape::StrippedReasoning),
            }
        ]
    );
    let want = Expect::default()
        .generated(&sim, a)
        .glue(&sim.prompt(b)[k..])
        .generated(&sim, b);
    assert_content(&traj.traces[0], sim.prompt(a), &want);
    assert_eq!(
        traj.traces[0].labels,
        [Label::Truncated, Label::TemplateSpliced]
    );
}

#[test]
fn calls_without_ids_or_failed_are_dropped_with_a_reason() {
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", "bump the version");
    let a = c.step(&mut sim, Turn::new("", "call read cargo"));
    c.tool("version 1");
    let turn = Turn::new("", "call write cargo");
    let b = sim.call_without_ids(&c.msgs, &turn);
    c.msgs.push(Msg::Assistant(turn));
    c.tool("written");
    let f = sim.call_failed(&c.msgs);
    let d = c.step(&mut sim, Turn::new("", "done"));
    let dropped = vec![
        DroppedCall {
            call_id: "c1".into(),
            reason: DropReason::TokenIdsMissing,
        },
        DroppedCall {
            call_id: "c2".into(),
            reason: DropReason::CallFailed {
                side: "backend".into(),
                error: "upstream reset".into(),
            },
        },
    ];
    let traj = run(&merging(false), &sim);
    assert_eq!(traj.traces.len(), 1);
    // The call without ids is glue now: its rendering, never re-tokenized.
    let want = Expect::default()
        .generated(&sim, a)
        .glue(&sim.prompt(d)[seq_len(&sim, a)..])
        .generated(&sim, d);
    assert_content(&traj.traces[0], sim.prompt(a), &want);
    assert_eq!(traj.traces[0].call_ids, ["c0", "c3"]);
    assert_eq!(
        traj.stats,
        stats(
            &traj,
            ReconstructionStats {
                calls: 4,
                chains: 1,
                segments: 1,
                calls_merged: 1,
                calls_dropped: dropped.clone(),
                ..ReconstructionStats::default()
            }
        )
    );
    let per = run(&Builder::PerRequest, &sim);
    assert_eq!(per.traces.len(), 2);
    assert_eq!(per.stats.calls_dropped, dropped);
    let _ = (b, f);
}

#[test]
fn records_out_of_order_are_taken_in_seq_order() {
    let (sim, _) = reasoning_session(Render::default());
    let mut shuffled = sim.records.clone();
    shuffled.reverse();
    let a = build(&merging(false), &sim.records, &meta());
    let b = build(&merging(false), &shuffled, &meta());
    assert_eq!(a, b);
    assert!(check(&b, &shuffled).is_ok());
}

#[test]
fn each_span_says_how_its_prompt_was_served() {
    use polar_record::Serving;
    let mut sim = Sim::new(Render::default());
    let mut c = Convo::new("you are a coding agent", "fix the failing test");
    let a = c.step(&mut sim, Turn::new("look first", "call read_file tests"));
    c.tool("off by one");
    let b = c.step(&mut sim, Turn::new("", "done"));
    let serving = |v: serde_json::Value| -> Serving { serde_json::from_value(v).unwrap() };
    let first = serving(serde_json::json!(
        {"mode": "token_in", "prompt": {"kind": "fresh", "reason": {"why": "first_call"}}}
    ));
    let kept = seq_len(&sim, a);
    let extends = serving(serde_json::json!({"mode": "token_in", "prompt": {
        "kind": "extends", "call": 0, "kept": kept, "added": sim.prompt(b).len() - kept
    }}));
    sim.records[a].backend.serving = Some(first.clone());
    sim.records[b].backend.serving = Some(extends.clone());
    let traj = run(&merging(false), &sim);
    assert_eq!(traj.traces.len(), 1);
    let servings: Vec<Option<Serving>> = traj.traces[0]
        .spans
        .iter()
        .map(|s| s.serving.clone())
        .collect();
    assert_eq!(servings, [Some(first), Some(extends)]);
    let v = serde_json::to_value(&traj.traces[0].spans[1]).unwrap();
    assert_eq!(v["serving"]["mode"], "token_in");
    assert_eq!(v["serving"]["prompt"]["kind"], "extends");
    // A record that does not say leaves the span without it.
    let v = serde_json::to_value(crate::CallSpan {
        serving: None,
        ..traj.traces[0].spans[0].clone()
    })
    .unwrap();
    assert!(v.get("serving").is_none());
}
