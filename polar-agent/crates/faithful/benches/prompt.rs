//! The per-call cost of a token-faithful prompt against rendering and
//! tokenizing the whole conversation, in Polar and in `transformers`, with
//! Qwen3's real files (`cargo xtask chat-models`; `POLAR_CHAT_MODELS_DIR`),
//! on agentic conversations of about 1k, 10k, 100k and 200k tokens: a
//! system prompt and a tool, then turns of a tool call and its result, and
//! the next call's request (the last reply echoed, a new tool result).
//!
//! - `extend/N`: [`Chains::prompt`] of the next call, the chain holding the
//!   three calls before it (so that it has checked a window of the same
//!   shape: what the agent does per call in a session's steady state);
//! - `whole/N`: the template rendered over the whole conversation and the
//!   text tokenized (what a fresh prompt, or a server, does).
//!
//! After criterion's estimates, a table of p50 and p99 per call of each,
//! timed call by call, beside `transformers`' `apply_chat_template` and
//! `encode` of the same conversation (`benches/transformers_prompt.py`,
//! run with the chat-template environment of `cargo xtask chat-models`, or
//! `POLAR_TEMPLATE_PYTHON`).
//!
//! `cargo bench -p polar-faithful --bench prompt`; BENCHMARKS.md has the
//! figures.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use serde_json::{Map, Value, json};

use polar_faithful::{Asked, Chains, Conversation, Origin, Renderer, Window};
use polar_template::{Model, ModelFiles};

const INSTALL: &str = "install it with `cargo xtask chat-models`";
const SIZES: [(&str, usize); 4] = [
    ("1k", 1_000),
    ("10k", 10_000),
    ("100k", 100_000),
    ("200k", 200_000),
];
/// Calls timed one by one for the p50/p99 table.
const EXTEND_RUNS: usize = 300;
const WHOLE_RUNS: usize = 20;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

fn model_dir() -> PathBuf {
    std::env::var_os("POLAR_CHAT_MODELS_DIR")
        .map_or_else(
            || workspace().join(".polar-cache/chat-models"),
            PathBuf::from,
        )
        .join("qwen3")
}

fn model(dir: &Path) -> Model {
    Model::load(&ModelFiles::from_dir(dir))
        .unwrap_or_else(|e| panic!("Qwen3's files in {}: {e}; {INSTALL}", dir.display()))
}

/// A session of `turns` tool-call turns as the harness sends it: a system
/// prompt, the task, then each reply echoed ("\n\n" text, the call) and its
/// result.
fn session(turns: usize) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent working in a repository. Use the bash tool."}),
        json!({"role": "user", "content": "The test suite fails; find out why and fix it."}),
    ];
    let output: String = (0..10)
        .map(|i| format!("-rw-r--r-- 1 polar polar {i:>5} Dec  6 08:00 src/module_{i}.rs\n"))
        .collect();
    for k in 0..turns {
        messages.push(json!({"role": "assistant", "content": "\n\n", "tool_calls": call(k)}));
        messages
            .push(json!({"role": "tool", "tool_call_id": format!("call_{k}"), "content": output}));
    }
    messages
}

fn call(k: usize) -> Value {
    json!([{"id": format!("call_{k}"), "type": "function",
        "function": {"name": "bash", "arguments": {"command": format!("ls -la src/{k}")}}}])
}

/// Reply `k` as served (with its reasoning).
fn served(k: usize) -> Value {
    json!({"role": "assistant", "content": "", "reasoning_content": "The listing shows the module; look inside.",
        "tool_calls": call(k)})
}

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}),
    ]
}

/// One conversation size: the request measured and the chain before it.
struct Case {
    label: &'static str,
    messages: Vec<Value>,
    chains: Chains,
    /// The chain's prompt ids (its own replies as generated).
    tokens: usize,
    /// Those the template's whole rendering has (replies as echoed).
    whole_tokens: usize,
    added: usize,
}

/// The chain of a session of `turns + 3` turns after its calls at `turns`,
/// `turns + 1` and `turns + 2` turns, and the request of the next call.
fn case(m: &Model, label: &'static str, turns: usize, tools: &[Value]) -> Case {
    let kwargs = Map::new();
    let messages = session(turns + 3);
    let generated = m
        .encode("<think>\nThe listing shows the module; look inside.\n</think>\n\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call><|im_end|>")
        .unwrap();
    let mut chains = Chains::new();
    let mut windows = None;
    for k in turns..turns + 3 {
        let asked = Asked {
            messages: messages[..2 + 2 * k].to_vec(),
            tools: Some(tools.to_vec()),
            kwargs: kwargs.clone(),
        };
        let p = chains.prompt(m, &asked.conversation()).unwrap();
        windows = Some(p.windows.clone());
        chains.finish(m, asked, p, &generated, served(k));
    }
    let conv = Conversation {
        messages: &messages,
        tools: Some(tools),
        kwargs: &kwargs,
    };
    let p = chains.prompt(m, &conv).unwrap();
    let Origin::Extends { kept, .. } = p.origin else {
        panic!("{label}: {:?}", p.origin)
    };
    assert_eq!(p.windows.state(), Window::Trusted, "{label}");
    assert_eq!(
        Some(p.windows),
        windows,
        "{label}: a window of a shape checked"
    );
    let whole_tokens = m
        .encode(&Renderer::render(m, &conv, true).unwrap())
        .unwrap()
        .len();
    Case {
        label,
        tokens: p.ids.len(),
        whole_tokens,
        added: p.ids.len() - kept,
        messages,
        chains,
    }
}

fn criterion_benches(m: &Model, cases: &[Case], tools: &[Value]) {
    let mut c = Criterion::default().configure_from_args();
    let kwargs = Map::new();
    let mut group = c.benchmark_group("prompt");
    group.sample_size(10);
    for case in cases {
        let conv = Conversation {
            messages: &case.messages,
            tools: Some(tools),
            kwargs: &kwargs,
        };
        group.bench_with_input(BenchmarkId::new("extend", case.label), &conv, |b, conv| {
            b.iter(|| case.chains.prompt(m, conv).unwrap());
        });
        group.bench_with_input(BenchmarkId::new("whole", case.label), &conv, |b, conv| {
            b.iter(|| m.encode(&Renderer::render(m, conv, true).unwrap()).unwrap());
        });
    }
    group.finish();
    c.final_summary();
}

/// p50 and p99 of `runs` (nearest rank).
fn percentiles(mut runs: Vec<Duration>) -> (Duration, Duration) {
    runs.sort();
    let rank = |p: f64| runs[((p * runs.len() as f64).ceil() as usize).clamp(1, runs.len()) - 1];
    (rank(0.50), rank(0.99))
}

fn timed(runs: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    percentiles(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed()
            })
            .collect(),
    )
}

/// transformers' p50 and p99 per case, by label.
fn transformers(dir: &Path, cases: &[Case], tools: &[Value]) -> Vec<(Duration, Duration)> {
    let python = std::env::var_os("POLAR_TEMPLATE_PYTHON").map_or_else(
        || workspace().join(".polar-cache/venvs/chat-template/bin/python"),
        PathBuf::from,
    );
    assert!(
        python.is_file(),
        "the chat-template Python environment ({}) is missing: {INSTALL}",
        python.display()
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/transformers_prompt.py");
    let job = json!({
        "model_dir": dir,
        "runs": WHOLE_RUNS,
        "conversations": cases.iter().map(|c| json!({"label": c.label, "messages": c.messages, "tools": tools})).collect::<Vec<_>>(),
    });
    let mut child = Command::new(&python)
        .arg(&script)
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}; {INSTALL}", python.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&job).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{} failed", script.display());
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    cases
        .iter()
        .map(|case| {
            let line = lines
                .iter()
                .find(|l| l["label"] == case.label)
                .unwrap_or_else(|| panic!("no transformers figures for {}", case.label));
            assert_eq!(
                line["tokens"].as_u64(),
                Some(case.whole_tokens as u64),
                "{}: transformers' prompt is another length",
                case.label
            );
            let runs = line["seconds"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| Duration::from_secs_f64(s.as_f64().unwrap()))
                .collect();
            percentiles(runs)
        })
        .collect()
}

fn table(m: &Model, dir: &Path, cases: &[Case], tools: &[Value]) {
    let kwargs = Map::new();
    let python = transformers(dir, cases, tools);
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1e3);
    eprintln!(
        "\n| conversation | prompt tokens | added | extend p50 / p99 | whole (Polar) p50 / p99 | whole (transformers) p50 / p99 |"
    );
    eprintln!("| --- | --- | --- | --- | --- | --- |");
    for (case, (t50, t99)) in cases.iter().zip(python) {
        let conv = Conversation {
            messages: &case.messages,
            tools: Some(tools),
            kwargs: &kwargs,
        };
        let (e50, e99) = timed(EXTEND_RUNS, || {
            std::hint::black_box(case.chains.prompt(m, &conv).unwrap());
        });
        let (w50, w99) = timed(WHOLE_RUNS, || {
            std::hint::black_box(
                m.encode(&Renderer::render(m, &conv, true).unwrap())
                    .unwrap(),
            );
        });
        eprintln!(
            "| {} | {} | {} | {} / {} | {} / {} | {} / {} |",
            case.label,
            case.tokens,
            case.added,
            ms(e50),
            ms(e99),
            ms(w50),
            ms(w99),
            ms(t50),
            ms(t99)
        );
    }
    eprintln!("(extend: {EXTEND_RUNS} calls; whole: {WHOLE_RUNS} each)");
}

fn main() {
    let dir = model_dir();
    let m = model(&dir);
    let tools = tools();
    // Turns of the size the conversation grows by per turn.
    let size = |turns: usize| {
        let messages = session(turns);
        let conv = Conversation {
            messages: &messages,
            tools: Some(&tools),
            kwargs: &Map::new(),
        };
        m.encode(&Renderer::render(&m, &conv, true).unwrap())
            .unwrap()
            .len()
    };
    let per_turn = (size(11) - size(1)) / 10;
    let cases: Vec<Case> = SIZES
        .iter()
        .map(|&(label, target)| {
            case(
                &m,
                label,
                (target / per_turn).saturating_sub(3).max(1),
                &tools,
            )
        })
        .collect();
    for c in &cases {
        eprintln!("prompt/{}: {} tokens, {} added", c.label, c.tokens, c.added);
    }
    criterion_benches(&m, &cases, &tools);
    table(&m, &dir, &cases, &tools);
}
