//! The per-call cost of a token-faithful prompt against rendering and
//! tokenizing the whole conversation, with Qwen3's real files (`cargo
//! xtask chat-models`; `POLAR_CHAT_MODELS_DIR`), on agentic conversations
//! of about 1k, 10k, 100k and 200k tokens: a system prompt and a tool, then
//! turns of reasoning, a tool call and its result, and the next call's
//! request (the last reply echoed, a new tool result).
//!
//! - `extend/N`: [`Chains::prompt`] of the next call, the chain holding the
//!   call before it (what the agent does per call);
//! - `whole/N`: the template rendered over the whole conversation and the
//!   text tokenized (what a fresh prompt, or a server, does).
//!
//! `cargo bench -p polar-faithful --bench prompt`; BENCHMARKS.md has the
//! figures.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark")]

use std::path::PathBuf;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::{Map, Value, json};

use polar_faithful::{Asked, Chains, Conversation, Origin, Renderer};
use polar_template::{Model, ModelFiles};

fn model() -> Model {
    let root = std::env::var_os("POLAR_CHAT_MODELS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../.polar-cache/chat-models"),
        PathBuf::from,
    );
    Model::load(&ModelFiles::from_dir(&root.join("qwen3")))
        .expect("Qwen3's files: cargo xtask chat-models")
}

/// A conversation of `turns` tool-call turns, its last reply, and the next
/// request's messages (the reply echoed, a new result).
pub fn conversation(turns: usize) -> (Vec<Value>, Value, Vec<Value>) {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent working in a repository. Use the bash tool."}),
        json!({"role": "user", "content": "The test suite fails; find out why and fix it."}),
    ];
    let output: String = (0..10)
        .map(|i| format!("-rw-r--r-- 1 polar polar {i:>5} Dec  6 08:00 src/module_{i}.rs\n"))
        .collect();
    let call = |k: usize| {
        json!([{"id": format!("call_{k}"), "type": "function",
            "function": {"name": "bash", "arguments": {"command": format!("ls -la src/{k}")}}}])
    };
    for k in 0..turns {
        messages.push(json!({"role": "assistant", "content": "\n\n", "tool_calls": call(k)}));
        messages
            .push(json!({"role": "tool", "tool_call_id": format!("call_{k}"), "content": output}));
    }
    let reply = json!({"role": "assistant", "content": "", "reasoning_content": "The listing shows the module; look inside.",
        "tool_calls": call(turns)});
    let mut next = messages.clone();
    next.push(json!({"role": "assistant", "content": "\n\n", "tool_calls": call(turns)}));
    next.push(json!({"role": "tool", "tool_call_id": format!("call_{turns}"), "content": output}));
    (messages, reply, next)
}

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}),
    ]
}

fn bench(c: &mut Criterion) {
    let m = model();
    let tools = tools();
    let kwargs = Map::new();
    let mut group = c.benchmark_group("prompt");
    group.sample_size(10);
    // Turns of the size the conversation grows by per turn.
    let size = |turns: usize| {
        let (messages, _, _) = conversation(turns);
        let conv = Conversation {
            messages: &messages,
            tools: Some(&tools),
            kwargs: &kwargs,
        };
        m.encode(&Renderer::render(&m, &conv, true).unwrap())
            .unwrap()
            .len()
    };
    let per_turn = size(11) - size(1);
    let per_turn = per_turn / 10;
    for (label, target) in [
        ("1k", 1_000),
        ("10k", 10_000),
        ("100k", 100_000),
        ("200k", 200_000),
    ] {
        let turns = (target / per_turn).max(1);
        let (messages, reply, next) = conversation(turns);
        let conv = Conversation {
            messages: &messages,
            tools: Some(&tools),
            kwargs: &kwargs,
        };
        let mut chains = Chains::new();
        let first = chains.prompt(&m, &conv).unwrap();
        let generated = m
            .encode("<think>\nThe listing shows the module; look inside.\n</think>\n\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call><|im_end|>")
            .unwrap();
        let asked = Asked {
            messages: messages.clone(),
            tools: Some(tools.clone()),
            kwargs: kwargs.clone(),
        };
        chains.finish(&m, asked, first, &generated, reply);
        let next_conv = Conversation {
            messages: &next,
            tools: Some(&tools),
            kwargs: &kwargs,
        };
        let p = chains.prompt(&m, &next_conv).unwrap();
        assert!(matches!(p.origin, Origin::Extends { .. }), "{:?}", p.origin);
        eprintln!(
            "prompt/{label}: {} tokens, {} added",
            p.ids.len(),
            p.ids.len()
                - match p.origin {
                    Origin::Extends { kept, .. } => kept,
                    _ => 0,
                }
        );
        group.bench_with_input(BenchmarkId::new("extend", label), &next_conv, |b, conv| {
            b.iter(|| chains.prompt(&m, conv).unwrap());
        });
        group.bench_with_input(BenchmarkId::new("whole", label), &next_conv, |b, conv| {
            b.iter(|| {
                m.encode(&Renderer::render(&m, conv, true).unwrap())
                    .unwrap()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
