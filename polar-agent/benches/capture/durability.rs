//! Part 4 of the capture bench, the capture log's durability: what each
//! `agent.capture_durability` mode costs a small non-streamed call, against
//! the mock called directly with the same body the agent sends it, in one
//! run: the added latency p50/p99 at one connection (alternating calls),
//! and the throughput at 64 connections spread over 64 sessions and over
//! one session. Separate cores, as the proxy bench measures: the agent
//! (`polar proxy`) on CPU 1, the mock and this client on CPU 0. With
//! `CAPTURE_BENCH_BASE` set to the path of another `polar` binary (the one
//! before group commit), its rows are measured in the same run too (its
//! default: one `fdatasync` per call).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;

const WARMUP: usize = 200;
const SAMPLES: usize = 2000;
const CONNECTIONS: usize = 64;
const THROUGHPUT_SECS: u64 = 5;

/// `taskset -c CPU polar ARGS`: every thread of the child on `cpu`.
fn pinned(binary: &str, cpu: u32) -> Command {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &cpu.to_string(), binary]);
    cmd
}

struct Pair {
    mock: Child,
    agent: Child,
    mock_addr: SocketAddr,
    agent_addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for c in [&mut self.agent, &mut self.mock] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The mock on CPU 0 and `binary`'s `polar proxy` on CPU 1, its state
/// directory on this machine's disk, with `durability` (`None`: the
/// binary's default, the key left out).
fn start(binary: &str, durability: Option<&str>) -> Pair {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mock_addr = free_port();
    let mock = pinned(binary, 0)
        .args(["mock-backend", "--listen", &mock_addr.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(mock_addr);
    let mode = durability.map_or(String::new(), |m| format!("capture_durability = \"{m}\"\n"));
    let config = proxy_config(dir.path(), mock_addr, &mode);
    let (agent, agent_addr) = spawn_proxy(pinned(binary, 1), &config, CONNECTIONS);
    Pair {
        mock,
        agent,
        mock_addr,
        agent_addr,
        _dir: dir,
    }
}

async fn call(client: &HttpClient, req: Request<Full<Bytes>>) -> Duration {
    let t = Instant::now();
    let resp = client.request(req).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    resp.into_body().collect().await.unwrap();
    t.elapsed()
}

/// Calls per second over `THROUGHPUT_SECS` with `CONNECTIONS` tasks, each
/// on a connection of its own, task `i` in session `session(i)`.
async fn throughput(
    addr: SocketAddr,
    path: &'static str,
    body: &Bytes,
    session: impl Fn(usize) -> String,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..CONNECTIONS {
        let (stop, done, body, session) = (
            Arc::clone(&stop),
            Arc::clone(&done),
            body.clone(),
            session(i),
        );
        tasks.push(tokio::spawn(async move {
            // One client per task: one keep-alive connection each.
            let client = http_client();
            while !stop.load(Ordering::Relaxed) {
                call(&client, post(addr, path, &session, &[], body.clone())).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Warm-up, then the measured window.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = (done.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(THROUGHPUT_SECS)).await;
    let n = done.load(Ordering::Relaxed) - start.0;
    let rate = n as f64 / start.1.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    rate
}

pub(super) async fn durability() {
    let body = json!({"model": "qwen3-coder", "messages": [
        {"role": "user", "content": "What is six times seven?"}
    ], "max_tokens": 8, "stream": false});
    let backend = BackendConfig::new("b", Dialect::Vllm, vec![], "polar-mock");
    let no_headers: &[(&str, &str)] = &[];
    let Detected::Model(c) = provider::detect("POST", "/v1/chat/completions", no_headers, &body)
    else {
        panic!("a model call")
    };
    let parsed = provider::parse_request_value(&c, &body).unwrap();
    let direct = Bytes::from(chat_body_bytes(
        &backend,
        &parsed.request,
        SamplingMode::Train,
    ));
    let through = Bytes::from(body.to_string());

    let mut runs: Vec<(String, String, Option<&str>)> = vec![
        ("power (default)".into(), polar().into(), Some("power")),
        ("process".into(), polar().into(), Some("process")),
    ];
    if let Ok(base) = std::env::var("CAPTURE_BENCH_BASE") {
        runs.insert(
            0,
            (
                "before group commit (one fdatasync per call)".into(),
                base,
                None,
            ),
        );
    }
    println!("\n### 4. Capture log durability, small non-streamed call, separate cores\n");
    println!(
        "OpenAI Chat, 1 message, 8 tokens, not streamed; the agent on CPU 1, the mock and the \
         client on CPU 0; the state directory on this machine's disk. Latency: {SAMPLES} \
         alternating calls each way on one connection after {WARMUP}. Throughput: \
         {CONNECTIONS} connections for {THROUGHPUT_SECS} s.\n"
    );
    println!(
        "| mode | direct p50 | added p50 | added p99 | direct calls/s | 64 sessions calls/s | 1 session calls/s |\n\
         | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (name, binary, mode) in runs {
        let pair = start(&binary, mode);
        let client = http_client();
        let (mut d, mut t) = (Vec::new(), Vec::new());
        for i in 0..WARMUP + SAMPLES {
            let dd = call(
                &client,
                post(
                    pair.mock_addr,
                    "/v1/chat/completions",
                    "b-0",
                    &[],
                    direct.clone(),
                ),
            )
            .await;
            let tt = call(
                &client,
                post(
                    pair.agent_addr,
                    "/v1/chat/completions",
                    "b-0",
                    &[],
                    through.clone(),
                ),
            )
            .await;
            if i >= WARMUP {
                d.push(dd);
                t.push(tt);
            }
        }
        let (d, t) = (stats(d), stats(t));
        let direct_rate = throughput(pair.mock_addr, "/v1/chat/completions", &direct, |_| {
            "b-0".into()
        })
        .await;
        let spread = throughput(pair.agent_addr, "/v1/chat/completions", &through, |i| {
            format!("b-{i}")
        })
        .await;
        let one = throughput(pair.agent_addr, "/v1/chat/completions", &through, |_| {
            "b-0".into()
        })
        .await;
        println!(
            "| {name} | {} | {} | {} | {direct_rate:.0} | {spread:.0} | {one:.0} |",
            us(d.p50),
            us(t.p50.saturating_sub(d.p50)),
            us(t.p99.saturating_sub(d.p99)),
        );
    }
}
