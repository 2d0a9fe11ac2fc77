//! The `prefix_merging` builder: calls whose server-side prompt extends an
//! earlier call's prompt + response merge into one trace; the earlier
//! response keeps loss 1 and its logprobs, the tokens in between (tool
//! results, template glue) get loss 0, the new response loss 1.
//!
//! Real sessions are not one clean chain, and each deviation is handled,
//! labelled and counted, never silently dropped:
//!
//! - **Retries** (the same prompt twice, or two prompts extending the same
//!   call): the sibling that later calls extend wins (then the one whose
//!   reply a later request holds); the other is a superseded retry,
//!   delivered as its own trace labelled `superseded_retry` (or dropped with
//!   that reason, per [`RetryPolicy`](super::options::RetryPolicy)); counted
//!   in `retries_superseded` either way. A call whose reply the harness went
//!   on with (a later request answers its tool calls or repeats its text) is
//!   never a retry: it forks. Identical records (same prompt and response)
//!   are interchangeable: the earliest stays in the chain.
//! - **Compaction by summary** (the harness asks for a summary, then starts
//!   a new conversation from it): the summary call gets its own segment,
//!   `CompactionSummary`, labelled `compaction_summary`, branching from the
//!   call it followed; the new conversation continues the chain after a
//!   `Compaction` break linked to the summary. Summary calls Polar itself
//!   made (server-side compaction) are labelled the same way.
//! - **Breaks** (compaction, rewritten history, template mismatch): a new
//!   segment of the same chain, `AfterBreak { reason }`, linked to the
//!   segment it left with the length of the common prefix. The reason is
//!   `Compaction` only after a summary call (the harness's, or Polar's for a
//!   server-side compaction); a request that keeps the earlier call's whole
//!   history, rendered into different tokens, is a `TemplateMismatch`; one
//!   that drops or edits earlier messages without a summary is
//!   `RewrittenHistory`. No chain continues from a side request (no tools
//!   offered in a session that offers them, or structured output): a title
//!   call that came first never starts the main chain.
//! - **Parallel sub-agents**: each call goes to the chain whose sequence is
//!   the longest prefix of its prompt (one walk of a radix tree over all
//!   earlier sequences), so interleaved chains stay apart; each chain's role
//!   (`main`, `sub_agent`, `side`) is decided afterwards by what its calls
//!   are (see `roles`). A sibling that is extended on its own forks a new
//!   chain labelled `forked`.
//! - **Template mismatches** (history re-rendered without the reasoning the
//!   model generated, think glue only in the generation prompt, echoed
//!   whitespace merged with the template's newline): detected
//!   and counted (`template_mismatches_detected`). With the template's
//!   [`TemplateInfo`](super::template::TemplateInfo) and splicing on, a call
//!   is spliced onto the earlier call `B` whose sequence `S = P_B + R_B` it
//!   leaves at `d` when: `R_B` holds an end-of-turn token only as its last
//!   token; either `d < |P_B|`, `P_B[d]` is a think token and `P_B[d..]` has
//!   no end-of-turn token (generation-only glue), or `d >= |P_B|` and
//!   `R_B[d - |P_B|..]` holds a think token (reasoning stripped from
//!   history, usually `d == |P_B|`), or `d >= |P_B| - 1` and `S[d]` and
//!   `P_C[d]` are both whitespace tokens (whitespace content the harness
//!   echoed merged with the template's newline, one token before `R_B`
//!   began or after `</think>`); and the new prompt has an end-of-turn
//!   token at some `k >= d` (the re-rendered turn is closed). Retried
//!   replies to one prompt all fit that shape; the splice goes onto the one
//!   whose end (answer, tool calls) the re-rendered turn `P_C[d..k]` shows
//!   (the longest common suffix), ties to the latest. The trace then
//!   goes on, after `R_B` as generated (loss 1), with the new prompt from
//!   `k + 1` (from `k` when `R_B` has no end-of-turn token of its own, as
//!   after a length cut), loss 0, then the new response (loss 1); the join
//!   is recorded as `Join::Splice { diverged_at: d, resumed_from, shape }`
//!   and counted by shape (`template_splices_by_shape`). Every loss-1
//!   token is one the model generated, with its logprob, but a call after a
//!   splice saw the template's re-rendering of the earlier turns where the
//!   trace holds what was generated: each span says by how many tokens
//!   (`off_policy_context_tokens`, see `off_policy`). Otherwise (ids unknown,
//!   splicing off, or the shape above not met, e.g. a re-serialized tool
//!   call or a rewrite of an older turn), a divergence inside the earlier
//!   call's last turn or at a think token (without ids: inside its response
//!   or its last few prompt tokens) starts a new segment
//!   `AfterBreak { TemplateMismatch }` linked to that call's segment.
//! - **Length cuts** (finish reason `length`): kept with loss 1, labelled
//!   `truncated`; calls extending them merge normally.
//! - **Calls without ids, failed calls**: dropped with the reason; a later
//!   call extending them merges with the call before, their tokens becoming
//!   glue (loss 0).

mod assemble;
mod history;
mod matching;
mod quote;
mod replies;
mod tree;

use polar_record::CompletionRecord;

use super::calls::usable;
use super::options::PrefixMergingOptions;
use super::stats::ReconstructionStats;
use super::types::Trace;

/// Merges the calls of a session into traces.
pub fn build(
    records: &[CompletionRecord],
    opts: &PrefixMergingOptions,
) -> (Vec<Trace>, ReconstructionStats) {
    let (calls, mut dropped) = usable(records);
    let matched = matching::match_calls(&calls, opts);
    let (traces, counts) = assemble::assemble(&calls, &matched, opts);
    dropped.extend(counts.dropped);
    let mut stats = ReconstructionStats {
        calls: records.len(),
        resumed_calls: records.iter().filter(|r| r.resumed.is_some()).count(),
        calls_dropped: dropped,
        retries_superseded: counts.retries_superseded,
        forks: counts.forks,
        breaks: counts.breaks,
        template_mismatches_detected: matched.iter().filter(|m| m.template_mismatch).count(),
        ..ReconstructionStats::default()
    };
    stats.tally(&traces);
    (traces, stats)
}
