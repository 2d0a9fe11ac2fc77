//! Part 4 of the capture bench, the capture log's durability: what each
//! `agent.capture_durability` mode costs a small non-streamed call, against
//! the mock called directly with the same body the agent sends it, in one
//! run: the added latency p50/p99 at one connection (alternating calls),
//! and the throughput at 64 connections spread over 64 sessions and over
//! one session.
//!
//! Throughput is measured on separate cores, as the proxy bench measures
//! it: the agent (`polar proxy`) on CPU 1, the mock and this client on
//! CPU 0. Latency is measured twice: with the agent on the mock's and the
//! client's core too (the proxy bench's latency arrangement: at one
//! connection nothing runs at once, and the figure is the agent's own), and
//! on its own core, where each of the four hand-overs between the cores
//! also waits for the other core to wake (in a virtual machine, a vCPU's
//! wake-up).
//!
//! `CAPTURE_BENCH_STATE_DIR` puts the agents' state directories on another
//! file system (by default they are in the target's temporary directory).
//!
//! At 64 sessions the agent's CPU time per call (user and system, all its
//! threads, from `/proc`) is reported too: throughput there is bounded by
//! the agent's one core, and this figure moves less than calls/s when the
//! virtual machine's speed drifts. So is how busy each of the two cores
//! was (from `/proc/stat`): a row is bound by the agent's core or by the
//! one the mock and the client share, whichever is near 100%.
//!
//! A row has the agent forward every call unchanged to the mock, nothing
//! translated or captured: the floor of the proxy path, under any
//! durability mode. A last row has this bench binary itself forward them
//! ([`bare_forwarder`]: hyper's HTTP/1 server and the agent's pooled
//! client, no Polar code between them): the floor of any proxy on the
//! HTTP stack the agent is built on.
//!
//! With `CAPTURE_BENCH_BASE` set to the path of another `polar` binary (an
//! earlier build, to compare with), its rows are measured in the same run
//! too: in its default mode, or in each of `CAPTURE_BENCH_BASE_MODES`
//! (comma-separated `capture_durability` values).

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

/// What the agent under test does with a call.
enum Role {
    /// Translates it, sends it to the mock and captures it, in this
    /// `capture_durability` mode (`None`: the binary's default, the key
    /// left out).
    Capture(Option<String>),
    /// Forwards it unchanged to the mock (a model route with an `upstream`
    /// and no backend): nothing translated or captured. The floor of the
    /// proxy path, under any capture.
    Forward,
    /// This bench binary as a [`bare_forwarder`] to the mock: no Polar
    /// code between hyper's server and client.
    Bare,
}

/// The mock on CPU 0 and, on `agent_cpu`, `binary`'s `polar proxy` in
/// `role` (its state directory under [`state_parent`]) or this binary as a
/// [`bare_forwarder`].
fn start(binary: &str, role: &Role, agent_cpu: u32) -> Servers {
    let dir = tempfile::tempdir_in(state_parent()).unwrap();
    let (mock, mock_addr) = mock_on(binary, 0);
    let proxy = |config: &Path| spawn_proxy(pinned(binary, agent_cpu), config, CONNECTIONS);
    let (agent, agent_addr) = match role {
        Role::Capture(mode) => {
            let mode = mode
                .as_ref()
                .map_or(String::new(), |m| format!("capture_durability = \"{m}\"\n"));
            proxy(&proxy_config(dir.path(), mock_addr, &mode))
        }
        Role::Forward => {
            let config = dir.path().join("polar.toml");
            std::fs::write(
                &config,
                format!(
                    "backend = []\n[agent]\nstate_dir = \"{}\"\n[[route]]\nhost = \"mock.example\"\n\
                     action = \"model\"\nprovider = \"openai\"\nupstream = \"http://{mock_addr}\"\n",
                    dir.path().display()
                ),
            )
            .unwrap();
            proxy(&config)
        }
        Role::Bare => {
            let exe = std::env::current_exe().unwrap();
            let mut agent = pinned(exe.to_str().unwrap(), agent_cpu)
                .env(BARE_UPSTREAM, mock_addr.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let addr = listening_on(&mut agent);
            (agent, addr)
        }
    };
    Servers {
        agent: Running(agent),
        mock,
        mock_addr,
        agent_addr,
        _dir: dir,
    }
}

/// Where the agents' state directories go: `CAPTURE_BENCH_STATE_DIR` (a
/// directory on the file system to measure), else the target's temporary
/// directory, on this machine's disk.
fn state_parent() -> String {
    std::env::var("CAPTURE_BENCH_STATE_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into())
}

/// `polar mock-backend` on `cpu`, listening.
fn mock_on(binary: &str, cpu: u32) -> (Running, SocketAddr) {
    let addr = free_port();
    let child = pinned(binary, cpu)
        .args(["mock-backend", "--listen", &addr.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(addr);
    (Running(child), addr)
}

/// What two hand-overs between the cores cost (the request to the other
/// core, the reply back): the median of a direct call to a mock on CPU 1
/// minus one to a mock on CPU 0 just before it, from this client on CPU 0.
async fn handover_cost(direct: &Bytes) -> Duration {
    let (_near, near_addr) = mock_on(polar(), 0);
    let (_far, far_addr) = mock_on(polar(), 1);
    let client = http_client();
    let mut diff = Vec::new();
    for i in 0..WARMUP + SAMPLES {
        let path = "/v1/chat/completions";
        let n = call(&client, post(near_addr, path, "b-0", &[], direct.clone())).await;
        let f = call(&client, post(far_addr, path, "b-0", &[], direct.clone())).await;
        if i >= WARMUP {
            diff.push(f.saturating_sub(n));
        }
    }
    stats(diff).p50
}

async fn call(client: &HttpClient, req: Request<Full<Bytes>>) -> Duration {
    let t = Instant::now();
    let resp = client.request(req).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    resp.into_body().collect().await.unwrap();
    t.elapsed()
}

/// What a throughput window measured.
struct Rate {
    calls_per_s: f64,
    /// The CPU time (user and system, every thread) the measured process
    /// spent per call in the window.
    cpu_per_call: Duration,
    /// How busy CPU 0 (the mock and the client) and CPU 1 were in the
    /// window, 0 to 1: the row is bound by whichever is near 1.
    busy: [f64; 2],
}

/// Busy and total time (in clock ticks, since boot) of CPUs 0 and 1, from
/// `/proc/stat` (busy: everything but idle and I/O wait).
fn core_ticks() -> [(u64, u64); 2] {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    [0, 1].map(|cpu| {
        let line = stat
            .lines()
            .find(|l| l.starts_with(&format!("cpu{cpu} ")))
            .unwrap();
        let t: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is
        // already in user).
        let total: u64 = t.iter().take(8).sum();
        (total - t[3] - t[4], total)
    })
}

/// Calls per second over `THROUGHPUT_SECS` with `CONNECTIONS` tasks, each
/// on a connection of its own, task `i` in session `session(i)`, and the
/// CPU time per call of the process `pid` serving them.
async fn throughput(
    addr: SocketAddr,
    pid: u32,
    path: &'static str,
    body: &Bytes,
    session: impl Fn(usize) -> String,
) -> Rate {
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
    let start = (done.load(Ordering::Relaxed), Instant::now(), cpu_time(pid));
    let ticks = core_ticks();
    tokio::time::sleep(Duration::from_secs(THROUGHPUT_SECS)).await;
    let n = done.load(Ordering::Relaxed) - start.0;
    let rate = Rate {
        calls_per_s: n as f64 / start.1.elapsed().as_secs_f64(),
        cpu_per_call: (cpu_time(pid) - start.2) / u32::try_from(n.max(1)).unwrap(),
        busy: {
            let end = core_ticks();
            [0, 1].map(|c| (end[c].0 - ticks[c].0) as f64 / (end[c].1 - ticks[c].1).max(1) as f64)
        },
    };
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

    // The base binary's rows first, then this build's.
    let mut runs: Vec<(String, String, Role)> = Vec::new();
    if let Ok(base) = std::env::var("CAPTURE_BENCH_BASE") {
        let modes = std::env::var("CAPTURE_BENCH_BASE_MODES").unwrap_or_default();
        let modes: Vec<&str> = modes.split(',').filter(|m| !m.is_empty()).collect();
        if modes.is_empty() {
            runs.push((
                "base binary, its default".into(),
                base.clone(),
                Role::Capture(None),
            ));
        }
        for m in modes {
            runs.push((
                format!("base binary, {m}"),
                base.clone(),
                Role::Capture(Some(m.into())),
            ));
        }
    }
    for (name, mode) in [("power (default)", "power"), ("process", "process")] {
        runs.push((
            name.into(),
            polar().into(),
            Role::Capture(Some(mode.into())),
        ));
    }
    runs.push((
        "forwarding only, nothing captured".into(),
        polar().into(),
        Role::Forward,
    ));
    runs.push((
        "bare hyper forwarder, no Polar code".into(),
        // The mock's binary: the forwarder is this one.
        polar().into(),
        Role::Bare,
    ));
    println!("\n### 4. Capture log durability, small non-streamed call\n");
    println!(
        "OpenAI Chat, 1 message, 8 tokens, not streamed; the mock and the client on CPU 0, the \
         agent on CPU 0 too (shared core) or on CPU 1 (separate cores); the state directories in \
         {}. Latency: {SAMPLES} alternating calls each way on one connection \
         after {WARMUP}, added = through the agent minus direct. Throughput, separate cores: \
         {CONNECTIONS} connections for {THROUGHPUT_SECS} s.\n",
        state_parent()
    );
    println!(
        "Two hand-overs between the cores (a direct call to a mock on CPU 1 instead of CPU 0) \
         add {} at p50; through the agent on its own core a call makes four.\n",
        us(handover_cost(&direct).await)
    );
    println!(
        "| mode | direct p50 | added p50, shared core | added p99, shared core | added p50, separate cores | added p99, separate cores | direct calls/s | 64 sessions calls/s | agent CPU per call, 64 sessions | CPU 0 / CPU 1 busy, 64 sessions | 1 session calls/s |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (name, binary, role) in runs {
        // A forwarded call reaches the mock as it was sent: the mock's own
        // body.
        let through = match role {
            Role::Capture(_) => &through,
            Role::Forward | Role::Bare => &direct,
        };
        let shared = start(&binary, &role, 0);
        let (d, t) = latency(&shared, &direct, through).await;
        drop(shared);
        let pair = start(&binary, &role, 1);
        let (_, apart) = latency(&pair, &direct, through).await;
        let path = "/v1/chat/completions";
        let (mock, agent) = (pair.mock.id(), pair.agent.id());
        let direct_rate = throughput(pair.mock_addr, mock, path, &direct, |_| "b-0".into()).await;
        let spread = throughput(pair.agent_addr, agent, path, through, |i| format!("b-{i}")).await;
        let one = throughput(pair.agent_addr, agent, path, through, |_| "b-0".into()).await;
        println!(
            "| {name} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {} | {:.0}% / {:.0}% | {:.0} |",
            us(d.p50),
            us(t.p50),
            us(t.p99),
            us(apart.p50),
            us(apart.p99),
            direct_rate.calls_per_s,
            spread.calls_per_s,
            us(spread.cpu_per_call),
            spread.busy[0] * 100.0,
            spread.busy[1] * 100.0,
            one.calls_per_s,
        );
    }
}

/// Latency of the direct call, and what the agent adds to it: `SAMPLES`
/// calls each way, alternating, on one keep-alive connection each, after
/// `WARMUP`. The added p50 is the median of each through-the-agent call's
/// latency minus the direct call's just before it (a pair shares the
/// machine's moment, which on a shared virtual machine drifts by more than
/// the agent adds); the added p99 is the p99 through the agent minus the
/// direct p99.
async fn latency(pair: &Servers, direct: &Bytes, through: &Bytes) -> (Stats, Stats) {
    let client = http_client();
    let (mut d, mut t, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..WARMUP + SAMPLES {
        let path = "/v1/chat/completions";
        let dd = call(
            &client,
            post(pair.mock_addr, path, "b-0", &[], direct.clone()),
        )
        .await;
        let tt = call(
            &client,
            post(pair.agent_addr, path, "b-0", &[], through.clone()),
        )
        .await;
        if i >= WARMUP {
            d.push(dd);
            t.push(tt);
            diff.push(tt.saturating_sub(dd));
        }
    }
    let (d, t, diff) = (stats(d), stats(t), stats(diff));
    let added = Stats {
        p50: diff.p50,
        p99: t.p99.saturating_sub(d.p99),
    };
    (d, added)
}

/// The variable that makes this bench binary a [`bare_forwarder`] to the
/// address it holds.
pub(super) const BARE_UPSTREAM: &str = "CAPTURE_BENCH_BARE_UPSTREAM";

/// Forwards every request to `upstream` and streams its reply back, with
/// hyper's HTTP/1 server (on the runtime the agent's CLI builds) and the
/// agent's pooled HTTP client, nothing between them; prints `listening on
/// ADDR` and serves until killed.
pub(super) fn bare_forwarder(upstream: SocketAddr) {
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("listening on {}", listener.local_addr().unwrap());
        let client: HttpClient<Incoming> =
            polar_io::http::client(&ClientOptions::new().pool_max_idle_per_host(2000));
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            stream.set_nodelay(true).unwrap();
            let client = client.clone();
            tokio::spawn(async move {
                let forward = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                    let client = client.clone();
                    async move {
                        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
                        *req.uri_mut() = format!("http://{upstream}{path}").parse().unwrap();
                        client.request(req).await
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), forward)
                    .await;
            });
        }
    });
}
