//! Sandbox benchmark (root only): `cargo bench -p polar-tests --bench sandbox`.
//!
//! 1. Start latency of a `native` sandbox: from the call of
//!    `polar_node::harness::run::run` (one agent, redirect already
//!    attached, as on a gateway node) to the first instruction of the
//!    sandboxed program: `polar-probe started FILE`, which records the wall
//!    clock first thing in `main`. 5 warm-up runs, then 40 measured. The
//!    sandbox's view is the allowlist, so the probe's directory is a
//!    read-only mount of the runtime spec (at [`PROBE_DIR`]).
//! 2. 32 sandboxes at once on this node, each running `curl` against the
//!    hard-coded `https://api.anthropic.com/v1/messages` with its session id
//!    in the body: every reply must reach its own sandbox, and the upstream
//!    must have received exactly one request per session with that
//!    session's id (attribution through the redirect, TLS and the proxy).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail, ensure};
use polar_config::Config;
use polar_harness::HarnessName;
use polar_harness::ModeKind;
use polar_node::agent::AgentParts;
use polar_node::harness::run::{HarnessOutcome, HarnessRun, run};
use polar_redirect::{Redirect, RedirectOptions};
use polar_spec::runtime::RuntimeSpec;
use polar_tests::servers::EchoUpstream;
use polar_tests::{polar_bin, probe_bin, sandbox_tempdir};
use tokio_util::sync::CancellationToken;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Where the probe's directory appears in the sandbox.
const PROBE_DIR: &str = "/polar-bench";

fn shell(session: String, command: Vec<String>) -> Result<HarnessRun> {
    Ok(HarnessRun {
        harness: HarnessName::Shell.into(),
        instruction: String::new(),
        command,
        mode: ModeKind::Transparent,
        spec: RuntimeSpec::default(),
        budget: Duration::from_secs(60),
        session: session.parse()?,
        install: None,
        info: Default::default(),
    })
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[expect(clippy::print_stdout, reason = "a benchmark reports on stdout")]
fn report(text: &str) {
    println!("{text}");
}

async fn latency(parts: &AgentParts, redirect: &Redirect, probe: &std::path::Path) -> Result<()> {
    let dir = probe.parent().context("the probe has no directory")?;
    let name = probe.file_name().context("the probe has no name")?;
    let inside = std::path::Path::new(PROBE_DIR)
        .join(name)
        .display()
        .to_string();
    let stop = CancellationToken::new();
    let (mut first, mut total) = (Vec::new(), Vec::new());
    for i in 0..45 {
        let session = format!("bench-lat-{i}");
        let t0 = now_ns();
        let started = Instant::now();
        let out = run(
            parts,
            redirect,
            {
                let mut job = shell(
                    session,
                    vec![inside.clone(), "started".into(), "/workspace/t".into()],
                )?;
                job.spec.mounts.push(polar_spec::runtime::Mount {
                    source: dir.to_owned(),
                    target: PROBE_DIR.into(),
                    read_only: true,
                });
                job
            },
            &stop,
        )
        .await?;
        let whole = started.elapsed();
        ensure!(out.succeeded(), "run {i} failed: {:?}", out.steps);
        let t1: u128 = std::fs::read_to_string(out.workspace.join("t"))?
            .trim()
            .parse()?;
        if i >= 5 {
            first.push((t1.saturating_sub(t0)) as f64 / 1e6);
            total.push(whole.as_secs_f64() * 1e3);
        }
    }
    first.sort_by(f64::total_cmp);
    total.sort_by(f64::total_cmp);
    report(&format!(
        "start latency, run() to first instruction, {} runs: p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        first.len(),
        pct(&first, 0.5),
        pct(&first, 0.9),
        pct(&first, 1.0)
    ));
    report(&format!(
        "whole session (start, run, tear-down): p50 {:.1} ms, p90 {:.1} ms",
        pct(&total, 0.5),
        pct(&total, 0.9)
    ));
    Ok(())
}

async fn concurrent(
    parts: Arc<AgentParts>,
    redirect: Arc<Redirect>,
    echo: &EchoUpstream,
    n: usize,
) -> Result<()> {
    let script = "curl -sS --max-time 60 -o /workspace/reply.json \
        https://api.anthropic.com/v1/messages -H 'content-type: application/json' \
        -d \"{\\\"session\\\":\\\"$POLAR_SESSION\\\"}\"";
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let (parts, redirect) = (Arc::clone(&parts), Arc::clone(&redirect));
        let job = shell(
            format!("bench-many-{i}"),
            vec!["sh".into(), "-c".into(), script.into()],
        )?;
        tasks.push(tokio::spawn(async move {
            let stop = CancellationToken::new();
            run(&parts, &redirect, job, &stop).await
        }));
    }
    let mut outcomes: Vec<HarnessOutcome> = Vec::new();
    for t in tasks {
        outcomes.push(t.await??);
    }
    let wall = started.elapsed();
    let mut ok = 0;
    for o in &outcomes {
        let reply = std::fs::read_to_string(o.workspace.join("reply.json")).unwrap_or_default();
        if o.succeeded() && reply.contains("anthropic-upstream") {
            ok += 1;
        }
    }
    let received = echo
        .received
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let mut attributed = 0;
    for o in &outcomes {
        let needle = format!("\"session\":\"{}\"", o.session);
        let hits = received
            .iter()
            .filter(|r| String::from_utf8_lossy(&r.body).contains(&needle))
            .count();
        if hits == 1 {
            attributed += 1;
        }
    }
    report(&format!(
        "{n} concurrent sandboxes: {ok}/{n} got their reply, {attributed}/{n} requests \
         attributed to their own session, wall {:.2} s",
        wall.as_secs_f64()
    ));
    ensure!(
        ok == n && attributed == n,
        "not every sandbox was served correctly"
    );
    Ok(())
}

fn main() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the sandbox benchmark needs root");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let tmp = sandbox_tempdir()?;
        let echo = EchoUpstream::start("127.0.0.1:0", "anthropic-upstream").await?;
        let cfg_path = tmp.path().join("polar.toml");
        std::fs::write(
            &cfg_path,
            format!(
                "[agent]\nstate_dir = \"{}\"\n\n[[route]]\nhost = \"api.anthropic.com\"\n\
                 action = \"model\"\nprovider = \"anthropic\"\nupstream = \"{}\"\n",
                tmp.path().join("state").display(),
                echo.url()
            ),
        )?;
        let parts = Arc::new(AgentParts::build(Config::load(&cfg_path)?)?);
        let redirect = Arc::new(Redirect::start(&RedirectOptions {
            reaper_exe: Some(polar_bin()?),
            sandboxes: None,
        })?);
        let probe: PathBuf = probe_bin()?;
        latency(&parts, &redirect, &probe).await?;
        concurrent(Arc::clone(&parts), Arc::clone(&redirect), &echo, 32).await?;
        drop(parts);
        Arc::try_unwrap(redirect)
            .map_err(|_| anyhow::anyhow!("redirect still shared"))?
            .shutdown()
            .context("shutting the redirect down")?;
        Ok(())
    })
}
