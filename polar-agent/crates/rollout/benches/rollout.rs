//! Rollout server dispatch benchmark: 10,000 sessions through a
//! real rollout server (SQLite on disk, HTTP on loopback) to simulated
//! gateways, measuring the dispatch latency of every session: from the
//! moment it could go to a node (queued with a free slot, or a slot freed
//! while it waited) to the gateway's acceptance of the push. Side by side:
//! the direct path, the same assignment POSTed straight to a gateway.
//!
//! All sessions are submitted at once (a trainer's batch), so after the
//! first fill every dispatch is a reaction to a slot freed by a result: the
//! latency is the server's (result committed, slot free, next session
//! chosen, assignment committed, pushed, accepted).
//!
//! The latencies are read from the server's `assignment accepted` debug
//! events (`latency_us`), collected by a tracing layer.
//!
//! `cargo bench -p polar-rollout --bench rollout`; knobs in the environment:
//! `ROLLOUT_BENCH_SESSIONS` (10000), `ROLLOUT_BENCH_SAMPLES` (samples per
//! task, 16), `ROLLOUT_BENCH_SUBMITTERS` (2).

#![expect(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "a benchmark binary: it fails loudly and reports on stdout"
)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;
use polar_gateway::sim::{SimGateway, SimGatewayConfig};
use polar_rollout::{RolloutConfig, RolloutServer};
use polar_rollout_api::http::{bearer_value, default_client};
use polar_rollout_api::{RolloutClient, TaskStatus};
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::{Layer, filter};

const TOKEN: &str = "bench-token-1";
const GATEWAY_TOKEN: &str = "bench-gateway-token";

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mean = v.iter().sum::<Duration>().as_secs_f64() * 1e3 / v.len().max(1) as f64;
    println!(
        "{name:<34} n={:<6} mean {:>7.3} ms  p50 {:>7.3}  p90 {:>7.3}  p99 {:>7.3}  p99.9 {:>7.3}  max {:>7.3}",
        v.len(),
        mean,
        ms(percentile(&v, 0.50)),
        ms(percentile(&v, 0.90)),
        ms(percentile(&v, 0.99)),
        ms(percentile(&v, 0.999)),
        ms(v.last().copied().unwrap_or_default()),
    );
}

/// The dispatch latencies of the server's `assignment accepted` events, in
/// the order they happened.
#[derive(Clone, Default)]
struct Latencies(Arc<Mutex<Vec<Duration>>>);

impl Latencies {
    /// Collects them from now on (the process's tracing subscriber).
    fn install() -> Self {
        let me = Self::default();
        let only = filter::Targets::new().with_target("polar_rollout::core", tracing::Level::DEBUG);
        let subscriber = tracing_subscriber::registry().with(me.clone().with_filter(only));
        tracing::subscriber::set_global_default(subscriber).unwrap();
        me
    }

    /// What was collected since the last call.
    fn take(&self) -> Vec<Duration> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl<S: tracing::Subscriber> Layer<S> for Latencies {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            accepted: bool,
            latency_us: Option<u64>,
        }
        impl Visit for Fields {
            fn record_u64(&mut self, field: &Field, value: u64) {
                if field.name() == "latency_us" {
                    self.latency_us = Some(value);
                }
            }
            fn record_str(&mut self, field: &Field, value: &str) {
                self.accepted |= field.name() == "message" && value == "assignment accepted";
            }
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.record_str(field, &format!("{value:?}"));
                }
            }
        }
        let mut f = Fields::default();
        event.record(&mut f);
        if let (true, Some(us)) = (f.accepted, f.latency_us) {
            self.0.lock().unwrap().push(Duration::from_micros(us));
        }
    }
}

fn main() {
    let latencies = Latencies::install();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(&latencies));
}

/// One workload.
struct Scenario {
    gateways: u64,
    slots: u32,
    session_ms: u64,
}

async fn run(latencies: &Latencies) {
    let sessions = knob("ROLLOUT_BENCH_SESSIONS", 10_000);
    let per_task = knob("ROLLOUT_BENCH_SAMPLES", 16);
    let submitters = knob("ROLLOUT_BENCH_SUBMITTERS", 2);
    let scenarios = [
        Scenario {
            gateways: 4,
            slots: 16,
            session_ms: 50,
        },
        Scenario {
            gateways: 4,
            slots: 64,
            session_ms: 200,
        },
    ];
    for sc in scenarios {
        scenario(&sc, sessions, per_task, submitters, latencies).await;
    }
}

async fn scenario(
    sc: &Scenario,
    sessions: u64,
    per_task: u64,
    submitters: u64,
    latencies: &Latencies,
) {
    let tasks = sessions.div_ceil(per_task);
    println!(
        "\n{sessions} sessions = {tasks} tasks x {per_task} samples, submitted at once by \
         {submitters} clients; {} simulated gateways x {} slots; sessions of {} ms +-50% \
         (capacity {:.0} sessions/s)",
        sc.gateways,
        sc.slots,
        sc.session_ms,
        (sc.gateways * u64::from(sc.slots)) as f64 * 1000.0 / sc.session_ms as f64
    );

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RolloutConfig::new(dir.path().join("bench.sqlite"), TOKEN);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.heartbeat_interval = Duration::from_millis(500);
    cfg.heartbeat_timeout = Duration::from_secs(10);
    cfg.gateway_token = GATEWAY_TOKEN.into();
    cfg.node_tokens = (0..sc.gateways)
        .map(|i| (format!("gw-{i}"), format!("bench-node-token-{i}")))
        .collect();
    let server = RolloutServer::start(cfg).await.unwrap();
    let mut gws = Vec::new();
    for i in 0..sc.gateways {
        let mut g = SimGatewayConfig::new(
            &format!("gw-{i}"),
            &server.url(),
            &format!("bench-node-token-{i}"),
        );
        g.accept_token = GATEWAY_TOKEN.into();
        g.max_sessions = sc.slots;
        g.session_time = Duration::from_millis(sc.session_ms);
        g.jitter = 0.5;
        g.heartbeat_interval = Duration::from_millis(500);
        gws.push(SimGateway::start(g).await.unwrap());
    }

    // Direct path: the same assignment POSTed straight to a gateway (then
    // cancelled so it holds no slot), sequentially.
    let direct = direct_path(&gws[0], 2000).await;

    let c = Arc::new(RolloutClient::new(server.url(), Some(TOKEN.into())));
    latencies.take();
    let started = Instant::now();
    let mut handles = Vec::new();
    for s in 0..submitters {
        let c = Arc::clone(&c);
        handles.push(tokio::spawn(async move {
            let mut i = s;
            while i < tasks {
                let t = json!({
                    "task_id": format!("bench-{i}"),
                    "instruction": "benchmark",
                    "num_samples": per_task,
                    "timeout_secs": 600,
                    "agent": {"harness": "shell"},
                    "metadata": {"group_id": format!("g-{i}")},
                });
                c.submit(&t).await.unwrap();
                i += submitters;
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let submitted = started.elapsed();
    loop {
        let done = c
            .tasks(Some(TaskStatus::Completed))
            .await
            .unwrap()
            .tasks
            .len() as u64;
        if done == tasks {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "stuck at {done}/{tasks}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = started.elapsed();
    let latencies = latencies.take();
    let st = c.status().await.unwrap();
    let (_, metrics) = c.raw(Method::GET, "/metrics", None).await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    let counter = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or("?")
            .to_owned()
    };
    println!(
        "submitted in {:.2} s; all {} tasks completed in {:.2} s: {:.0} sessions/s",
        submitted.as_secs_f64(),
        tasks,
        total.as_secs_f64(),
        (tasks * per_task) as f64 / total.as_secs_f64()
    );
    println!(
        "sessions done {}, per gateway {:?}, pushes refused {}",
        st.sessions["done"],
        gws.iter().map(SimGateway::reported).collect::<Vec<_>>(),
        counter("polar_rollout_push_failures_total"),
    );
    let fill = (sc.gateways * u64::from(sc.slots)) as usize;
    summary("dispatch latency, all", latencies.clone());
    summary(
        "  after the first fill",
        latencies.get(fill..).unwrap_or_default().to_vec(),
    );
    summary("direct POST to a gateway", direct);
    for g in gws {
        g.stop().await;
    }
    server.shutdown().await;
}

async fn direct_path(gw: &SimGateway, n: usize) -> Vec<Duration> {
    let http = default_client();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let a = json!({
            "session_id": format!("direct-s{i}"), "attempt": 1, "task_id": "direct",
            "sample_index": i, "instruction": "benchmark", "runtime": {},
            "agent": {"harness": "shell"}, "builder": {"kind": "prefix_merging"},
            "evaluator": {"kind": "session_completed"}, "metadata": {"group_id": "direct"},
            "timeout_secs": 600, "deadline_unix_ms": 0,
        });
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("{}/v1/sessions", gw.address()))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, bearer_value(GATEWAY_TOKEN))
            .body(Full::new(Bytes::from(a.to_string())))
            .unwrap();
        let t = Instant::now();
        let resp = http.request(req).await.unwrap();
        out.push(t.elapsed());
        assert!(resp.status().is_success(), "{}", resp.status());
        let cancel = Request::builder()
            .method(Method::POST)
            .uri(format!("{}/v1/sessions/direct-s{i}/cancel", gw.address()))
            .header(header::AUTHORIZATION, bearer_value(GATEWAY_TOKEN))
            .body(Full::new(Bytes::from(r#"{"attempt":1,"reason":"bench"}"#)))
            .unwrap();
        http.request(cancel).await.unwrap();
    }
    out
}
