//! Trajectory build speed on long synthetic sessions: 200 calls growing to
//! about 200,000 tokens of context (prefix-preserving template, reasoning-
//! stripping template, four interleaved sub-agents), for both builders.
//! The setup prints to stderr what each builder produces in tokens.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::Map;

use polar_chat::Api;
use polar_chat::{ChatRequest, FinishReason, Message, Role, Sampling};
use polar_record::{
    BackendInfo, CallStatus, CompletionRecord, NativeRequest, RECORD_VERSION, Timings,
};
use polar_trajectory::{
    Builder, PrefixMergingOptions, SessionMeta, SessionOutcome, TemplateInfo, Trajectory, build,
    check,
};

const IM_END: u32 = 2;
const THINK: u32 = 3;
const END_THINK: u32 = 4;
const HEADER: [u32; 3] = [1, 8, 5];
const CALLS: usize = 200;
const SYSTEM_TOKENS: usize = 2_000;
const TOOL_TOKENS: usize = 690;
const REASONING_TOKENS: usize = 100;
const ANSWER_TOKENS: usize = 200;

struct Rng(u64);

impl Rng {
    fn ids(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                100 + (self.0 % 150_000) as u32
            })
            .collect()
    }
}

fn record(seq: usize, system: &str, prompt: Vec<u32>, response: Vec<u32>) -> CompletionRecord {
    let logprobs = (0..response.len()).map(|j| -0.001 * j as f32).collect();
    CompletionRecord {
        version: RECORD_VERSION,
        call_id: format!("c{seq}"),
        seq: seq as u64,
        session_id: "bench".into(),
        task_id: None,
        policy_version: None,
        native_request: NativeRequest {
            api: Api::OpenaiChat,
            method: "POST".into(),
            host: "api.openai.com".into(),
            path: "/v1/chat/completions".into(),
            body: polar_json::RawJson::null(),
        },
        request: ChatRequest {
            model: "m".into(),
            messages: vec![Message::text(Role::System, system)],
            tools: Vec::new(),
            tool_choice: None,
            response_format: None,
            sampling: Sampling::default(),
            stream: true,
            extra: Map::new(),
        },
        response: None,
        prompt_token_ids: Some(prompt),
        response_token_ids: Some(response),
        response_logprobs: Some(logprobs),
        token_ids_missing: false,
        finish_reason: Some(FinishReason::ToolCalls),
        backend: BackendInfo::default(),
        timings: Timings::default(),
        resumed: None,
        status: CallStatus::Completed,
    }
}

/// One agent's growing conversation.
struct Agent {
    name: String,
    history: Vec<u32>,
}

impl Agent {
    fn new(rng: &mut Rng, name: &str) -> Self {
        let mut history = rng.ids(SYSTEM_TOKENS);
        history.extend(HEADER);
        Self {
            name: name.to_owned(),
            history,
        }
    }

    /// One call; with `strip`, history keeps the answer without reasoning.
    fn call(&mut self, rng: &mut Rng, seq: usize, strip: bool) -> CompletionRecord {
        let prompt = self.history.clone();
        let answer = rng.ids(ANSWER_TOKENS);
        let mut response = vec![THINK];
        response.extend(rng.ids(REASONING_TOKENS));
        response.push(END_THINK);
        response.extend(&answer);
        response.push(IM_END);
        if strip {
            self.history.extend(&answer);
            self.history.push(IM_END);
        } else {
            self.history.extend(&response);
        }
        self.history.extend(HEADER);
        self.history.extend(rng.ids(TOOL_TOKENS));
        self.history.push(IM_END);
        self.history.extend(HEADER);
        record(seq, &self.name, prompt, response)
    }
}

fn session(agents: usize, strip: bool) -> Vec<CompletionRecord> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut all: Vec<Agent> = (0..agents)
        .map(|i| Agent::new(&mut rng, &format!("agent {i}")))
        .collect();
    (0..CALLS)
        .map(|seq| {
            let k = seq % agents;
            all[k].call(&mut rng, seq, strip)
        })
        .collect()
}

fn meta() -> SessionMeta {
    SessionMeta {
        session_id: "bench".into(),
        task_id: None,
        group_id: None,
        attempt: None,
        superseded_attempts: 0,
        outcome: SessionOutcome::Completed,
        ended_by: None,
        evaluation: None,
        policy_version: None,
        instruction: None,
    }
}

fn merging() -> Builder {
    Builder::PrefixMerging(PrefixMergingOptions {
        template: Some(TemplateInfo {
            end_of_turn: vec![IM_END],
            think: vec![THINK, END_THINK],
            whitespace: Vec::new(),
        }),
        ..PrefixMergingOptions::default()
    })
}

fn report(name: &str, records: &[CompletionRecord]) {
    let show = |builder: &str, t: &Trajectory| {
        if let Err(e) = check(t, records) {
            eprintln!("{name} {builder}: invariant broken: {e}");
        }
        let s = &t.stats;
        eprintln!(
            "{name:>16} {builder:>14}: {:>4} traces, {:>11} tokens ({:>10} prompt + {:>9} response, {:>7} with loss 1), {} spliced",
            t.traces.len(),
            s.total_tokens(),
            s.prompt_tokens,
            s.response_tokens,
            s.loss_tokens,
            s.template_mismatches_spliced,
        );
    };
    let per = build(&Builder::PerRequest, records, &meta());
    let merged = build(&merging(), records, &meta());
    show("per_request", &per);
    show("prefix_merging", &merged);
    eprintln!(
        "{name:>16}: prefix_merging reads {:.1}x fewer tokens",
        per.stats.total_tokens() as f64 / merged.stats.total_tokens().max(1) as f64
    );
}

fn benches(c: &mut Criterion) {
    let sessions = [
        ("plain", session(1, false)),
        ("strip_reasoning", session(1, true)),
        ("4_sub_agents", session(4, false)),
    ];
    for (name, records) in &sessions {
        report(name, records);
    }
    for (name, records) in &sessions {
        c.bench_function(&format!("prefix_merging/{name}"), |b| {
            b.iter(|| build(black_box(&merging()), black_box(records), &meta()));
        });
    }
    let plain = &sessions[0].1;
    c.bench_function("per_request/plain", |b| {
        b.iter(|| build(black_box(&Builder::PerRequest), black_box(plain), &meta()));
    });
    let traj = build(&merging(), plain, &meta());
    c.bench_function("check/prefix_merging_plain", |b| {
        b.iter(|| check(black_box(&traj), black_box(plain)));
    });
}

criterion_group!(trajectory, benches);
criterion_main!(trajectory);
