//! What writing a reply costs, per API (`cargo bench -p polar-chat --bench
//! encode`; prints a Markdown table): a 200-token reply as the backend
//! streams it (198 events: text in 150 pieces, then a tool call whose
//! arguments come in 45 pieces), encoded into each API's stream with a
//! fresh encoder, and the same reply, assembled, written as each API's
//! complete (non-streamed) body. 3,000 rounds each; p50 and p99 of one
//! round. Pure CPU: no socket, no file.
#![allow(clippy::print_stdout, reason = "a benchmark: reports on stdout")]

use std::hint::black_box;
use std::time::Instant;

use polar_chat::provider::StreamEncoder as _;
use polar_chat::provider::{Framing, ReplyOptions, encoder, response_body};
use polar_chat::{Api, FinishReason, StreamEvent, Usage, assemble};

const ROUNDS: usize = 3000;

/// The reply's events.
fn events() -> Vec<StreamEvent> {
    let mut events = vec![StreamEvent::Start {
        id: "abc123".into(),
        model: "polar-mock".into(),
        prompt_tokens: Some(48_257),
    }];
    events.extend((0..150).map(|i| StreamEvent::TextDelta {
        text: format!("w{i} "),
    }));
    events.push(StreamEvent::ToolCallStart {
        index: 0,
        id: "call_1".into(),
        name: "Bash".into(),
    });
    events.extend((0..45).map(|i| StreamEvent::ToolCallDelta {
        index: 0,
        arguments: format!("{{\"c{i}\":"),
    }));
    events.push(StreamEvent::Finish {
        finish_reason: FinishReason::ToolCalls,
        usage: Usage {
            prompt_tokens: 48_257,
            completion_tokens: 200,
            cached_tokens: Some(1024),
        },
    });
    events
}

/// p50 and p99 of `f`'s time, in microseconds.
fn time(mut f: impl FnMut()) -> (f64, f64) {
    let mut us: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    us.sort_by(f64::total_cmp);
    (us[ROUNDS / 2], us[ROUNDS * 99 / 100])
}

fn main() {
    let events = events();
    let reply = assemble(&events);
    let opts = ReplyOptions {
        created: 1_700_000_000,
        include_usage: true,
        framing: Framing::Sse,
        response_format: None,
        compaction: false,
    };
    println!("| API | stream, 198 events: p50 | p99 | bytes | complete body: p50 | p99 | bytes |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for api in [
        Api::AnthropicMessages,
        Api::OpenaiChat,
        Api::OpenaiResponses,
        Api::Gemini,
    ] {
        let mut stream_len = 0;
        let stream = time(|| {
            let mut enc = encoder(api, &opts);
            stream_len = events.iter().map(|ev| black_box(enc.push(ev)).len()).sum();
        });
        let mut body_len = 0;
        let body = time(|| body_len = black_box(response_body(api, &reply, &opts)).len());
        println!(
            "| {api:?} | {:.1} µs | {:.1} µs | {stream_len} | {:.1} µs | {:.1} µs | {body_len} |",
            stream.0, stream.1, body.0, body.1
        );
    }
}
