//! The `per_request` builder: one trace per usable call, its prompt as the
//! trace's prompt and its generated tokens with loss 1. Lossless and simple,
//! but a multi-turn session repeats its prefix in every trace (quadratic
//! tokens). Calls without token ids or that failed are dropped with their
//! reason, never re-tokenized.

use polar_record::CompletionRecord;

use super::calls::usable;
use super::stats::ReconstructionStats;
use super::trace_buf::TraceBuf;
use super::types::{ChainId, SegmentKind, Trace};

/// One trace per call; each trace is its own chain.
pub fn build(records: &[CompletionRecord]) -> (Vec<Trace>, ReconstructionStats) {
    let (calls, dropped) = usable(records);
    let mut traces = Vec::with_capacity(calls.len());
    for (i, call) in calls.into_iter().enumerate() {
        let chain = ChainId(u32::try_from(i).unwrap_or(u32::MAX));
        traces.push(TraceBuf::new(call).finish(chain, 0, SegmentKind::Start, None));
    }
    let mut stats = ReconstructionStats {
        calls: records.len(),
        resumed_calls: records.iter().filter(|r| r.resumed.is_some()).count(),
        calls_dropped: dropped,
        ..ReconstructionStats::default()
    };
    stats.tally(&traces);
    (traces, stats)
}
