//! Property tests: random sessions (multi-turn tool use in several
//! interleaved conversations, with retries, compactions, length cuts, calls
//! without ids and failed calls, under each template variant) must always
//! give trajectories that pass the invariant checker, with consistent
//! statistics, whatever the builder options.

use proptest::prelude::*;

use super::kit::{Convo, Msg, Render, Sim, Turn, meta, template, template_ws};
use crate::{
    Builder, DropReason, Join, Label, PrefixMergingOptions, RetryPolicy, SegmentKind, SpliceShape,
    Trajectory, build, check,
};

/// Render variants: 0 plain, 1 reasoning stripped, 2 generation glue, 3
/// echoed whitespace with reasoning stripped, 4 echoed whitespace with
/// reasoning kept.
const MODES: u8 = 5;

#[derive(Clone, Debug)]
enum Op {
    /// A model call in conversation `conv`, then a tool result.
    Step {
        conv: usize,
        reasoning: Vec<u32>,
        content: Vec<u32>,
        tool: Vec<u32>,
        cut: Option<usize>,
    },
    /// The conversation's last call again, same prompt; the new reply (or
    /// the same one) replaces the old in the history.
    Retry {
        conv: usize,
        content: Vec<u32>,
        same: bool,
    },
    /// A call, then the harness replaces the tool result and calls again.
    NewToolResult {
        conv: usize,
        content: Vec<u32>,
        tool: Vec<u32>,
    },
    /// A summary call, then the context becomes the summary.
    Compact { conv: usize, summary: Vec<u32> },
    /// A new sub-agent conversation.
    Spawn { task: Vec<u32> },
    /// A call without token ids (history goes on).
    MissingIds {
        conv: usize,
        content: Vec<u32>,
        tool: Vec<u32>,
    },
    /// A failed call (history unchanged).
    Fail { conv: usize },
}

fn words(max: usize) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(prop_oneof![12 => 100u32..130, 1 => 1u32..11], 0..max)
}

fn plain_words(min: usize, max: usize) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(100u32..130, min..max)
}

fn op() -> impl Strategy<Value = Op> {
    let conv = 0usize..4;
    prop_oneof![
        8 => (conv.clone(), words(6), words(8), plain_words(0, 8), prop::option::weighted(0.15, 1usize..12))
            .prop_map(|(conv, reasoning, content, tool, cut)| Op::Step { conv, reasoning, content, tool, cut }),
        1 => (conv.clone(), words(6), any::<bool>()).prop_map(|(conv, content, same)| Op::Retry { conv, content, same }),
        1 => (conv.clone(), words(6), plain_words(0, 6)).prop_map(|(conv, content, tool)| Op::NewToolResult { conv, content, tool }),
        1 => (conv.clone(), plain_words(0, 24)).prop_map(|(conv, summary)| Op::Compact { conv, summary }),
        1 => plain_words(1, 6).prop_map(|task| Op::Spawn { task }),
        1 => (conv.clone(), words(6), plain_words(0, 6)).prop_map(|(conv, content, tool)| Op::MissingIds { conv, content, tool }),
        1 => conv.prop_map(|conv| Op::Fail { conv }),
    ]
}

struct Agent {
    convo: Convo,
    /// History when the last call was made, and that call's tool result.
    last: Option<(Vec<Msg>, Vec<u32>)>,
}

fn simulate(render: Render, ops: &[Op]) -> Sim {
    let mut sim = Sim::new(render);
    let mut agents = vec![Agent {
        convo: Convo::new("you are the main agent", "solve the task"),
        last: None,
    }];
    for op in ops {
        let n = agents.len();
        match op.clone() {
            Op::Step {
                conv,
                reasoning,
                content,
                tool,
                cut,
            } => {
                let a = &mut agents[conv % n];
                let before = a.convo.msgs.clone();
                a.convo.step(
                    &mut sim,
                    Turn {
                        reasoning,
                        content,
                        cut,
                    },
                );
                a.convo.msgs.push(Msg::Tool(tool.clone()));
                a.last = Some((before, tool));
            }
            Op::Retry {
                conv,
                content,
                same,
            } => {
                let a = &mut agents[conv % n];
                let Some((before, tool)) = a.last.clone() else {
                    continue;
                };
                let old = match before
                    .len()
                    .checked_sub(0)
                    .and_then(|_| a.convo.msgs.get(before.len()))
                {
                    Some(Msg::Assistant(t)) => t.clone(),
                    _ => continue,
                };
                let turn = if same {
                    old
                } else {
                    Turn {
                        content,
                        ..Turn::default()
                    }
                };
                sim.call(&before, &turn);
                a.convo.msgs = before;
                a.convo.msgs.push(Msg::Assistant(turn));
                a.convo.msgs.push(Msg::Tool(tool));
            }
            Op::NewToolResult {
                conv,
                content,
                tool,
            } => {
                let a = &mut agents[conv % n];
                sim.call(
                    &a.convo.msgs,
                    &Turn {
                        content,
                        ..Turn::default()
                    },
                );
                if matches!(a.convo.msgs.last(), Some(Msg::Tool(_))) {
                    a.convo.msgs.pop();
                    a.convo.msgs.push(Msg::Tool(tool));
                }
            }
            Op::Compact { conv, summary } => {
                let a = &mut agents[conv % n];
                let mut ask = a.convo.msgs.clone();
                ask.push(Msg::User(vec![120, 121, 122]));
                sim.call(
                    &ask,
                    &Turn {
                        content: summary.clone(),
                        ..Turn::default()
                    },
                );
                let system = a.convo.msgs[0].clone();
                let mut context = vec![123, 124];
                context.extend(summary);
                a.convo.msgs = vec![system, Msg::User(context)];
                a.last = None;
            }
            Op::Spawn { task } => agents.push(Agent {
                convo: Convo {
                    msgs: vec![Msg::System(vec![110, 111, 112]), Msg::User(task)],
                },
                last: None,
            }),
            Op::MissingIds {
                conv,
                content,
                tool,
            } => {
                let a = &mut agents[conv % n];
                let turn = Turn {
                    content,
                    ..Turn::default()
                };
                sim.call_without_ids(&a.convo.msgs, &turn);
                a.convo.msgs.push(Msg::Assistant(turn));
                a.convo.msgs.push(Msg::Tool(tool));
                a.last = None;
            }
            Op::Fail { conv } => {
                sim.call_failed(&agents[conv % n].convo.msgs);
            }
        }
    }
    sim
}

fn render_of(mode: u8) -> Render {
    Render {
        strip_reasoning: mode == 1 || mode == 3,
        generation_glue: mode == 2,
        echo_whitespace: mode >= 3,
    }
}

fn builders() -> Vec<Builder> {
    let mut out = Vec::new();
    for tpl in [None, Some(template()), Some(template_ws())] {
        for splice in [true, false] {
            for retries in [RetryPolicy::KeepAsTrace, RetryPolicy::Drop] {
                out.push(Builder::PrefixMerging(PrefixMergingOptions {
                    template: tpl.clone(),
                    splice,
                    retries,
                }));
            }
        }
    }
    out
}

fn response_len(sim: &Sim, call_id: &str) -> usize {
    sim.records
        .iter()
        .find(|r| r.call_id == call_id)
        .and_then(|r| r.response_token_ids.as_ref())
        .map_or(0, Vec::len)
}

fn check_consistency(
    traj: &Trajectory,
    per: &Trajectory,
    sim: &Sim,
    builder: &Builder,
) -> Result<(), TestCaseError> {
    if let Err(e) = check(traj, &sim.records) {
        return Err(TestCaseError::fail(format!("{e}")));
    }
    let s = &traj.stats;
    prop_assert_eq!(s.calls, sim.records.len());
    let dropped_retry_tokens: usize = s
        .calls_dropped
        .iter()
        .filter(|d| d.reason == DropReason::SupersededRetry)
        .map(|d| response_len(sim, &d.call_id))
        .sum();
    prop_assert_eq!(s.loss_tokens + dropped_retry_tokens, per.stats.loss_tokens);
    prop_assert!(s.total_tokens() <= per.stats.total_tokens());
    let in_traces: usize = traj.traces.iter().map(|t| t.call_ids.len()).sum();
    prop_assert_eq!(in_traces + s.calls_dropped.len(), s.calls);
    prop_assert_eq!(s.calls_merged + s.segments, in_traces);
    let retry_traces = traj
        .traces
        .iter()
        .filter(|t| t.has_label(Label::SupersededRetry))
        .count();
    let retry_drops = s.calls_dropped.len() - per.stats.calls_dropped.len();
    prop_assert_eq!(retry_traces + retry_drops, s.retries_superseded);
    let breaks: Vec<_> = traj
        .traces
        .iter()
        .filter(|t| matches!(t.segment_kind, SegmentKind::AfterBreak { .. }))
        .collect();
    prop_assert_eq!(breaks.len(), s.breaks);
    prop_assert!(breaks.iter().all(|t| t.previous.is_some()));
    prop_assert!(s.template_mismatches_spliced <= s.template_mismatches_detected);
    let by_shape = s.template_splices_by_shape;
    prop_assert_eq!(
        by_shape.generation_glue + by_shape.stripped_reasoning + by_shape.whitespace_merge,
        s.template_mismatches_spliced
    );
    let spans: Vec<_> = traj.traces.iter().flat_map(|t| &t.spans).collect();
    prop_assert_eq!(
        s.off_policy_joins,
        spans
            .iter()
            .filter(|x| x.off_policy_context_tokens > 0)
            .count()
    );
    prop_assert_eq!(
        s.off_policy_context_tokens,
        spans
            .iter()
            .map(|x| x.off_policy_context_tokens)
            .sum::<usize>()
    );
    for t in &traj.traces {
        // Zero until the trace's first splice, positive from it on.
        let first_splice = t
            .spans
            .iter()
            .position(|x| matches!(x.join, Join::Splice { .. }))
            .unwrap_or(t.spans.len());
        prop_assert!(
            t.spans[..first_splice]
                .iter()
                .all(|x| x.off_policy_context_tokens == 0)
        );
        prop_assert!(
            t.spans[first_splice..]
                .iter()
                .all(|x| x.off_policy_context_tokens > 0)
        );
        prop_assert!(
            t.spans
                .windows(2)
                .all(|w| w[0].off_policy_context_tokens <= w[1].off_policy_context_tokens)
        );
    }
    if let Builder::PrefixMerging(o) = builder
        && o.template.as_ref().is_some_and(|t| t.whitespace.is_empty())
    {
        prop_assert_eq!(by_shape.whitespace_merge, 0);
    }
    if let Builder::PrefixMerging(o) = builder
        && (o.template.is_none() || !o.splice)
    {
        prop_assert_eq!(s.template_mismatches_spliced, 0);
    }
    let json = serde_json::to_string(traj).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back: Trajectory =
        serde_json::from_str(&json).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&back, traj);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn random_sessions_satisfy_the_invariants(mode in 0u8..MODES, ops in prop::collection::vec(op(), 1..40)) {
        let sim = simulate(render_of(mode), &ops);
        let per = build(&Builder::PerRequest, &sim.records, &meta());
        if let Err(e) = check(&per, &sim.records) {
            return Err(TestCaseError::fail(format!("per_request: {e}")));
        }
        prop_assert_eq!(per.traces.len() + per.stats.calls_dropped.len(), sim.records.len());
        let mut reversed = sim.records.clone();
        reversed.reverse();
        for builder in builders() {
            let traj = build(&builder, &sim.records, &meta());
            check_consistency(&traj, &per, &sim, &builder)?;
            prop_assert_eq!(&build(&builder, &reversed, &meta()), &traj, "depends on record order");
        }
    }

    /// Interleaved conversations that only step (lengths cut at random) stay
    /// one trace each under every template variant when the template ids are
    /// known.
    #[test]
    fn clean_interleaved_sessions_are_one_trace_per_conversation(
        mode in 0u8..MODES,
        convs in 1usize..4,
        steps in prop::collection::vec(
            (0usize..4, plain_words(0, 5), plain_words(0, 6), plain_words(0, 6), prop::option::weighted(0.2, 1usize..10)),
            1..30,
        ),
    ) {
        let render = render_of(mode);
        let mut sim = Sim::new(render);
        let mut agents: Vec<Convo> = (0..convs)
            .map(|i| Convo {
                msgs: vec![Msg::System(vec![110, 111]), Msg::User(vec![200 + i as u32, 101])],
            })
            .collect();
        let mut used = vec![false; convs];
        // Per conversation: its calls, and what each one's turn makes the
        // context differ by when echoed whitespace is spliced (None: a
        // turn cut by the token limit, whose splice is not of that shape).
        let mut turns: Vec<Vec<(usize, Option<usize>)>> = vec![Vec::new(); convs];
        for (conv, reasoning, content, tool, cut) in steps {
            let k = conv % convs;
            let drift = match (mode, cut, reasoning.len()) {
                (_, Some(_), _) => None,
                (3, None, r) if r > 0 => Some(r + 5),
                (4, None, r) if r > 0 => Some(2),
                _ => Some(0),
            };
            let i = agents[k].step(&mut sim, Turn { reasoning, content, cut });
            turns[k].push((i, drift));
            agents[k].msgs.push(Msg::Tool(tool));
            used[k] = true;
        }
        let live = used.iter().filter(|&&u| u).count();
        let builder = Builder::PrefixMerging(PrefixMergingOptions {
            template: Some(template_ws()),
            ..PrefixMergingOptions::default()
        });
        let traj = build(&builder, &sim.records, &meta());
        if let Err(e) = check(&traj, &sim.records) {
            return Err(TestCaseError::fail(format!("{e}")));
        }
        // Echoed whitespace: each call after a turn with reasoning is a
        // whitespace-merge splice, and the context differs by what every
        // spliced turn before it left (r + 5 tokens with the reasoning
        // stripped: the template's newline, the think block and the two
        // newlines after it; 2 with it kept: the two newlines the model
        // generated after `</think>`, where the template wrote one token).
        for calls in turns.iter().filter(|c| !c.is_empty()) {
            if mode < 3 || calls.iter().any(|(_, d)| d.is_none()) {
                continue;
            }
            let first = format!("c{}", calls[0].0);
            let t = traj.traces.iter().find(|t| t.call_ids[0] == first).unwrap();
            let mut want = 0;
            for (j, (_, drift)) in calls.iter().enumerate() {
                let span = &t.spans[j];
                prop_assert_eq!(span.off_policy_context_tokens, want, "call {} of {:?}", j, calls);
                if j > 0 && calls[j - 1].1 != Some(0) {
                    let is_ws = matches!(span.join, Join::Splice { shape: Some(SpliceShape::WhitespaceMerge), .. });
                    prop_assert!(is_ws, "{:?}", span.join);
                }
                want += drift.unwrap_or_default();
            }
        }
        prop_assert_eq!(traj.traces.len(), live);
        prop_assert_eq!(traj.stats.chains, live);
        prop_assert_eq!(traj.stats.calls_merged, sim.records.len() - live);
        prop_assert_eq!(traj.stats.breaks, 0);
        prop_assert_eq!(traj.stats.template_mismatches_spliced, traj.stats.template_mismatches_detected);
        if mode == 0 {
            prop_assert_eq!(traj.stats.template_mismatches_detected, 0);
        }
    }
}
