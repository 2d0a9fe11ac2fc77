//! Benchmark of the transparent redirect (root only): connections per second
//! through the redirect against direct connections to the same listener, in
//! the same run, and the time the agent takes to look up the original
//! destination of an accepted connection.
//!
//! Both clients are the same `polar-probe loop` process making sequential
//! connections (connect, send a byte, wait for the agent to close); the
//! direct one dials the listener's own address from outside any sandbox, the
//! redirected one dials a "remote" loopback address from inside a session.
//! The agent side is the same accept loop for both; for redirected
//! connections it also looks up the record, which is timed on its own.
//!
//! Run: `cargo bench -p polar-tests --bench redirect` (prints a table).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use polar_redirect::{Redirect, RedirectOptions, SessionTarget};
use polar_sandbox::netns::Sockets;
use polar_sandbox::process::{Launch, spawn};
use tokio::io::AsyncReadExt;
use tokio::sync::Mutex;

const PROBE: &str = env!("CARGO_BIN_EXE_polar-probe");
const CONNECTIONS: u64 = 20_000;
const ROUNDS: usize = 3;

struct Server {
    lookups: Mutex<Vec<u64>>,
    accepted: AtomicU64,
}

async fn serve(listener: tokio::net::TcpListener, redirect: Redirect, server: Arc<Server>) {
    loop {
        let Ok((mut stream, peer)) = listener.accept().await else {
            continue;
        };
        let t = Instant::now();
        let found = redirect.original_destination(&stream, peer);
        let ns = t.elapsed().as_nanos() as u64;
        if matches!(found, Ok(Some(_))) {
            server.lookups.lock().await.push(ns);
        }
        server.accepted.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut b = [0u8; 8];
            let _ = stream.read(&mut b).await;
        });
    }
}

async fn run_probe(target: &str, session: Option<&polar_redirect::SessionCgroup>) -> Result<f64> {
    let argv: Vec<std::ffi::OsString> = vec![
        PROBE.into(),
        "loop".into(),
        target.into(),
        CONNECTIONS.to_string().into(),
    ];
    let start = Instant::now();
    let status = match session {
        Some(s) => {
            let dir = s.dir().context("session ended")?;
            let mut child = spawn(Launch {
                argv: &argv,
                cgroup_procs: dir.procs_file()?,
                netns: None,
                env: &[],
                binds: &[],
                stdout: Stdio::null(),
                stderr: Stdio::inherit(),
            })?;
            child.wait().await?
        }
        None => {
            tokio::process::Command::new(PROBE)
                .args(&argv[1..])
                .stdout(Stdio::null())
                .status()
                .await?
        }
    };
    ensure!(status.success(), "probe failed");
    Ok(CONNECTIONS as f64 / start.elapsed().as_secs_f64())
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let redirect = Redirect::start(&RedirectOptions {
        reaper_exe: None,
        sandboxes: None,
    })?;
    let sockets = Sockets::bind_loopback()?;
    let port = sockets.tcp_port();
    let l = sockets.tcp_v4.try_clone()?;
    l.set_nonblocking(true)?;
    let server = Arc::new(Server {
        lookups: Mutex::new(Vec::new()),
        accepted: AtomicU64::new(0),
    });
    tokio::spawn(serve(
        tokio::net::TcpListener::from_std(l)?,
        redirect.clone(),
        Arc::clone(&server),
    ));
    let session = redirect.create_session(
        &"bench".parse()?,
        SessionTarget {
            listen_v4: Ipv4Addr::LOCALHOST,
            listen_v6: Ipv6Addr::LOCALHOST,
            tcp_port: port,
            dns_port: sockets.dns_port(),
            local_bypass: false,
        },
    )?;
    let direct_target = format!("127.0.0.1:{port}");
    let mut direct = Vec::new();
    let mut redirected = Vec::new();
    for _ in 0..ROUNDS {
        direct.push(run_probe(&direct_target, None).await?);
        redirected.push(run_probe("127.10.0.1:443", Some(&session)).await?);
    }
    let mut lookups = server.lookups.lock().await.clone();
    lookups.sort_unstable();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (d, r) = (mean(&direct), mean(&redirected));
    eprintln!(
        "redirect benchmark: {ROUNDS} rounds x {CONNECTIONS} sequential connections each way"
    );
    eprintln!("| path | connections/s (mean) | rounds |");
    eprintln!("| --- | --- | --- |");
    eprintln!("| direct to the listener | {d:.0} | {direct:.0?} |");
    eprintln!("| through the redirect | {r:.0} | {redirected:.0?} |");
    eprintln!("redirected / direct: {:.1}%", 100.0 * r / d);
    eprintln!(
        "original-destination lookup: n={} p50 {:.2} us, p99 {:.2} us, max {:.2} us",
        lookups.len(),
        percentile(&lookups, 0.5),
        percentile(&lookups, 0.99),
        percentile(&lookups, 1.0)
    );
    drop(session);
    redirect.shutdown()?;
    Ok(())
}
