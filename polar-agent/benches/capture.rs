//! The capture stage's cost, three ways (`cargo bench -p polar-agent --bench
//! capture`; prints Markdown tables):
//!
//! 1. **Stage work** on a Claude-Code-shaped request of 50 messages and about
//!    100 KB, no sockets: JSON parse + detection + translation to the
//!    normalized request + the backend's request body; encoding a 200-token
//!    reply into Anthropic SSE, and serializing its token ids and logprobs
//!    as they arrive; the record's request part serialized and appended
//!    while the backend generates; at the end, the record built and its
//!    completion appended without and with `fdatasync` (and, for
//!    comparison, the whole record as one line). Each step timed alone,
//!    p50/p99 over many iterations, and the sums.
//! 2. **Time to first token** through the whole path (client -> `polar
//!    proxy` -> `polar mock-backend`, streamed) against the mock called
//!    directly with the same (translated) request, alternating, in one run.
//! 3. **1,000 concurrent streaming calls** on one `polar proxy` (1,000
//!    sessions, every record synced), with the agent's resident memory
//!    sampled from `/proc`.
//!
//! 4. **Capture log durability** (`capture/durability.rs`): each
//!    `agent.capture_durability` mode's added latency and throughput on
//!    separate cores.
//!
//! Both servers are the release `polar` binary in child processes (but for
//! part 4's bare forwarder, this bench binary re-run); the client is this
//! process. Set `CAPTURE_BENCH_ONLY` to a comma-separated
//! list of `stage`, `ttft`, `concurrent`, `durability` to run only those
//! parts.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark: reports on stdout, a failed step ends it"
)]

use std::hint::black_box;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use polar_capture::GroupCommit;
use polar_capture::bench::{Draft, Journaled, LogFile, Produced, call_id, keep_event, now_ms};
use polar_capture_log::encode::{
    PartHead, PartPrompt, PreEncoded, RecordParts, encode_end, encode_record, encode_request_part,
};
use polar_capture_log::{ReplyTokensJson, encode_line};
use polar_chat::provider::sse::EventJson as _;
use polar_chat::provider::{self, Detected, StreamEncoder};
use polar_chat::{FinishReason, StreamEvent, Tokens, Usage};
use polar_inference::wire::chat_body_bytes;
use polar_inference::{BackendConfig, Dialect, SamplingMode};
use polar_io::http::{ClientOptions, HttpClient};
use polar_json::{Doc, RawJson};
use polar_mock::template::{TemplateOptions, render_prompt};
use polar_mock::tokenizer;
use polar_record::NativeRequest;
use polar_sse::SseParser;

#[path = "capture/durability.rs"]
mod durability;

// ------------------------------------------------------------- helpers

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    Stats {
        p50: percentile(&v, 0.5),
        p99: percentile(&v, 0.99),
    }
}

fn filler(seed: usize, len: usize) -> String {
    const WORDS: [&str; 12] = [
        "the", "file", "function", "returns", "error", "value", "test", "module", "struct",
        "config", "parse", "request",
    ];
    let mut out = String::with_capacity(len + 16);
    let mut i = seed;
    while out.len() < len {
        out.push_str(WORDS[i % WORDS.len()]);
        out.push(if i.is_multiple_of(17) { '\n' } else { ' ' });
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

/// A Claude Code turn: system blocks, 50 messages (text, tool uses, tool
/// results), 8 tools; about 100 KB.
fn big_request() -> Value {
    let schema = json!({"type": "object", "properties": {"command": {"type": "string", "description": filler(1, 300)}, "timeout": {"type": "number"}}, "required": ["command"]});
    let tools: Vec<Value> = (0..8)
        .map(|i| json!({"name": format!("Tool{i}"), "description": filler(i, 800), "input_schema": schema}))
        .collect();
    let mut messages =
        vec![json!({"role": "user", "content": [{"type": "text", "text": filler(3, 1500)}]})];
    for i in 0..49usize {
        let id = format!("toolu_{i:04}");
        if i.is_multiple_of(2) {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "text", "text": filler(i, 400)},
                {"type": "tool_use", "id": id, "name": "Tool0", "input": {"command": filler(i + 1, 200)}}
            ]}));
        } else {
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("toolu_{:04}", i - 1), "content": [{"type": "text", "text": filler(i, 2600)}]}
            ]}));
        }
    }
    json!({
        "model": "claude-opus-4-8",
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.a1b;"},
            {"type": "text", "text": filler(9, 6000), "cache_control": {"type": "ephemeral"}}
        ],
        "messages": messages,
        "tools": tools,
        "metadata": {"user_id": "bench"},
    })
}

/// A 200-token reply: a start, 150 text deltas, a tool call in 45 argument
/// pieces, the finish.
fn reply_events() -> Vec<StreamEvent> {
    let mut ev = vec![StreamEvent::Start {
        id: "chatcmpl-bench".into(),
        model: "claude-opus-4-8".into(),
        prompt_tokens: Some(25_000),
    }];
    for i in 0..150 {
        ev.push(StreamEvent::TextDelta {
            text: format!("w{i} "),
        });
    }
    ev.push(StreamEvent::ToolCallStart {
        index: 0,
        id: "call_bench".into(),
        name: "Tool0".into(),
    });
    ev.push(StreamEvent::ToolCallDelta {
        index: 0,
        arguments: "{\"command\": \"".into(),
    });
    for i in 0..43 {
        ev.push(StreamEvent::ToolCallDelta {
            index: 0,
            arguments: format!("a{i} "),
        });
    }
    ev.push(StreamEvent::ToolCallDelta {
        index: 0,
        arguments: "\"}".into(),
    });
    ev.push(StreamEvent::Finish {
        finish_reason: FinishReason::ToolCalls,
        usage: Usage {
            prompt_tokens: 25_000,
            completion_tokens: 200,
            cached_tokens: None,
        },
    });
    ev
}

// ------------------------------------------------------------- 1. stage work

fn stage_work() {
    let body = Bytes::from(big_request().to_string());
    let backend = BackendConfig::new(
        "bench",
        Dialect::Vllm,
        vec!["http://127.0.0.1:1".into()],
        "m",
    );
    let headers = [("anthropic-version", "2023-06-01")];
    let path = "/v1/messages?beta=true";
    // Token data as the backend reports it, sized like the real thing.
    let parsed_once = {
        let v: Value = serde_json::from_slice(&body).unwrap();
        let Detected::Model(call) = provider::detect("POST", path, &headers, &v) else {
            panic!("not a model call")
        };
        provider::parse_request_value(&call, &v).unwrap()
    };
    let prompt_ids = tokenizer::encode(&render_prompt(
        &parsed_once.request.messages,
        &parsed_once.request.tools,
        &TemplateOptions::default(),
        true,
    ));
    let events = reply_events();
    // The events as the agent keeps them for the record (pieces of the
    // same text or arguments merged).
    let mut kept = Vec::new();
    for e in events.clone() {
        keep_event(&mut kept, e);
    }
    let tokens = Tokens {
        prompt_token_ids: Some(prompt_ids.clone()),
        response_token_ids: Some((0..200).map(|i| 1000 + i).collect()),
        response_logprobs: Some((0..200).map(|i| -0.01 * i as f32).collect()),
    };
    let dir = tempfile::tempdir().unwrap();
    // `process` durability (written, not synced), and `power` (the line
    // journaled too, the journal synced by the syncing thread, alone here).
    let commit = GroupCommit::start(dir.path(), polar_capture::DEFAULT_JOURNAL_BYTES).unwrap();
    let nosync = Arc::new(LogFile::open(&dir.path().join("a.jsonl"), None).unwrap().0);
    let journaled = Journaled {
        commit,
        session: "bench".parse().unwrap(),
    };
    let sync = Arc::new(
        LogFile::open(&dir.path().join("b.jsonl"), Some(journaled))
            .unwrap()
            .0,
    );
    // The logs are emptied now and then (between timed steps), so the run
    // needs tens of megabytes of disk, not a gigabyte.
    let cap_logs = || {
        for log in [&*nosync, &*sync] {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(log.path())
                .unwrap();
            if f.metadata().unwrap().len() > 32 << 20 {
                f.set_len(0).unwrap();
            }
        }
    };

    let iterations = 600;
    let mut t: [Vec<Duration>; 14] = Default::default();
    let (mut part_len, mut end_len, mut line_len) = (0, 0, 0);
    for i in 0..iterations + 50 {
        let mut d = [Duration::ZERO; 14];
        cap_logs();
        // 0. Request: parse, detect, translate, the backend's body, the
        //    native body kept for the record. The body is a fresh buffer,
        //    as the agent gets it (just read from the connection).
        let body = Bytes::copy_from_slice(&body);
        let t0 = Instant::now();
        let doc = Doc::parse_shared(&body).unwrap();
        let Detected::Model(call) = provider::detect("POST", path, &headers, &doc.root()) else {
            panic!()
        };
        let parsed = provider::parse_request(&call, doc.root()).unwrap();
        let opts = parsed.reply_options(&call, 0);
        let upstream = chat_body_bytes(&backend, &parsed.request, SamplingMode::Train);
        let native_body = RawJson::from_checked(body.clone());
        d[0] = t0.elapsed();
        black_box(upstream);
        drop(doc);

        // 1. Reply: every event through the Anthropic encoder.
        let t1 = Instant::now();
        let mut enc = provider::encoder(call.api, &opts);
        let mut n = 0;
        for e in &events {
            n += enc.push(e).len();
        }
        d[1] = t1.elapsed();
        black_box(n);

        // 2. Also spread over the stream, on the task sending the events:
        //    the reply's token ids and logprobs serialized as they arrive
        //    (one token per event here).
        let (ids, lps) = (
            tokens.response_token_ids.as_deref().unwrap(),
            tokens.response_logprobs.as_deref().unwrap(),
        );
        let t2 = Instant::now();
        let mut reply_tokens = ReplyTokensJson::default();
        for n in 1..=ids.len() {
            reply_tokens.catch_up(&ids[..n], &lps[..n]);
        }
        d[2] = t2.elapsed();

        // 3. While the backend generates (blocking threads): the requests
        //    serialized, then the prompt ids, and the request part written
        //    (one write; its fdatasync, also during generation, is not
        //    timed).
        let native = NativeRequest {
            api: call.api,
            method: "POST".into(),
            host: "api.anthropic.com".into(),
            path: path.into(),
            body: native_body,
        };
        let head = PartHead {
            call_id: call_id(),
            seq: i as u64,
            session_id: "bench".into(),
        };
        let t3 = Instant::now();
        let pre = PreEncoded::requests(&native, &parsed.request);
        let part = encode_request_part(&head, &pre, Some(&prompt_ids))
            .unwrap()
            .unwrap();
        let _written = nosync.append_line(&part).unwrap();
        d[3] = t3.elapsed();
        // The ids the part was written from, given back for the end (a
        // move on the agent).
        let parts = RecordParts::InRequestPart(PartPrompt::Ids(prompt_ids.clone()));
        let _written = sync.append_line(&part).unwrap();
        part_len = part.len();

        // 4. End of the call, as the agent does it: the tokens of the last
        //    events caught up (none left here), the part's prompt ids let
        //    go without comparing them (the stream did not set them
        //    again), the record built, its completion line (the token data
        //    copied in), one write (no fsync).
        let draft = Draft {
            call_id: head.call_id,
            seq: head.seq,
            session_id: head.session_id,
            task_id: Some("t".into()),
            policy_version: None,
            native,
            request: parsed.request,
            received_ms: now_ms(),
        };
        let tokens = tokens.clone();
        let t4 = Instant::now();
        reply_tokens.catch_up(ids, lps);
        let parts = parts.prompt_unchanged();
        let record = draft.finish(
            Produced {
                tokens,
                ..Produced::default()
            },
            &kept,
            None,
        );
        let built = t4.elapsed();
        let end = encode_end(&record, &parts, &reply_tokens).unwrap();
        let _written = nosync.append_line(&end).unwrap();
        d[4] = t4.elapsed();
        end_len = end.len();

        // 5. The same with fdatasync.
        let t5 = Instant::now();
        let end = encode_end(&record, &parts, &reply_tokens).unwrap();
        sync.durable_blocking(sync.append_line(&end).unwrap())
            .unwrap();
        d[5] = built + t5.elapsed();

        // 6. For comparison: the whole line serialized at the end.
        let t6 = Instant::now();
        let line = encode_line(&record).unwrap();
        let _written = nosync.append_line(&line).unwrap();
        d[6] = t6.elapsed();

        // 7. For comparison: the whole line with the parts serialized
        //    ahead (the fallback when no request part was written, and
        //    what every call did before the two-part records).
        let mut pre = pre;
        pre.prompt_token_ids = PreEncoded::prompt(&prompt_ids);
        let t7 = Instant::now();
        let line = encode_record(&record, &pre, &reply_tokens).unwrap();
        let _written = nosync.append_line(&line).unwrap();
        d[7] = built + t7.elapsed();
        line_len = line.len();

        d[8] = d[0] + d[1] + d[2] + d[4];
        d[9] = d[0] + d[1] + d[2] + d[3] + d[4];
        // What the harness waits for: the request step, the end, and the
        // last event's encoding (the others are encoded, and their tokens
        // serialized, as they arrive, between the backend's tokens).
        d[10] = d[0] + d[4] + d[1] / events.len() as u32;

        // What the JSON alone costs on this machine, for scale: the body
        // only validated, parsed into a tree, and that tree written back.
        let t11 = Instant::now();
        black_box(serde_json::from_slice::<serde::de::IgnoredAny>(&body).unwrap());
        d[11] = t11.elapsed();
        let t12 = Instant::now();
        let tree: Value = serde_json::from_slice(&body).unwrap();
        d[12] = t12.elapsed();
        let t13 = Instant::now();
        black_box(serde_json::to_vec(&tree).unwrap());
        d[13] = t13.elapsed();
        if i >= 50 {
            for (k, x) in d.iter().enumerate() {
                t[k].push(*x);
            }
        }
    }
    let messages = parsed_once.request.messages.len();
    println!("\n### 1. Stage work per call (no sockets)\n");
    println!(
        "Request: {} bytes, 50 messages ({messages} normalized, system included), 8 tools; prompt {} tokens \
         (mock tokenizer, about 2 bytes per token); reply 200 tokens ({} events); record: request part {} bytes, \
         completion {} bytes (as one whole line {} bytes). {iterations} iterations, p50/p99 of each step.\n",
        body.len(),
        prompt_ids.len(),
        events.len(),
        part_len,
        end_len,
        line_len
    );
    println!("| step | when | p50 | p99 |\n| --- | --- | --- | --- |");
    let names = [
        (
            "request: JSON parse + detect + translate + backend body",
            "before the backend call",
        ),
        (
            "reply: 200-token stream encoded as Anthropic SSE",
            "spread over the stream",
        ),
        (
            "reply: its 200 token ids and logprobs serialized as they arrive (per call)",
            "spread over the stream",
        ),
        (
            "requests and prompt ids serialized + request part written, no fsync",
            "during generation, blocking thread",
        ),
        (
            "record built + completion line + one write, no fsync",
            "before the last bytes",
        ),
        ("the same + fdatasync", "before the last bytes"),
        (
            "(for comparison) whole line serialized at the end + write",
            "-",
        ),
        (
            "(for comparison) record built + whole line from the parts serialized ahead + write (the fallback)",
            "-",
        ),
        (
            "**critical path total, no fsync** (request + reply + end)",
            "-",
        ),
        ("all CPU work, no fsync", "-"),
        (
            "**latency added to the call**, no fsync (request + end + the last event)",
            "-",
        ),
        (
            "(for scale) the body's JSON only validated (`IgnoredAny`)",
            "-",
        ),
        ("(for scale) the body parsed into a `serde_json` tree", "-"),
        ("(for scale) that tree written back as JSON", "-"),
    ];
    for ((name, when), v) in names.iter().zip(t) {
        let s = stats(v);
        println!("| {name} | {when} | {} | {} |", us(s.p50), us(s.p99));
    }
}

// ------------------------------------------------------------- servers

fn polar() -> &'static str {
    env!("CARGO_BIN_EXE_polar")
}

fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

/// A child process, killed and reaped when dropped (also when the bench
/// panics half-way).
struct Running(Child);

impl Running {
    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent and the mock it calls (the agent stopped first).
struct Servers {
    agent: Running,
    mock: Running,
    mock_addr: SocketAddr,
    agent_addr: SocketAddr,
    _dir: tempfile::TempDir,
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Waits (up to 4 s) until something accepts connections at `addr`.
fn wait_listening(addr: SocketAddr) {
    for _ in 0..200 {
        if std::net::TcpStream::connect(addr).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The agent's configuration in `dir`: its state there, the mock at
/// `mock_addr` as the backend, `agent_extra` lines added to `[agent]`.
fn proxy_config(dir: &Path, mock_addr: SocketAddr, agent_extra: &str) -> std::path::PathBuf {
    let config = dir.join("polar.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = \"{}\"\n{agent_extra}[[backend]]\nname = \"mock\"\ndialect = \"vllm\"\n\
             replicas = [\"http://{mock_addr}\"]\nserved_model = \"polar-mock\"\nrequest_timeout_ms = 60000\n",
            dir.display()
        ),
    )
    .unwrap();
    config
}

/// `cmd` (a `polar` binary) run as `polar proxy` on `config` with
/// `sessions` base-URL sessions `b-0`..; its address once it listens.
fn spawn_proxy(mut cmd: Command, config: &Path, sessions: usize) -> (Child, SocketAddr) {
    cmd.arg("proxy")
        .arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0", "--drain-ms", "100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .env("RUST_LOG", "warn");
    for i in 0..sessions {
        cmd.args(["--session", &format!("b-{i}")]);
    }
    let mut agent = cmd.spawn().unwrap();
    let addr = listening_on(&mut agent);
    (agent, addr)
}

/// The address in a server child's first line, `listening on ADDR`.
fn listening_on(child: &mut Child) -> SocketAddr {
    first_line(child)
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .parse()
        .unwrap()
}

fn start_servers(mock_args: &[&str], sessions: usize, script: Option<&str>) -> Servers {
    let dir = tempfile::tempdir().unwrap();
    let mock_addr = free_port();
    let mut cmd = Command::new(polar());
    cmd.args(["mock-backend", "--listen", &mock_addr.to_string()])
        .args(mock_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(s) = script {
        let p = dir.path().join("script.toml");
        std::fs::write(&p, s).unwrap();
        cmd.arg("--script").arg(p);
    }
    let mock = Running(cmd.spawn().unwrap());
    wait_listening(mock_addr);
    let config = proxy_config(dir.path(), mock_addr, "");
    let (agent, agent_addr) = spawn_proxy(Command::new(polar()), &config, sessions);
    Servers {
        agent: Running(agent),
        mock,
        mock_addr,
        agent_addr,
        _dir: dir,
    }
}

fn http_client() -> HttpClient {
    polar_io::http::client(&ClientOptions::new().pool_max_idle_per_host(2000))
}

fn post(
    addr: SocketAddr,
    path: &str,
    session: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .header("x-polar-session", session)
        .header("x-polar-key", session);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body)).unwrap()
}

/// Sends `req`; returns the time to the first SSE event with generated
/// content and the time to the end.
async fn time_stream(client: &HttpClient, req: Request<Full<Bytes>>) -> (Duration, Duration) {
    let started = Instant::now();
    let resp = client.request(req).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let mut body = resp.into_body();
    let mut parser = SseParser::new();
    let mut first = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.unwrap().into_data() else {
            continue;
        };
        if first.is_some() {
            continue;
        }
        for ev in parser.push(&data).unwrap() {
            let Ok(v) = ev.json() else { continue };
            let content = v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
                || v["delta"]["type"] == "text_delta";
            if content && first.is_none() {
                first = Some(started.elapsed());
            }
        }
    }
    (first.expect("a content event"), started.elapsed())
}

// ------------------------------------------------------------- 2. ttft

async fn ttft() {
    let servers = start_servers(
        &["--max-model-len", "1000000"],
        4,
        Some("final_text = \"The answer is forty two.\"\n"),
    );
    let client = http_client();
    let backend = BackendConfig::new("b", Dialect::Vllm, vec![], "polar-mock");
    let small_chat = json!({"model": "qwen3-coder", "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What is six times seven?"}
    ], "stream": true, "stream_options": {"include_usage": true}});
    let big = big_request();
    // What the agent sends the mock for each request (the direct path gets
    // the same bytes).
    let direct_body = |body: &Value, api_path: &str, headers: &[(&str, &str)]| {
        let Detected::Model(call) = provider::detect("POST", api_path, headers, body) else {
            panic!()
        };
        let parsed = provider::parse_request_value(&call, body).unwrap();
        Bytes::from(chat_body_bytes(
            &backend,
            &parsed.request,
            SamplingMode::Train,
        ))
    };
    let cases = [
        (
            "OpenAI Chat, 2 messages",
            "/v1/chat/completions",
            vec![],
            small_chat.clone(),
        ),
        (
            "Anthropic Messages, 50 messages / 100 KB",
            "/v1/messages",
            vec![("anthropic-version", "2023-06-01")],
            big,
        ),
    ];
    println!("\n### 2. Time to first token, through the agent vs the mock directly\n");
    println!(
        "Streamed; time from sending the request to the first event carrying generated text, \
         p50/p99 of 300 alternating samples each way after 30 warm-up rounds. The agent syncs every record.\n"
    );
    println!(
        "| request | direct p50 | through p50 | added p50 | direct p99 | through p99 |\n| --- | --- | --- | --- | --- | --- |"
    );
    for (name, path, headers, body) in cases {
        let direct = direct_body(&body, path, &headers);
        let through = Bytes::from(body.to_string());
        let (mut d, mut t) = (Vec::new(), Vec::new());
        for i in 0..330 {
            let session = format!("b-{}", i % 4);
            let (dd, _) = time_stream(
                &client,
                post(
                    servers.mock_addr,
                    "/v1/chat/completions",
                    &session,
                    &[],
                    direct.clone(),
                ),
            )
            .await;
            let (tt, _) = time_stream(
                &client,
                post(
                    servers.agent_addr,
                    path,
                    &session,
                    &headers,
                    through.clone(),
                ),
            )
            .await;
            if i >= 30 {
                d.push(dd);
                t.push(tt);
            }
        }
        let (d, t) = (stats(d), stats(t));
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            ms(d.p50),
            ms(t.p50),
            ms(t.p50.saturating_sub(d.p50)),
            ms(d.p99),
            ms(t.p99)
        );
    }
}

// ------------------------------------------------------------- 3. concurrency

/// User + system CPU time of a process.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn concurrent() {
    const CALLS: usize = 1000;
    let words: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
    let script = format!("final_text = \"{}\"\n", words.join(" "));
    let servers = start_servers(&["--token-latency-ms", "5"], CALLS, Some(&script));
    let agent_pid = servers.agent.id();
    let client = Arc::new(http_client());
    let idle = rss_kib(agent_pid, "VmRSS:");
    let body = Bytes::from(
        json!({"model": "qwen3-coder", "messages": [
            {"role": "system", "content": filler(1, 4000)},
            {"role": "user", "content": "Write a poem."}
        ], "stream": true})
        .to_string(),
    );
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let peak = {
        let sampling = Arc::clone(&sampling);
        tokio::spawn(async move {
            let mut peak = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib(agent_pid, "VmRSS:"));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        })
    };
    let mut rounds = Vec::new();
    let (agent_cpu0, mock_cpu0) = (cpu_time(agent_pid), cpu_time(servers.mock.id()));
    for round in 0..2 {
        let started = Instant::now();
        let mut handles = Vec::new();
        for i in 0..CALLS {
            let client = Arc::clone(&client);
            let req = post(
                servers.agent_addr,
                "/v1/chat/completions",
                &format!("b-{i}"),
                &[],
                body.clone(),
            );
            handles.push(tokio::spawn(async move { time_stream(&client, req).await }));
        }
        let mut firsts = Vec::new();
        let mut ends = Vec::new();
        for h in handles {
            let (f, e) = h.await.unwrap();
            firsts.push(f);
            ends.push(e);
        }
        rounds.push((round, started.elapsed(), stats(firsts), stats(ends)));
    }
    let agent_cpu = cpu_time(agent_pid) - agent_cpu0;
    let mock_cpu = cpu_time(servers.mock.id()) - mock_cpu0;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak = peak.await.unwrap();
    let hwm = rss_kib(agent_pid, "VmHWM:");
    let threads = rss_kib(agent_pid, "Threads:");
    let anon = rss_kib(agent_pid, "RssAnon:");
    let after = rss_kib(agent_pid, "VmRSS:");
    let mock_hwm = rss_kib(servers.mock.id(), "VmHWM:");
    let records: usize = (0..CALLS)
        .map(|i| {
            let p = servers
                ._dir
                .path()
                .join("sessions")
                .join(format!("b-{i}"))
                .join("calls.jsonl");
            polar_capture::read_log(Path::new(&p)).map_or(0, |(r, _)| r.len())
        })
        .sum();
    println!("\n### 3. {CALLS} concurrent streaming calls on one agent\n");
    println!(
        "OpenAI Chat, streamed, {CALLS} sessions (one call each per round, 2 rounds), the mock generating 201 tokens per reply \
         at 5 ms per token; every record synced.\n"
    );
    println!(
        "| round | wall time | first token p50 / p99 | reply end p50 / p99 |\n| --- | --- | --- | --- |"
    );
    for (round, wall, f, e) in rounds {
        println!(
            "| {} | {} | {} / {} | {} / {} |",
            round + 1,
            ms(wall),
            ms(f.p50),
            ms(f.p99),
            ms(e.p50),
            ms(e.p99)
        );
    }
    println!(
        "\nAgent resident memory: idle {:.1} MiB, peak sampled {:.1} MiB, high-water mark (VmHWM) {:.1} MiB, after {:.1} MiB. \
         Mock backend high-water mark {:.1} MiB. Records in the logs: {records} of {}. \
         (Agent after the run: {threads} threads, anonymous memory {:.1} MiB.) \
         CPU time over both rounds: agent {:.1} s ({:.1} µs per streamed token), mock backend {:.1} s.",
        idle as f64 / 1024.0,
        peak as f64 / 1024.0,
        hwm as f64 / 1024.0,
        after as f64 / 1024.0,
        mock_hwm as f64 / 1024.0,
        CALLS * 2,
        anon as f64 / 1024.0,
        agent_cpu.as_secs_f64(),
        agent_cpu.as_secs_f64() * 1e6 / (CALLS * 2 * 201) as f64,
        mock_cpu.as_secs_f64(),
    );
}

fn main() {
    if let Ok(upstream) = std::env::var(durability::BARE_UPSTREAM) {
        durability::bare_forwarder(upstream.parse().unwrap());
        return;
    }
    let only = std::env::var("CAPTURE_BENCH_ONLY").unwrap_or_default();
    let run = |part: &str| only.is_empty() || only.split(',').any(|p| p == part);
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if run("stage") {
        stage_work();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if run("ttft") {
        rt.block_on(ttft());
    }
    if run("concurrent") {
        rt.block_on(concurrent());
    }
    if run("durability") {
        // The client's threads on CPU 0, with the mock (the agent on CPU 1).
        let mut cpu0 = nix::sched::CpuSet::new();
        cpu0.set(0).unwrap();
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpu0).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .on_thread_start(move || {
                let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpu0);
            })
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(durability::durability());
    }
}
