//! Session identity and fair shares on one agent (root only): the agent's
//! parts and the redirect in this process, as on a gateway node, sessions
//! run with `polar_node::harness::run::run`, the mock inference backend on
//! loopback.
//!
//! - A sandbox in base-URL mode that names its live sibling session (in
//!   `x-polar-session`, with the sibling's own key, both) gets 403 in the
//!   API's error shape; the sibling's capture log is byte for byte what it
//!   was, and `polar_proxy_session_mismatch_total` counted each attempt.
//! - One sandbox flooding the base-URL address with thousands of
//!   connections, each a request with a large body sent slowly (HTTP/1
//!   requests in flight are the session's streams), then with more
//!   keep-alive connections at once than its share, does not stop a
//!   second session's calls: every one succeeds, each in under
//!   10 s; the flood's excess gets the cap errors (429 naming the cap, or
//!   the connection closed); the agent's peak memory stays under its body
//!   budget plus a stated baseline. The second session's latency alone and
//!   during the flood is printed (figures in BENCHMARKS.md).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_agent::metrics::{AgentMetrics, render};
use polar_config::Config;
use polar_harness::{HarnessName, ModeKind};
use polar_ids::SessionId;
use polar_mock::{self as mock, MockConfig};
use polar_node::agent::AgentParts;
use polar_node::harness::run::{HarnessOutcome, HarnessRun, capture_log, run};
use polar_redirect::{Redirect, RedirectOptions};
use polar_sandbox::runtime::steps::SandboxDirs;
use polar_spec::runtime::RuntimeSpec;
use polar_tests::{polar_bin, sandbox_tempdir};
use tokio_util::sync::CancellationToken;

fn shell(session: &str, script: &str, budget: Duration) -> Result<HarnessRun> {
    Ok(HarnessRun {
        harness: HarnessName::Shell.into(),
        instruction: String::new(),
        command: vec!["bash".into(), "-c".into(), script.into()],
        mode: ModeKind::BaseUrl,
        spec: RuntimeSpec::default(),
        budget,
        session: session.parse()?,
        install: None,
        info: Default::default(),
    })
}

struct Node {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    parts: Arc<AgentParts>,
    redirect: Arc<Redirect>,
    _mock: mock::MockHandle,
}

impl Node {
    async fn start(proxy: &str) -> Result<Self> {
        let mock = mock::start(MockConfig::default()).await?;
        let tmp = sandbox_tempdir()?;
        let state = tmp.path().join("state");
        let cfg = tmp.path().join("polar.toml");
        std::fs::write(
            &cfg,
            format!(
                r#"
[agent]
state_dir = "{state}"

[proxy]
{proxy}

[[backend]]
name = "mock"
dialect = "vllm"
replicas = ["{url}"]
served_model = "polar-mock"

[[route]]
host = "api.openai.com"
action = "model"
provider = "auto"
backend = "mock"
"#,
                state = state.display(),
                url = mock.url()
            ),
        )?;
        let parts = Arc::new(AgentParts::build(Config::load(&cfg)?)?);
        let redirect = Arc::new(Redirect::start(&RedirectOptions {
            reaper_exe: Some(polar_bin()?),
            sandboxes: None,
        })?);
        Ok(Self {
            _tmp: tmp,
            state,
            parts,
            redirect,
            _mock: mock,
        })
    }

    fn spawn(&self, run_: HarnessRun) -> tokio::task::JoinHandle<Result<HarnessOutcome>> {
        let (parts, redirect) = (Arc::clone(&self.parts), Arc::clone(&self.redirect));
        tokio::spawn(async move {
            let stop = CancellationToken::new();
            Ok(run(&parts, &redirect, run_, &stop).await?)
        })
    }

    fn workspace(&self, session: &str) -> Result<PathBuf> {
        Ok(SandboxDirs::of(&self.state, &session.parse::<SessionId>()?).workspace)
    }

    fn metrics(&self) -> String {
        render(&AgentMetrics {
            proxy: Some(&self.parts.proxy.stats),
            ..AgentMetrics::default()
        })
    }

    fn shutdown(self) -> Result<()> {
        drop(self.parts);
        Arc::try_unwrap(self.redirect)
            .map_err(|_| anyhow::anyhow!("redirect still shared"))?
            .shutdown()
            .context("shutting the redirect down")?;
        Ok(())
    }
}

async fn wait_for_file(path: &Path, timeout: Duration) -> Result<String> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return Ok(text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{} did not appear in {timeout:?}", path.display())
}

/// One chat call with the session's key, then `POLAR_API_KEY` to
/// `/workspace/key`, then waits (bounded) for `/workspace/done`.
const SIBLING: &str = r#"
curl -sS --max-time 20 -o /workspace/first.json -H "Authorization: Bearer $POLAR_API_KEY" \
  "$POLAR_BASE_URL/v1/chat/completions" -d '{"model":"m","messages":[{"role":"user","content":"say hi"}]}'
echo "$POLAR_API_KEY" > /workspace/key.tmp && mv /workspace/key.tmp /workspace/key
for i in $(seq 600); do [ -e /workspace/done ] && exit 0; sleep 0.1; done
exit 1
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_sandbox_naming_its_sibling_session_is_refused_and_the_siblings_log_is_unchanged()
-> Result<()> {
    let node = Node::start("").await?;
    let (victim, attacker) = ("task-1-s0", "task-1-s1");
    let sibling = node.spawn(shell(victim, SIBLING, Duration::from_secs(90))?);
    let key = wait_for_file(
        &node.workspace(victim)?.join("key"),
        Duration::from_secs(60),
    )
    .await?;
    let key = key.trim().to_owned();
    let log = capture_log(&node.state, &victim.parse()?);
    let before = std::fs::read(&log).context("the sibling's capture log")?;
    ensure!(
        !before.is_empty(),
        "the sibling's own call was not captured"
    );

    let body = r#"{"model":"m","messages":[{"role":"user","content":"write into the sibling"}]}"#;
    let attack = format!(
        r#"
c() {{ label=$1; shift; code=$(curl -sS --max-time 20 -o /workspace/$label.json -w '%{{http_code}}' "$@" \
  "$POLAR_BASE_URL/v1/chat/completions" -d '{body}'); echo "$label=$code" >> /workspace/codes; }}
c header -H "x-polar-session: {victim}"
c key -H "Authorization: Bearer {key}"
c both -H "x-polar-session: {victim}" -H "x-polar-key: {key}"
c own_key_other_header -H "Authorization: Bearer $POLAR_API_KEY" -H "x-polar-session: {victim}"
c own -H "Authorization: Bearer $POLAR_API_KEY"
"#
    );
    let out = node
        .spawn(shell(attacker, &attack, Duration::from_secs(60))?)
        .await??;
    let ws = out.workspace.clone();
    let codes = std::fs::read_to_string(ws.join("codes"))?;
    for (label, want) in [
        ("header", "403"),
        ("key", "403"),
        ("both", "403"),
        ("own_key_other_header", "403"),
        ("own", "200"),
    ] {
        ensure!(
            codes.lines().any(|l| l == format!("{label}={want}")),
            "{label}: wanted {want} in\n{codes}"
        );
        if want == "403" {
            let reply: serde_json::Value =
                serde_json::from_slice(&std::fs::read(ws.join(format!("{label}.json")))?)?;
            let msg = reply["error"]["message"].as_str().unwrap_or_default();
            ensure!(
                msg.contains(&format!("belongs to session {attacker}")),
                "{label}: not the OpenAI error shape naming the session: {reply}"
            );
        }
    }
    // The sibling's log: not a byte more.
    let after = std::fs::read(&log)?;
    ensure!(
        after == before,
        "the sibling's capture log changed ({} -> {} bytes)",
        before.len(),
        after.len()
    );
    let stats = &node.parts.proxy.stats;
    ensure!(stats.session_mismatch_header.load(Ordering::Relaxed) == 2);
    ensure!(stats.session_mismatch_key.load(Ordering::Relaxed) == 2);
    let text = node.metrics();
    ensure!(
        text.contains("polar_proxy_session_mismatch_total{via=\"header\"} 2\n")
            && text.contains("polar_proxy_session_mismatch_total{via=\"key\"} 2\n"),
        "{text}"
    );
    // The attacker's own call went to its own log.
    let own = std::fs::read(capture_log(&node.state, &attacker.parse()?))?;
    ensure!(!own.is_empty());

    std::fs::write(node.workspace(victim)?.join("done"), b"")?;
    let sib = sibling.await??;
    ensure!(sib.succeeded(), "the sibling failed: {:?}", sib.steps);
    ensure!(std::fs::read(&log)? == before);
    node.shutdown()
}

/// `proxy.max_body_bytes` etc. for the flood test: small enough that the
/// flood hits every cap quickly.
const BODY_MAX: u64 = 4 << 20;
const SESSION_CONNECTIONS: u64 = 64;
const SESSION_BODY: u64 = 32 << 20;
const BUDGET: u64 = 64 << 20;
/// What the agent process may hold besides request bodies during the flood:
/// connection buffers (hyper keeps up to ~400 KiB per connection), tasks,
/// the flood's queued sockets, the mock backend and this test.
const BASELINE_ALLOWANCE: u64 = 160 << 20;

/// Waves of connections to the base-URL address, at least three and then
/// until `/workspace/stop` (or 90 s): each connection declares a 4 MiB
/// body, sends three quarters of it, holds, then sends the rest. Then 100
/// connections at once, each a small complete request left open for 3 s
/// after its reply (so the session's connection cap is reached however fast
/// the agent refuses the waves' bodies). Each status (or how the connection
/// ended) is counted into `/workspace/flood.json`.
const FLOOD_PY: &str = r#"
import asyncio, collections, json, os, resource, time, urllib.parse
u = urllib.parse.urlparse(os.environ["POLAR_BASE_URL"])
KEY = os.environ["POLAR_API_KEY"]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
WAVE = min(600, hard - 256)
HOLD = 100
BODY = 4 << 20
seen = collections.Counter()
def head(length):
    return ("POST /v1/chat/completions HTTP/1.1\r\nhost: polar\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {KEY}\r\ncontent-length: {length}\r\n\r\n").encode()
async def connect(tag):
    try:
        return await asyncio.wait_for(asyncio.open_connection(u.hostname, u.port), 10)
    except Exception as e:
        seen[tag + "connect:" + type(e).__name__] += 1
        return None
async def one():
    if not (rw := await connect("")):
        return
    r, w = rw
    async def send():
        w.write(head(BODY))
        chunk = b" " * (256 << 10)
        for _ in range(12):
            w.write(chunk); await w.drain()
        await asyncio.sleep(3)
        for _ in range(4):
            w.write(chunk); await w.drain()
    sender = asyncio.ensure_future(send())
    try:
        line = await asyncio.wait_for(r.readline(), 30)
        seen[(line.split() or [b"closed"])[1 if line else 0].decode()] += 1
        if line:
            rest = await asyncio.wait_for(r.read(4096), 5)
            if b"proxy.max_session" in rest or b"proxy.body_budget" in rest:
                seen["names_cap"] += 1
    except Exception as e:
        seen["read:" + type(e).__name__] += 1
    sender.cancel()
    w.close()
async def hold():
    # A small complete request, its whole reply read, then the connection
    # left open and idle for 3 s as a keep-alive client leaves it: it keeps
    # its place among the session's connections however fast the agent
    # answers. One over the cap is closed without a reply.
    if not (rw := await connect("hold:")):
        return
    r, w = rw
    w.write(head(2) + b"{}")
    try:
        line = await asyncio.wait_for(r.readline(), 30)
        if not line:
            raise ConnectionResetError
        fields = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
        length = [int(h.split(b":")[1]) for h in fields.lower().split(b"\r\n")
                  if h.startswith(b"content-length:")]
        if length:
            await asyncio.wait_for(r.readexactly(length[0]), 5)
        else:
            await asyncio.wait_for(r.readuntil(b"\r\n0\r\n\r\n"), 5)
        await asyncio.sleep(3)
        try:
            closed = await asyncio.wait_for(r.read(1), 0.2) == b""
        except asyncio.TimeoutError:
            closed = False
        seen["hold:" + line.split()[1].decode() + (":closed" if closed else ":kept")] += 1
    except ConnectionResetError:
        seen["hold:refused"] += 1
    except Exception as e:
        seen["hold:read:" + type(e).__name__] += 1
    w.close()
async def main():
    end = time.monotonic() + 90
    waves = 0
    while waves < 3 or (time.monotonic() < end and not os.path.exists("/workspace/stop")):
        wave = asyncio.gather(*(one() for _ in range(WAVE)))
        if waves == 0:
            await asyncio.sleep(1)
            open("/workspace/started", "w").write("1\n")
        await wave
        waves += 1
    # Then more connections at once than the session may hold, each kept
    # open: those over the cap are closed after the admission wait.
    await asyncio.gather(*(hold() for _ in range(HOLD)))
    seen["waves"] = waves
    seen["per_wave"] = WAVE
    open("/workspace/flood.json", "w").write(json.dumps(seen) + "\n")
asyncio.run(main())
"#;

/// The flood: [`FLOOD_PY`] in the sandbox's Python.
fn flood_script() -> String {
    format!("python3 - <<'PY'\n{FLOOD_PY}\nPY\n")
}

/// Twenty chat calls one after the other, each's code and time appended to
/// `/workspace/calls`.
const CALLS: &str = r#"
for i in $(seq 20); do
  curl -sS --max-time 30 -o /dev/null -w '%{http_code} %{time_total}\n' \
    -H "Authorization: Bearer $POLAR_API_KEY" "$POLAR_BASE_URL/v1/chat/completions" \
    -d '{"model":"m","messages":[{"role":"user","content":"say hi"}]}' >> /workspace/calls
done
"#;

fn status_kib(field: &str) -> Result<u64> {
    let text = std::fs::read_to_string("/proc/self/status")?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{field} in /proc/self/status"))
}

/// The calls of a finished [`CALLS`] session: all 200, each under 10 s;
/// their times in ms, sorted.
fn call_times(out: &HarnessOutcome) -> Result<Vec<f64>> {
    let text = std::fs::read_to_string(out.workspace.join("calls"))?;
    let mut times = Vec::new();
    for line in text.lines() {
        let (code, secs) = line.split_once(' ').context("a curl line")?;
        ensure!(code == "200", "a call failed: {line}\n{text}");
        let secs: f64 = secs.parse()?;
        ensure!(secs < 10.0, "a call took {secs} s (bound: 10 s)\n{text}");
        times.push(secs * 1e3);
    }
    ensure!(times.len() == 20, "{text}");
    times.sort_by(f64::total_cmp);
    Ok(times)
}

#[expect(clippy::print_stderr, reason = "the test reports its measurement")]
fn report(text: &str) {
    eprintln!("{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn one_session_flooding_the_proxy_does_not_stop_a_sibling_and_memory_stays_in_budget()
-> Result<()> {
    let node = Node::start(&format!(
        "max_body_bytes = {BODY_MAX}\nmax_session_connections = {SESSION_CONNECTIONS}\nmax_session_streams = 32\n\
         max_session_body_bytes = {SESSION_BODY}\nbody_budget_bytes = {BUDGET}\nadmission_wait_ms = 500\n"
    ))
    .await?;
    // The second session alone, for the figures.
    let alone = node
        .spawn(shell("fair-1-s0", CALLS, Duration::from_secs(120))?)
        .await??;
    let alone = call_times(&alone)?;

    let baseline = status_kib("VmRSS:")? * 1024;
    let flood = node.spawn(shell(
        "fair-1-s1",
        &flood_script(),
        Duration::from_secs(150),
    )?);
    let flood_ws = node.workspace("fair-1-s1")?;
    wait_for_file(&flood_ws.join("started"), Duration::from_secs(60)).await?;
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampling = CancellationToken::new();
    let sampler = {
        let (peak, stop) = (Arc::clone(&peak), sampling.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if let Ok(kib) = status_kib("VmRSS:") {
                    peak.fetch_max(kib * 1024, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let started = Instant::now();
    let during = node
        .spawn(shell("fair-1-s2", CALLS, Duration::from_secs(120))?)
        .await??;
    let took = started.elapsed();
    let body_peak = node.parts.proxy.shares().body_bytes_in_use();
    std::fs::write(flood_ws.join("stop"), b"")?;
    let flooded = flood.await??;
    sampling.cancel();
    sampler.await?;
    let during = call_times(&during)?;

    let seen: serde_json::Value =
        serde_json::from_slice(&std::fs::read(flooded.workspace.join("flood.json"))?)?;
    let n = |k: &str| seen[k].as_u64().unwrap_or(0);
    let stats = &node.parts.proxy.stats;
    let refused = |cap| stats.refused.get(cap);
    use polar_proxy::shares::Cap;
    let attempts = n("waves") * n("per_wave");
    ensure!(
        attempts >= 1000,
        "the flood made only {attempts} connections: {seen}"
    );
    ensure!(
        n("429") > 0 && n("names_cap") > 0,
        "the flood got no 429 naming a cap: {seen}"
    );
    // The 100 held connections: no more than the session's cap got in.
    let kept: u64 = seen
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("hold:") && k.ends_with(":kept"))
        .filter_map(|(_, v)| v.as_u64())
        .sum();
    ensure!(
        n("hold:refused") > 0 && kept > 0 && kept <= SESSION_CONNECTIONS,
        "of the 100 held connections {kept} were kept open (cap {SESSION_CONNECTIONS}): {seen}"
    );
    ensure!(
        refused(Cap::SessionConnections) > 0
            && refused(Cap::SessionStreams) + refused(Cap::SessionBodyBytes) > 0,
        "caps not hit: {}",
        node.metrics()
    );
    let hwm = status_kib("VmHWM:")? * 1024;
    let rss_peak = peak.load(Ordering::Relaxed);
    let bound = baseline + BUDGET + BASELINE_ALLOWANCE;
    ensure!(
        rss_peak <= bound && hwm <= bound,
        "agent memory: peak VmRSS {rss_peak}, VmHWM {hwm}, bound {bound} \
         (baseline {baseline} + budget {BUDGET} + allowance {BASELINE_ALLOWANCE})"
    );
    let pct = |t: &[f64], p: f64| t[((t.len() - 1) as f64 * p).round() as usize];
    report(&format!(
        "second session, 20 calls: alone p50 {:.1} ms max {:.1} ms; during the flood p50 {:.1} ms max {:.1} ms ({:.1} s in all)\n\
         flood: {attempts} connections in {} waves: {seen}\n\
         refused: session_connections {}, session_streams {}, session_body_bytes {}, node_body_bytes {}, node_connections {}\n\
         agent memory: VmRSS before {} MiB, peak {} MiB, VmHWM {} MiB; bodies buffered at the end of the calls {} KiB",
        pct(&alone, 0.5),
        pct(&alone, 1.0),
        pct(&during, 0.5),
        pct(&during, 1.0),
        took.as_secs_f64(),
        n("waves"),
        refused(Cap::SessionConnections),
        refused(Cap::SessionStreams),
        refused(Cap::SessionBodyBytes),
        refused(Cap::NodeBodyBytes),
        refused(Cap::NodeConnections),
        baseline >> 20,
        rss_peak >> 20,
        hwm >> 20,
        body_peak >> 10,
    ));
    node.shutdown()
}
