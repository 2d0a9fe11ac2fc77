//! `cargo xtask demo`: Polar's main job on embedded defaults, on one machine.
//!
//! It installs what the demo needs (not what only the tests need, such as
//! cargo-deny), builds the release binary and starts, on loopback, the three
//! parts of a rollout: the mock inference server (a stand-in for vLLM with a
//! deterministic tokenizer and a tool-calling policy), a rollout server, and
//! one gateway node (`polar agent`). It then submits a task of 4 samples
//! whose harness is a small Python agent with a hard-coded HTTPS endpoint
//! (`examples/mini_agent.py`, run by the `shell` preset), and a task of 2
//! samples run by a real harness CLI, Claude Code, which it installs from
//! the npm registry at the version pinned in `harnesses/` (see
//! [`harnesses::claude_code`]); `--no-harness` leaves Claude Code out and
//! stays off npm. Nothing else leaves the machine: the eBPF redirect hands
//! each connection to the agent, which terminates TLS with its own CA,
//! calls the inference server with token ids, and records each call; each
//! session is evaluated, its trajectory rebuilt and exported. The demo
//! prints the tasks' tables and a summary of the trajectories written, and
//! fails unless every sample earned reward 1. With `--serve` the stack stays
//! up afterwards, for `examples/grpo_loop.py` (the Python client's training
//! loop), until SIGINT, SIGTERM or (at a terminal) Enter.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::daemon::{free_ports, tail};
use crate::stack::{Stack, TOKENIZER_FILE};
use crate::{harnesses, release, setup};

/// Bounds each task of the demo.
const TASK_TIMEOUT: Duration = Duration::from_secs(300);
const TRAINER_TOKEN: &str = "demo-trainer-token";
const NODE_TOKEN: &str = "demo-node-token";
const GATEWAY_TOKEN: &str = "demo-gateway-token";

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Leave Claude Code out (no npm install): only the small Python agent
    /// runs.
    #[arg(long)]
    no_harness: bool,
    /// Keep the stack running after the tasks, for a trainer's loop against
    /// it (`examples/grpo_loop.py`), until SIGINT, SIGTERM or (at a
    /// terminal) Enter.
    #[arg(long)]
    serve: bool,
}

pub fn run(args: DemoArgs) -> Result<()> {
    setup::run(setup::Scope::Demo)?;
    // Before the build, so that a failing npm install fails fast.
    let claude = if args.no_harness {
        None
    } else {
        Some(harnesses::claude_code()?)
    };
    release::build()?;
    let polar = release::polar_binary()?;
    let root = workspace_root()?;
    let dir = root.join("target/polar-demo");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let ports = free_ports()?;
    let [mock_port, server_port, gateway_port] = ports;
    let config = dir.join("polar.toml");
    std::fs::write(&config, config_text(&dir, &root, ports))?;
    let stack = Stack::start(&polar, &dir, &config, ports, claude.as_deref())?;
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
    if claude.is_some() {
        tasks.push(write_task(
            &dir,
            &root,
            "demo-claude",
            ShellOrHarness::Harness("claude_code"),
        )?);
    } else {
        say(
            "(--no-harness: only the small Python agent runs; without it, Claude Code runs too.)\n",
        );
    }
    let mut result = Ok(());
    for Task { id, file, samples } in &tasks {
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
                        "task {id} did not complete ({}): {}",
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
        if let Err(e) = summarize(&dir.join("trajectories"), id, *samples) {
            result = Err(e);
            break;
        }
    }
    let trainer = format!(
        "python3 -m venv .venv && .venv/bin/pip install ./python\n  \
         .venv/bin/python examples/grpo_loop.py --server {server_url} \\\n    \
         --token {TRAINER_TOKEN} --gateway-token {GATEWAY_TOKEN}"
    );
    if result.is_ok() && args.serve {
        say(&format!(
            "\nThe stack keeps running. A trainer's loop against it (groups of samples, \
             group-relative advantages, a pause around each weight update):\n  {trainer}\n\
             The dashboard, its trajectories with each token's text: {server_url}/ui \
             (token {TRAINER_TOKEN}).\n\
             Stop the stack with Ctrl-C or SIGTERM (or Enter at a terminal)."
        ));
        crate::group::serve_until_interrupted();
        say("Stopping the stack.");
    }
    stack.stop();
    if let Err(e) = result {
        say(&format!(
            "--- gateway log (last lines) ---\n{}",
            tail(&dir.join("gateway.log"), 30)
        ));
        return Err(e);
    }
    say(&format!(
        "\nDemo done. Trajectories (Parquet and JSONL, one row per trace) are in {}.\n\
         Re-derive them with another builder: polar export --state-dir {} --out DIR --builder per_request\n\
         Load them in Python as token arrays: polar_client.load(\"{}\") (python3 -m venv .venv && .venv/bin/pip install ./python).\n\
         A trainer's loop over this stack: examples/grpo_loop.py (cargo xtask demo --serve keeps the stack up for it).",
        dir.join("trajectories").display(),
        dir.join("state").display(),
        dir.join("trajectories").display(),
    ));
    Ok(())
}

fn config_text(dir: &Path, root: &Path, [mock, server, gateway]: [u16; 3]) -> String {
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
gateway_token = "{GATEWAY_TOKEN}"

[rollout.node_tokens]
demo-node = "{NODE_TOKEN}"

# The dashboard (/ui): the exported trajectories, with each token's text
# from the mock's vocabulary (`polar mock-backend --write-tokenizer`).
[rollout.dashboard]
export_roots = ["{traj}"]
tokenizer = "{tokenizer}"

[gateway]
server = "http://127.0.0.1:{server}"
node_id = "demo-node"
listen = "127.0.0.1:{gateway}"
token = "{NODE_TOKEN}"
accept_tokens = ["{GATEWAY_TOKEN}"]
running_workers = 2
ready_buffer = 2
export = "{traj}"
formats = ["parquet", "jsonl"]
drain_timeout_secs = 20

# The shell task uploads examples/mini_agent.py; nothing else may be.
[gateway.policy]
upload_roots = ["{examples}"]
"#,
        examples = root.join("examples").display(),
        state = dir.join("state").display(),
        db = dir.join("rollout.sqlite").display(),
        traj = dir.join("trajectories").display(),
        tokenizer = dir.join(TOKENIZER_FILE).display(),
    )
}

enum ShellOrHarness {
    Shell,
    Harness(&'static str),
}

/// A task of the demo, as written to its file.
struct Task {
    id: String,
    file: PathBuf,
    samples: usize,
}

/// Writes a task file.
fn write_task(dir: &Path, root: &Path, name: &str, harness: ShellOrHarness) -> Result<Task> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let task_id = format!("{name}-{stamp}");
    let samples = match harness {
        ShellOrHarness::Shell => 4,
        ShellOrHarness::Harness(_) => 2,
    };
    let body = match harness {
        ShellOrHarness::Shell => format!(
            r#"task_id = "{task_id}"
instruction = "Create the file polar-demo.txt."
num_samples = {samples}
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
num_samples = {samples}
timeout_secs = 240
builder = {{ kind = "prefix_merging" }}

[agent]
harness = "{h}"

[evaluator]
kind = "command"
options = {{ command = "test -s polar-demo.txt" }}

[metadata]
group_id = "{task_id}"
policy_version = "demo"
"#
        ),
    };
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, body)?;
    Ok(Task {
        id: task_id,
        file,
        samples,
    })
}

/// Prints what the task's JSONL trajectories hold and checks them: each of
/// the `samples` sessions exported a trajectory with reward 1, every trace
/// has token ids, and every response token a logprob.
fn summarize(root: &Path, task_id: &str, samples: usize) -> Result<()> {
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
    let mut sessions = std::collections::BTreeSet::new();
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
            if r["reward"].as_f64() != Some(1.0) {
                bail!(
                    "{}: {} earned reward {}, not 1",
                    f.display(),
                    r["trace_id"],
                    r["reward"]
                );
            }
            sessions.insert(r["session_id"].as_str().unwrap_or_default().to_owned());
        }
    }
    if sessions.len() != samples {
        bail!(
            "{} of the {samples} samples of {task_id} exported a trajectory",
            sessions.len()
        );
    }
    Ok(())
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
    fn summary_requires_token_ids_logprobs_and_reward_1_for_every_sample() {
        let dir = std::env::temp_dir().join(format!("polar-demo-test-{}", std::process::id()));
        let part = dir.join("task=t");
        std::fs::create_dir_all(&part).unwrap();
        let trace = |session: &str, reward: f64, ids: &str| {
            format!(
                r#"{{"trace_id":"{session}/0","session_id":"{session}","group_id":"t","reward":{reward},"prompt_ids":[1,2],"response_ids":{ids},"response_logprobs":[-0.1],"loss_mask":[1],"call_ids":["c"],"finish_reason":"stop"}}"#
            )
        };
        let write = |lines: &[String]| {
            std::fs::write(part.join("s.jsonl"), lines.join("\n") + "\n").unwrap();
        };
        write(&[trace("a", 1.0, "[3]"), trace("b", 1.0, "[3]")]);
        assert!(summarize(&dir, "t", 2).is_ok());
        // A sample missing, a reward of 0, logprobs missing.
        assert!(summarize(&dir, "t", 3).is_err());
        write(&[trace("a", 1.0, "[3]"), trace("b", 0.0, "[3]")]);
        assert!(summarize(&dir, "t", 2).is_err());
        write(&[trace("a", 1.0, "[3]"), trace("b", 1.0, "[3,4]")]);
        assert!(summarize(&dir, "t", 2).is_err());
        assert!(summarize(&dir, "missing", 2).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
