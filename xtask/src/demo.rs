//! `cargo xtask demo`: Polar's main job on embedded defaults, on one machine.
//!
//! It builds the release binary and starts, on loopback, the three parts of
//! a rollout: the mock inference server (a stand-in for vLLM with a
//! deterministic tokenizer and a tool-calling policy), a rollout server, and
//! one gateway node (`polar agent`). It then submits a task of 4 samples
//! whose harness is a small Python agent with a hard-coded HTTPS endpoint
//! (`examples/mini_agent.py`, run by the `shell` preset), and, when a real
//! harness CLI is installed (`cargo xtask harnesses`), a second task run by
//! Claude Code. Nothing leaves the machine: the eBPF redirect hands each
//! connection to the agent, which terminates TLS with its own CA, calls the
//! inference server with token ids, and records each call; each session is
//! evaluated, its trajectory rebuilt and exported. The demo prints the
//! task's table and a summary of the trajectories written.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::{release, setup};

/// Bounds each task of the demo.
const TASK_TIMEOUT: Duration = Duration::from_secs(300);
const TRAINER_TOKEN: &str = "demo-trainer-token";
const NODE_TOKEN: &str = "demo-node-token";

pub fn run() -> Result<()> {
    setup::run()?;
    release::build()?;
    let polar = release::polar_binary()?;
    let root = workspace_root()?;
    let dir = root.join("target/polar-demo");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let [mock_port, server_port, gateway_port] = free_ports()?;
    let config = dir.join("polar.toml");
    std::fs::write(
        &config,
        config_text(&dir, mock_port, server_port, gateway_port),
    )?;
    let mut mock = Daemon::start(
        "mock inference server",
        &polar,
        &[
            "mock-backend",
            "--listen",
            &format!("127.0.0.1:{mock_port}"),
            "--served-model",
            "default",
        ],
        &dir.join("mock-backend.log"),
        mock_port,
    )?;
    let config_arg = config.display().to_string();
    let mut server = Daemon::start(
        "rollout server",
        &polar,
        &["rollout", "serve", "--config", &config_arg],
        &dir.join("rollout-server.log"),
        server_port,
    )?;
    let mut gateway = Daemon::start(
        "gateway",
        &polar,
        &["agent", "--config", &config_arg],
        &dir.join("gateway.log"),
        gateway_port,
    )?;
    say(&format!(
        "\nPolar demo\n\n\
         On loopback: a mock inference server (vLLM's token-id dialect) on port {mock_port},\n\
         a rollout server on port {server_port} and one gateway node (`polar agent`) on port\n\
         {gateway_port}; configuration in {config}, logs in {dir}.\n\n\
         Each sample runs in a sandbox with its own cgroup and network namespace. eBPF\n\
         programs steer its connections to the agent, which terminates TLS with its own\n\
         CA (trusted inside the sandbox only), calls the inference server for token ids\n\
         and logprobs, answers in the harness's API and records every call. After the\n\
         harness, the evaluator scores the sample, and the trajectory is rebuilt and\n\
         exported for training.\n",
        config = config.display(),
        dir = dir.display(),
    ));
    let server_url = format!("http://127.0.0.1:{server_port}");
    let mut tasks = vec![write_task(
        &dir,
        &root,
        "demo-shell",
        ShellOrHarness::Shell,
    )?];
    let claude = root.join(".polar-cache/harnesses/node_modules/.bin/claude");
    if claude.is_file() {
        tasks.push(write_task(
            &dir,
            &root,
            "demo-claude",
            ShellOrHarness::Harness("claude_code"),
        )?);
    } else {
        say(
            "(No real harness CLI installed: `cargo xtask harnesses` installs them; the demo then also runs Claude Code.)\n",
        );
    }
    let mut result = Ok(());
    for (task_id, file) in &tasks {
        let out = Cmd::new(&polar)?
            .arg("submit")
            .arg(file)
            .args(["--server", &server_url, "--token", TRAINER_TOKEN])
            .capture(TASK_TIMEOUT);
        match out {
            Ok(o) => {
                say(&format!(
                    "--- polar submit {} ---\n{}",
                    file.display(),
                    o.stdout.trim_end()
                ));
                if !o.status.success() {
                    result = Err(anyhow::anyhow!(
                        "task {task_id} did not complete ({}): {}",
                        o.status,
                        o.stderr.trim_end()
                    ));
                    break;
                }
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        if let Err(e) = summarize(&dir.join("trajectories"), task_id) {
            result = Err(e);
            break;
        }
    }
    // A graceful stop: the gateway drains and detaches its eBPF programs.
    gateway.stop(Duration::from_secs(30));
    server.stop(Duration::from_secs(10));
    mock.stop(Duration::from_secs(5));
    if let Err(e) = result {
        say(&format!(
            "--- gateway log (last lines) ---\n{}",
            tail(&dir.join("gateway.log"), 30)
        ));
        return Err(e);
    }
    say(&format!(
        "\nDemo done. Trajectories (Parquet and JSONL, one row per trace) are in {}.\n\
         Re-derive them with another builder: polar export --state-dir {} --out DIR --builder per_request",
        dir.join("trajectories").display(),
        dir.join("state").display()
    ));
    Ok(())
}

fn free_ports() -> Result<[u16; 3]> {
    // Held together so that the three differ.
    let l: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()?;
    let p = |i: usize| -> Result<u16> { Ok(l[i].local_addr()?.port()) };
    Ok([p(0)?, p(1)?, p(2)?])
}

fn config_text(dir: &Path, mock: u16, server: u16, gateway: u16) -> String {
    format!(
        r#"# Written by `cargo xtask demo`.
[agent]
state_dir = "{state}"

[[backend]]
name = "local"
dialect = "vllm"
replicas = ["http://127.0.0.1:{mock}"]
served_model = "default"

[rollout]
listen = "127.0.0.1:{server}"
database = "{db}"
tokens = ["{TRAINER_TOKEN}"]
node_tokens = ["{NODE_TOKEN}"]

[gateway]
server = "http://127.0.0.1:{server}"
node_id = "demo-node"
listen = "127.0.0.1:{gateway}"
token = "{NODE_TOKEN}"
running_workers = 2
ready_buffer = 2
export = "{traj}"
formats = ["parquet", "jsonl"]
drain_timeout_secs = 20
"#,
        state = dir.join("state").display(),
        db = dir.join("rollout.sqlite").display(),
        traj = dir.join("trajectories").display(),
    )
}

enum ShellOrHarness {
    Shell,
    Harness(&'static str),
}

/// Writes a task file; returns the task id and the file.
fn write_task(
    dir: &Path,
    root: &Path,
    name: &str,
    harness: ShellOrHarness,
) -> Result<(String, PathBuf)> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let task_id = format!("{name}-{stamp}");
    let body = match harness {
        ShellOrHarness::Shell => format!(
            r#"task_id = "{task_id}"
instruction = "Create the file polar-demo.txt."
num_samples = 4
timeout_secs = 120
builder = {{ kind = "prefix_merging" }}

[agent]
harness = "shell"
options = {{ command = "python3 /workspace/mini_agent.py" }}

[runtime]
prepare = [{{ upload = {{ from = "{script}", to = "mini_agent.py" }} }}]

[evaluator]
kind = "command"
options = {{ command = "test -s polar-demo.txt" }}

[metadata]
group_id = "{task_id}"
policy_version = "demo"
"#,
            script = root.join("examples/mini_agent.py").display()
        ),
        ShellOrHarness::Harness(h) => format!(
            r#"task_id = "{task_id}"
instruction = "Create the file polar-demo.txt containing the word polar."
num_samples = 2
timeout_secs = 240
builder = {{ kind = "prefix_merging" }}

[agent]
harness = "{h}"

[evaluator]
kind = "session_completed"

[metadata]
group_id = "{task_id}"
policy_version = "demo"
"#
        ),
    };
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, body)?;
    Ok((task_id, file))
}

/// Prints what the task's JSONL trajectories hold and checks them: every
/// trace has token ids, and every loss-1 token a logprob.
fn summarize(root: &Path, task_id: &str) -> Result<()> {
    let part = root.join(format!("task={task_id}"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&part)
        .with_context(|| format!("reading {}", part.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no trajectory was exported to {}", part.display());
    }
    say(&format!("--- trajectories in {} ---", part.display()));
    for f in &files {
        let text = std::fs::read_to_string(f)?;
        for line in text.lines() {
            let r: serde_json::Value = serde_json::from_str(line)?;
            let len = |k: &str| r[k].as_array().map_or(0, Vec::len);
            let trained = r["loss_mask"]
                .as_array()
                .map_or(0, |m| m.iter().filter(|v| v.as_u64() == Some(1)).count());
            say(&format!(
                "{}: group {}, reward {}, {} prompt + {} response tokens ({} trained), {} calls merged, finish {}",
                r["trace_id"].as_str().unwrap_or("?"),
                r["group_id"].as_str().unwrap_or("?"),
                r["reward"],
                len("prompt_ids"),
                len("response_ids"),
                trained,
                len("call_ids"),
                r["finish_reason"].as_str().unwrap_or("?"),
            ));
            if len("prompt_ids") == 0 || len("response_ids") == 0 {
                bail!("{} has no token ids", f.display());
            }
            if len("response_logprobs") != len("response_ids") {
                bail!(
                    "{}: logprobs and response ids differ in length",
                    f.display()
                );
            }
        }
    }
    Ok(())
}

/// A `polar` subcommand running in the background, stopped by its pid.
struct Daemon {
    what: &'static str,
    child: Child,
}

impl Daemon {
    fn start(
        what: &'static str,
        polar: &Path,
        args: &[&str],
        log: &Path,
        port: u16,
    ) -> Result<Self> {
        let file = std::fs::File::create(log)?;
        let mut child = Command::new(polar)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .with_context(|| format!("starting the {what}"))?;
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(Self { what, child });
            }
            if let Some(status) = child.try_wait()? {
                bail!("the {what} exited early ({status}):\n{}", tail(log, 20));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "the {what} did not listen on port {port}:\n{}",
            tail(log, 20)
        )
    }

    /// SIGTERM, then SIGKILL after `grace`.
    fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        say(&format!(
            "the {} did not stop within {grace:?}; killing it",
            self.what
        ));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[expect(
    clippy::print_stdout,
    reason = "the demo's explanation and report are its output"
)]
fn say(text: &str) {
    println!("{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_requires_token_ids_and_logprobs() {
        let dir = std::env::temp_dir().join(format!("polar-demo-test-{}", std::process::id()));
        let part = dir.join("task=t");
        std::fs::create_dir_all(&part).unwrap();
        let good = r#"{"trace_id":"s/0","group_id":"t","reward":1.0,"prompt_ids":[1,2],"response_ids":[3],"response_logprobs":[-0.1],"loss_mask":[1],"call_ids":["c"],"finish_reason":"stop"}"#;
        let bad = r#"{"trace_id":"s/1","group_id":"t","reward":1.0,"prompt_ids":[1,2],"response_ids":[3,4],"response_logprobs":[-0.1],"loss_mask":[1,1],"call_ids":["c"],"finish_reason":"stop"}"#;
        std::fs::write(part.join("s.jsonl"), format!("{good}\n")).unwrap();
        assert!(summarize(&dir, "t").is_ok());
        std::fs::write(part.join("s.jsonl"), format!("{good}\n{bad}\n")).unwrap();
        assert!(summarize(&dir, "t").is_err());
        assert!(summarize(&dir, "missing").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
