//! How far a trace's context is from what the model saw: for a call joined
//! by a template splice, the tokens of the trace before its response that
//! are not the prompt the backend saw for it (see
//! [`CallSpan::off_policy_context_tokens`](super::types::CallSpan)).
//!
//! A call `C` spliced onto the previous call `B` of its trace (sequence
//! `S = P_B + R_B`) shares `S[..d]` with its prompt `P_C`, which then holds
//! the template's re-rendering `P_C[d..k]` of the turn the trace keeps as
//! generated, `S[d..]`, and goes on with the glue `P_C[k..]` the trace holds
//! too. The two sides meet again at their longest common suffix (a template
//! that strips reasoning or whitespace keeps the end of the turn: the
//! answer, the tool calls, the end-of-turn token). Before it, the trace
//! holds `a` tokens the model did not see there and the model saw `b`
//! tokens the trace does not hold; the join counts `max(a, b)` (at least
//! that many positions of the context differ, whichever way the two
//! stretches line up). An extension adds nothing, but carries on what
//! earlier joins left: every later call of the trace sees the trace's
//! context through the same re-renderings. Pure arithmetic on slices, no
//! allocation.

/// How many context tokens a splice makes differ: `S[d..]` (the previous
/// call's sequence `prev_prompt + prev_response` from `diverged_at` on, as
/// the trace holds it) against `prompt[d..resumed_from]` (the spliced
/// call's re-rendering of that stretch), each less their longest common
/// suffix; the longer of the two rests.
pub(crate) fn splice_drift(
    prev_prompt: &[u32],
    prev_response: &[u32],
    prompt: &[u32],
    diverged_at: usize,
    resumed_from: usize,
) -> usize {
    let n = prev_prompt.len();
    let kept_prompt = prev_prompt.get(diverged_at..).unwrap_or_default();
    let kept_response = prev_response
        .get(diverged_at.saturating_sub(n)..)
        .unwrap_or_default();
    let rerendered = prompt
        .get(diverged_at..resumed_from.max(diverged_at))
        .unwrap_or_default();
    let kept = kept_prompt.len() + kept_response.len();
    let common = kept_response
        .iter()
        .rev()
        .chain(kept_prompt.iter().rev())
        .zip(rerendered.iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    (kept - common).max(rerendered.len() - common)
}

#[cfg(test)]
mod tests {
    use super::splice_drift;

    /// Reasoning dropped from the history: the think block and the
    /// whitespace after it are the difference, the answer and end-of-turn
    /// token are shared.
    #[test]
    fn stripped_reasoning_counts_the_dropped_block() {
        let p = [1, 2, 3];
        let r = [10, 11, 12, 13, 14, 20, 21, 99];
        let next = [1, 2, 3, 20, 21, 99, 5, 6];
        assert_eq!(splice_drift(&p, &r, &next, 3, 6), 5);
    }

    /// A divergence inside the previous prompt (generation-only glue, a
    /// merged whitespace token) counts the prompt's tail too.
    #[test]
    fn divergence_in_the_generation_prompt() {
        let p = [1, 2, 3, 7];
        let r = [10, 20, 99];
        let next = [1, 2, 3, 8, 20, 99, 5];
        assert_eq!(splice_drift(&p, &r, &next, 3, 6), 2);
    }

    /// Nothing in common after the divergence: the longer stretch, on
    /// either side.
    #[test]
    fn no_common_suffix() {
        let p = [1, 2];
        let r = [10, 11];
        let next = [1, 2, 30, 31, 32, 99, 4];
        assert_eq!(splice_drift(&p, &r, &next, 2, 6), 4);
        let next = [1, 2, 30, 99];
        assert_eq!(splice_drift(&p, &r, &next, 2, 3), 2);
        // A suffix match never counts below zero nor past the re-rendering.
        let next = [1, 11, 99];
        assert_eq!(splice_drift(&p, &r, &next, 1, 2), 2);
    }

    /// Tokens the model saw that the trace lacks count too (a re-rendering
    /// that inserts an empty think block before the answer).
    #[test]
    fn inserted_tokens_count() {
        let p = [1, 2];
        let r = [20, 99];
        let next = [1, 2, 3, 4, 20, 99, 5];
        assert_eq!(splice_drift(&p, &r, &next, 2, 6), 2);
    }
}
