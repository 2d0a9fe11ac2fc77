//! Retries under a template that re-renders the retried turn: neither reply
//! is a prefix of the next prompt, so the splice must go onto the reply
//! the next prompt shows, whichever of the two came first.

use super::kit::{Convo, IM_END, Render, Sim, Turn, meta, template};
use crate::{
    Builder, ChainId, Join, Label, PrefixMergingOptions, SegmentKind, SpliceShape, build, check,
};

fn splice_onto(sim: &Sim, prev: usize, next: usize) -> Join {
    let (p, q) = (sim.prompt(prev), sim.prompt(next));
    let d = p.len();
    assert_eq!(q[..d], *p, "the next prompt keeps the retried prompt");
    let k = d + q[d..].iter().position(|&t| t == IM_END).unwrap_or(0);
    Join::Splice {
        diverged_at: d,
        resumed_from: k + 1,
        shape: Some(SpliceShape::StrippedReasoning),
    }
}

#[test]
fn retry_under_a_stripping_template_is_spliced_onto_the_reply_shown() {
    let builder = Builder::PrefixMerging(PrefixMergingOptions {
        template: Some(template()),
        ..PrefixMergingOptions::default()
    });
    for used_first in [true, false] {
        let mut sim = Sim::new(Render {
            strip_reasoning: true,
            ..Render::default()
        });
        let mut c = Convo::new("you are a coding agent", "read the sources");
        let first = Turn::new("read one", "call cat a.rs");
        let second = Turn::new("read the other", "call cat b.rs");
        let b1 = sim.call(&c.msgs, &first);
        let b2 = sim.call(&c.msgs, &second);
        let (used, other, turn) = if used_first {
            (b1, b2, first)
        } else {
            (b2, b1, second)
        };
        c.msgs.push(super::kit::Msg::Assistant(turn));
        c.tool("fn main");
        let d = c.step(&mut sim, Turn::new("done reading", "done"));
        // Both replies start with their reasoning, which the history drops:
        // the next prompt extends neither.
        for b in [b1, b2] {
            let seq = [sim.prompt(b), sim.response(b)].concat();
            assert!(!sim.prompt(d).starts_with(&seq));
        }

        let traj = build(&builder, &sim.records, &meta());
        check(&traj, &sim.records).unwrap();
        assert_eq!(traj.traces.len(), 2, "used_first {used_first}");
        // Segments are numbered in the order of their first calls: the
        // retry comes first when it was the first reply.
        let (main, retry) = if used_first {
            (&traj.traces[0], &traj.traces[1])
        } else {
            (&traj.traces[1], &traj.traces[0])
        };
        let id = |i: usize| sim.records[i].call_id.clone();
        assert_eq!(main.call_ids, [id(used), id(d)], "used_first {used_first}");
        assert_eq!(main.spans[1].join, splice_onto(&sim, used, d));
        assert_eq!(main.labels, [Label::TemplateSpliced]);
        assert_eq!(retry.call_ids, [id(other)]);
        assert_eq!(retry.segment_kind, SegmentKind::SupersededRetry);
        assert_eq!(retry.previous.map(|l| l.chain), Some(ChainId(0)));
        assert_eq!(traj.stats.retries_superseded, 1);
        assert_eq!(traj.stats.template_mismatches_spliced, 1);
    }
}
