//! Second pass of prefix merging: from what each call attaches to (a forest
//! of calls) to chains, segments and traces.
//!
//! - Siblings (calls attached to the same call, or roots with the same
//!   prompt) compete: the one with the most descendants continues the trace
//!   (ties: the latest). A sibling nothing extended is a superseded retry; a
//!   sibling with descendants of its own forks a new chain.
//! - A root (a call extending no earlier call) starts a new segment of an
//!   earlier chain (a break) when its divergence looks like a template
//!   mismatch; or when, sharing a token prefix with the latest call `B` it
//!   left, whose trace never grows again afterwards, it is the same
//!   conversation as `B` (a common message beyond the system prompt:
//!   compaction when the new prompt is shorter than `B`'s prompt + response,
//!   rewritten history otherwise) or quotes `B`'s response (a summary:
//!   compaction). Any other root starts a new chain: a sub-agent or a side
//!   request, running alongside or after the others.

use crate::calls::Call;
use crate::options::{PrefixMergingOptions, RetryPolicy};
use crate::stats::{DropReason, DroppedCall};
use crate::trace_buf::TraceBuf;
use crate::types::{BreakReason, ChainId, Join, Label, SegmentKind, SegmentLink, Trace};
use polar_chat::Role;

use super::matching::{Attach, Matched};
use super::quote::quoted;
use super::tree::CallIx;

/// How a trace begins.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// A new chain.
    Root,
    /// A new segment after a break in `from`'s chain.
    Break {
        reason: BreakReason,
        from: CallIx,
        lcp: usize,
    },
    /// A superseded retry, linked to `link`'s trace.
    Retry { link: CallIx, lcp: usize },
    /// A new chain forked at `link`.
    Fork { link: CallIx, lcp: usize },
}

struct Plan {
    first: CallIx,
    start: Start,
    calls: Vec<CallIx>,
    dropped: bool,
}

/// Counts the second pass adds to the statistics.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub retries_superseded: usize,
    pub forks: usize,
    pub breaks: usize,
    pub dropped: Vec<DroppedCall>,
}

pub(super) fn assemble(
    calls: &[Call<'_>],
    matched: &[Matched],
    opts: &PrefixMergingOptions,
) -> (Vec<Trace>, Counts) {
    let n = calls.len();
    let mut children: Vec<Vec<CallIx>> = vec![Vec::new(); n];
    let mut root_groups: Vec<Vec<CallIx>> = vec![Vec::new(); n];
    for (i, m) in matched.iter().enumerate() {
        match m.attach {
            Attach::Root(info) => root_groups[info.same_prompt_as.unwrap_or(i)].push(i),
            Attach::Extend { parent } | Attach::Splice { parent, .. } => children[parent].push(i),
        }
    }
    let mut desc = vec![0usize; n];
    for i in (0..n).rev() {
        if let Some(p) = matched[i].attach.parent() {
            desc[p] += 1 + desc[i];
        }
    }

    let mut plans = trace_starts(calls, matched, &children, &root_groups, &desc);
    // Follow the winners down from each start.
    let next: Vec<Option<CallIx>> = children.iter().map(|k| winner(k, &desc)).collect();
    let mut trace_of = vec![0usize; n];
    for (t, plan) in plans.iter_mut().enumerate() {
        let mut c = Some(plan.first);
        while let Some(call) = c {
            plan.calls.push(call);
            trace_of[call] = t;
            c = next[call];
        }
    }
    mark_breaks(calls, matched, &next, &mut plans);
    let counts = count_starts(calls, opts, &mut plans);
    let traces = build_traces(calls, matched, &plans, &trace_of);
    (traces, counts)
}

/// The sibling that continues the trace: the one with the most descendants
/// (`desc`), ties to the latest.
fn winner(group: &[CallIx], desc: &[usize]) -> Option<CallIx> {
    group.iter().copied().max_by_key(|&c| (desc[c], c))
}

/// The trace starts, in the order of their first calls: each root group's
/// winner, and every losing sibling (a retry, or a fork when it has
/// descendants of its own).
fn trace_starts(
    calls: &[Call<'_>],
    matched: &[Matched],
    children: &[Vec<CallIx>],
    root_groups: &[Vec<CallIx>],
    desc: &[usize],
) -> Vec<Plan> {
    let mut plans: Vec<Plan> = Vec::new();
    let mut push = |first: CallIx, start: Start| {
        plans.push(Plan {
            first,
            start,
            calls: Vec::new(),
            dropped: false,
        });
    };
    let loser = |c: CallIx, link: CallIx, lcp: usize| {
        if desc[c] == 0 {
            Start::Retry { link, lcp }
        } else {
            Start::Fork { link, lcp }
        }
    };
    for group in root_groups {
        let Some(w) = winner(group, desc) else {
            continue;
        };
        push(w, Start::Root);
        for &c in group.iter().filter(|&&c| c != w) {
            push(c, loser(c, w, calls[c].prompt.len()));
        }
    }
    for (p, kids) in children.iter().enumerate() {
        let Some(w) = winner(kids, desc) else {
            continue;
        };
        for &c in kids.iter().filter(|&&c| c != w) {
            let lcp = match matched[c].attach {
                Attach::Splice { diverged_at, .. } => diverged_at,
                _ => calls[p].seq_len(),
            };
            push(c, loser(c, p, lcp));
        }
    }
    plans.sort_by_key(|p| p.first);
    plans
}

/// Roots: turns each root that continues an earlier chain into a break
/// (`next`: the winning child of each call); the others stay new chains.
fn mark_breaks(
    calls: &[Call<'_>],
    matched: &[Matched],
    next: &[Option<CallIx>],
    plans: &mut [Plan],
) {
    for plan in plans {
        let Start::Root = plan.start else { continue };
        let Attach::Root(info) = matched[plan.first].attach else {
            continue;
        };
        let Some(d) = info.divergence else { continue };
        let r = &calls[plan.first];
        let b = &calls[d.from];
        let reason = if d.template_mismatch {
            Some(BreakReason::TemplateMismatch)
        } else if d.common_prefix_len == 0 || last_of(next, d.from) > plan.first {
            None
        } else {
            break_reason(r, b)
        };
        if let Some(reason) = reason {
            plan.start = Start::Break {
                reason,
                from: d.from,
                lcp: d.common_prefix_len,
            };
        }
    }
}

/// Counts the retries, forks and breaks, marking the retries dropped when
/// the options say so.
fn count_starts(calls: &[Call<'_>], opts: &PrefixMergingOptions, plans: &mut [Plan]) -> Counts {
    let mut counts = Counts::default();
    for plan in plans {
        match plan.start {
            Start::Retry { .. } => {
                counts.retries_superseded += 1;
                if opts.retries == RetryPolicy::Drop {
                    plan.dropped = true;
                    counts.dropped.push(DroppedCall {
                        call_id: calls[plan.first].record.call_id.clone(),
                        reason: DropReason::SupersededRetry,
                    });
                }
            }
            Start::Fork { .. } => counts.forks += 1,
            Start::Break { .. } => counts.breaks += 1,
            Start::Root => {}
        }
    }
    counts
}

/// The traces of the plans not dropped (`trace_of`: each call's plan), with
/// their chains, segments, links and labels, ordered by chain and segment.
fn build_traces(
    calls: &[Call<'_>],
    matched: &[Matched],
    plans: &[Plan],
    trace_of: &[usize],
) -> Vec<Trace> {
    let chains = chain_ids(plans, trace_of);
    let segments = segment_numbers(plans, &chains);
    let link_to = |call: CallIx, lcp: usize| {
        let mut t = trace_of[call];
        // A dropped retry's trace does not exist: link to what it linked to.
        while plans[t].dropped {
            match plans[t].start {
                Start::Retry { link, .. } => t = trace_of[link],
                _ => break,
            }
        }
        SegmentLink {
            chain: chains[t],
            segment: segments[t],
            common_prefix_len: lcp,
        }
    };

    let mut traces = Vec::with_capacity(plans.len());
    for (t, plan) in plans.iter().enumerate() {
        if plan.dropped {
            continue;
        }
        let (kind, previous, label) = match plan.start {
            Start::Root => (SegmentKind::Start, None, None),
            Start::Break { reason, from, lcp } => (
                SegmentKind::AfterBreak { reason },
                Some(link_to(from, lcp)),
                None,
            ),
            Start::Retry { link, lcp } => (
                SegmentKind::SupersededRetry,
                Some(link_to(link, lcp)),
                Some(Label::SupersededRetry),
            ),
            Start::Fork { link, lcp } => (
                SegmentKind::Start,
                Some(link_to(link, lcp)),
                Some(Label::Forked),
            ),
        };
        let mut trace =
            build_trace(calls, matched, &plan.calls).finish(chains[t], segments[t], kind, previous);
        if let Some(label) = label {
            trace.add_label(label);
        }
        traces.push(trace);
    }
    traces.sort_by_key(|t| (t.chain, t.segment));
    traces
}

/// Why root `r`, which left `b`'s sequence after a common prefix while `b`'s
/// trace never grew again, continues `b`'s chain; `None` when it starts a
/// chain of its own. It continues it when it is the same conversation (it
/// shares a message beyond the system prompt with `b`), or when its prompt
/// quotes `b`'s response (a summary made by `b`, then used as the new
/// context: compaction by summary).
fn break_reason(r: &Call<'_>, b: &Call<'_>) -> Option<BreakReason> {
    let (rm, bm) = (&r.record.request.messages, &b.record.request.messages);
    let shared = rm.iter().zip(bm).take_while(|(x, y)| x == y).count();
    let system = usize::from(
        rm.first()
            .is_some_and(|m| matches!(m.role, Role::System | Role::Developer)),
    );
    if shared > system {
        Some(if r.prompt.len() < b.seq_len() {
            BreakReason::Compaction
        } else {
            BreakReason::RewrittenHistory
        })
    } else {
        quoted(r.prompt, b.response).then_some(BreakReason::Compaction)
    }
}

/// The last call of the trace holding `c`.
fn last_of(next: &[Option<CallIx>], mut c: CallIx) -> CallIx {
    while let Some(n) = next[c] {
        c = n;
    }
    c
}

/// Chain of each plan: roots and forks open chains in the order of their
/// first calls; breaks and retries belong to the chain of what they link.
fn chain_ids(plans: &[Plan], trace_of: &[usize]) -> Vec<ChainId> {
    let mut chains: Vec<Option<ChainId>> = vec![None; plans.len()];
    let mut next_id = 0u32;
    for (t, plan) in plans.iter().enumerate() {
        if matches!(plan.start, Start::Root | Start::Fork { .. }) {
            chains[t] = Some(ChainId(next_id));
            next_id += 1;
        }
    }
    for t in 0..plans.len() {
        // Follow links to a plan with a chain; a cycle (possible only in
        // contrived sessions) opens a new chain.
        let mut seen = vec![t];
        let mut cur = t;
        let id = loop {
            if let Some(id) = chains[cur] {
                break id;
            }
            let target = match plans[cur].start {
                Start::Break { from, .. } => trace_of[from],
                Start::Retry { link, .. } => trace_of[link],
                Start::Root | Start::Fork { .. } => cur,
            };
            if seen.contains(&target) {
                let id = ChainId(next_id);
                next_id += 1;
                break id;
            }
            seen.push(target);
            cur = target;
        };
        for s in seen {
            chains[s].get_or_insert(id);
        }
    }
    chains.into_iter().map(Option::unwrap_or_default).collect()
}

/// Segment number of each plan within its chain, in the order of first
/// calls, skipping dropped retries.
fn segment_numbers(plans: &[Plan], chains: &[ChainId]) -> Vec<u32> {
    let mut used: std::collections::HashMap<ChainId, u32> = std::collections::HashMap::new();
    plans
        .iter()
        .zip(chains)
        .map(|(plan, chain)| {
            let counter = used.entry(*chain).or_insert(0);
            let seg = *counter;
            if !plan.dropped {
                *counter += 1;
            }
            seg
        })
        .collect()
}

/// Concatenates the calls of one trace.
fn build_trace<'a>(calls: &[Call<'a>], matched: &[Matched], path: &[CallIx]) -> TraceBuf<'a> {
    let mut ids = path.iter().copied();
    let first = ids.next().unwrap_or_default();
    let mut buf = TraceBuf::new(calls[first]);
    for c in ids {
        let call = calls[c];
        let (glue, join) = match matched[c].attach {
            Attach::Splice {
                diverged_at,
                resumed_from,
                ..
            } => (
                call.prompt.get(resumed_from..).unwrap_or_default(),
                Join::Splice {
                    diverged_at,
                    resumed_from,
                },
            ),
            Attach::Extend { parent } => (
                call.prompt
                    .get(calls[parent].seq_len()..)
                    .unwrap_or_default(),
                Join::Extend,
            ),
            // Only a trace's first call is a root.
            Attach::Root(_) => (&[][..], Join::Extend),
        };
        buf.push(call, glue, join);
    }
    buf
}
