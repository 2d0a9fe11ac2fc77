//! The cost of failover inside a call (`cargo bench -p polar-mock --bench
//! failover`; prints Markdown tables): a streamed reply whose replica
//! aborts it after 40 tokens, resumed on the other replica (the ids so far
//! detokenized, the token-in request, the continuation's first token),
//! against the same reply unfaulted. Measured at the inference client,
//! where failover happens (the proxy above it adds nothing to it), with
//! two in-process mock replicas of the vLLM and the SGLang dialect:
//!
//! - *first token*: request sent -> first output event (before the fault
//!   in both);
//! - *whole reply*: request sent -> its last event;
//! - *extra at the fault*: the resumed reply's whole-reply p50 minus the
//!   unfaulted one's: how much later every token after the fault arrives
//!   (the ids so far detokenized, the token-in request, its time to first
//!   token), i.e. the extra time to first token after the fault.
//!
//! Two backend speeds: no simulated latency (what Polar and the mock's
//! HTTP cost), and a backend with a 20 ms time to first token and 5 ms
//! per token (a resumed generation pays the prefill of its prompt again,
//! as a real backend does unless its prefix cache holds it).
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark: reports on stdout, a failed step ends it"
)]

use std::time::{Duration, Instant};

use polar_chat::output::OutputFormat;
use polar_chat::{ChatRequest, Message, Role, Sampling, StreamEvent, Tool};
use polar_inference::{BackendConfig, Client, Dialect};
use polar_mock::script::{Script, ScriptedCall, SessionScript, Turn};
use polar_mock::{self as mock, MockConfig, MockHandle};

const SAMPLES: usize = 200;
const FAULT_AT: u32 = 40;

fn turn(abort: bool) -> Turn {
    Turn {
        think: Some("The user wants the demo file; a shell command writes it in one step.".into()),
        text: Some("Writing the demo file with one command.".into()),
        tool_calls: vec![ScriptedCall {
            shell: Some("echo polar > polar-demo.txt && ls -la".into()),
            ..ScriptedCall::default()
        }],
        abort_after: abort.then_some(FAULT_AT),
        ..Turn::default()
    }
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        messages: vec![
            Message::text(Role::System, "You are a coder."),
            Message::text(Role::User, "make the demo file"),
        ],
        tools: vec![Tool {
            name: "bash".into(),
            description: None,
            parameters: polar_json::RawJson::from_value(
                &serde_json::json!({"type": "object", "properties": {"command": {"type": "string"}}}),
            ),
        }],
        tool_choice: None,
        response_format: None,
        sampling: Sampling::default(),
        stream: true,
        extra: serde_json::Map::new(),
    }
}

async fn replicas(
    dialect: Dialect,
    abort: bool,
    ttft: Duration,
    per_token: Duration,
) -> Vec<MockHandle> {
    let mut out = Vec::new();
    for _ in 0..2 {
        out.push(
            mock::start(MockConfig {
                dialect,
                script: Some(Script {
                    final_text: None,
                    sessions: vec![SessionScript {
                        id: "*".into(),
                        turns: vec![turn(abort)],
                        ..SessionScript::default()
                    }],
                }),
                ttft,
                token_latency: per_token,
                ..MockConfig::default()
            })
            .await
            .unwrap(),
        );
    }
    out
}

/// Time to the first output event and to the last event.
async fn one(client: &Client, session: &str) -> (Duration, Duration) {
    let sent = Instant::now();
    let mut s = client.chat(session, &request()).await.unwrap();
    let mut first = None;
    while let Some(ev) = s.next().await {
        let ev = ev.unwrap();
        if first.is_none() && !matches!(ev, StreamEvent::Start { .. }) {
            first = Some(sent.elapsed());
        }
    }
    assert!(s.resumed().is_some() || s.backend().attempts == 1);
    (first.unwrap_or_default(), sent.elapsed())
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

async fn run(dialect: Dialect, ttft: Duration, per_token: Duration, samples: usize) {
    let mut rows = Vec::new();
    for abort in [false, true] {
        let m = replicas(dialect, abort, ttft, per_token).await;
        let mut cfg = BackendConfig::new(
            "b",
            dialect,
            m.iter().map(MockHandle::url).collect(),
            "polar-mock",
        );
        cfg.output_parser = Some(OutputFormat::Qwen3);
        let client = Client::new(cfg).unwrap();
        let (mut firsts, mut wholes) = (Vec::new(), Vec::new());
        for i in 0..samples + 20 {
            let (first, whole) = one(&client, &format!("s{i}")).await;
            if i >= 20 {
                firsts.push(first);
                wholes.push(whole);
            }
        }
        rows.push((
            abort,
            pct(&mut firsts, 0.5),
            pct(&mut firsts, 0.99),
            pct(&mut wholes, 0.5),
            pct(&mut wholes, 0.99),
        ));
        for m in m {
            m.stop().await;
        }
    }
    println!(
        "\n#### {} dialect, time to first token {}, {} per token ({samples} calls each)\n",
        dialect.as_str(),
        ms(ttft),
        ms(per_token)
    );
    println!(
        "| reply | first token p50 | p99 | whole reply p50 | p99 | extra at the fault p50 |\n| --- | --- | --- | --- | --- | --- |"
    );
    let plain = rows.first().map_or(Duration::ZERO, |r| r.3);
    for (abort, f50, f99, w50, w99) in rows {
        let extra = if abort {
            ms(w50.saturating_sub(plain))
        } else {
            "-".into()
        };
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            if abort {
                "aborted after 40 tokens, resumed"
            } else {
                "unfaulted"
            },
            ms(f50),
            ms(f99),
            ms(w50),
            ms(w99),
            extra
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("### Failover inside a call (after 20 warm-up calls)");
    for dialect in [Dialect::Vllm, Dialect::Sglang] {
        rt.block_on(run(dialect, Duration::ZERO, Duration::ZERO, SAMPLES));
        let slow = (Duration::from_millis(20), Duration::from_millis(5));
        rt.block_on(run(dialect, slow.0, slow.1, SAMPLES / 4));
    }
}
