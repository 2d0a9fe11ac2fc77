//! What a builder reports about its reconstruction: counts of what it
//! merged, split, spliced and superseded, and every call it could not use,
//! each with its reason. Nothing is dropped without an entry here.

use serde::{Deserialize, Serialize};

/// Counts and reasons of one reconstruction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconstructionStats {
    /// Records given to the builder.
    pub calls: usize,
    /// Distinct chains among the traces.
    pub chains: usize,
    /// Traces delivered (segments of all chains, superseded retries included).
    pub segments: usize,
    /// Calls that joined a trace started by an earlier call.
    pub calls_merged: usize,
    /// Calls in no trace, with the reason.
    pub calls_dropped: Vec<DroppedCall>,
    /// Calls superseded by a retry (delivered alone or dropped, per the
    /// builder's retry policy).
    pub retries_superseded: usize,
    /// Chains forked from another chain's call.
    pub forks: usize,
    /// Segments started by a break in the prefix.
    pub breaks: usize,
    /// Calls whose prompt re-rendered the previous assistant turn differently
    /// from what the model generated (spliced or not).
    pub template_mismatches_detected: usize,
    /// Joins made by a template splice.
    pub template_mismatches_spliced: usize,
    /// The splices by the mismatch they bridged (absent in files written
    /// before it existed).
    #[serde(default)]
    pub template_splices_by_shape: SpliceCounts,
    /// Calls kept although cut by the token limit.
    pub truncated_calls: usize,
    /// Tokens of all traces' `prompt_ids`.
    pub prompt_tokens: usize,
    /// Tokens of all traces' `response_ids`.
    pub response_tokens: usize,
    /// Tokens with loss 1.
    pub loss_tokens: usize,
    /// Earlier attempts of the session set apart on its node
    /// ([`crate::SessionMeta::superseded_attempts`]): none of their calls
    /// is in this trajectory.
    #[serde(default)]
    pub superseded_attempts: usize,
    /// Calls whose reply went on after a backend fault (their record's
    /// `resumed`): their tokens come from two or more replicas, possibly
    /// on both sides of a weight update (`resumed.weight_versions`).
    #[serde(default)]
    pub resumed_calls: usize,
    /// Joins whose call saw a prompt other than the trace's context before
    /// its response (spans with `off_policy_context_tokens > 0`: a splice,
    /// and every later call of its trace).
    #[serde(default)]
    pub off_policy_joins: usize,
    /// The traces' `off_policy_context_tokens`, summed.
    #[serde(default)]
    pub off_policy_context_tokens: usize,
}

/// Template splices counted by [`SpliceShape`](super::types::SpliceShape).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpliceCounts {
    /// Think glue of the generation prompt left out of the history.
    #[serde(default)]
    pub generation_glue: usize,
    /// Reasoning dropped or rewritten in the history.
    #[serde(default)]
    pub stripped_reasoning: usize,
    /// Echoed whitespace merged with the template's newline.
    #[serde(default)]
    pub whitespace_merge: usize,
}

impl ReconstructionStats {
    /// Prompt plus response tokens of all traces: what training reads.
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens + self.response_tokens
    }
}

/// A call left out of every trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DroppedCall {
    /// The call.
    pub call_id: String,
    /// Why.
    pub reason: DropReason,
}

/// Why a call is in no trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DropReason {
    /// The backend gave no token ids; they are never re-created from text.
    TokenIdsMissing,
    /// The call failed.
    CallFailed {
        /// Which side failed (`harness`, `backend`, `agent`).
        side: String,
        /// The error.
        error: String,
    },
    /// The record's logprobs do not match its response ids in length.
    LogprobsLengthMismatch {
        /// Response tokens.
        response_len: usize,
        /// Logprobs.
        logprobs_len: usize,
    },
    /// A retry superseded the call and the retry policy drops such calls.
    SupersededRetry,
}

impl ReconstructionStats {
    /// Fills the counts that follow from the delivered traces: chains,
    /// segments, merged calls, truncated calls, splices and token totals.
    pub(crate) fn tally(&mut self, traces: &[super::types::Trace]) {
        use super::types::{Join, Label, SpliceShape};
        let mut chains: Vec<_> = traces.iter().map(|t| t.chain).collect();
        chains.sort_unstable();
        chains.dedup();
        self.chains = chains.len();
        self.segments = traces.len();
        self.calls_merged = traces
            .iter()
            .map(|t| t.call_ids.len().saturating_sub(1))
            .sum();
        self.template_mismatches_spliced = traces
            .iter()
            .flat_map(|t| &t.spans)
            .filter(|s| matches!(s.join, Join::Splice { .. }))
            .count();
        self.template_splices_by_shape = SpliceCounts::default();
        for span in traces.iter().flat_map(|t| &t.spans) {
            let Join::Splice { shape, .. } = span.join else {
                continue;
            };
            let c = &mut self.template_splices_by_shape;
            match shape {
                Some(SpliceShape::GenerationGlue) => c.generation_glue += 1,
                Some(SpliceShape::StrippedReasoning) => c.stripped_reasoning += 1,
                Some(SpliceShape::WhitespaceMerge) => c.whitespace_merge += 1,
                None => {}
            }
        }
        self.off_policy_joins = traces
            .iter()
            .flat_map(|t| &t.spans)
            .filter(|s| s.off_policy_context_tokens > 0)
            .count();
        self.off_policy_context_tokens = traces
            .iter()
            .map(|t| t.metadata.off_policy_context_tokens)
            .sum();
        self.truncated_calls = traces
            .iter()
            .filter(|t| t.has_label(Label::Truncated))
            .flat_map(|t| &t.spans)
            .filter(|s| s.truncated)
            .count();
        self.prompt_tokens = traces.iter().map(|t| t.prompt_ids.len()).sum();
        self.response_tokens = traces.iter().map(|t| t.response_ids.len()).sum();
        self.loss_tokens = traces.iter().map(super::types::Trace::loss_tokens).sum();
    }
}
