//! The rollout control plane end to end (root only): a rollout server and
//! the mock inference backend on loopback, and real gateway nodes (`polar
//! agent --config FILE`, each its own process with its own state
//! directory, cgroup and eBPF programs, listening on its own loopback
//! address). Each sample is the `shell` preset running
//! `examples/mini_agent.py`, a small agent with a hard-coded HTTPS endpoint
//! whose tool calls the mock's policy scripts; the `command` evaluator
//! rewards the file the agent made; trajectories are exported to a shared
//! directory.
//!
//! - 8 samples on one gateway; then on three: spread, every trajectory
//!   exported, rewards and group ids right; each session's calls file
//!   exported beside it, and, once the node dropped its copy, `polar
//!   export --from` re-derives the same rows from the export alone;
//! - a gateway with `export_calls = false`: its trajectories exported, no
//!   calls file, its session directories removed once exported;
//! - a gateway killed (SIGKILL) mid-task: its sessions are dispatched again,
//!   the task finishes, the killed agent's cgroup is reaped;
//! - the rollout server restarted mid-task: nothing is lost;
//! - the node's only inference replica (a `polar mock-backend` process)
//!   killed mid-task: the node is `backend_down`, nothing is dispatched
//!   to it until the replica is back, then the task completes;
//! - a backend that fails once (HTTP 503 mid-session: the agent exits):
//!   the sample is run again and completes; one that stays down: run again
//!   up to `max_retries`, then kept as an error of the backend without a
//!   reward, its trajectory exported with `status = "error"` and
//!   `infra_fault`, the task `partial`; `polar submit` of a task with no
//!   usable sample exits 1 naming the failures;
//! - assignments outside the node's `[gateway.policy]` (an upload source
//!   outside its roots or through a symbolic link out of one, a mount, the
//!   host network, a limit over its ceiling) are refused at INIT, naming
//!   the field, not retried, without a reward; a harness the node does not
//!   define fails at once when no other node can take it;
//! - the control plane over HTTPS with certificates `polar rollout ca`
//!   issued, mutual TLS on: a small rollout through a gateway; a client
//!   (and `polar status`) trusting another CA refused; the gateway's and
//!   the server's tokens rotated (SIGHUP for `polar agent`); plain HTTP on
//!   a network address refused at start by both servers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_mock::{self as mock, MockConfig, MockHandle};
use polar_rollout::{RolloutConfig, RolloutServer};
use polar_rollout_api::{RolloutClient, SessionState, TaskStatus, TaskView};
use polar_tests::{alive, cgroup2_mount, eventually, polar_bin, sandbox_tempdir};

const TOKEN: &str = "gateway-e2e-token";
/// The token the server presents to the gateways.
const GATEWAY_TOKEN: &str = "gateway-e2e-server-token";
/// The nodes the tests start, each with its own token.
const NODES: [&str; 16] = [
    "gw-a",
    "gw-b",
    "gw-c",
    "gw-e",
    "gw-f",
    "gw-hasty",
    "gw-health",
    "gw-k1",
    "gw-k2",
    "gw-nocalls",
    "gw-p",
    "gw-patient",
    "gw-r",
    "gw-s",
    "gw-spare",
    "gw-t",
];

fn node_token(node_id: &str) -> String {
    format!("gateway-e2e-node-{node_id}")
}

fn mini_agent() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/mini_agent.py")
        .canonicalize()
        .unwrap_or_default()
}

struct Fixture {
    dir: tempfile::TempDir,
    mock: Option<MockHandle>,
    server: Option<RolloutServer>,
    server_cfg: RolloutConfig,
    gateways: Vec<Gateway>,
    /// The cluster CA of a fixture over HTTPS.
    pki: Option<Pki>,
    /// The replica the gateways started from now on use instead of the
    /// in-process mock, with health checks every 200 ms.
    replica: Option<String>,
    /// More `[gateway]` lines for the gateways started from now on.
    gateway_keys: String,
}

/// A cluster CA made and used through `polar rollout ca`.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn init(dir: PathBuf) -> Result<Self> {
        let out = Command::new(polar_bin()?)
            .args(["rollout", "ca", "init", "--dir"])
            .arg(&dir)
            .output()?;
        ensure!(out.status.success(), "ca init: {out:?}");
        Ok(Self { dir })
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// `name`'s certificate for `ip`: (cert, key).
    fn issue(&self, name: &str, ip: &str) -> Result<(PathBuf, PathBuf)> {
        let out = Command::new(polar_bin()?)
            .args(["rollout", "ca", "issue", "--dir"])
            .arg(&self.dir)
            .args(["--name", name, "--ip", ip])
            .output()?;
        ensure!(out.status.success(), "ca issue {name}: {out:?}");
        Ok((
            self.dir.join(format!("{name}.crt")),
            self.dir.join(format!("{name}.key")),
        ))
    }

    fn client(&self) -> Result<rustls::ClientConfig> {
        Ok(polar_io::tls::client_config(Some(&self.ca()), None)?)
    }
}

struct Gateway {
    node_id: String,
    url: String,
    config: PathBuf,
    child: Child,
    log: PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Fixture {
    async fn start() -> Result<Self> {
        Self::start_with(None).await
    }

    /// A fixture whose mock follows `script` (TOML; the built-in policy
    /// without).
    async fn start_with(script: Option<&str>) -> Result<Self> {
        Self::start_full(script, false).await
    }

    /// A fixture whose server serves HTTPS and requires the nodes'
    /// certificates; its gateways serve HTTPS too.
    async fn start_tls() -> Result<Self> {
        Self::start_full(None, true).await
    }

    async fn start_full(script: Option<&str>, tls: bool) -> Result<Self> {
        let dir = sandbox_tempdir()?;
        let script = match script {
            Some(text) => {
                let path = dir.path().join("mock-script.toml");
                std::fs::write(&path, text)?;
                Some(polar_mock::script::Script::load(&path)?)
            }
            None => None,
        };
        let mock = mock::start(MockConfig {
            served_model: "default".into(),
            script,
            ..MockConfig::default()
        })
        .await?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cfg = RolloutConfig::new(dir.path().join("rollout.sqlite"), TOKEN);
        cfg.listen = ([127, 0, 0, 1], port).into();
        cfg.heartbeat_interval = Duration::from_millis(300);
        cfg.heartbeat_timeout = Duration::from_millis(2000);
        cfg.max_retries = 3;
        cfg.gateway_token = GATEWAY_TOKEN.into();
        cfg.node_tokens = NODES
            .iter()
            .map(|n| ((*n).to_owned(), node_token(n)))
            .collect();
        let pki = match tls {
            false => None,
            true => {
                let pki = Pki::init(dir.path().join("ca"))?;
                cfg.tls.identity = Some(pki.issue("rollout", "127.0.0.1")?);
                cfg.tls.ca_file = Some(pki.ca());
                cfg.tls.client_ca_file = Some(pki.ca());
                Some(pki)
            }
        };
        let server = RolloutServer::start(cfg.clone()).await?;
        Ok(Self {
            dir,
            mock: Some(mock),
            server: Some(server),
            server_cfg: cfg,
            gateways: Vec::new(),
            pki,
            replica: None,
            gateway_keys: String::new(),
        })
    }

    /// `http` or `https`.
    fn scheme(&self) -> &'static str {
        if self.pki.is_some() { "https" } else { "http" }
    }

    fn server_url(&self) -> String {
        format!("{}://{}", self.scheme(), self.server_cfg.listen)
    }

    /// A client of the server with `token`, trusting the fixture's CA.
    fn client_as(&self, base: &str, token: &str) -> RolloutClient {
        let c = RolloutClient::new(base.to_owned(), Some(token.into()));
        match self.pki.as_ref().and_then(|p| p.client().ok()) {
            Some(tls) => c.with_tls(tls),
            None => c,
        }
    }

    fn client(&self) -> RolloutClient {
        self.client_as(&self.server_url(), TOKEN)
    }

    fn export_dir(&self) -> PathBuf {
        self.dir.path().join("trajectories")
    }

    /// A second upload root of every gateway's policy.
    fn tasks_dir(&self) -> PathBuf {
        self.dir.path().join("tasks")
    }

    /// Starts `polar agent` as node `node_id` listening on `ip`, and waits
    /// until the server lists it.
    async fn gateway(&mut self, node_id: &str, ip: &str) -> Result<()> {
        self.gateway_with(node_id, ip, 20).await
    }

    /// [`Fixture::gateway`] with a drain timeout.
    async fn gateway_with(&mut self, node_id: &str, ip: &str, drain_secs: u32) -> Result<()> {
        let base = self.dir.path().join(node_id);
        std::fs::create_dir_all(&base)?;
        let port = std::net::TcpListener::bind((ip, 0))?.local_addr()?.port();
        let (mock, health) = match &self.replica {
            Some(addr) => (addr.clone(), "\nhealth_check_interval_ms = 200"),
            None => (self.mock.as_ref().context("no mock")?.addr.to_string(), ""),
        };
        let config = base.join("agent.toml");
        let tls = match &self.pki {
            None => String::new(),
            Some(pki) => {
                let (cert, key) = pki.issue(node_id, ip)?;
                format!(
                    "\n[gateway.tls]\ncert_file = {cert:?}\nkey_file = {key:?}\nca_file = {:?}\n",
                    pki.ca()
                )
            }
        };
        std::fs::write(
            &config,
            format!(
                r#"[agent]
state_dir = "{state}"

[[backend]]
name = "local"
dialect = "vllm"
replicas = ["http://{mock}"]
served_model = "default"{health}

[gateway]
server = "{scheme}://{server}"
node_id = "{node_id}"
listen = "{ip}:{port}"
token = "{token}"
accept_tokens = ["{GATEWAY_TOKEN}"]
max_sessions = 4
init_workers = 2
running_workers = 2
ready_buffer = 2
postrun_workers = 2
heartbeat_interval_ms = 300
drain_timeout_secs = {drain_secs}
export = "{export}"
formats = ["parquet", "jsonl"]
{keys}
[gateway.policy]
upload_roots = ["{examples}", "{tasks}"]
{tls}"#,
                scheme = self.scheme(),
                keys = self.gateway_keys,
                tasks = self.tasks_dir().display(),
                token = node_token(node_id),
                state = base.join("state").display(),
                server = self.server_cfg.listen,
                export = self.export_dir().display(),
                examples = mini_agent()
                    .parent()
                    .context("no examples directory")?
                    .display(),
            ),
        )?;
        let log = base.join("agent.log");
        let child = Command::new(polar_bin()?)
            .args(["--log-format", "json", "agent", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        self.gateways.push(Gateway {
            node_id: node_id.to_owned(),
            url: format!("{}://{ip}:{port}", self.scheme()),
            config: config.clone(),
            child,
            log,
        });
        let c = self.client();
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(nodes) = c.nodes().await
                && nodes.nodes.iter().any(|n| n.node_id == node_id)
            {
                return Ok(());
            }
            let g = self.gateways.last_mut().context("no gateway")?;
            if let Some(status) = g.child.try_wait()? {
                bail!("{node_id} exited ({status}): {}", g.log_text());
            }
            if Instant::now() > until {
                bail!("{node_id} did not register: {}", g.log_text());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Submits a task of `n` samples; `pause_secs` of sleep before the
    /// agent runs makes the sessions long enough to interfere with.
    async fn submit(&self, task_id: &str, n: u32, pause_secs: u32) -> Result<()> {
        self.submit_with(
            task_id,
            n,
            pause_secs,
            serde_json::json!({"kind": "command", "options": {"command": "test -s polar-demo.txt"}}),
        )
        .await
    }

    async fn submit_with(
        &self,
        task_id: &str,
        n: u32,
        pause_secs: u32,
        evaluator: serde_json::Value,
    ) -> Result<()> {
        let command = if pause_secs > 0 {
            format!("sleep {pause_secs}; python3 /workspace/mini_agent.py")
        } else {
            "python3 /workspace/mini_agent.py".into()
        };
        let task = serde_json::json!({
            "task_id": task_id,
            "instruction": "Create the file polar-demo.txt.",
            "num_samples": n,
            "timeout_secs": 120,
            "agent": {"harness": "shell", "options": {"command": command}},
            "runtime": {"prepare": [{"upload": {"from": mini_agent(), "to": "mini_agent.py"}}]},
            "evaluator": evaluator,
            "builder": {"kind": "prefix_merging"},
            "metadata": {"group_id": format!("group-{task_id}"), "policy_version": "v3"},
        });
        self.client().submit(&task).await?;
        Ok(())
    }

    async fn wait_finished(&self, task_id: &str, timeout: Duration) -> Result<TaskView> {
        let c = self.client();
        let until = Instant::now() + timeout;
        loop {
            if let Ok(t) = c.task(task_id).await
                && t.status.is_finished()
            {
                return Ok(t);
            }
            if Instant::now() > until {
                let t = c.task(task_id).await?;
                bail!(
                    "task {task_id} not finished after {timeout:?}: {t:#?}\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn logs(&self) -> String {
        self.gateways
            .iter()
            .map(|g| {
                let text = g.log_text();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- {} ---\n{}",
                    g.node_id,
                    lines[lines.len().saturating_sub(40)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGTERM every gateway and wait for each to exit cleanly.
    fn stop_gateways(&mut self) -> Result<()> {
        for g in &mut self.gateways {
            if g.child.try_wait()?.is_some() {
                continue;
            }
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(g.child.id())?),
                nix::sys::signal::Signal::SIGTERM,
            )?;
            let until = Instant::now() + Duration::from_secs(40);
            loop {
                if let Some(status) = g.child.try_wait()? {
                    ensure!(
                        status.success(),
                        "{} exited with {status}: {}",
                        g.node_id,
                        g.log_text()
                    );
                    break;
                }
                ensure!(
                    Instant::now() < until,
                    "{} did not stop on SIGTERM",
                    g.node_id
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }
}

/// Every sample done, rewarded 1, with an exported trajectory whose rows
/// carry the task's group id and the sample's reward. Returns the nodes
/// that ran the samples.
/// The call ids of a capture log (a call written in two parts counts once).
fn call_ids_of(log: &Path) -> Result<std::collections::BTreeSet<String>> {
    let text = std::fs::read_to_string(log).with_context(|| log.display().to_string())?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["call_id"].as_str().map(str::to_owned))
        .collect())
}

fn check_results(t: &TaskView, export: &Path) -> Result<Vec<String>> {
    ensure!(t.status == TaskStatus::Completed, "{t:#?}");
    let mut nodes = Vec::new();
    for s in &t.samples {
        let SessionState::Done { node, result, .. } = &s.state else {
            bail!("sample {} not done: {:?}", s.sample_index, s.state);
        };
        ensure!(
            result.reward == Some(1.0),
            "sample {}: {result:?}",
            s.sample_index
        );
        ensure!(
            result.tokens.calls >= 2 && result.tokens.response > 0,
            "{result:?}"
        );
        let uri = result
            .trajectory_uri
            .as_deref()
            .with_context(|| format!("no trajectory uri: {result:?}"))?;
        ensure!(Path::new(uri).is_file(), "{uri} missing");
        ensure!(uri.starts_with(&export.display().to_string()), "{uri}");
        let jsonl = Path::new(uri).with_extension("jsonl");
        let rows = jsonl_rows(&jsonl)?;
        ensure!(!rows.is_empty(), "{} is empty", jsonl.display());
        for r in &rows {
            ensure!(
                r["group_id"] == format!("group-{}", t.task_id).as_str(),
                "{r}"
            );
            ensure!(r["reward"] == 1.0, "{r}");
            ensure!(r["task_id"] == t.task_id.as_str(), "{r}");
            let ids = r["response_ids"].as_array().map_or(0, Vec::len);
            let lps = r["response_logprobs"].as_array().map_or(0, Vec::len);
            ensure!(ids > 0 && ids == lps, "{r}");
        }
        nodes.push(node.clone());
    }
    Ok(nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_samples_on_one_gateway_then_on_three() -> Result<()> {
    let mut f = Fixture::start().await?;
    f.gateway("gw-a", "127.0.0.11").await?;
    f.submit("one-node", 8, 0).await?;
    let t = f
        .wait_finished("one-node", Duration::from_secs(240))
        .await?;
    let nodes = check_results(&t, &f.export_dir())?;
    ensure!(nodes.iter().all(|n| n == "gw-a"), "{nodes:?}");
    // The node at a glance, and its metrics.
    let url = f.gateways[0].url.clone();
    let out = Command::new(polar_bin()?)
        .args(["status", "--node", &url, "--token", GATEWAY_TOKEN])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        text.contains("node gw-a at")
            && text.contains("finished 8, reported 8")
            && text.contains("\nbackends: local 1/1 replicas healthy\n"),
        "{text}"
    );
    let metrics = RolloutClient::new(url, Some(GATEWAY_TOKEN.into()))
        .raw(http::Method::GET, "/metrics", None)
        .await?;
    let metrics = String::from_utf8_lossy(&metrics.1);
    ensure!(
        metrics.contains("polar_gateway_sessions_finished_total 8")
            && metrics.contains("polar_gateway_stage_active{stage=\"running\"} 0")
            && metrics.contains("polar_sessions{stage=\"running\"} 0"),
        "{metrics}"
    );
    // The node's capture counters equal what its capture logs held, as
    // each result counted them at export (the logs are gone since: each
    // session's directories are removed once its trajectory is exported).
    let (mut calls, mut prompt, mut response) = (0u64, 0u64, 0u64);
    for s in &t.samples {
        let SessionState::Done { result, .. } = &s.state else {
            bail!("{s:?}");
        };
        calls += result.tokens.calls;
        prompt += result.tokens.prompt;
        response += result.tokens.response;
    }
    ensure!(calls == 16, "{calls} calls in the results");
    ensure!(
        !f.dir
            .path()
            .join("gw-a/state/sessions/one-node-s0")
            .exists(),
        "an exported session's capture log is left"
    );
    check_rederived(&t, &f.export_dir())?;
    for line in [
        format!("polar_capture_calls_total {calls}"),
        format!("polar_capture_tokens_total{{kind=\"prompt\"}} {prompt}"),
        format!("polar_capture_tokens_total{{kind=\"response\"}} {response}"),
    ] {
        ensure!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
    // SIGHUP: a broken file keeps the rules in force, a good one is loaded.
    let g = &f.gateways[0];
    let good = std::fs::read_to_string(&g.config)?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(g.child.id())?);
    std::fs::write(
        &g.config,
        format!("{good}\n[[route]]\nhost = \"x\"\naction = \"sideways\"\n"),
    )?;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)?;
    ensure!(
        eventually(Duration::from_secs(10), || g
            .log_text()
            .contains("does not check")),
        "{}",
        g.log_text()
    );
    std::fs::write(&g.config, &good)?;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)?;
    ensure!(
        eventually(Duration::from_secs(10), || g
            .log_text()
            .contains("routing rules reloaded")),
        "{}",
        g.log_text()
    );
    f.gateway("gw-b", "127.0.0.12").await?;
    f.gateway("gw-c", "127.0.0.13").await?;
    // Long enough sessions that the three nodes share the 8.
    f.submit("three-nodes", 8, 2).await?;
    let t = f
        .wait_finished("three-nodes", Duration::from_secs(240))
        .await?;
    let nodes = check_results(&t, &f.export_dir())?;
    for g in ["gw-a", "gw-b", "gw-c"] {
        ensure!(nodes.iter().any(|n| n == g), "{g} ran nothing: {nodes:?}");
    }
    // Each sample's trajectory was exported (checked above), so the node
    // that ran it removed its sandbox and capture directories, its disk
    // quota's tmpfs included.
    for s in &t.samples {
        let SessionState::Done { node, .. } = &s.state else {
            continue;
        };
        let state = f.dir.path().join(node).join("state");
        for tree in ["sandboxes", "sessions"] {
            let d = state.join(tree).join(&s.session_id);
            ensure!(!d.exists(), "{} left after the export", d.display());
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    let base = f.dir.path().display().to_string();
    ensure!(
        !mounts
            .lines()
            .any(|l| l.contains(&base) && l.contains("/state/sandboxes/")),
        "a session's tmpfs is still mounted"
    );
    f.stop_gateways()?;
    Ok(())
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(files_under(&path)?);
        } else {
            out.push(path);
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_export_calls_off_only_the_trajectories_are_exported() -> Result<()> {
    let mut f = Fixture::start().await?;
    f.gateway_keys = "export_calls = false\n".into();
    f.gateway("gw-nocalls", "127.0.0.91").await?;
    f.submit("no-calls", 2, 0).await?;
    let t = f
        .wait_finished("no-calls", Duration::from_secs(240))
        .await?;
    // The trajectories are exported as with the calls (checked here).
    check_results(&t, &f.export_dir())?;
    let files = files_under(&f.export_dir())?;
    let calls: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".calls.jsonl.zst"))
        .collect();
    ensure!(calls.is_empty(), "calls files written: {calls:?}");
    let state = f.dir.path().join("gw-nocalls/state");
    for s in &t.samples {
        let SessionState::Done { result, .. } = &s.state else {
            bail!("{s:?}");
        };
        let calls_uri = result.stats.as_ref().map(|x| &x["calls_uri"]);
        ensure!(
            calls_uri.is_none_or(serde_json::Value::is_null),
            "a calls_uri without a calls file: {result:?}"
        );
        // Exported and not failed: the node removed the session's
        // directories at once, its raw record with them (docs/CONFIG.md).
        for tree in ["sandboxes", "sessions"] {
            let d = state.join(tree).join(&s.session_id);
            ensure!(!d.exists(), "{} left after the export", d.display());
        }
    }
    // Nothing to re-derive from the export root: `polar export --from`
    // says so.
    let out = tempfile::tempdir()?;
    let o = Command::new(polar_bin()?)
        .arg("export")
        .arg("--from")
        .arg(f.export_dir())
        .arg("--out")
        .arg(out.path())
        .output()?;
    let text = String::from_utf8_lossy(&o.stdout);
    ensure!(
        o.status.success()
            && text.ends_with(&format!(
                "nothing exported: no calls file under {}\n",
                f.export_dir().display()
            )),
        "{text} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    f.stop_gateways()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_s_sessions_are_dispatched_again() -> Result<()> {
    let mut f = Fixture::start().await?;
    f.gateway("gw-k1", "127.0.0.21").await?;
    f.gateway("gw-k2", "127.0.0.22").await?;
    f.submit("kill", 6, 4).await?;
    // Wait until the first gateway holds sessions, then kill it.
    let c = f.client();
    ensure!(
        {
            let until = Instant::now() + Duration::from_secs(30);
            let mut held = false;
            while !held && Instant::now() < until {
                let t = c.task("kill").await?;
                held = t.samples.iter().any(
                    |s| matches!(&s.state, SessionState::Running { node, .. } if node == "gw-k1"),
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            held
        },
        "gw-k1 never ran a session"
    );
    let victim = &mut f.gateways[0];
    let pid = i32::try_from(victim.child.id())?;
    victim.child.kill()?;
    victim.child.wait()?;
    let t = f.wait_finished("kill", Duration::from_secs(240)).await?;
    let nodes = check_results(&t, &f.export_dir())?;
    let again: Vec<_> = t.samples.iter().filter(|s| s.attempts > 1).collect();
    ensure!(!again.is_empty(), "no session was dispatched again: {t:#?}");
    ensure!(
        nodes.iter().all(|n| n == "gw-k2"),
        "results from the killed node: {nodes:?}"
    );
    // The killed agent's reaper removed its cgroup and programs.
    let cg = cgroup2_mount()?.join("polar");
    ensure!(
        eventually(Duration::from_secs(20), || {
            std::fs::read_dir(&cg).map_or(true, |d| {
                d.filter_map(Result::ok).all(|e| {
                    !e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("agent-{pid}-"))
                })
            })
        }),
        "the killed agent's cgroup is still there"
    );
    ensure!(!alive(pid), "the killed agent is alive");
    // And its guardian released its sessions' disk quotas (tmpfs mounts),
    // keeping their files.
    let sandboxes = f.dir.path().join("gw-k1/state/sandboxes");
    let mounted = || polar_sandbox::runtime::quota::mounts_below(&sandboxes).unwrap_or_default();
    ensure!(
        eventually(Duration::from_secs(20), || mounted().is_empty()),
        "the killed agent's disk quotas are still mounted: {:?}",
        mounted()
    );
    f.stop_gateways()?;
    Ok(())
}

/// The mock's script for task `faults`: sample 0's backend fails once
/// (HTTP 503 after the first step: the agent exits, the sample is run
/// again and completes); sample 1's stays down (503 on every later call).
const FAULTS: &str = r#"
[[sessions]]
id = "faults-s0"
turns = [
  { tool_calls = [{ shell = "echo polar > polar-demo.txt" }] },
  { error = { status = 503, message = "replica restarting" } },
  { tool_calls = [{ shell = "echo polar > polar-demo.txt" }] },
]

# Every attempt (each exports its own calls only) makes one
# call that works, then meets the replica set that is down.
[[sessions]]
id = "faults-s1"
turns = [
  { tool_calls = [{ shell = "echo polar > polar-demo.txt" }] },
  { error = { status = 503, message = "replica down" } },
  { tool_calls = [{ shell = "echo polar > polar-demo.txt" }] },
  { error = { status = 503, message = "replica down" } },
  { tool_calls = [{ shell = "echo polar > polar-demo.txt" }] },
  { error = { status = 503, message = "replica down" } },
  { tool_calls = [{ shell = "echo polar > polar-demo.txt" }] },
  { error = { status = 503, message = "replica down" } },
]

# A task whose every attempt meets the replica set down: no usable sample.
[[sessions]]
id = "down-s0"
turns = [
  { error = { status = 503, message = "replica down" } },
  { error = { status = 503, message = "replica down" } },
  { error = { status = 503, message = "replica down" } },
  { error = { status = 503, message = "replica down" } },
]
"#;

/// The exported rows of a sample's trajectory (JSONL beside the Parquet).
fn rows_of(result: &polar_rollout_api::SampleResult) -> Result<Vec<serde_json::Value>> {
    let uri = result
        .trajectory_uri
        .as_deref()
        .with_context(|| format!("no trajectory uri: {result:?}"))?;
    let text = std::fs::read_to_string(Path::new(uri).with_extension("jsonl"))?;
    Ok(text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_fault_is_run_again_and_never_exported_as_completed() -> Result<()> {
    let mut f = Fixture::start_with(Some(FAULTS)).await?;
    f.gateway("gw-f", "127.0.0.41").await?;
    f.submit("faults", 2, 0).await?;
    let t = f.wait_finished("faults", Duration::from_secs(300)).await?;
    let done = |i: usize| match &t.samples[i].state {
        SessionState::Done { result, .. } => Ok(result.clone()),
        other => bail!("sample {i} not done: {other:?}\n{}", f.logs()),
    };
    // The transient fault: run again once, then completed and rewarded.
    let r0 = done(0)?;
    ensure!(t.samples[0].retries == 1, "{t:#?}");
    ensure!(
        r0.status == polar_rollout_api::SampleStatus::Completed,
        "{r0:?}"
    );
    ensure!(r0.reward == Some(1.0), "{r0:?}");
    let ended = |r: &polar_rollout_api::SampleResult| {
        r.stats
            .as_ref()
            .and_then(|s| s["ended_by"].as_str().map(str::to_owned))
    };
    ensure!(ended(&r0).as_deref() == Some("policy"), "{r0:?}");
    for row in rows_of(&r0)? {
        ensure!(row["status"] == "completed", "{row}");
    }
    // The replica set that stays down: run again up to max_retries (3),
    // then kept as an error of the backend, exported as one.
    let r1 = done(1)?;
    ensure!(t.samples[1].retries == 3, "{t:#?}");
    ensure!(
        r1.status == polar_rollout_api::SampleStatus::Error,
        "{r1:?}"
    );
    ensure!(ended(&r1).as_deref() == Some("backend"), "{r1:?}");
    ensure!(
        r1.error
            .as_deref()
            .is_some_and(|e| e.contains("the inference backend ended the session")),
        "{r1:?}"
    );
    let rows = rows_of(&r1)?;
    ensure!(!rows.is_empty(), "no row for the faulted sample");
    for row in rows {
        let labels = row["labels"].as_array().cloned().unwrap_or_default();
        ensure!(row["status"] == "error", "{row}");
        ensure!(labels.contains(&"infra_fault".into()), "{row}");
        ensure!(labels.contains(&"session_failed".into()), "{row}");
        let md: serde_json::Value = match &row["trajectory_metadata"] {
            serde_json::Value::String(s) => serde_json::from_str(s)?,
            v => v.clone(),
        };
        ensure!(md["ended_by"] == "backend", "{row}");
        // Its evaluator made the file, yet the infrastructure ended it:
        // no reward, in the result or in its rows.
        ensure!(row["reward"].is_null(), "{row}");
    }
    ensure!(r1.reward.is_none(), "{r1:?}");
    // One of two usable: partial, the mean over the usable one only, the
    // failure named.
    ensure!(t.status == TaskStatus::Partial, "{t:#?}");
    ensure!((t.counts.usable, t.requested) == (1, 2), "{t:#?}");
    ensure!(t.mean_reward == Some(1.0), "{t:#?}");
    ensure!(
        t.failures.len() == 1
            && t.failures[0].status == "error"
            && t.failures[0].samples == [1]
            && t.failures[0]
                .error
                .starts_with("the inference backend ended the session"),
        "{:#?}",
        t.failures
    );
    // `polar submit` of a task no sample of which is usable: exit 1, the
    // failures grouped on stderr.
    let file = f.dir.path().join("down.json");
    std::fs::write(
        &file,
        serde_json::json!({
            "task_id": "down",
            "instruction": "Create the file polar-demo.txt.",
            "num_samples": 1,
            "timeout_secs": 120,
            "agent": {"harness": "shell", "options": {"command": "python3 /workspace/mini_agent.py"}},
            "runtime": {"prepare": [{"upload": {"from": mini_agent(), "to": "mini_agent.py"}}]},
            "evaluator": {"kind": "command", "options": {"command": "true"}},
        })
        .to_string(),
    )?;
    let out = Command::new(polar_bin()?)
        .arg("submit")
        .arg(&file)
        .args([
            "--server",
            &f.server_url(),
            "--token",
            TOKEN,
            "--poll-ms",
            "100",
        ])
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    ensure!(out.status.code() == Some(1), "{stdout}\n{stderr}");
    ensure!(
        stdout.contains("0 of 1 requested samples usable\nunusable samples, by reason:\n  1 sample error: the inference backend ended the session"),
        "{stdout}"
    );
    ensure!(
        stderr.starts_with("task down ended failed: 0 of 1 requested samples usable\nunusable samples, by reason:\n  1 sample error: the inference backend ended the session: its last model call"),
        "{stderr}"
    );
    f.stop_gateways()?;
    Ok(())
}

/// A `polar mock-backend` process, killed by its pid when dropped.
struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `polar mock-backend` as a process of its own on `addr`, ready.
fn replica_process(addr: &str, log: &Path) -> Result<Replica> {
    let mut child = Command::new(polar_bin()?)
        .args([
            "mock-backend",
            "--listen",
            addr,
            "--served-model",
            "default",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()?;
    let until = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("mock-backend exited ({status})");
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            bail!("mock-backend does not listen on {addr}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Replica(child))
}

/// Sessions dispatched so far, over every sample.
fn dispatches(t: &TaskView) -> u32 {
    t.samples.iter().map(|s| s.attempts).sum()
}

/// The node's only inference replica killed mid-task: the node reports
/// its backend down, the server dispatches nothing to it meanwhile (the
/// sessions the kill ended wait in the queue), `polar status` and
/// `/metrics` say so; once the replica is back the task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_replica_killed_mid_task_holds_dispatch_until_it_is_back() -> Result<()> {
    let mut f = Fixture::start().await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let log = f.dir.path().join("replica.log");
    let replica = replica_process(&addr, &log)?;
    f.replica = Some(addr.clone());
    f.gateway("gw-health", "127.0.0.81").await?;
    let c = f.client();
    f.submit("health", 4, 2).await?;
    // Mid-task: some session on the node.
    let until = Instant::now() + Duration::from_secs(60);
    while !c.task("health").await?.samples.iter().any(
        |s| matches!(&s.state, SessionState::Running { stage: Some(st), .. } if st == "running"),
    ) {
        ensure!(Instant::now() < until, "no session ran: {}", f.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(replica.0.id())?),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    drop(replica);
    // The node's health checks see it; its heartbeat tells the server.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let nodes = c.nodes().await?;
        let n = nodes.nodes.iter().find(|n| n.node_id == "gw-health");
        if n.is_some_and(|n| n.health == polar_rollout_api::NodeHealth::BackendDown) {
            let b = n.and_then(|n| n.backends.get("local")).copied();
            ensure!(
                b == Some(polar_rollout_api::BackendHealth {
                    replicas: 1,
                    healthy: 0
                }),
                "{b:?}"
            );
            break;
        }
        ensure!(Instant::now() < until, "never backend_down: {nodes:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = Command::new(polar_bin()?)
        .args(["status", "--server", &f.server_url(), "--token", TOKEN])
        .output()?;
    let text = String::from_utf8_lossy(&status.stdout);
    ensure!(
        text.contains("gw-health http://127.0.0.81:")
            && text.contains(" backend_down assigned ")
            && text.contains("    backends: local 0/1 replicas healthy (DOWN)"),
        "{text}"
    );
    let node_url = f.gateways[0].url.clone();
    let status = Command::new(polar_bin()?)
        .args(["status", "--node", &node_url, "--token", GATEWAY_TOKEN])
        .output()?;
    let text = String::from_utf8_lossy(&status.stdout);
    ensure!(
        text.contains(
            "\nbackends: local 0/1 replicas healthy (DOWN: the server sends this node no session)\n"
        ),
        "{text}"
    );
    let metrics = c
        .raw(http::Method::GET, "/metrics", None)
        .await
        .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())?;
    ensure!(
        metrics.contains(
            "polar_rollout_node_backend_healthy_replicas{node=\"gw-health\",backend=\"local\"} 0"
        ) && metrics.contains("polar_rollout_nodes{health=\"backend_down\"} 1"),
        "{metrics}"
    );
    // While it is down (several heartbeats and health checks), nothing is
    // dispatched: the sessions the kill ended are back in the queue.
    let before = dispatches(&c.task("health").await?);
    let quiet = Instant::now() + Duration::from_secs(4);
    while Instant::now() < quiet {
        let t = c.task("health").await?;
        ensure!(
            dispatches(&t) == before,
            "dispatched while the backend was down: {t:#?}"
        );
        ensure!(!t.status.is_finished(), "{t:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = c.task("health").await?;
    ensure!(
        t.samples
            .iter()
            .any(|s| matches!(s.state, SessionState::Pending)),
        "no session waits: {t:#?}"
    );
    // Back: the node takes sessions again and the task completes.
    let _replica = replica_process(&addr, &log)?;
    let t = f.wait_finished("health", Duration::from_secs(240)).await?;
    check_results(&t, &f.export_dir())?;
    ensure!(t.counts.usable == 4, "{t:#?}");
    f.stop_gateways()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_rollout_server_loses_nothing() -> Result<()> {
    let mut f = Fixture::start().await?;
    f.gateway("gw-r", "127.0.0.31").await?;
    f.submit("restart", 4, 3).await?;
    let c = f.client();
    ensure!(
        eventually(Duration::from_secs(30), || {
            futures_block(c.task("restart")).is_ok_and(|t| {
                t.samples.iter().all(|s| {
                    matches!(
                        s.state,
                        SessionState::Running { .. } | SessionState::Dispatched { .. }
                    )
                }) && t
                    .samples
                    .iter()
                    .any(|s| matches!(s.state, SessionState::Running { .. }))
            })
        }),
        "the sessions never ran"
    );
    // Crash-like stop, a pause, then a restart on the same database.
    if let Some(s) = f.server.take() {
        s.abort();
        drop(s);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.server = Some(RolloutServer::start(f.server_cfg.clone()).await?);
    let t = f.wait_finished("restart", Duration::from_secs(240)).await?;
    check_results(&t, &f.export_dir())?;
    f.stop_gateways()?;
    Ok(())
}

/// Runs a future to completion from a synchronous closure inside the
/// multi-threaded test runtime.
fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// A SWE-bench style evaluation through the gateway: the test patch adds a
/// unittest checking the file the agent wrote, it is applied in the
/// sandbox, the tests run, and the expected test must pass; and a `command`
/// evaluator in a fresh sandbox on the same workspace, rewarded from a
/// reward file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_output_and_fresh_sandbox_evaluators() -> Result<()> {
    let mut f = Fixture::start().await?;
    f.gateway("gw-e", "127.0.0.41").await?;
    let patch = "--- /dev/null\n+++ b/test_demo.py\n@@ -0,0 +1,9 @@\n+import unittest\n+\n+\n+class T(unittest.TestCase):\n+    def test_file(self):\n+        self.assertEqual(open(\"polar-demo.txt\").read().strip(), \"polar\")\n+\n+    def test_other(self):\n+        self.assertTrue(True)\n";
    f.submit_with(
        "swe",
        2,
        0,
        serde_json::json!({"kind": "test_output", "options": {
            "test_patch": patch,
            "command": "python3 -m unittest -v test_demo",
            "parser": "unittest",
            "fail_to_pass": ["test_demo.T.test_file"],
            "pass_to_pass": ["test_demo.T.test_other"],
        }}),
    )
    .await?;
    f.submit_with(
        "fresh",
        1,
        0,
        serde_json::json!({"kind": "command", "options": {
            "command": "if [ -s polar-demo.txt ]; then echo 1.0; else echo 0.0; fi > $POLAR_REWARD_FILE",
            "reward": "file",
            "fresh": true,
        }}),
    )
    .await?;
    for task in ["swe", "fresh"] {
        let t = f.wait_finished(task, Duration::from_secs(240)).await?;
        check_results(&t, &f.export_dir())?;
    }
    // A patch whose test fails scores 0 and stays usable.
    f.submit_with(
        "swe-fail",
        1,
        0,
        serde_json::json!({"kind": "test_output", "options": {
            "test_patch": patch.replace("\"polar\"", "\"other\""),
            "command": "python3 -m unittest -v test_demo",
            "parser": "unittest",
            "fail_to_pass": ["test_demo.T.test_file"],
        }}),
    )
    .await?;
    let t = f
        .wait_finished("swe-fail", Duration::from_secs(240))
        .await?;
    let SessionState::Done { result, .. } = &t.samples[0].state else {
        bail!("{t:#?}");
    };
    ensure!(result.reward == Some(0.0), "{result:?}");
    // A reward file that scores the main chain's traces apart: the sample's
    // reward is the outcome, each main row carries the main chain's own.
    f.submit_with(
        "roles",
        1,
        0,
        serde_json::json!({"kind": "command", "options": {
            "command": "echo '{\"reward\": 1.0, \"trace_rewards\": {\"main\": 0.25, \"side\": 0}}' > $POLAR_REWARD_FILE",
            "reward": "file",
        }}),
    )
    .await?;
    let t = f.wait_finished("roles", Duration::from_secs(240)).await?;
    let SessionState::Done { result, .. } = &t.samples[0].state else {
        bail!("{t:#?}");
    };
    ensure!(result.reward == Some(1.0), "{result:?}");
    let uri = result.trajectory_uri.as_deref().context("no trajectory")?;
    let rows = jsonl_rows(&Path::new(uri).with_extension("jsonl"))?;
    ensure!(rows.iter().any(|r| r["chain_role"] == "main"), "{rows:?}");
    for r in &rows {
        let want = if r["chain_role"] == "main" { 0.25 } else { 1.0 };
        ensure!(r["reward"] == want, "{r}");
    }
    f.stop_gateways()?;
    Ok(())
}

/// Each sample's calls file sits beside its trajectory (the result's
/// `stats.calls_uri`), and `polar export --from` the export root, with
/// the node's builder, re-derives exactly the rows the node exported.
fn check_rederived(t: &TaskView, export: &Path) -> Result<()> {
    let out = tempfile::tempdir()?;
    let o = Command::new(polar_bin()?)
        .arg("export")
        .arg("--from")
        .arg(export)
        .args(["--task", &t.task_id, "--format", "jsonl", "--json", "--out"])
        .arg(out.path())
        .output()?;
    let summary = String::from_utf8_lossy(&o.stdout);
    ensure!(
        o.status.success(),
        "{summary} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let summary: serde_json::Value = serde_json::from_str(&summary)?;
    ensure!(summary["sessions"] == t.samples.len(), "{summary}");
    for s in &t.samples {
        let SessionState::Done { result, .. } = &s.state else {
            bail!("{s:?}");
        };
        let uri = Path::new(result.trajectory_uri.as_deref().context("no trajectory")?);
        let calls = result
            .stats
            .as_ref()
            .and_then(|s| s["calls_uri"].as_str())
            .with_context(|| format!("no calls_uri: {result:?}"))?;
        let beside = uri.with_file_name(format!("{}.calls.jsonl.zst", s.session_id));
        ensure!(
            Path::new(calls) == beside,
            "{calls} is not beside {}",
            uri.display()
        );
        ensure!(beside.is_file(), "{calls} missing");
        let node_rows = jsonl_rows(&uri.with_extension("jsonl"))?;
        let partition = uri
            .parent()
            .and_then(Path::file_name)
            .context("partition")?;
        let again = out
            .path()
            .join(partition)
            .join(format!("{}.jsonl", s.session_id));
        let rows = jsonl_rows(&again)?;
        ensure!(
            !rows.is_empty() && rows == node_rows,
            "{}: re-derived rows differ",
            s.session_id
        );
    }
    Ok(())
}

/// The rows of a JSONL export file.
fn jsonl_rows(path: &Path) -> Result<Vec<serde_json::Value>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

/// The rollout server here has no policy, so these reach the node, which
/// refuses each at INIT by its own `[gateway.policy]`: a failed sample
/// naming the field and the node's policy, dispatched once, no reward,
/// `stats.refused = "node_policy"`; and a task inside the policy still
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignments_outside_the_node_s_policy_are_refused_at_init() -> Result<()> {
    let mut f = Fixture::start().await?;
    std::fs::create_dir_all(f.tasks_dir())?;
    f.gateway("gw-p", "127.0.0.61").await?;
    // A link inside an allowed root to the gateway's own config (its token).
    let config = f.gateways[0].config.clone();
    std::os::unix::fs::symlink(&config, f.tasks_dir().join("escape"))?;
    let upload =
        |from: &Path| serde_json::json!({"prepare": [{"upload": {"from": from, "to": "x"}}]});
    let cases = [
        (
            "p-shadow",
            upload(Path::new("/etc/shadow")),
            "runtime.prepare[0].upload.from: /etc/shadow is outside the allowed upload roots",
        ),
        (
            "p-link",
            upload(&f.tasks_dir().join("escape")),
            &*format!(
                "runtime.prepare[0].upload.from: {} is outside the allowed upload roots",
                config.canonicalize()?.display()
            ),
        ),
        (
            "p-mount",
            serde_json::json!({"mounts": [{"source": "/etc", "target": "/host-etc", "read_only": false}]}),
            "runtime.mounts[0].source: /etc is outside the allowed writable mount roots [] (read_only = false)",
        ),
        (
            "p-net",
            serde_json::json!({"network": "host"}),
            "runtime.network: \"host\" is not allowed by the node's policy",
        ),
        (
            "p-pids",
            serde_json::json!({"limits": {"pids": 100_000}}),
            "runtime.limits.pids: above the node's ceiling of 4096",
        ),
    ];
    for (id, runtime, _) in &cases {
        let task = serde_json::json!({
            "task_id": id, "instruction": "x", "num_samples": 1, "timeout_secs": 60,
            "agent": {"harness": "shell", "options": {"command": "touch polar-demo.txt"}},
            "runtime": runtime,
        });
        f.client().submit(&task).await?;
    }
    for (id, _, want) in &cases {
        let t = f.wait_finished(id, Duration::from_secs(60)).await?;
        let s = &t.samples[0];
        let SessionState::Done {
            result, attempt, ..
        } = &s.state
        else {
            bail!("{id}: {t:#?}");
        };
        let error = result.error.as_deref().unwrap_or_default();
        ensure!(
            error.starts_with(&format!("refused by this node's policy: {want}")),
            "{id}: {error}"
        );
        ensure!(
            result.status == polar_rollout_api::SampleStatus::Error,
            "{id}: {result:?}"
        );
        ensure!(
            result.reward.is_none() && result.trajectory_uri.is_none(),
            "{id}: {result:?}"
        );
        ensure!(
            *attempt == 1 && s.attempts == 1,
            "{id} was dispatched again: {s:?}"
        );
        let refused = result.stats.as_ref().and_then(|st| st.get("refused"));
        ensure!(
            refused == Some(&serde_json::json!("node_policy")),
            "{id}: {result:?}"
        );
    }
    // A harness this node does not define would fail here again: with no
    // other node, the session fails at once with the node's reason.
    let task = serde_json::json!({
        "task_id": "p-unfit", "instruction": "x", "num_samples": 1, "timeout_secs": 60,
        "agent": {"harness": "custom:not-on-this-node"},
    });
    f.client().submit(&task).await?;
    let t = f.wait_finished("p-unfit", Duration::from_secs(60)).await?;
    let s = &t.samples[0];
    ensure!(t.status == TaskStatus::Failed, "{t:#?}");
    ensure!(s.attempts == 1 && s.retries == 0, "dispatched again: {s:?}");
    let SessionState::Failed { error } = &s.state else {
        bail!("{t:#?}");
    };
    ensure!(
        error.starts_with("node gw-p cannot run it: ")
            && error.contains("not-on-this-node")
            && error.ends_with(" (no other node to try)"),
        "{error}"
    );
    // Inside the policy: runs as before.
    f.submit("p-ok", 1, 0).await?;
    let t = f.wait_finished("p-ok", Duration::from_secs(120)).await?;
    check_results(&t, &f.export_dir())?;
    f.stop_gateways()?;
    Ok(())
}

/// SIGTERM in the middle of a task: a node with time to drain lets its
/// sessions finish and report; a node without hands them back, and another
/// node runs them. Both exit 0 and leave no cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_gateway_drains_or_hands_its_sessions_back() -> Result<()> {
    let mut f = Fixture::start().await?;
    f.gateway_with("gw-patient", "127.0.0.51", 60).await?;
    f.gateway_with("gw-hasty", "127.0.0.52", 1).await?;
    f.submit("drain", 4, 4).await?;
    let c = f.client();
    ensure!(
        {
            let until = Instant::now() + Duration::from_secs(30);
            let mut both = false;
            while !both && Instant::now() < until {
                let t = c.task("drain").await?;
                let on = |g: &str| {
                    t.samples.iter().any(
                        |s| matches!(&s.state, SessionState::Running { node, .. } if node == g),
                    )
                };
                both = on("gw-patient") && on("gw-hasty");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            both
        },
        "the sessions did not spread over both nodes"
    );
    let pids: Vec<i32> = f
        .gateways
        .iter()
        .map(|g| i32::try_from(g.child.id()))
        .collect::<Result<_, _>>()?;
    // The hasty one hands back; the patient one drains.
    let patient = f.gateways.remove(0);
    let hasty = f.gateways.remove(0);
    let mut stopped = vec![hasty, patient];
    for g in &mut stopped {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(g.child.id())?),
            nix::sys::signal::Signal::SIGTERM,
        )?;
    }
    // A third node takes what was handed back.
    f.gateway("gw-spare", "127.0.0.53").await?;
    for g in &mut stopped {
        let until = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(status) = g.child.try_wait()? {
                ensure!(
                    status.success(),
                    "{} exited {status}: {}",
                    g.node_id,
                    g.log_text()
                );
                break;
            }
            ensure!(
                Instant::now() < until,
                "{} did not stop: {}",
                g.node_id,
                g.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    ensure!(
        stopped[0]
            .log_text()
            .contains("handing the remaining sessions back"),
        "{}",
        stopped[0].log_text()
    );
    let t = f.wait_finished("drain", Duration::from_secs(240)).await?;
    let nodes = check_results(&t, &f.export_dir())?;
    ensure!(nodes.iter().any(|n| n == "gw-patient"), "{nodes:?}");
    ensure!(nodes.iter().any(|n| n == "gw-spare"), "{nodes:?}");
    ensure!(!nodes.iter().any(|n| n == "gw-hasty"), "{nodes:?}");
    let cg = cgroup2_mount()?.join("polar");
    for pid in pids {
        ensure!(
            std::fs::read_dir(&cg).map_or(true, |d| d.filter_map(Result::ok).all(|e| !e
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("agent-{pid}-")))),
            "agent {pid} left its cgroup"
        );
    }
    f.stop_gateways()?;
    Ok(())
}

/// One attempt, one trajectory: attempt 1 runs (its calls captured, a
/// marker left in its workspace), the server is told it failed and
/// dispatches attempt 2 to the same (only) node while attempt 1 still runs.
/// The node stops attempt 1, tears it down, sets its directories apart and
/// runs attempt 2 on a fresh workspace (the command leaves a file and exits
/// 7 if it sees the marker, and the evaluator then scores 0): the exported trajectory
/// holds attempt 2's calls only, attempt 1's are kept apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_dispatched_again_to_the_same_node_exports_only_the_new_attempt() -> Result<()> {
    let mut f = Fixture::start().await?;
    f.gateway("gw-s", "127.0.0.71").await?;
    let task = serde_json::json!({
        "task_id": "again",
        "instruction": "Create the file polar-demo.txt.",
        "num_samples": 1,
        "timeout_secs": 120,
        "agent": {"harness": "shell", "options": {"command":
            "if [ -e attempt-marker ]; then touch saw-an-earlier-attempt; exit 7; fi; \
             touch attempt-marker; python3 /workspace/mini_agent.py && sleep 15"}},
        "runtime": {"prepare": [{"upload": {"from": mini_agent(), "to": "mini_agent.py"}}]},
        "evaluator": {"kind": "command", "options": {"command":
            "test -s polar-demo.txt && test ! -e saw-an-earlier-attempt"}},
        "builder": {"kind": "prefix_merging"},
        "metadata": {"group_id": "group-again"},
    });
    f.client().submit(&task).await?;
    let state = f.dir.path().join("gw-s").join("state");
    let live_log = state.join("sessions/again-s0/calls.jsonl");
    // Attempt 1 made its calls and sleeps.
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let t = f.client().task("again").await?;
        let running = matches!(t.samples[0].state, SessionState::Running { attempt: 1, .. });
        if running && call_ids_of(&live_log).is_ok_and(|c| c.len() >= 2) {
            break;
        }
        ensure!(
            Instant::now() < until,
            "attempt 1 did not call: {t:#?}\n{}",
            f.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first = call_ids_of(&live_log)?;
    // Forced: the server hears attempt 1 failed and dispatches attempt 2 to
    // its only node, which still runs attempt 1.
    let as_node = f.client_as(&f.server_url(), &node_token("gw-s"));
    let failed = serde_json::json!({"node_id": "gw-s", "attempt": 1, "status": "error",
                                    "error": "forced re-dispatch", "retry": true});
    let (code, body) = as_node
        .raw(
            http::Method::POST,
            "/v1/sessions/again-s0/result",
            Some(failed.to_string().into_bytes()),
        )
        .await?;
    ensure!(code.is_success(), "{code}: {body:?}");
    let t = f.wait_finished("again", Duration::from_secs(180)).await?;
    let s0 = &t.samples[0];
    let SessionState::Done {
        node,
        attempt,
        result,
    } = &s0.state
    else {
        bail!("{s0:?}\n{}", f.logs());
    };
    ensure!(node == "gw-s" && *attempt == 2, "{s0:?}");
    // Attempt 2 did not see attempt 1's marker: it made the file.
    ensure!(result.reward == Some(1.0), "{result:?}\n{}", f.logs());
    ensure!(
        s0.ended_attempts.len() == 1 && s0.ended_attempts[0].attempt == 1,
        "{s0:?}"
    );
    // Attempt 1's files and calls are kept apart.
    let kept = state.join("attempts/again-s0/1");
    ensure!(
        kept.join("sandbox/workspace/attempt-marker").is_file(),
        "{}",
        kept.display()
    );
    let kept_ids = call_ids_of(&kept.join("capture/calls.jsonl"))?;
    ensure!(first.is_subset(&kept_ids), "{first:?} {kept_ids:?}");
    // The export holds attempt 2's calls only; once it was written, the
    // node removed attempt 2's live directories (attempt 1's, not
    // exported, stay kept apart).
    let uri = result.trajectory_uri.as_deref().context("no trajectory")?;
    let rows = std::fs::read_to_string(Path::new(uri).with_extension("jsonl"))?;
    let mut exported = std::collections::BTreeSet::new();
    for line in rows.lines() {
        let r: serde_json::Value = serde_json::from_str(line)?;
        // Each row names its attempt; attempt 1 is counted, not merged.
        ensure!(
            r["attempt"] == 2
                && r["trajectory_metadata"]["attempt"] == 2
                && r["stats"]["superseded_attempts"] == 1,
            "attempt {}, trajectory_metadata {}, stats {}",
            r["attempt"],
            r["trajectory_metadata"],
            r["stats"]
        );
        for id in r["call_ids"].as_array().into_iter().flatten() {
            exported.insert(id.as_str().unwrap_or_default().to_owned());
        }
    }
    ensure!(
        !exported.is_empty() && exported.is_disjoint(&kept_ids),
        "exported {exported:?}, attempt 1 made {kept_ids:?}"
    );
    ensure!(
        !live_log.exists() && !state.join("sandboxes/again-s0").exists(),
        "attempt 2's directories left after its export"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_over_https_with_mutual_tls_and_tokens_rotated_by_reload() -> Result<()> {
    let mut f = Fixture::start_tls().await?;
    f.gateway("gw-t", "127.0.0.41").await?;
    ensure!(f.gateways[0].url.starts_with("https://127.0.0.41:"));
    f.submit("over-tls", 2, 0).await?;
    let t = f
        .wait_finished("over-tls", Duration::from_secs(240))
        .await?;
    ensure!(check_results(&t, &f.export_dir())? == ["gw-t", "gw-t"]);

    // A client trusting another CA is refused, naming why; so is
    // `polar status` given that CA.
    let other = Pki::init(f.dir.path().join("other-ca"))?;
    let wrong = RolloutClient::new(f.server_url(), Some(TOKEN.into())).with_tls(other.client()?);
    let e = wrong
        .status()
        .await
        .err()
        .context("another CA was trusted")?;
    ensure!(
        e.to_string()
            .contains("invalid peer certificate: UnknownIssuer"),
        "{e}"
    );
    let polar_status = |ca: PathBuf| -> Result<std::process::Output> {
        let server = f.server_url();
        let args = ["status", "--server", &server, "--token", TOKEN, "--ca-file"];
        Ok(Command::new(polar_bin()?).args(args).arg(ca).output()?)
    };
    let out = polar_status(other.ca())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("UnknownIssuer"),
        "{out:?}"
    );
    let out = polar_status(f.pki.as_ref().context("no pki")?.ca())?;
    ensure!(out.status.success(), "{out:?}");

    // Rotation: the server's gateway token and gw-t's token, the server
    // first, then the gateway's file and SIGHUP.
    let (new_node, new_server) = (
        "gateway-e2e-node-gw-t-rotated",
        "gateway-e2e-server-rotated",
    );
    let mut rotated = f.server_cfg.clone();
    rotated.gateway_token = new_server.into();
    rotated.node_tokens.insert("gw-t".into(), new_node.into());
    f.server
        .as_ref()
        .context("no server")?
        .set_tokens(&rotated)?;
    let g = &f.gateways[0];
    let text = std::fs::read_to_string(&g.config)?
        .replace(&node_token("gw-t"), new_node)
        .replace(GATEWAY_TOKEN, new_server);
    std::fs::write(&g.config, text)?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(g.child.id())?),
        nix::sys::signal::Signal::SIGHUP,
    )?;
    ensure!(
        eventually(Duration::from_secs(20), || g
            .log_text()
            .contains("gateway tokens reloaded")),
        "no reload: {}",
        g.log_text()
    );
    let status = |token: &str| {
        let c = f.client_as(&g.url, token);
        async move { c.raw(http::Method::GET, "/v1/status", None).await }
    };
    ensure!(status(GATEWAY_TOKEN).await?.0 == http::StatusCode::UNAUTHORIZED);
    ensure!(status(new_server).await?.0 == http::StatusCode::OK);
    // Sessions run with the new tokens both ways (the old node token is
    // refused by the server now).
    f.submit("after-rotation", 2, 0).await?;
    let t = f
        .wait_finished("after-rotation", Duration::from_secs(240))
        .await?;
    ensure!(check_results(&t, &f.export_dir())? == ["gw-t", "gw-t"]);
    f.stop_gateways()?;
    Ok(())
}

#[test]
fn plain_http_on_a_network_address_is_refused_at_start() -> Result<()> {
    let dir = sandbox_tempdir()?;
    // Nothing is bound: the check comes first (no traffic leaves loopback).
    let rollout = dir.path().join("rollout.toml");
    std::fs::write(
        &rollout,
        format!(
            "[rollout]\ntokens = [\"{TOKEN}\"]\ngateway_token = \"{GATEWAY_TOKEN}\"\n\
             [rollout.node_tokens]\ngw-a = \"{}\"\n",
            node_token("gw-a")
        ),
    )?;
    let out = Command::new(polar_bin()?)
        .args([
            "rollout",
            "serve",
            "--listen",
            "10.255.0.1:7070",
            "--database",
        ])
        .arg(dir.path().join("r.sqlite"))
        .arg("--config")
        .arg(&rollout)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(125), "{out:?}");
    ensure!(
        stderr.contains("rollout.listen: 10.255.0.1:7070 is not a loopback address and rollout.tls has no cert_file"),
        "{stderr}"
    );
    let agent = dir.path().join("agent.toml");
    std::fs::write(
        &agent,
        format!(
            "[agent]\nstate_dir = {:?}\n[gateway]\nserver = \"http://127.0.0.1:7070\"\n\
             node_id = \"gw-a\"\nlisten = \"10.255.0.1:7071\"\ntoken = \"{}\"\n\
             accept_tokens = [\"{GATEWAY_TOKEN}\"]\n",
            dir.path().join("state"),
            node_token("gw-a")
        ),
    )?;
    let out = Command::new(polar_bin()?)
        .args(["agent", "--config"])
        .arg(&agent)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(125), "{out:?}");
    ensure!(
        stderr.contains("gateway.listen: 10.255.0.1:7071 is not a loopback address and gateway.tls has no cert_file"),
        "{stderr}"
    );
    Ok(())
}
