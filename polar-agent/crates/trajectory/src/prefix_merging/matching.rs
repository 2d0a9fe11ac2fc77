//! First pass of prefix merging: for each call, in order, what it attaches
//! to. The call's server-side prompt is walked down the [`PrefixTree`] of
//! all earlier calls' prompt + response sequences, then:
//!
//! 1. same prompt as an earlier call: it attaches exactly as that call did
//!    (a retry; the second pass decides which one the chain keeps);
//! 2. a template splice onto a call whose sequence it leaves deeper than any
//!    plain extension reaches (see [`splice_rule`]);
//! 3. a plain extension of the longest earlier sequence that is a prefix of
//!    its prompt, unless the prompt after that sequence quotes the end of
//!    the turn of another call extending the same sequence: then the harness
//!    rewrote the history before that turn and kept it, and the call is a
//!    root that left that sibling (not a retry of it);
//! 4. otherwise a root, with the point where it left the earlier sequences
//!    (the second pass tells a break from a new chain).

use crate::calls::Call;
use crate::options::PrefixMergingOptions;
use crate::template::TemplateInfo;
use crate::types::SpliceShape;

use super::quote::{common_prefix_with, tail_quoted};
use super::tree::{CallIx, PrefixTree, Walk};

/// Without template ids, a divergence this close to the end of the earlier
/// prompt (or inside its response) is taken for a template mismatch.
const GLUE_WINDOW: usize = 16;

/// What a call attaches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Attach {
    /// Its prompt extends nothing (a new chain, or a segment after a break).
    Root(RootInfo),
    /// Its prompt extends `parent`'s prompt + response.
    Extend { parent: CallIx },
    /// Its prompt re-renders `parent`'s last turn; see [`splice_rule`].
    Splice {
        parent: CallIx,
        diverged_at: usize,
        resumed_from: usize,
        shape: SpliceShape,
    },
}

impl Attach {
    /// The call this one continues.
    pub fn parent(&self) -> Option<CallIx> {
        match *self {
            Self::Root(_) => None,
            Self::Extend { parent } | Self::Splice { parent, .. } => Some(parent),
        }
    }
}

/// What is known about a root call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RootInfo {
    /// The earliest earlier root with the same prompt.
    pub same_prompt_as: Option<CallIx>,
    /// Where its prompt left the earlier sequences.
    pub divergence: Option<Divergence>,
}

/// Where a root's prompt left the earlier sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Divergence {
    /// The latest call sharing the longest prefix with the prompt.
    pub from: CallIx,
    /// That prefix's length.
    pub common_prefix_len: usize,
    /// The divergence has the shape of a template mismatch.
    pub template_mismatch: bool,
}

/// The first pass's verdict on a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Matched {
    pub attach: Attach,
    /// The prompt re-rendered an earlier assistant turn (spliced or not).
    pub template_mismatch: bool,
}

/// Attaches every call, in order.
pub(super) fn match_calls(calls: &[Call<'_>], opts: &PrefixMergingOptions) -> Vec<Matched> {
    let mut tree = PrefixTree::new(calls);
    let mut out: Vec<Matched> = Vec::with_capacity(calls.len());
    let mut children: Vec<Vec<CallIx>> = vec![Vec::new(); calls.len()];
    for (i, call) in calls.iter().enumerate() {
        let walk = tree.walk(call.prompt);
        let verdict = decide(&tree, &walk, calls, call, opts, &out, &children);
        tree.insert(&walk, i);
        if let Some(p) = verdict.attach.parent() {
            children[p].push(i);
        }
        out.push(verdict);
    }
    out
}

fn decide(
    tree: &PrefixTree<'_, '_>,
    walk: &Walk,
    calls: &[Call<'_>],
    call: &Call<'_>,
    opts: &PrefixMergingOptions,
    earlier: &[Matched],
    children: &[Vec<CallIx>],
) -> Matched {
    if let Some(j) = tree.same_prompt(walk, call.prompt.len()) {
        let mut verdict = earlier[j];
        if let Attach::Root(info) = &mut verdict.attach {
            info.same_prompt_as = Some(info.same_prompt_as.unwrap_or(j));
        }
        return verdict;
    }
    let extension = tree.deepest_seq_end(walk);
    if let Some(tpl) = &opts.template
        && let Some(splice) =
            find_splice(tree, walk, calls, call.prompt, tpl, extension.map(|e| e.0))
    {
        let attach = if opts.splice {
            Attach::Splice {
                parent: splice.parent,
                diverged_at: splice.diverged_at,
                resumed_from: splice.resumed_from,
                shape: splice.shape,
            }
        } else {
            Attach::Root(RootInfo {
                same_prompt_as: None,
                divergence: Some(Divergence {
                    from: splice.parent,
                    common_prefix_len: splice.diverged_at,
                    template_mismatch: true,
                }),
            })
        };
        return Matched {
            attach,
            template_mismatch: true,
        };
    }
    if let Some((depth, parent)) = extension {
        let rest = call.prompt.get(depth..).unwrap_or_default();
        let rewritten = children[parent]
            .iter()
            .rev()
            .find(|&&x| tail_quoted(rest, calls[x].response));
        let attach = match rewritten {
            Some(&from) => Attach::Root(RootInfo {
                same_prompt_as: None,
                divergence: Some(Divergence {
                    from,
                    common_prefix_len: common_prefix_with(call.prompt, &calls[from]),
                    template_mismatch: false,
                }),
            }),
            None => Attach::Extend { parent },
        };
        return Matched {
            attach,
            template_mismatch: false,
        };
    }
    let divergence = tree
        .divergence(walk)
        .map(|(from, common_prefix_len)| Divergence {
            from,
            common_prefix_len,
            template_mismatch: mismatch_shape(
                &calls[from],
                common_prefix_len,
                opts.template.as_ref(),
            ),
        });
    Matched {
        attach: Attach::Root(RootInfo {
            same_prompt_as: None,
            divergence,
        }),
        template_mismatch: divergence.is_some_and(|d| d.template_mismatch),
    }
}

#[derive(Clone, Copy, Debug)]
struct Splice {
    parent: CallIx,
    diverged_at: usize,
    resumed_from: usize,
    shape: SpliceShape,
}

/// The deepest splice the prompt allows, deeper than `extension_depth`.
/// Among candidates leaving the prompt at the same point (retried replies
/// to one prompt), the one whose reply the re-rendered turn shows wins (see
/// [`turn_fit`]); among equally fitting ones, the latest (the harness
/// resends the reply it used, usually the last one).
fn find_splice(
    tree: &PrefixTree<'_, '_>,
    walk: &Walk,
    calls: &[Call<'_>],
    prompt: &[u32],
    tpl: &TemplateInfo,
    extension_depth: Option<usize>,
) -> Option<Splice> {
    let mut candidates = Vec::new();
    for branch in tree.branches(walk) {
        if extension_depth.is_some_and(|d| branch.depth <= d) {
            break;
        }
        candidates.clear();
        tree.turn_candidates(branch, tpl, &mut candidates);
        let best = candidates
            .iter()
            .filter_map(|&b| {
                splice_rule(&calls[b], branch.depth, prompt, tpl).map(|(resumed_from, shape)| {
                    Splice {
                        parent: b,
                        diverged_at: branch.depth,
                        resumed_from,
                        shape,
                    }
                })
            })
            .max_by_key(|s| {
                (
                    turn_fit(&calls[s.parent], prompt, s.diverged_at, tpl),
                    s.parent,
                )
            });
        if best.is_some() {
            return best;
        }
    }
    None
}

/// The splicing rule. Let `S = P_B + R_B` be the earlier call's prompt and
/// response, `n = |P_B|`, and `d` the length of the longest common prefix of
/// the new prompt `P_C` with `S`. The new call is spliced onto `B` when:
///
/// - `R_B` is one turn: it holds no end-of-turn token except as its last
///   token;
/// - the divergence has one of the three template shapes
///   ([`SpliceShape`]):
///   - generation-only glue: `d < n`, `P_B[d]` is a think token and
///     `P_B[d..n]` holds no end-of-turn token (the generation prompt carried
///     a think block, e.g. `<think>\n\n</think>\n\n`, that the history
///     rendering of the turn leaves out);
///   - stripped reasoning: `n <= d < |S|` and `R_B[d - n..]` holds a think
///     token (the history rendering dropped or rewrote the reasoning the
///     model generated; usually `d == n`);
///   - whitespace merge: `n - 1 <= d < |S|`, and `S[d]` and `P_C[d]` are
///     both whitespace tokens (the harness echoed the whitespace content a
///     tool parser returned before a tool call, e.g. `"\n\n"`, and the
///     template's newline after `assistant`, or after `</think>`, merged
///     with it and with the newline before `<tool_call>` into one token:
///     Qwen3 renders `assistant\n` + `"\n\n"` + `"\n"` as `assistant` +
///     one four-newline token where the model saw `\n` and began its
///     response);
/// - `P_C` holds an end-of-turn token at some `k >= d`: the re-rendered turn
///   `P_C[d..k]` is closed (it is not compared with `R_B`: reasoning and
///   whitespace differ by design).
///
/// The glue appended after `R_B` in the trace is then `P_C[k + 1..]` when
/// `R_B` ends with an end-of-turn token, else `P_C[k..]` (the template's
/// token closes the cut turn). Returns that start index and the shape.
pub(super) fn splice_rule(
    b: &Call<'_>,
    d: usize,
    prompt: &[u32],
    tpl: &TemplateInfo,
) -> Option<(usize, SpliceShape)> {
    let r = b.response;
    let eot = |t: &u32| tpl.is_end_of_turn(*t);
    if r.split_last().is_some_and(|(_, head)| head.iter().any(eot)) {
        return None;
    }
    let shape = divergence_shape(b, d, prompt, tpl)?;
    let k = d + tpl.find_end_of_turn(prompt.get(d..)?)?;
    Some((if r.last().is_some_and(eot) { k + 1 } else { k }, shape))
}

/// Which of the splicable shapes the divergence of `prompt` from `b`'s
/// sequence at `d` has, if any (see [`splice_rule`]).
fn divergence_shape(
    b: &Call<'_>,
    d: usize,
    prompt: &[u32],
    tpl: &TemplateInfo,
) -> Option<SpliceShape> {
    let n = b.prompt.len();
    let r = b.response;
    let at = |i: usize| {
        b.prompt
            .get(i)
            .or_else(|| r.get(i.checked_sub(n)?))
            .copied()
    };
    if d < n && tpl.is_think(b.prompt[d]) && !b.prompt[d..].iter().any(|&t| tpl.is_end_of_turn(t)) {
        return Some(SpliceShape::GenerationGlue);
    }
    if d >= n && d < n + r.len() && r[d - n..].iter().any(|&t| tpl.is_think(t)) {
        return Some(SpliceShape::StrippedReasoning);
    }
    let whitespace = |t: Option<u32>| t.is_some_and(|t| tpl.is_whitespace(t));
    if d + 1 >= n && whitespace(at(d)) && whitespace(prompt.get(d).copied()) {
        return Some(SpliceShape::WhitespaceMerge);
    }
    None
}

/// How much of `b`'s reply the new prompt's re-rendering of it shows: the
/// length of the common suffix of `b`'s response (without its own
/// end-of-turn token) and the re-rendered turn (the prompt from the
/// divergence `d` to the end-of-turn token closing the turn). A template
/// that strips reasoning or glue keeps the end of the turn (the answer, the
/// tool calls) as generated, so the reply the harness went on with fits
/// best.
fn turn_fit(b: &Call<'_>, prompt: &[u32], d: usize, tpl: &TemplateInfo) -> usize {
    let Some(turn) = prompt
        .get(d..)
        .and_then(|rest| tpl.find_end_of_turn(rest).map(|k| &rest[..k]))
    else {
        return 0;
    };
    let r = match b.response.split_last() {
        Some((last, head)) if tpl.is_end_of_turn(*last) => head,
        _ => b.response,
    };
    r.iter()
        .rev()
        .zip(turn.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

/// Whether a root's divergence from `b` after `lcp` tokens looks like a
/// template mismatch: inside `b`'s last turn (its generation prompt after the
/// last end-of-turn token, or its response), or at a think token. Without
/// template ids: inside `b`'s response or within the last few tokens of its
/// prompt.
fn mismatch_shape(b: &Call<'_>, lcp: usize, tpl: Option<&TemplateInfo>) -> bool {
    let n = b.prompt.len();
    match tpl {
        Some(tpl) => {
            let at = if lcp < n {
                b.prompt.get(lcp)
            } else {
                b.response.get(lcp - n)
            };
            let in_last_turn = lcp >= n || !b.prompt[lcp..].iter().any(|&t| tpl.is_end_of_turn(t));
            in_last_turn || at.is_some_and(|&t| tpl.is_think(t))
        }
        None => lcp + GLUE_WINDOW.min(n / 4) >= n,
    }
}
