//! The invariant checker catches every kind of corruption it is there for.

use super::kit::{Convo, Render, Sim, Turn, meta, template};
use crate::{Builder, InvariantViolation, Join, PrefixMergingOptions, Trajectory, build, check};

fn session(render: Render) -> Sim {
    let mut sim = Sim::new(render);
    let mut c = Convo::new("you are a coding agent", "tidy up");
    c.step(&mut sim, Turn::new("hmm", "call ls"));
    c.tool("a b c");
    c.step(&mut sim, Turn::new("ok", "call rm c"));
    c.tool("removed");
    c.step(&mut sim, Turn::new("", "done"));
    sim
}

fn merged(sim: &Sim) -> Trajectory {
    let builder = Builder::PrefixMerging(PrefixMergingOptions {
        template: Some(template()),
        ..PrefixMergingOptions::default()
    });
    let traj = build(&builder, &sim.records, &meta());
    assert_eq!(check(&traj, &sim.records), Ok(()));
    assert_eq!(traj.traces.len(), 1);
    traj
}

fn broken(sim: &Sim, corrupt: impl FnOnce(&mut Trajectory)) -> InvariantViolation {
    let mut traj = merged(sim);
    corrupt(&mut traj);
    match check(&traj, &sim.records) {
        Err(e) => e,
        Ok(()) => panic!("corruption not detected"),
    }
}

#[test]
fn checker_catches_corrupted_traces() {
    let sim = session(Render::default());
    let first_glue = sim.response(0).len();
    assert!(matches!(
        broken(&sim, |t| {
            t.traces[0].loss_mask.pop();
        }),
        InvariantViolation::Length {
            what: "loss_mask",
            ..
        }
    ));
    assert!(matches!(
        broken(&sim, |t| t.traces[0].loss_mask[0] = 2),
        InvariantViolation::MaskValue { index: 0, .. }
    ));
    assert!(matches!(
        broken(&sim, |t| t.traces[0].loss_mask[first_glue] = 1),
        InvariantViolation::CallTokens { .. }
    ));
    assert!(matches!(
        broken(&sim, |t| t.traces[0].loss_mask[0] = 0),
        InvariantViolation::CallTokens { .. }
    ));
    assert!(matches!(
        broken(&sim, |t| {
            if let Some(lp) = &mut t.traces[0].response_logprobs {
                lp[1] += 1e-6;
            }
        }),
        InvariantViolation::CallTokens { .. }
    ));
    assert!(matches!(
        broken(&sim, |t| t.traces[0].response_logprobs = None),
        InvariantViolation::CallTokens { .. }
    ));
    assert!(matches!(
        broken(&sim, |t| t.traces[0].response_ids[first_glue] += 1),
        InvariantViolation::Join { .. }
    ));
    assert!(matches!(
        broken(&sim, |t| t.traces[0].prompt_ids[0] += 1),
        InvariantViolation::Join { .. }
    ));
    assert!(matches!(
        broken(&sim, |t| t.traces[0].spans[1].response_start += 1),
        InvariantViolation::CallTokens { .. } | InvariantViolation::Spans { .. }
    ));
    assert!(matches!(
        broken(&sim, |t| {
            t.traces[0].call_ids.pop();
            t.traces[0].spans.pop();
        }),
        InvariantViolation::Spans { .. }
    ));
    assert_eq!(
        broken(&sim, |t| {
            let mut dup = t.traces[0].clone();
            dup.call_ids.truncate(1);
            dup.spans.truncate(1);
            t.traces.push(dup);
        }),
        InvariantViolation::PlacedTwice("c0".into())
    );
    assert_eq!(
        broken(&sim, |t| t.traces[0].call_ids[2] = "c9".into()),
        InvariantViolation::UnknownCall("c9".into())
    );
    assert!(matches!(
        broken(&sim, |t| t.stats.calls = 7),
        InvariantViolation::Stats(_)
    ));
}

#[test]
fn checker_catches_a_missing_call_and_a_wrong_splice() {
    let sim = session(Render::default());
    let mut fewer = merged(&sim);
    fewer.traces[0].call_ids.truncate(2);
    fewer.traces[0].spans.truncate(2);
    let end = fewer.traces[0].spans[1].response_start + fewer.traces[0].spans[1].response_len;
    fewer.traces[0].response_ids.truncate(end);
    fewer.traces[0].loss_mask.truncate(end);
    if let Some(lp) = &mut fewer.traces[0].response_logprobs {
        lp.truncate(end);
    }
    assert_eq!(
        check(&fewer, &sim.records),
        Err(InvariantViolation::Missing("c2".into()))
    );

    let stripped = session(Render {
        strip_reasoning: true,
        ..Render::default()
    });
    let mut t = merged(&stripped);
    assert!(matches!(t.traces[0].spans[1].join, Join::Splice { .. }));
    if let Join::Splice { diverged_at, .. } = &mut t.traces[0].spans[1].join {
        *diverged_at -= 1;
    }
    assert!(matches!(
        check(&t, &stripped.records),
        Err(InvariantViolation::Join { .. })
    ));

    let mut dup = stripped.records.clone();
    dup.push(dup[0].clone());
    assert_eq!(
        check(&merged(&stripped), &dup),
        Err(InvariantViolation::DuplicateRecord("c0".into()))
    );
}
