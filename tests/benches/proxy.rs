//! Benchmark of the interception proxy against the direct path, in one run
//! (no root needed: the proxy takes direct connections on loopback, as it
//! does after the redirect).
//!
//! - Latency at a paced 1,000 requests/s on one keep-alive connection:
//!   client -> upstream directly (HTTP) against client -> proxy (HTTPS,
//!   terminated with a Polar leaf) -> the same upstream (HTTP keep-alive).
//! - Throughput with 64 concurrent keep-alive connections, both ways, in two
//!   layouts. *Separate cores* (the target's measurement, as proxies are
//!   benchmarked: the load generator and the upstream on the same hardware
//!   in both paths, the proxy on hardware of its own): the client and the
//!   upstreams pinned to CPU 0, the proxy to CPU 1, in `PINNED_ROUNDS`
//!   alternating rounds, the median ratio reported. *Shared cores*: proxy
//!   and load on both cores, where the run is CPU-bound and the ratio is
//!   the ratio of CPU per request (reported with the CPU each role spent).
//! - A new TLS connection with a cached leaf, and with a leaf issued for it.
//! - Memory per idle established TLS connection (held by another process).
//!
//! Run: `cargo bench -p polar-tests --bench proxy` (prints a table).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;
use polar_tests::proxy::{ProxyHarness, trusting};
use polar_tests::servers::EchoUpstream;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio_rustls::TlsConnector;

const PROBE: &str = env!("CARGO_BIN_EXE_polar-probe");
const PACED: usize = 5_000;
const THROUGHPUT_SECS: u64 = 5;
const CONCURRENCY: usize = 64;
/// Rounds of the separate-cores throughput comparison.
const PINNED_ROUNDS: usize = 3;
const IDLE_CONNECTIONS: usize = 2_000;
const BODY: &[u8] =
    br#"{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}"#;

async fn http1<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: T,
) -> Result<SendRequest<Full<Bytes>>> {
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(conn);
    Ok(send)
}

async fn request(send: &mut SendRequest<Full<Bytes>>, host: &str) -> Result<()> {
    send.ready().await?;
    let req = http::Request::post("/v1/messages")
        .header("host", host)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY)))?;
    let resp = send.send_request(req).await?;
    ensure!(resp.status() == 200, "status {}", resp.status());
    resp.into_body().collect().await?;
    Ok(())
}

struct Target {
    addr: SocketAddr,
    tls: Option<TlsConnector>,
    sni: String,
}

impl Target {
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        match &self.tls {
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.sni.clone())?;
                http1(tls.connect(name, tcp).await?).await
            }
            None => http1(tcp).await,
        }
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Latencies (µs) of `n` requests paced at 1,000/s on one connection.
async fn paced(t: &Target) -> Result<Vec<f64>> {
    let mut send = t.connect().await?;
    for _ in 0..200 {
        request(&mut send, &t.sni).await?;
    }
    let mut lat = Vec::with_capacity(PACED);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for _ in 0..PACED {
        tick.tick().await;
        let s = Instant::now();
        request(&mut send, &t.sni).await?;
        lat.push(s.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

/// Requests per second with `CONCURRENCY` back-to-back connections.
async fn throughput(t: Arc<Target>) -> Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(THROUGHPUT_SECS);
    let mut joins = Vec::new();
    for _ in 0..CONCURRENCY {
        let (t, done) = (Arc::clone(&t), Arc::clone(&done));
        joins.push(tokio::spawn(async move {
            let mut send = t.connect().await?;
            while Instant::now() < stop {
                request(&mut send, &t.sni).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for j in joins {
        j.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / THROUGHPUT_SECS as f64)
}

/// Mean time (µs) of a TCP connect plus TLS handshake for each name.
async fn handshakes(addr: SocketAddr, tls: &TlsConnector, names: &[String]) -> Result<f64> {
    let s = Instant::now();
    for n in names {
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from(n.clone())?;
        let _ = tls.connect(name, tcp).await?;
    }
    Ok(s.elapsed().as_secs_f64() * 1e6 / names.len() as f64)
}

fn rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")
}

/// Thread-name prefixes of the two runtimes: the proxy's, and the load's
/// (the client and the upstreams).
const PROXY_THREADS: &str = "polar-proxy";
const LOAD_THREADS: &str = "bench-load";

/// A runtime of `workers` threads named `name`, every thread pinned to
/// `cpu` when given.
fn runtime(name: &'static str, workers: usize, cpu: Option<usize>) -> Result<Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .on_thread_start(move || {
            if let Some(cpu) = cpu {
                let mut set = CpuSet::new();
                let pinned = set
                    .set(cpu)
                    .and_then(|()| sched_setaffinity(Pid::from_raw(0), &set));
                if let Err(e) = pinned {
                    eprintln!("cannot pin a {name} thread to CPU {cpu}: {e}");
                }
            }
        })
        .build()?)
}

/// CPU time (ns on CPU, from `/proc/self/task/*/schedstat`) used so far by
/// the proxy's threads and by the load's.
fn cpu_by_role() -> Result<(u64, u64)> {
    let (mut proxy, mut load) = (0, 0);
    for entry in std::fs::read_dir("/proc/self/task")? {
        let dir = entry?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let ns: u64 = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        if comm.starts_with(PROXY_THREADS) {
            proxy += ns;
        } else if comm.starts_with(LOAD_THREADS) {
            load += ns;
        }
    }
    Ok((proxy, load))
}

/// A throughput run with the CPU time each role spent per request.
struct Run {
    rate: f64,
    proxy_us: f64,
    load_us: f64,
}

async fn measured(t: Arc<Target>) -> Result<Run> {
    let (p0, l0) = cpu_by_role()?;
    let rate = throughput(t).await?;
    let (p1, l1) = cpu_by_role()?;
    let n = rate * THROUGHPUT_SECS as f64;
    Ok(Run {
        rate,
        proxy_us: (p1 - p0) as f64 / 1e3 / n,
        load_us: (l1 - l0) as f64 / 1e3 / n,
    })
}

fn config(upstream: &str, slow: &str) -> String {
    format!(
        r#"
[proxy]
header_timeout_ms = 120000
idle_timeout_ms = 120000
max_connections = 100000
[ca]
leaf_cache_size = 100000
[[route]]
host = "api.anthropic.com"
action = "model"
provider = "anthropic"
upstream = "{upstream}"
[[route]]
host = "slow.bench.test"
action = "model"
upstream = "{slow}"
[[route]]
host = "*.bench.test"
action = "model"
upstream = "{upstream}"
"#
    )
}

/// Everything the throughput comparison needs, on one pair of runtimes.
struct Setup {
    harness: ProxyHarness,
    upstream: EchoUpstream,
    tls_upstream: EchoUpstream,
    direct: Arc<Target>,
    direct_tls: Arc<Target>,
    proxied: Arc<Target>,
    tls: TlsConnector,
}

/// Starts the upstreams on `load` and the proxy on `proxy`.
fn setup(load: &Runtime, proxy: &Runtime, slow_url: &str) -> Result<Setup> {
    let (upstream, (tls_upstream, up_pem)) = load.block_on(async {
        anyhow::Ok((
            EchoUpstream::start("127.0.0.1:0", "echo").await?,
            // The same upstream behind HTTPS, as the harness would reach
            // it without Polar.
            EchoUpstream::start_tls("127.0.0.1:0", "echo-tls", "api.anthropic.com").await?,
        ))
    })?;
    let harness = proxy.block_on(ProxyHarness::start(&config(&upstream.url(), slow_url)))?;
    let tls = trusting(&std::fs::read(harness.ca_file())?, &[b"http/1.1"])?;
    let sni = "api.anthropic.com".to_owned();
    Ok(Setup {
        direct: Arc::new(Target {
            addr: upstream.addr,
            tls: None,
            sni: sni.clone(),
        }),
        direct_tls: Arc::new(Target {
            addr: tls_upstream.addr,
            tls: Some(trusting(up_pem.as_bytes(), &[b"http/1.1"])?),
            sni: sni.clone(),
        }),
        proxied: Arc::new(Target {
            addr: harness.addr,
            tls: Some(tls.clone()),
            sni,
        }),
        harness,
        upstream,
        tls_upstream,
        tls,
    })
}

fn print_runs(title: &str, d: &Run, dt: &Run, p: &Run) {
    eprintln!("{title}");
    eprintln!(
        "| path | req/s | % of direct HTTP / HTTPS | CPU µs per request: proxy | client + upstream |"
    );
    eprintln!("| --- | --- | --- | --- | --- |");
    for (name, r) in [
        ("direct (HTTP)", d),
        ("direct (HTTPS)", dt),
        ("through the proxy", p),
    ] {
        eprintln!(
            "| {name} | {:.0} | {:.1}% / {:.1}% | {:.1} | {:.1} |",
            r.rate,
            100.0 * r.rate / d.rate,
            100.0 * r.rate / dt.rate,
            r.proxy_us,
            r.load_us
        );
    }
}

fn main() -> Result<()> {
    let only_throughput = std::env::var_os("POLAR_BENCH_THROUGHPUT_ONLY").is_some();
    // The proxy on its own runtime (as in the agent's process), the client
    // and the upstreams on another; two workers each, sharing both cores.
    let proxy_rt = runtime(PROXY_THREADS, 2, None)?;
    let load_rt = runtime(LOAD_THREADS, 2, None)?;
    // The slow upstream's port must be in the config: reserve it first.
    let reserve = std::net::TcpListener::bind("127.0.0.1:0")?;
    let slow_addr = reserve.local_addr()?;
    drop(reserve);
    let slow_url = format!("http://{slow_addr}");
    let s = setup(&load_rt, &proxy_rt, &slow_url)?;
    let shared = load_rt.block_on(async {
        let dt = measured(Arc::clone(&s.direct_tls)).await?;
        let d = measured(Arc::clone(&s.direct)).await?;
        let p = measured(Arc::clone(&s.proxied)).await?;
        anyhow::Ok((d, dt, p))
    })?;
    // Separate cores: the proxy alone on CPU 1, client and upstreams on CPU
    // 0 (one worker each), so the proxy does not take CPU from the load;
    // the three paths alternate, round after round.
    let pinned = {
        let proxy_rt = runtime(PROXY_THREADS, 1, Some(1))?;
        let load_rt = runtime(LOAD_THREADS, 1, Some(0))?;
        let s = setup(&load_rt, &proxy_rt, &slow_url)?;
        let runs = load_rt.block_on(async {
            let mut rounds = Vec::with_capacity(PINNED_ROUNDS);
            for _ in 0..PINNED_ROUNDS {
                let dt = measured(Arc::clone(&s.direct_tls)).await?;
                let d = measured(Arc::clone(&s.direct)).await?;
                let p = measured(Arc::clone(&s.proxied)).await?;
                rounds.push((d, dt, p));
            }
            anyhow::Ok(rounds)
        })?;
        drop(s);
        runs
    };
    eprintln!(
        "proxy benchmark (keep-alive HTTP/1.1, {} byte JSON body, {CONCURRENCY} connections, {THROUGHPUT_SECS} s each)",
        BODY.len()
    );
    print_runs(
        "shared cores: proxy and load on both cores (2 + 2 workers)",
        &shared.0,
        &shared.1,
        &shared.2,
    );
    for (i, (d, dt, p)) in pinned.iter().enumerate() {
        print_runs(
            &format!(
                "separate cores, round {}/{PINNED_ROUNDS}: proxy on CPU 1, client and upstreams on CPU 0 (1 + 1 worker)",
                i + 1
            ),
            d,
            dt,
            p,
        );
    }
    let median = |ratio: fn(&(Run, Run, Run)) -> f64| {
        let mut v: Vec<f64> = pinned.iter().map(ratio).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "separate cores, median of {PINNED_ROUNDS} rounds: through the proxy {:.1}% of direct HTTP, {:.1}% of direct HTTPS",
        median(|(d, _, p)| 100.0 * p.rate / d.rate),
        median(|(_, dt, p)| 100.0 * p.rate / dt.rate),
    );
    if only_throughput {
        return Ok(());
    }
    load_rt.block_on(latency_and_more(&s, &slow_addr, &shared))
}

async fn latency_and_more(
    s: &Setup,
    slow_addr: &SocketAddr,
    shared: &(Run, Run, Run),
) -> Result<()> {
    let (addr, parts, tls) = (s.harness.addr, &s.harness.parts, &s.tls);
    let (direct, proxied, direct_tls) = (&s.direct, &s.proxied, &s.direct_tls);
    let _ = (&s.upstream, &s.tls_upstream);
    let (d, p) = (paced(direct).await?, paced(proxied).await?);
    let (d2, p2) = (paced(direct).await?, paced(proxied).await?);
    let merge = |a: Vec<f64>, b: Vec<f64>| {
        let mut v = [a, b].concat();
        v.sort_by(f64::total_cmp);
        v
    };
    let (d, p) = (merge(d, d2), merge(p, p2));
    let (dt, dt2) = (paced(direct_tls).await?, paced(direct_tls).await?);
    let dt = merge(dt, dt2);
    let (tdt, td, tp) = (shared.1.rate, shared.0.rate, shared.2.rate);
    // The same with an upstream that takes 2 ms per request, as any real
    // inference server takes at least that: the proxy's own cost then sits
    // beside the upstream's time instead of competing with it for the CPU.
    let slow =
        EchoUpstream::start_with_delay(&slow_addr.to_string(), "slow", Duration::from_millis(2))
            .await?;
    let (std_, stp) = (
        Arc::new(Target {
            addr: slow.addr,
            tls: None,
            sni: "slow.bench.test".into(),
        }),
        Arc::new(Target {
            addr,
            tls: Some(tls.clone()),
            sni: "slow.bench.test".into(),
        }),
    );
    let tsd = throughput(std_).await?;
    let tsp = throughput(stp).await?;
    let cached: Vec<String> = (0..200).map(|_| "api.anthropic.com".to_owned()).collect();
    let fresh: Vec<String> = (0..200).map(|i| format!("h{i}.bench.test")).collect();
    let hs_cached = handshakes(addr, tls, &cached).await?;
    let hs_fresh = handshakes(addr, tls, &fresh).await?;

    // Idle established TLS connections held by another process.
    let before = rss_kib()?;
    let mut holder = tokio::process::Command::new(PROBE)
        .args([
            "hold-tls",
            &addr.to_string(),
            &IDLE_CONNECTIONS.to_string(),
            "api.anthropic.com",
        ])
        .arg(&parts.trust.ca)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut out = tokio::io::BufReader::new(holder.stdout.take().context("stdout")?);
    let mut line = String::new();
    out.read_line(&mut line).await?;
    ensure!(
        line.contains(&format!("\"held\":{IDLE_CONNECTIONS}")),
        "{line}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib()?;
    drop(holder.stdin.take());
    let _ = holder.wait().await;

    eprintln!(
        "proxy benchmark (keep-alive HTTP/1.1, {} byte JSON body)",
        BODY.len()
    );
    eprintln!(
        "direct to the upstream over HTTPS: p50 {:.0} µs, p99 {:.0} µs, {tdt:.0} req/s with {CONCURRENCY} connections; through the proxy: {:+.0} µs p50, {:+.0} µs p99, {:.1}% of its throughput",
        pct(&dt, 0.5),
        pct(&dt, 0.99),
        pct(&p, 0.5) - pct(&dt, 0.5),
        pct(&p, 0.99) - pct(&dt, 0.99),
        100.0 * tp / tdt
    );
    eprintln!("| measure | direct to upstream (HTTP) | through the proxy (HTTPS) | difference |");
    eprintln!("| --- | --- | --- | --- |");
    for (name, q) in [
        ("p50 latency at 1,000 req/s", 0.5),
        ("p99 latency at 1,000 req/s", 0.99),
    ] {
        let (a, b) = (pct(&d, q), pct(&p, q));
        eprintln!("| {name} | {a:.0} µs | {b:.0} µs | +{:.0} µs |", b - a);
    }
    eprintln!(
        "| throughput, {CONCURRENCY} connections | {td:.0} req/s | {tp:.0} req/s | {:.1}% of direct |",
        100.0 * tp / td
    );
    eprintln!(
        "| throughput, {CONCURRENCY} connections, upstream taking 2 ms | {tsd:.0} req/s | {tsp:.0} req/s | {:.1}% of direct |",
        100.0 * tsp / tsd
    );
    eprintln!("new TLS connection (connect + handshake), cached leaf: {hs_cached:.0} µs");
    eprintln!("new TLS connection with a leaf issued for it: {hs_fresh:.0} µs");
    eprintln!(
        "memory per idle TLS connection: {:.1} KiB ({IDLE_CONNECTIONS} connections, RSS {before} -> {after} KiB)",
        (after.saturating_sub(before)) as f64 / IDLE_CONNECTIONS as f64
    );
    Ok(())
}
