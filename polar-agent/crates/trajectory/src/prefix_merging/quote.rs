//! Whether a prompt quotes an earlier call's response: how a continuation
//! after rewritten history, or a context rebuilt from a summary, is told
//! apart from a retry or an unrelated conversation. Token ids only.

use super::tree::common_prefix_len;
use crate::calls::Call;

/// Tokens of a response that must reappear to count as quoted.
const WINDOW: usize = 8;
/// Responses shorter than this quote nothing.
const MIN_TAIL: usize = 3;

/// Whether `haystack` holds the end of `response`: its last tokens,
/// the final (end-of-turn) token included. A template re-rendering the turn
/// in history ends it with the same token; a tool result quoting the text
/// does not.
pub(super) fn tail_quoted(haystack: &[u32], response: &[u32]) -> bool {
    if response.len() < MIN_TAIL {
        return false;
    }
    let tail = &response[response.len() - response.len().min(WINDOW)..];
    contains(haystack, tail)
}

/// Whether `haystack` holds the middle of `response` (responses of at least
/// two windows) or its end ([`tail_quoted`]).
pub(super) fn quoted(haystack: &[u32], response: &[u32]) -> bool {
    if response.len() >= 2 * WINDOW {
        let mid = response.len() / 2 - WINDOW / 2;
        if contains(haystack, &response[mid..mid + WINDOW]) {
            return true;
        }
    }
    tail_quoted(haystack, response)
}

fn contains(haystack: &[u32], needle: &[u32]) -> bool {
    let Some((&first, _)) = needle.split_first() else {
        return true;
    };
    haystack
        .iter()
        .enumerate()
        .filter(|&(_, &t)| t == first)
        .any(|(i, _)| haystack.get(i..i + needle.len()) == Some(needle))
}

/// Length of the longest common prefix of `prompt` and `x`'s prompt +
/// response.
pub(super) fn common_prefix_with(prompt: &[u32], x: &Call<'_>) -> usize {
    let p = common_prefix_len(prompt, x.prompt);
    if p < x.prompt.len() {
        return p;
    }
    p + common_prefix_len(&prompt[p..], x.response)
}
