//! Benchmark of the interception proxy against the direct path, in one run
//! (no root needed: the proxy takes direct connections on loopback, as it
//! does after the redirect).
//!
//! - Latency at a paced 1,000 requests/s on one keep-alive connection:
//!   client -> upstream directly (HTTP) against client -> proxy (HTTPS,
//!   terminated with a Polar leaf) -> the same upstream (HTTP keep-alive).
//! - Throughput with 64 concurrent keep-alive connections, both ways.
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
use polar_tests::proxy::{ProxyHarness, trusting};
use polar_tests::servers::EchoUpstream;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const PROBE: &str = env!("CARGO_BIN_EXE_polar-probe");
const PACED: usize = 5_000;
const THROUGHPUT_SECS: u64 = 5;
const CONCURRENCY: usize = 64;
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let upstream = EchoUpstream::start("127.0.0.1:0", "echo").await?;
    // The slow upstream's port must be in the config: reserve it first.
    let reserve = std::net::TcpListener::bind("127.0.0.1:0")?;
    let slow_addr = reserve.local_addr()?;
    drop(reserve);
    let slow_url = format!("http://{slow_addr}");
    let harness = ProxyHarness::start(&format!(
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
upstream = "{u}"
[[route]]
host = "slow.bench.test"
action = "model"
upstream = "{s}"
[[route]]
host = "*.bench.test"
action = "model"
upstream = "{u}"
"#,
        u = upstream.url(),
        s = slow_url,
    ))
    .await?;
    let (addr, parts) = (harness.addr, &harness.parts);
    let tls = trusting(&std::fs::read(harness.ca_file())?, &[b"http/1.1"])?;
    let direct = Arc::new(Target {
        addr: upstream.addr,
        tls: None,
        sni: "api.anthropic.com".into(),
    });
    let proxied = Arc::new(Target {
        addr,
        tls: Some(tls.clone()),
        sni: "api.anthropic.com".into(),
    });
    // The same upstream behind HTTPS, as the harness would reach it without Polar.
    let (tls_upstream, up_pem) =
        EchoUpstream::start_tls("127.0.0.1:0", "echo-tls", "api.anthropic.com").await?;
    let direct_tls = Arc::new(Target {
        addr: tls_upstream.addr,
        tls: Some(trusting(up_pem.as_bytes(), &[b"http/1.1"])?),
        sni: "api.anthropic.com".into(),
    });

    let (d, p) = (paced(&direct).await?, paced(&proxied).await?);
    let (d2, p2) = (paced(&direct).await?, paced(&proxied).await?);
    let merge = |a: Vec<f64>, b: Vec<f64>| {
        let mut v = [a, b].concat();
        v.sort_by(f64::total_cmp);
        v
    };
    let (d, p) = (merge(d, d2), merge(p, p2));
    let (dt, dt2) = (paced(&direct_tls).await?, paced(&direct_tls).await?);
    let dt = merge(dt, dt2);
    let tdt = throughput(Arc::clone(&direct_tls)).await?;
    let td = throughput(Arc::clone(&direct)).await?;
    let tp = throughput(Arc::clone(&proxied)).await?;
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
    let hs_cached = handshakes(addr, &tls, &cached).await?;
    let hs_fresh = handshakes(addr, &tls, &fresh).await?;

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
