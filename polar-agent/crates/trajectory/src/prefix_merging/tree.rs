//! A radix tree over the token sequences (prompt + response) of the calls
//! seen so far. Walking a new prompt down the tree finds, in one pass over
//! the prompt, every earlier sequence that is a prefix of it and the point
//! where it leaves the others; inserting the call costs only the part not
//! already in the tree. Edge labels are slices of the calls' own token
//! vectors: nothing is copied.
//!
//! A node exists at the end of every call's prompt and at the end of every
//! call's sequence, so both can be found by position.

use crate::calls::Call;
use crate::template::TemplateInfo;

/// Index of a call in the builder's list of usable calls.
pub(super) type CallIx = usize;
/// Index of a node.
pub(super) type NodeId = usize;
const ROOT: NodeId = 0;

#[derive(Clone, Copy, Debug)]
enum Part {
    Prompt,
    Response,
}

/// The tokens of the edge into a node: `len` tokens of one call's prompt or
/// response, from `start`.
#[derive(Clone, Copy, Debug)]
struct Edge {
    call: CallIx,
    part: Part,
    start: usize,
    len: usize,
}

#[derive(Debug)]
struct Node {
    parent: NodeId,
    depth: usize,
    edge: Edge,
    children: Vec<(u32, NodeId)>,
    /// Calls whose prompt + response ends here, earliest first.
    seq_ends: Vec<CallIx>,
    /// Calls whose prompt ends here, earliest first.
    prompt_ends: Vec<CallIx>,
    /// The latest call whose sequence reaches or passes this node.
    latest: Option<CallIx>,
}

/// A position in the tree: at a node, or `offset` tokens into the edge that
/// leads to `child` (0 < offset < that edge's length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pos {
    At(NodeId),
    Mid { child: NodeId, offset: usize },
}

/// Where a token sequence's walk down the tree ended.
#[derive(Clone, Debug)]
pub(super) struct Walk {
    /// The nodes fully matched, from the root down.
    pub path: Vec<NodeId>,
    /// Where matching stopped.
    pub end: Pos,
    /// How many tokens matched (the longest common prefix with every
    /// sequence in the tree).
    pub matched: usize,
}

/// Branch point of a walk: the sequences under `entry` (from `skip` tokens
/// into its edge) share exactly `depth` tokens with the walked sequence.
#[derive(Clone, Copy, Debug)]
pub(super) struct Branch {
    pub depth: usize,
    pub entry: NodeId,
    pub skip: usize,
}

/// The tree, borrowing the calls whose tokens its edges point into.
pub(super) struct PrefixTree<'c, 'a> {
    calls: &'c [Call<'a>],
    nodes: Vec<Node>,
}

/// Length of the longest common prefix of `a` and `b`, comparing in chunks
/// (slice equality is a vectorized `memcmp`) before finishing token by token.
pub(crate) fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    const CHUNK: usize = 64;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

impl<'c, 'a> PrefixTree<'c, 'a> {
    /// An empty tree over `calls` (inserted later, by index).
    pub fn new(calls: &'c [Call<'a>]) -> Self {
        let root = Node {
            parent: ROOT,
            depth: 0,
            edge: Edge {
                call: 0,
                part: Part::Prompt,
                start: 0,
                len: 0,
            },
            children: Vec::new(),
            seq_ends: Vec::new(),
            prompt_ends: Vec::new(),
            latest: None,
        };
        Self {
            calls,
            nodes: vec![root],
        }
    }

    fn label(&self, n: NodeId) -> &'a [u32] {
        let e = self.nodes[n].edge;
        let call = &self.calls[e.call];
        let src = match e.part {
            Part::Prompt => call.prompt,
            Part::Response => call.response,
        };
        src.get(e.start..e.start + e.len).unwrap_or_default()
    }

    fn child(&self, n: NodeId, first: u32) -> Option<NodeId> {
        self.nodes[n]
            .children
            .iter()
            .find_map(|&(t, c)| (t == first).then_some(c))
    }

    /// Walks `tokens` down from the root.
    pub fn walk(&self, tokens: &[u32]) -> Walk {
        let mut path = Vec::new();
        let (end, matched) = self.walk_from(ROOT, tokens, &mut path);
        Walk { path, end, matched }
    }

    fn walk_from(&self, start: NodeId, tokens: &[u32], path: &mut Vec<NodeId>) -> (Pos, usize) {
        let mut node = start;
        let mut i = 0;
        loop {
            path.push(node);
            let Some(child) = tokens.get(i).and_then(|&t| self.child(node, t)) else {
                return (Pos::At(node), i);
            };
            let label = self.label(child);
            let c = common_prefix_len(label, &tokens[i..]);
            i += c;
            if c < label.len() {
                return (Pos::Mid { child, offset: c }, i);
            }
            node = child;
        }
    }

    /// The deepest non-empty earlier sequence that is a prefix of the walked
    /// tokens: its length and its call (the earliest of identical ones).
    pub fn deepest_seq_end(&self, walk: &Walk) -> Option<(usize, CallIx)> {
        walk.path.iter().rev().find_map(|&n| {
            let node = &self.nodes[n];
            let first = node.seq_ends.first().filter(|_| node.depth > 0);
            first.map(|&c| (node.depth, c))
        })
    }

    /// The earliest call whose prompt equals the walked tokens (of length
    /// `len`).
    pub fn same_prompt(&self, walk: &Walk, len: usize) -> Option<CallIx> {
        match walk.end {
            Pos::At(n) if walk.matched == len => self.nodes[n].prompt_ends.first().copied(),
            _ => None,
        }
    }

    /// The latest call whose sequence shares the walk's whole matched
    /// prefix, with that prefix's length; `None` when nothing matched.
    pub fn divergence(&self, walk: &Walk) -> Option<(CallIx, usize)> {
        if walk.matched == 0 {
            return None;
        }
        let n = match walk.end {
            Pos::At(n) => n,
            Pos::Mid { child, .. } => child,
        };
        self.nodes[n].latest.map(|c| (c, walk.matched))
    }

    /// The branch points of a walk, deepest first: where other sequences
    /// leave the walked one.
    pub fn branches(&self, walk: &Walk) -> Vec<Branch> {
        let mut out = Vec::new();
        let mut on_path = match walk.end {
            Pos::Mid { child, offset } => {
                out.push(Branch {
                    depth: walk.matched,
                    entry: child,
                    skip: offset,
                });
                Some(child)
            }
            Pos::At(_) => None,
        };
        for &n in walk.path.iter().rev() {
            let node = &self.nodes[n];
            for &(_, c) in &node.children {
                if Some(c) != on_path {
                    out.push(Branch {
                        depth: node.depth,
                        entry: c,
                        skip: 0,
                    });
                }
            }
            on_path = Some(n);
        }
        out
    }

    /// Calls whose sequence, from `branch` on, stays within one assistant
    /// turn: no end-of-turn token except as its very last token. One call per
    /// distinct sequence (the earliest of identical ones).
    pub fn turn_candidates(&self, branch: Branch, tpl: &TemplateInfo, out: &mut Vec<CallIx>) {
        let mut stack = vec![(branch.entry, branch.skip)];
        while let Some((n, skip)) = stack.pop() {
            let label = self.label(n).get(skip..).unwrap_or_default();
            let node = &self.nodes[n];
            match tpl.find_end_of_turn(label) {
                Some(p) => {
                    if p + 1 == label.len() {
                        out.extend(node.seq_ends.first());
                    }
                }
                None => {
                    out.extend(node.seq_ends.first());
                    stack.extend(node.children.iter().map(|&(_, c)| (c, 0)));
                }
            }
        }
    }

    /// Inserts call `call`, whose prompt was walked as `walk`.
    pub fn insert(&mut self, walk: &Walk, call: CallIx) {
        let c = self.calls[call];
        let p_node = self.materialize(walk.end, walk.matched, call, Part::Prompt, c.prompt);
        self.nodes[p_node].prompt_ends.push(call);
        let (end, matched) = self.walk_from(p_node, c.response, &mut Vec::new());
        let s_node = self.materialize(end, matched, call, Part::Response, c.response);
        self.nodes[s_node].seq_ends.push(call);
        let mut up = s_node;
        loop {
            self.nodes[up].latest = Some(call);
            if up == ROOT {
                break;
            }
            up = self.nodes[up].parent;
        }
    }

    /// Makes a node at `end` (splitting an edge if needed) and hangs the
    /// unmatched rest of `tokens` below it; returns the node where `tokens`
    /// ends.
    fn materialize(
        &mut self,
        end: Pos,
        matched: usize,
        call: CallIx,
        part: Part,
        tokens: &[u32],
    ) -> NodeId {
        let at = match end {
            Pos::At(n) => n,
            Pos::Mid { child, offset } => self.split(child, offset),
        };
        let Some(&first) = tokens.get(matched) else {
            return at;
        };
        let leaf = self.nodes.len();
        self.nodes.push(Node {
            parent: at,
            depth: self.nodes[at].depth + tokens.len() - matched,
            edge: Edge {
                call,
                part,
                start: matched,
                len: tokens.len() - matched,
            },
            children: Vec::new(),
            seq_ends: Vec::new(),
            prompt_ends: Vec::new(),
            latest: None,
        });
        self.nodes[at].children.push((first, leaf));
        leaf
    }

    /// Splits the edge into `child` after `offset` tokens; returns the new
    /// node in the middle.
    fn split(&mut self, child: NodeId, offset: usize) -> NodeId {
        let mid = self.nodes.len();
        let old = &self.nodes[child];
        let (parent, edge, latest) = (old.parent, old.edge, old.latest);
        let depth = old.depth - edge.len + offset;
        let rest_first = self.label(child)[offset];
        self.nodes.push(Node {
            parent,
            depth,
            edge: Edge {
                len: offset,
                ..edge
            },
            children: vec![(rest_first, child)],
            seq_ends: Vec::new(),
            prompt_ends: Vec::new(),
            latest,
        });
        let node = &mut self.nodes[child];
        node.parent = mid;
        node.edge.start += offset;
        node.edge.len -= offset;
        for entry in &mut self.nodes[parent].children {
            if entry.1 == child {
                entry.1 = mid;
            }
        }
        mid
    }
}

#[cfg(test)]
mod tests {
    use super::common_prefix_len;

    #[test]
    fn common_prefix_across_chunk_boundaries() {
        let a: Vec<u32> = (0..300).collect();
        for cut in [0, 1, 63, 64, 65, 128, 299] {
            let mut b = a.clone();
            b[cut] += 1000;
            assert_eq!(common_prefix_len(&a, &b), cut);
        }
        assert_eq!(common_prefix_len(&a, &a[..200]), 200);
        assert_eq!(common_prefix_len(&a, &[]), 0);
    }
}
