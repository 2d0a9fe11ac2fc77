//! Retention soak (BENCHMARKS.md, "Bounded state"): hundreds of thousands of
//! sessions through a real rollout server (`polar rollout serve`, SQLite on
//! disk, a short `retention_secs`) and simulated gateways (`polar rollout
//! sim-gateway`, each its own process), all on loopback. A driver keeps a
//! few tasks in flight, each with a callback to the driver: every task's
//! callback must show every sample done with the reward its gateway gave
//! (nothing live lost). Meanwhile the resident memory (`VmRSS`) and open
//! files (`/proc/<pid>/fd`) of the server and of each gateway, the
//! database's size (file + WAL) and the server's counts of tasks and
//! sessions it holds are sampled; the summary compares the samples after
//! the retention window (the steady state) with each other.
//!
//! A measurement, not a test: it fails only when a session is lost or a
//! process dies, never on a figure. Build the binary it drives first:
//! `cargo build --bin polar && cargo run -p polar-tests --bin polar-soak`.
//! Knobs (environment): `SOAK_SESSIONS` (200000), `SOAK_GATEWAYS` (4),
//! `SOAK_SLOTS` (sessions per gateway, 16), `SOAK_SESSION_MS` (2),
//! `SOAK_SAMPLES` (samples per task, 64), `SOAK_IN_FLIGHT` (tasks at once,
//! 8), `SOAK_RETENTION_SECS` (20), `SOAK_EVERY_SECS` (sampling, 5).
//! Figures in BENCHMARKS.md ("Bounded state").
#![forbid(unsafe_code)]
#![expect(
    clippy::print_stdout,
    reason = "a measurement binary: it reports on stdout"
)]

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use http::StatusCode;
use polar_io::tasks::Tasks;
use polar_rollout_api::RolloutClient;
use polar_rollout_api::http::{json, read_body};
use polar_rollout_api::serve::{ServeLimits, serve};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const TRAINER: &str = "soak-trainer-token";
const GATEWAY: &str = "soak-gateway-token";

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn node_token(i: u64) -> String {
    format!("soak-node-token-{i}")
}

/// One process's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Proc {
    rss_kib: u64,
    fds: u64,
}

fn proc_of(pid: u32) -> Result<Proc> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("process {pid} is gone"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
    Ok(Proc { rss_kib, fds })
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// One sample of everything.
#[derive(Clone, Debug)]
struct Sample {
    at_s: f64,
    finished: u64,
    server: Proc,
    gateways: Vec<Proc>,
    db_bytes: u64,
    wal_bytes: u64,
    tasks_held: u64,
    sessions_held: u64,
    load1: f64,
}

/// What the callbacks saw.
#[derive(Default)]
struct Seen {
    tasks: HashSet<String>,
    sessions: u64,
    bad: Vec<String>,
}

/// Checks a delivered task: every sample done and completed, with the
/// simulated gateway's reward `1 / (1 + index)`. Returns its sessions.
fn check_task(v: &Value) -> Result<u64, String> {
    let id = v["task_id"].as_str().unwrap_or("?");
    if v["status"] != "completed" {
        return Err(format!("{id}: status {}", v["status"]));
    }
    let samples = v["samples"].as_array().map_or(&[][..], Vec::as_slice);
    let n = v["num_samples"].as_u64().unwrap_or(0);
    if samples.len() as u64 != n {
        return Err(format!("{id}: {} samples of {n}", samples.len()));
    }
    for s in samples {
        let i = s["sample_index"].as_f64().unwrap_or(-1.0);
        let r = &s["result"];
        let want = 1.0 / (1.0 + i);
        if s["state"] != "done"
            || r["status"] != "completed"
            || r["reward"].as_f64().is_none_or(|x| (x - want).abs() > 1e-9)
        {
            return Err(format!("{id}: sample {i}: {s}"));
        }
    }
    Ok(n)
}

/// The callback receiver: records each task once, tells the driver.
async fn receive(
    listener: TcpListener,
    tasks: Tasks,
    seen: Arc<Mutex<Seen>>,
    done: mpsc::UnboundedSender<()>,
) {
    let handle = move |req: http::Request<hyper::body::Incoming>| {
        let (seen, done) = (Arc::clone(&seen), done.clone());
        async move {
            let Some(body) = read_body(req.into_body(), 64 << 20).await else {
                return json(StatusCode::BAD_REQUEST, &json!({"error": "body"}));
            };
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let id = v["task_id"].as_str().unwrap_or_default().to_owned();
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            if s.tasks.insert(id) {
                match check_task(&v) {
                    Ok(n) => s.sessions += n,
                    Err(e) => s.bad.push(e),
                }
                let _ = done.send(());
            }
            json(StatusCode::OK, &json!({"ok": true}))
        }
    };
    serve(
        "soak-callbacks",
        listener,
        &tasks,
        ServeLimits::default(),
        None,
        handle,
    )
    .await;
}

fn spawn(polar: &Path, args: &[String], log: &Path) -> Result<Child> {
    let out = std::fs::File::create(log)?;
    Command::new(polar)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {} {args:?}", polar.display()))
}

fn stop(children: &mut [Child]) {
    for c in children.iter() {
        if let Ok(pid) = i32::try_from(c.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    for c in children.iter_mut() {
        let _ = c.wait();
    }
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let sessions = knob("SOAK_SESSIONS", 200_000);
    let gateways = knob("SOAK_GATEWAYS", 4);
    let slots = knob("SOAK_SLOTS", 16);
    let session_ms = knob("SOAK_SESSION_MS", 2);
    let samples = knob("SOAK_SAMPLES", 64).clamp(1, 1024);
    let in_flight = knob("SOAK_IN_FLIGHT", 8).max(1);
    let retention = knob("SOAK_RETENTION_SECS", 20).max(1);
    let every = Duration::from_secs(knob("SOAK_EVERY_SECS", 5).max(1));
    let polar = polar_tests::polar_bin()?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("rollout.sqlite");
    let port = free_port()?;
    let url = format!("http://127.0.0.1:{port}");
    let node_tokens: String = (0..gateways)
        .map(|i| format!("soak-{i} = \"{}\"\n", node_token(i)))
        .collect();
    let config = format!(
        "[rollout]\nlisten = \"127.0.0.1:{port}\"\ndatabase = \"{}\"\ntokens = [\"{TRAINER}\"]\n\
         gateway_token = \"{GATEWAY}\"\nretention_secs = {retention}\nheartbeat_interval_ms = 1000\n\
         [rollout.node_tokens]\n{node_tokens}",
        db.display()
    );
    let cfg = dir.path().join("rollout.toml");
    std::fs::write(&cfg, config)?;
    let mut children = vec![spawn(
        &polar,
        &[
            "rollout".into(),
            "serve".into(),
            "--config".into(),
            cfg.display().to_string(),
        ],
        &dir.path().join("server.log"),
    )?];
    let client = RolloutClient::new(url.clone(), Some(TRAINER.into()));
    let until = Instant::now() + Duration::from_secs(30);
    while client.status().await.is_err() {
        ensure!(
            Instant::now() < until,
            "the server did not start: {}",
            std::fs::read_to_string(dir.path().join("server.log"))?
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..gateways {
        children.push(spawn(
            &polar,
            &[
                "rollout".into(),
                "sim-gateway".into(),
                "--server".into(),
                url.clone(),
                "--node-id".into(),
                format!("soak-{i}"),
                "--token".into(),
                node_token(i),
                "--accept-token".into(),
                GATEWAY.into(),
                "--max-sessions".into(),
                slots.to_string(),
                "--session-ms".into(),
                session_ms.to_string(),
            ],
            &dir.path().join(format!("gateway-{i}.log")),
        )?);
    }
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let run = drive(
        &client,
        &pids,
        &db,
        Params {
            sessions,
            samples,
            in_flight,
            every,
        },
    )
    .await;
    // Retention deleted the first task long ago.
    let first_gone = client.task("soak-0").await.err().and_then(|e| e.status());
    stop(&mut children);
    let (seen, rows, elapsed) = run?;
    report(
        &rows,
        retention,
        elapsed,
        &seen,
        Config {
            gateways,
            slots,
            session_ms,
            samples,
            in_flight,
        },
    );
    ensure!(
        seen.bad.is_empty(),
        "sessions without their result: {:?}",
        &seen.bad[..seen.bad.len().min(5)]
    );
    // Past the retention window (with a tick's slack), the first task is
    // gone; a run shorter than that measures the state within retention.
    if elapsed > Duration::from_secs(retention + 5) {
        ensure!(
            first_gone == Some(StatusCode::NOT_FOUND),
            "the first task was not deleted after the retention: {first_gone:?}"
        );
    }
    Ok(())
}

struct Params {
    sessions: u64,
    samples: u64,
    in_flight: u64,
    every: Duration,
}

struct Config {
    gateways: u64,
    slots: u64,
    session_ms: u64,
    samples: u64,
    in_flight: u64,
}

/// Submits tasks until `sessions` ran, `in_flight` at once, sampling
/// every `every`; returns what the callbacks saw, the samples and the
/// time taken.
async fn drive(
    client: &RolloutClient,
    pids: &[u32],
    db: &Path,
    p: Params,
) -> Result<(Seen, Vec<Sample>, Duration)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let callback = format!("http://{}/done", listener.local_addr()?);
    let tasks = Tasks::new();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    {
        let (t, s) = (tasks.clone(), Arc::clone(&seen));
        tasks.spawn(receive(listener, t, s, tx));
    }
    let total_tasks = p.sessions.div_ceil(p.samples);
    let t0 = Instant::now();
    let mut next_sample = t0;
    let mut rows = Vec::new();
    let (mut submitted, mut finished) = (0u64, 0u64);
    let wal = db.with_extension("sqlite-wal");
    while finished < total_tasks {
        while submitted < total_tasks && submitted - finished < p.in_flight {
            let task = json!({
                "task_id": format!("soak-{submitted}"),
                "instruction": "soak",
                "num_samples": p.samples,
                "timeout_secs": 600,
                "agent": {"harness": "shell"},
                "callback_url": callback,
            });
            client.submit(&task).await.context("submitting")?;
            submitted += 1;
        }
        if Instant::now() >= next_sample {
            next_sample += p.every;
            let status = client.status().await.context("the server's status")?;
            let mut gws = Vec::new();
            for pid in &pids[1..] {
                gws.push(proc_of(*pid)?);
            }
            let row = Sample {
                at_s: t0.elapsed().as_secs_f64(),
                finished: lock(&seen).sessions,
                server: proc_of(pids[0])?,
                gateways: gws,
                db_bytes: file_len(db),
                wal_bytes: file_len(&wal),
                tasks_held: status.tasks.values().sum(),
                sessions_held: status.sessions.values().sum(),
                load1: load1(),
            };
            print_row(&row);
            rows.push(row);
        }
        let wait = next_sample.saturating_duration_since(Instant::now());
        tokio::select! {
            got = rx.recv() => {
                if got.is_none() {
                    bail!("the callback receiver stopped");
                }
                finished += 1;
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
    let elapsed = t0.elapsed();
    tasks.drain(Duration::from_secs(2)).await;
    let seen = std::mem::take(&mut *lock(&seen));
    Ok((seen, rows, elapsed))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_row(r: &Sample) {
    let gw_rss: Vec<String> = r
        .gateways
        .iter()
        .map(|g| format!("{:.1}", mib(g.rss_kib)))
        .collect();
    let gw_fds: Vec<String> = r.gateways.iter().map(|g| g.fds.to_string()).collect();
    println!(
        "t={:>6.1}s finished={:>8} server rss={:>7.1} MiB fds={:>4} | gateways rss=[{}] MiB fds=[{}] | db={:>6.2} MiB wal={:>6.2} MiB | held tasks={} sessions={} | load {:.1}",
        r.at_s,
        r.finished,
        mib(r.server.rss_kib),
        r.server.fds,
        gw_rss.join(" "),
        gw_fds.join(" "),
        r.db_bytes as f64 / 1048576.0,
        r.wal_bytes as f64 / 1048576.0,
        r.tasks_held,
        r.sessions_held,
        r.load1
    );
}

/// The range of `f` over the samples.
fn range(rows: &[&Sample], f: impl Fn(&Sample) -> f64) -> (f64, f64) {
    rows.iter()
        .map(|r| f(r))
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

fn report(rows: &[Sample], retention: u64, elapsed: Duration, seen: &Seen, c: Config) {
    let rate = seen.sessions as f64 / elapsed.as_secs_f64();
    println!(
        "\n{} sessions ({} tasks of {}) in {:.0} s: {:.0} sessions/s; {} gateways x {} slots, {} ms sessions, {} tasks in flight, retention {} s; lost: {}",
        seen.sessions,
        seen.tasks.len(),
        c.samples,
        elapsed.as_secs_f64(),
        rate,
        c.gateways,
        c.slots,
        c.session_ms,
        c.in_flight,
        retention,
        seen.bad.len()
    );
    // The steady state: from two retention windows in (the first tasks
    // are deleted by then) to the end.
    let steady: Vec<&Sample> = rows
        .iter()
        .filter(|r| r.at_s >= 2.0 * retention as f64)
        .collect();
    if steady.is_empty() {
        println!("(no sample after two retention windows: run longer)");
        return;
    }
    let line = |name: &str, (lo, hi): (f64, f64), unit: &str| {
        println!("  {name:<28} {lo:>9.1} .. {hi:>9.1} {unit}");
    };
    println!(
        "steady state, {} samples from t={:.0} s (finished {} .. {}):",
        steady.len(),
        steady[0].at_s,
        steady[0].finished,
        steady[steady.len() - 1].finished
    );
    line(
        "server VmRSS",
        range(&steady, |r| mib(r.server.rss_kib)),
        "MiB",
    );
    line(
        "server open files",
        range(&steady, |r| r.server.fds as f64),
        "",
    );
    let gw_min = |r: &Sample| {
        r.gateways
            .iter()
            .map(|g| mib(g.rss_kib))
            .fold(f64::MAX, f64::min)
    };
    let gw_max = |r: &Sample| {
        r.gateways
            .iter()
            .map(|g| mib(g.rss_kib))
            .fold(0.0, f64::max)
    };
    line(
        "gateway VmRSS (any gateway)",
        (range(&steady, gw_min).0, range(&steady, gw_max).1),
        "MiB",
    );
    let fd_min = |r: &Sample| {
        r.gateways
            .iter()
            .map(|g| g.fds as f64)
            .fold(f64::MAX, f64::min)
    };
    let fd_max = |r: &Sample| r.gateways.iter().map(|g| g.fds as f64).fold(0.0, f64::max);
    line(
        "gateway open files (any)",
        (range(&steady, fd_min).0, range(&steady, fd_max).1),
        "",
    );
    line(
        "database + WAL",
        range(&steady, |r| (r.db_bytes + r.wal_bytes) as f64 / 1048576.0),
        "MiB",
    );
    line(
        "tasks held by the server",
        range(&steady, |r| r.tasks_held as f64),
        "",
    );
    line(
        "sessions held by the server",
        range(&steady, |r| r.sessions_held as f64),
        "",
    );
    line("load average (1 min)", range(&steady, |r| r.load1), "");
    let first = steady[0];
    let last = steady[steady.len() - 1];
    println!(
        "  server VmRSS first -> last steady sample: {:.1} -> {:.1} MiB over {} more sessions",
        mib(first.server.rss_kib),
        mib(last.server.rss_kib),
        last.finished - first.finished
    );
}
