//! Second pass of prefix merging: from what each call attaches to (a forest
//! of calls) to chains, segments and traces.
//!
//! - Compaction summaries: a call whose reply a later root's prompt quotes
//!   while that root is not the same conversation (the harness summarized,
//!   then started afresh from the summary), and which nothing extends, is
//!   the compaction's summary call: it never continues a trace, and gets a
//!   segment of its own, `CompactionSummary`, linked to the call it branched
//!   from (its parent, or where its prompt left the chain), labelled
//!   `compaction_summary`; the root that quotes it continues its chain after
//!   a `Compaction` break.
//! - Siblings (calls attached to the same call, or roots with the same
//!   prompt) compete: the one with the most descendants continues the trace
//!   (ties: the one whose reply a later call holds, see `replies`; then the
//!   latest). A call asking for structured output that nothing extends
//!   never continues a trace of calls that do not: it forks a chain of its
//!   own (a check asked with the main conversation, as Gemini CLI's
//!   next-speaker check, is a side request beside it, not its next call
//!   nor a retry); one the conversation goes on from is one of its calls.
//!   A sibling is a
//!   superseded retry only when nothing extended it,
//!   no later call holds its reply and it holds no sibling's reply (it is a
//!   later request, not a retry); any other losing sibling forks a new
//!   chain.
//! - A root (a call extending no earlier call) starts a new segment of an
//!   earlier chain (a break) when its divergence looks like a template
//!   mismatch; or when, sharing a token prefix with the latest call `B` it
//!   left, whose trace never grows again afterwards, it keeps `B`'s whole
//!   history (same messages, re-rendered differently: template mismatch),
//!   is otherwise the same conversation as `B` (a common message beyond the
//!   system prompt: rewritten history) or quotes `B`'s response (a summary:
//!   compaction). A break is labelled compaction only after a summary call.
//!   A call that is no side request never continues from a side request (a
//!   title call that came first): it starts a chain of its own. Any other
//!   root starts a new chain: a sub-agent or a side request, running
//!   alongside or after the others.

use crate::calls::Call;
use crate::options::{PrefixMergingOptions, RetryPolicy};
use crate::stats::{DropReason, DroppedCall};
use crate::trace_buf::TraceBuf;
use crate::types::{BreakReason, ChainId, Join, Label, SegmentKind, SegmentLink, Trace};

use super::history::{keeps_history, same_conversation};
use super::matching::{Attach, Matched};
use super::quote::{common_prefix_with, quoted};
use super::replies::ReplyUse;
use super::tree::CallIx;

/// A summary quoted this far into a response is found without the
/// divergence pointing at it: only responses this long are searched.
const MIN_SUMMARY_LEN: usize = 16;

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
    /// A compaction's summary call, branching from `link`'s trace.
    Summary { link: CallIx, lcp: usize },
}

struct Plan {
    first: CallIx,
    start: Start,
    calls: Vec<CallIx>,
    dropped: bool,
    /// The first call is a compaction's summary call.
    summary: bool,
}

/// What the second pass knows about each call.
struct Facts {
    /// Descendants (calls extending it, transitively).
    desc: Vec<usize>,
    /// Compaction summary calls.
    summary: Vec<bool>,
    /// For a root that continues from a summary: that summary call.
    summarized_by: Vec<Option<CallIx>>,
    /// Which later calls hold each call's reply.
    replies: ReplyUse,
    /// Side-shaped calls (`roles::side_shaped`): no conversation that is
    /// not one continues from them.
    side: Vec<bool>,
    /// Calls asking for structured output: one that nothing extends never
    /// joins a trace of calls that do not (a check asked with the main
    /// conversation branches off it, as a chain of its own).
    structured: Vec<bool>,
}

impl Facts {
    /// Whether `r` may continue (or branch from) `b`'s chain: a call that is
    /// no side request never continues from one (a title call that came
    /// first is not the main chain's start).
    fn may_continue(&self, r: CallIx, b: CallIx) -> bool {
        self.side[r] || !self.side[b]
    }

    /// Whether `c` may continue its parent `p`'s trace: not when `c` asks
    /// for structured output, `p` does not, and nothing extends `c` (a check
    /// beside the conversation; a structured turn the conversation goes on
    /// from is one of its calls).
    fn joins(&self, c: CallIx, p: CallIx) -> bool {
        !self.structured[c] || self.structured[p] || self.desc[c] > 0
    }
}

impl Facts {
    /// The sibling that continues the trace: not a summary call; the one
    /// with the most descendants, then one whose reply a later call holds,
    /// then the latest.
    fn winner(&self, group: &[CallIx]) -> Option<CallIx> {
        group
            .iter()
            .copied()
            .filter(|&c| !self.summary[c])
            .max_by_key(|&c| (self.desc[c], self.replies.used_among(c, group), c))
    }

    /// [`Facts::winner`] among the children `kids` of `p`, of those that
    /// may continue its trace ([`Facts::joins`]).
    fn next_of(&self, p: CallIx, kids: &[CallIx]) -> Option<CallIx> {
        let joining: Vec<CallIx> = kids.iter().copied().filter(|&c| self.joins(c, p)).collect();
        self.winner(&joining)
    }

    /// How sibling `c` of `group`, which lost to `won`, starts its trace. A
    /// sibling with the winner's very tokens (prompt and response) is
    /// interchangeable with it: a retry, whichever reply the harness named.
    fn loser(
        &self,
        calls: &[Call<'_>],
        c: CallIx,
        group: &[CallIx],
        won: Option<CallIx>,
        link: CallIx,
        lcp: usize,
    ) -> Start {
        if self.summary[c] {
            return Start::Summary { link, lcp };
        }
        // A structured request beside calls that are not, which nothing
        // extends: a check branching off the conversation, never a retry.
        if self.structured[c] && self.desc[c] == 0 && won.is_none_or(|w| !self.structured[w]) {
            return Start::Fork { link, lcp };
        }
        let same_tokens = won.is_some_and(|w| {
            calls[w].prompt == calls[c].prompt && calls[w].response == calls[c].response
        });
        let later_request = group.iter().any(|&g| g != c && self.replies.holds(c, g));
        let used = self.replies.used_among(c, group) || later_request;
        if self.desc[c] == 0 && (same_tokens || !used) {
            Start::Retry { link, lcp }
        } else {
            Start::Fork { link, lcp }
        }
    }
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
    let replies = ReplyUse::new(calls);
    let (summary, summarized_by) = summaries(calls, matched, &children, &replies);
    let facts = Facts {
        desc,
        summary,
        summarized_by,
        replies,
        side: crate::roles::side_shaped(calls.iter().map(|c| &c.record.request)),
        structured: calls
            .iter()
            .map(|c| crate::roles::asks_structured(&c.record.request))
            .collect(),
    };

    let mut plans = trace_starts(calls, matched, &children, &root_groups, &facts);
    // Follow the winners down from each start.
    let next: Vec<Option<CallIx>> = children
        .iter()
        .enumerate()
        .map(|(p, k)| facts.next_of(p, k))
        .collect();
    let mut trace_of = vec![0usize; n];
    for (t, plan) in plans.iter_mut().enumerate() {
        let mut c = Some(plan.first);
        while let Some(call) = c {
            plan.calls.push(call);
            trace_of[call] = t;
            c = next[call];
        }
    }
    mark_breaks(calls, matched, &next, &facts, &mut plans);
    let counts = count_starts(calls, opts, &mut plans);
    let traces = build_traces(calls, matched, &plans, &trace_of);
    (traces, counts)
}

/// The compaction summary calls, and for each root continuing from one,
/// which. The summaries Polar made for server-side compactions are known
/// from their request; a harness's own are found from what follows. A root
/// `r` continues from summary `b` when nothing extends `b`, `r`'s prompt
/// quotes `b`'s response, `r`'s request does not keep `b`'s whole history
/// (`history::keeps_history`: then `r` went on with `b`'s conversation and
/// quotes its reply because it re-renders it), and `b` is a known summary, or `r` is not `b`'s
/// conversation (no message beyond the system prompt in common: the harness
/// summarized, then started afresh from the summary), or `b`'s reply is
/// text that `r` quotes outside its assistant turns (the harness kept the
/// start of the conversation and put the summary after it; a history that
/// was rewritten shows the reply as an assistant turn instead). `b` is the
/// call where `r`'s prompt left the earlier sequences, else the latest
/// known summary or call with a long enough response that fits.
fn summaries(
    calls: &[Call<'_>],
    matched: &[Matched],
    children: &[Vec<CallIx>],
    replies: &ReplyUse,
) -> (Vec<bool>, Vec<Option<CallIx>>) {
    let known: Vec<bool> = calls.iter().map(Call::server_compaction).collect();
    let mut summary = known.clone();
    let mut by = vec![None; calls.len()];
    for (r, m) in matched.iter().enumerate() {
        let Attach::Root(info) = m.attach else {
            continue;
        };
        let fits = |b: CallIx| {
            let text_reply = calls[b]
                .record
                .response
                .as_ref()
                .is_some_and(|resp| resp.message.tool_calls.is_empty());
            children[b].is_empty()
                && !keeps_history(&calls[r], &calls[b])
                && (known[b]
                    || !same_conversation(&calls[r], &calls[b])
                    || (text_reply && !replies.holds(r, b)))
                && quoted(calls[r].prompt, calls[b].response)
        };
        let at_divergence = info
            .divergence
            .filter(|d| d.common_prefix_len > 0 && !d.template_mismatch)
            .map(|d| d.from)
            .filter(|&b| fits(b));
        let found = at_divergence.or_else(|| {
            (0..r)
                .rev()
                .find(|&b| (known[b] || calls[b].response.len() >= MIN_SUMMARY_LEN) && fits(b))
        });
        if let Some(b) = found {
            summary[b] = true;
            by[r] = Some(b);
        }
    }
    (summary, by)
}

/// How a summary call that is a root starts: linked to where its prompt
/// left the chain, else to the latest call whose reply its request holds;
/// never to a side request (see [`Facts::may_continue`]).
fn summary_root(calls: &[Call<'_>], matched: &[Matched], facts: &Facts, c: CallIx) -> Start {
    if let Attach::Root(info) = matched[c].attach
        && let Some(d) = info
            .divergence
            .filter(|d| d.common_prefix_len > 0 && facts.may_continue(c, d.from))
    {
        return Start::Summary {
            link: d.from,
            lcp: d.common_prefix_len,
        };
    }
    match (0..c)
        .rev()
        .find(|&b| facts.replies.holds(c, b) && facts.may_continue(c, b))
    {
        Some(b) => Start::Summary {
            link: b,
            lcp: common_prefix_with(calls[c].prompt, &calls[b]),
        },
        None => Start::Root,
    }
}

/// The trace starts, in the order of their first calls: each root group's
/// winner, every losing sibling (a retry, a fork, or a summary call), and
/// summary calls that are roots.
fn trace_starts(
    calls: &[Call<'_>],
    matched: &[Matched],
    children: &[Vec<CallIx>],
    root_groups: &[Vec<CallIx>],
    facts: &Facts,
) -> Vec<Plan> {
    let mut plans: Vec<Plan> = Vec::new();
    let mut push = |first: CallIx, start: Start| {
        plans.push(Plan {
            first,
            start,
            calls: Vec::new(),
            dropped: false,
            summary: facts.summary[first],
        });
    };
    for group in root_groups {
        match facts.winner(group) {
            Some(w) => {
                push(w, Start::Root);
                for &c in group.iter().filter(|&&c| c != w) {
                    push(
                        c,
                        facts.loser(calls, c, group, Some(w), w, calls[c].prompt.len()),
                    );
                }
            }
            None => {
                for &c in group {
                    push(c, summary_root(calls, matched, facts, c));
                }
            }
        }
    }
    for (p, kids) in children.iter().enumerate() {
        let w = facts.next_of(p, kids);
        for &c in kids.iter().filter(|&&c| Some(c) != w) {
            let lcp = match matched[c].attach {
                Attach::Splice { diverged_at, .. } => diverged_at,
                _ => calls[p].seq_len(),
            };
            push(c, facts.loser(calls, c, kids, w, p, lcp));
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
    facts: &Facts,
    plans: &mut [Plan],
) {
    for plan in plans {
        let Start::Root = plan.start else { continue };
        if plan.summary {
            continue;
        }
        let Attach::Root(info) = matched[plan.first].attach else {
            continue;
        };
        if let Some(b) = facts.summarized_by[plan.first] {
            let lcp = info.divergence.filter(|d| d.from == b).map_or_else(
                || common_prefix_with(calls[plan.first].prompt, &calls[b]),
                |d| d.common_prefix_len,
            );
            plan.start = Start::Break {
                reason: BreakReason::Compaction,
                from: b,
                lcp,
            };
            continue;
        }
        let Some(d) = info
            .divergence
            .filter(|d| facts.may_continue(plan.first, d.from))
        else {
            continue;
        };
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
            Start::Root | Start::Summary { .. } => {}
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
            Start::Summary { link, lcp } => (
                SegmentKind::CompactionSummary,
                Some(link_to(link, lcp)),
                None,
            ),
        };
        let mut trace =
            build_trace(calls, matched, &plan.calls).finish(chains[t], segments[t], kind, previous);
        if let Some(label) = label {
            trace.add_label(label);
        }
        if plan.summary {
            trace.add_label(Label::CompactionSummary);
        }
        traces.push(trace);
    }
    traces.sort_by_key(|t| (t.chain, t.segment));
    traces
}

/// Why root `r`, which left `b`'s sequence after a common prefix while `b`'s
/// trace never grew again, continues `b`'s chain; `None` when it starts a
/// chain of its own. It continues it when its request keeps `b`'s whole
/// history (`history::keeps_history`: the template rendered the same
/// messages differently, a template mismatch the splice could not bridge),
/// when it is otherwise the same conversation (it shares a message beyond
/// the system prompt with `b`: the harness rewrote its history, dropping or
/// editing messages, with no summary call), or when its prompt quotes `b`'s
/// response (a summary made by `b`, then used as the new context:
/// compaction by summary).
fn break_reason(r: &Call<'_>, b: &Call<'_>) -> Option<BreakReason> {
    if keeps_history(r, b) {
        Some(BreakReason::TemplateMismatch)
    } else if same_conversation(r, b) {
        Some(BreakReason::RewrittenHistory)
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
                Start::Retry { link, .. } | Start::Summary { link, .. } => trace_of[link],
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
                shape,
                ..
            } => (
                call.prompt.get(resumed_from..).unwrap_or_default(),
                Join::Splice {
                    diverged_at,
                    resumed_from,
                    shape: Some(shape),
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
