//! The invariants every trajectory satisfies against the records it was
//! built from, checked by tests and before export:
//!
//! 1. `loss_mask` and `response_logprobs` have the length of `response_ids`;
//!    the mask holds only 0 and 1.
//! 2. The [`CallSpan`](super::types::CallSpan)s tile `response_ids`: glue
//!    (loss 0, logprob 0.0) then the call's generated tokens, equal to the
//!    record's, with loss 1 and, when the trace has logprobs, exactly the
//!    backend's logprob for each (bit for bit). A trace lacks logprobs only
//!    when one of its calls does.
//! 3. Joins: the first call's prompt is `prompt_ids`. An `Extend` call's
//!    prompt starts with the previous call's prompt + response and the glue
//!    is the rest of it. Hence, for every call up to the first splice,
//!    `prompt_ids + response_ids` starts with that call's prompt + response
//!    (checked directly too): each loss-1 token follows exactly the context
//!    the model saw. The adapted invariant of a `Splice { diverged_at: d,
//!    resumed_from: k }` call: its prompt equals the previous call's prompt +
//!    response on exactly its first `d` tokens, `k >= d`, and the glue is
//!    its prompt from `k` on; so every trace token is, in order, a token of
//!    some merged call's server-side prompt or response, never invented.
//! 4. Every record's call is in exactly one trace or listed once as dropped,
//!    with a reason; traces hold no unknown call.
//! 5. The statistics count the records and the traces.
//! 6. Each span's `off_policy_context_tokens` is 0 for the first call,
//!    the previous span's after an `Extend`, and after a `Splice` the
//!    previous span's plus what the splice left of the earlier turn (see
//!    `off_policy`); the trace's metadata and the statistics hold their
//!    sums.

use std::collections::HashMap;

use polar_record::CompletionRecord;

use super::off_policy::splice_drift;
use super::types::{Join, Trace, Trajectory};

/// A broken invariant.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvariantViolation {
    /// `loss_mask` or `response_logprobs` differs in length from
    /// `response_ids`.
    #[error("trace {trace}: {what} has {got} entries for {expected} response tokens")]
    Length {
        /// The trace's index.
        trace: usize,
        /// Which vector.
        what: &'static str,
        /// Length of `response_ids`.
        expected: usize,
        /// Its length.
        got: usize,
    },
    /// The mask holds a value other than 0 and 1.
    #[error("trace {trace}: loss mask value {value} at {index}")]
    MaskValue {
        /// The trace's index.
        trace: usize,
        /// Position.
        index: usize,
        /// The value.
        value: u8,
    },
    /// The spans do not describe the trace: none, not one per call, or not
    /// tiling `response_ids`.
    #[error("trace {trace}: spans do not tile the response: {detail}")]
    Spans {
        /// The trace's index.
        trace: usize,
        /// What is wrong.
        detail: String,
    },
    /// A call's tokens, mask or logprobs in the trace differ from its record.
    #[error("trace {trace}, call {call_id}: {detail}")]
    CallTokens {
        /// The trace's index.
        trace: usize,
        /// The call.
        call_id: String,
        /// What differs.
        detail: String,
    },
    /// A call's prompt does not relate to the trace as its join says.
    #[error("trace {trace}, call {call_id}: join broken: {detail}")]
    Join {
        /// The trace's index.
        trace: usize,
        /// The call.
        call_id: String,
        /// What differs.
        detail: String,
    },
    /// A trace or drop entry names a call no record has.
    #[error("unknown call {0}")]
    UnknownCall(String),
    /// A call is in two traces, twice in one, or both in a trace and dropped.
    #[error("call {0} is placed more than once")]
    PlacedTwice(String),
    /// A record's call is in no trace and not dropped.
    #[error("call {0} is in no trace and not reported as dropped")]
    Missing(String),
    /// Two records share a call id.
    #[error("two records share call id {0}")]
    DuplicateRecord(String),
    /// The statistics disagree with the records or traces.
    #[error("statistics: {0}")]
    Stats(String),
}

/// Checks `traj` against the `records` it was built from.
pub fn check(traj: &Trajectory, records: &[CompletionRecord]) -> Result<(), InvariantViolation> {
    let mut by_id: HashMap<&str, &CompletionRecord> = HashMap::with_capacity(records.len());
    for r in records {
        if by_id.insert(&r.call_id, r).is_some() {
            return Err(InvariantViolation::DuplicateRecord(r.call_id.clone()));
        }
    }
    let mut placed: HashMap<&str, ()> = HashMap::with_capacity(records.len());
    let mut place = |id: &str| -> Result<(), InvariantViolation> {
        let Some((&key, _)) = by_id.get_key_value(id) else {
            return Err(InvariantViolation::UnknownCall(id.to_owned()));
        };
        if placed.insert(key, ()).is_some() {
            return Err(InvariantViolation::PlacedTwice(id.to_owned()));
        }
        Ok(())
    };
    for (ti, trace) in traj.traces.iter().enumerate() {
        for id in &trace.call_ids {
            place(id)?;
        }
        check_trace(ti, trace, &by_id)?;
    }
    for d in &traj.stats.calls_dropped {
        place(&d.call_id)?;
    }
    if let Some(r) = records
        .iter()
        .find(|r| !placed.contains_key(r.call_id.as_str()))
    {
        return Err(InvariantViolation::Missing(r.call_id.clone()));
    }
    let off_policy: usize = traj
        .traces
        .iter()
        .map(|t| t.metadata.off_policy_context_tokens)
        .sum();
    if traj.stats.off_policy_context_tokens != off_policy {
        return Err(InvariantViolation::Stats(format!(
            "{} off-policy context tokens counted, the traces hold {off_policy}",
            traj.stats.off_policy_context_tokens
        )));
    }
    if traj.stats.calls != records.len() || traj.stats.segments != traj.traces.len() {
        return Err(InvariantViolation::Stats(format!(
            "{} calls and {} segments counted for {} records and {} traces",
            traj.stats.calls,
            traj.stats.segments,
            records.len(),
            traj.traces.len()
        )));
    }
    Ok(())
}

fn ids(r: &CompletionRecord) -> (&[u32], &[u32]) {
    (
        r.prompt_token_ids.as_deref().unwrap_or_default(),
        r.response_token_ids.as_deref().unwrap_or_default(),
    )
}

/// Whether the concatenation `a + b` has `x` at offset `at`.
fn concat_has(a: &[u32], b: &[u32], at: usize, x: &[u32]) -> bool {
    let end = at + x.len();
    if end > a.len() + b.len() {
        return false;
    }
    // Where `a` ends, clamped to the compared range.
    let split = a.len().clamp(at, end);
    let (xa, xb) = x.split_at(split - at);
    let in_a = a
        .get(at.min(a.len())..split.min(a.len()))
        .unwrap_or_default();
    let b_from = split.saturating_sub(a.len());
    let in_b = b.get(b_from..b_from + xb.len()).unwrap_or_default();
    in_a == xa && in_b == xb
}

fn check_trace(
    ti: usize,
    trace: &Trace,
    by_id: &HashMap<&str, &CompletionRecord>,
) -> Result<(), InvariantViolation> {
    check_lengths(ti, trace)?;
    let n = trace.response_ids.len();
    let spans_err = |detail: String| InvariantViolation::Spans { trace: ti, detail };
    if trace.spans.is_empty() || trace.spans.len() != trace.call_ids.len() {
        return Err(spans_err(format!(
            "{} spans for {} calls",
            trace.spans.len(),
            trace.call_ids.len()
        )));
    }
    let mut offset = 0;
    let mut any_without_logprobs = false;
    let mut spliced = false;
    let mut prev: Option<&CompletionRecord> = None;
    let mut off_policy = 0;
    for (id, span) in trace.call_ids.iter().zip(&trace.spans) {
        let rec = by_id
            .get(id.as_str())
            .ok_or_else(|| InvariantViolation::UnknownCall(id.clone()))?;
        let response = ids(rec).1;
        let start = span.response_start;
        let end = start + span.response_len;
        if start < offset || end > n || span.response_len != response.len() {
            return Err(spans_err(format!(
                "call {id} at {start}..{end} after {offset}"
            )));
        }
        let call = PlacedCall {
            ti,
            trace,
            id,
            rec,
            offset,
            start,
            end,
        };
        any_without_logprobs |= call.check_tokens()?;
        spliced |= matches!(span.join, Join::Splice { .. });
        call.check_join(span.join, prev)?;
        call.check_trace_prefix(spliced)?;
        off_policy = call.check_off_policy(span, prev, off_policy)?;
        offset = end;
        prev = Some(rec);
    }
    if offset != n {
        return Err(spans_err(format!(
            "{} tokens after the last call",
            n - offset
        )));
    }
    let sum: usize = trace
        .spans
        .iter()
        .map(|s| s.off_policy_context_tokens)
        .sum();
    if trace.metadata.off_policy_context_tokens != sum {
        return Err(spans_err(format!(
            "metadata counts {} off-policy context tokens, the spans {sum}",
            trace.metadata.off_policy_context_tokens
        )));
    }
    if trace.response_logprobs.is_none() && !any_without_logprobs {
        return Err(InvariantViolation::CallTokens {
            trace: ti,
            call_id: trace.call_ids.first().cloned().unwrap_or_default(),
            detail: "trace lost the logprobs all its calls have".to_owned(),
        });
    }
    Ok(())
}

/// Invariant 1 for trace `ti`: the lengths of `loss_mask` and
/// `response_logprobs`, and the mask's values.
fn check_lengths(ti: usize, trace: &Trace) -> Result<(), InvariantViolation> {
    let n = trace.response_ids.len();
    let length = |what, got| InvariantViolation::Length {
        trace: ti,
        what,
        expected: n,
        got,
    };
    if trace.loss_mask.len() != n {
        return Err(length("loss_mask", trace.loss_mask.len()));
    }
    if let Some(lp) = &trace.response_logprobs
        && lp.len() != n
    {
        return Err(length("response_logprobs", lp.len()));
    }
    if let Some((index, &value)) = trace.loss_mask.iter().enumerate().find(|(_, m)| **m > 1) {
        return Err(InvariantViolation::MaskValue {
            trace: ti,
            index,
            value,
        });
    }
    Ok(())
}

/// One call of trace `ti`, its span checked to lie within the trace: its
/// glue is `response_ids[offset..start]`, its generated tokens
/// `response_ids[start..end]`.
struct PlacedCall<'a> {
    ti: usize,
    trace: &'a Trace,
    id: &'a str,
    rec: &'a CompletionRecord,
    offset: usize,
    start: usize,
    end: usize,
}

impl PlacedCall<'_> {
    fn call_err(&self, detail: &str) -> InvariantViolation {
        InvariantViolation::CallTokens {
            trace: self.ti,
            call_id: self.id.to_owned(),
            detail: detail.to_owned(),
        }
    }

    fn join_err(&self, detail: &str) -> InvariantViolation {
        InvariantViolation::Join {
            trace: self.ti,
            call_id: self.id.to_owned(),
            detail: detail.to_owned(),
        }
    }

    /// Invariant 2 for this call: its generated tokens, the mask and the
    /// logprobs of its glue and tokens. Whether it lacks logprobs in a
    /// trace without them.
    fn check_tokens(&self) -> Result<bool, InvariantViolation> {
        let (trace, rec) = (self.trace, self.rec);
        let (offset, start, end) = (self.offset, self.start, self.end);
        if trace.response_ids[start..end] != *ids(rec).1 {
            return Err(self.call_err("generated tokens differ from the record"));
        }
        if trace.loss_mask[offset..start].iter().any(|&m| m != 0) {
            return Err(self.call_err("glue has loss 1"));
        }
        if trace.loss_mask[start..end].iter().any(|&m| m != 1) {
            return Err(self.call_err("a generated token has loss 0"));
        }
        match (&trace.response_logprobs, rec.response_logprobs.as_deref()) {
            (Some(lp), Some(want)) => {
                if lp[offset..start].iter().any(|&x| x != 0.0) {
                    return Err(self.call_err("glue has a non-zero logprob"));
                }
                let same = lp[start..end].len() == want.len()
                    && lp[start..end]
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                if !same {
                    return Err(self.call_err("logprobs differ from the backend's"));
                }
                Ok(false)
            }
            (Some(_), None) => Err(self.call_err("trace has logprobs the record lacks")),
            (None, _) => Ok(rec.response_logprobs.is_none()),
        }
    }

    /// Invariant 3 for this call: its prompt and glue against the previous
    /// call `prev` as `join` says.
    fn check_join(
        &self,
        join: Join,
        prev: Option<&CompletionRecord>,
    ) -> Result<(), InvariantViolation> {
        let prompt = ids(self.rec).0;
        let glue = &self.trace.response_ids[self.offset..self.start];
        match (join, prev) {
            (Join::First, None) => {
                if self.trace.prompt_ids != *prompt || self.offset != self.start {
                    return Err(self.join_err("first call's prompt is not the trace's prompt"));
                }
            }
            (Join::Extend, Some(p)) => {
                let (pp, pr) = ids(p);
                let s = pp.len() + pr.len();
                if prompt.len() < s || prompt[..pp.len()] != *pp || prompt[pp.len()..s] != *pr {
                    return Err(
                        self.join_err("prompt does not extend the previous prompt + response")
                    );
                }
                if glue != &prompt[s..] {
                    return Err(self.join_err("glue is not the rest of the prompt"));
                }
            }
            (
                Join::Splice {
                    diverged_at: d,
                    resumed_from: k,
                    ..
                },
                Some(p),
            ) => {
                let (pp, pr) = ids(p);
                let s = pp.len() + pr.len();
                let shared = d < s
                    && d <= k
                    && k <= prompt.len()
                    && concat_has(pp, pr, 0, &prompt[..d])
                    && (d == prompt.len() || !concat_has(pp, pr, d, &prompt[d..=d]));
                if !shared {
                    return Err(self.join_err(
                        "prompt does not diverge from the previous sequence where recorded",
                    ));
                }
                if glue != &prompt[k..] {
                    return Err(self.join_err("glue is not the prompt after the re-rendered turn"));
                }
            }
            _ => return Err(self.join_err("first call of the trace is not the first span")),
        }
        Ok(())
    }

    /// Invariant 6 for this call: its span's off-policy context count,
    /// given the previous span's (`before`); returns it.
    fn check_off_policy(
        &self,
        span: &super::types::CallSpan,
        prev: Option<&CompletionRecord>,
        before: usize,
    ) -> Result<usize, InvariantViolation> {
        let want = match (span.join, prev) {
            (
                Join::Splice {
                    diverged_at,
                    resumed_from,
                    ..
                },
                Some(p),
            ) => {
                let (pp, pr) = ids(p);
                before + splice_drift(pp, pr, ids(self.rec).0, diverged_at, resumed_from)
            }
            (Join::First, _) => 0,
            _ => before,
        };
        if span.off_policy_context_tokens != want {
            return Err(self.join_err(&format!(
                "{} off-policy context tokens recorded, {want} follow from the joins",
                span.off_policy_context_tokens
            )));
        }
        Ok(want)
    }

    /// Invariant 3, checked directly: up to the first splice (`spliced`:
    /// this call or an earlier one is one), the trace starts with this
    /// call's prompt + response.
    fn check_trace_prefix(&self, spliced: bool) -> Result<(), InvariantViolation> {
        let (prompt, response) = ids(self.rec);
        let (tp, tr) = (&self.trace.prompt_ids, &self.trace.response_ids);
        let exact = spliced
            || (concat_has(tp, tr, 0, prompt) && concat_has(tp, tr, prompt.len(), response));
        if !exact {
            return Err(self.join_err("trace does not start with the call's prompt + response"));
        }
        Ok(())
    }
}
