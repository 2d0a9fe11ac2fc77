//! Polar in a real Slurm job (root only): the test cluster `cargo xtask
//! test` starts (Debian's `slurm-wlm`: slurmctld and two slurmd, nodes
//! `polar-n1` and `polar-n2` on this machine; `POLAR_TEST_SLURM_CONF` names
//! its `slurm.conf`). The job is the shipped template,
//! `deploy/slurm/polar-rollout.sbatch`, submitted with `sbatch --wait` on
//! both nodes: `polar slurm run` starts the job's rollout server and a
//! gateway per node through `srun`, then the job's command (`polar submit`
//! of a small task: the `shell` preset running `examples/mini_agent.py`
//! against the mock backend on loopback) runs against them. The command
//! also records what it sees of the job directory. Afterwards: every
//! sample done with its reward, both nodes used, trajectories exported,
//! the job's files private while it ran (0700 directories, 0600 keys and
//! tokens, no CA key), its secrets and directory gone after it, no
//! process of it left, Slurm's record of the job `COMPLETED`.
//!
//! A job whose operator file sets one of the job's own keys fails, naming
//! the key, before any directory or secret is made. A job cancelled
//! (`scancel`) while its sessions run: both gateways drain, no process of
//! the job is left after Slurm's `KillWait`, and the job directory is kept
//! for the operator without its keys and tokens.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_mock::{self as mock, MockConfig, MockHandle};
use polar_tests::{polar_bin, processes_with, sandbox_tempdir};

/// The nodes of the test cluster (`xtask/src/slurm.rs`).
const NODES: [&str; 2] = ["polar-n1", "polar-n2"];

fn slurm_conf() -> Result<PathBuf> {
    std::env::var_os("POLAR_TEST_SLURM_CONF")
        .map(PathBuf::from)
        .context(
            "POLAR_TEST_SLURM_CONF is not set: these tests need the Slurm test cluster \
             that `cargo xtask test` starts (or run them under `cargo xtask slurm -- cargo test ...`)",
        )
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Python client's interpreter, from the set-up's environment.
fn client_python() -> Result<PathBuf> {
    let p = repo().join(".polar-cache/venvs/client/bin/python");
    ensure!(
        p.exists(),
        "{} is missing: `cargo xtask test` (its set-up) makes it",
        p.display()
    );
    Ok(p)
}

/// One job's files: the operator's configuration, the task, the command.
struct Job {
    dir: tempfile::TempDir,
    _mock: MockHandle,
    conf: PathBuf,
}

impl Job {
    async fn new(pause_secs: u32) -> Result<Self> {
        let conf = slurm_conf()?;
        let dir = sandbox_tempdir()?;
        let mock = mock::start(MockConfig {
            served_model: "default".into(),
            ..MockConfig::default()
        })
        .await?;
        let examples = repo().join("examples").canonicalize()?;
        let d = dir.path();
        std::fs::create_dir(d.join("out"))?;
        std::fs::write(
            d.join("agent.toml"),
            format!(
                r#"[agent]
state_dir = "{state}"

[[backend]]
name = "local"
dialect = "vllm"
replicas = ["http://{mock}"]
served_model = "default"

[gateway]
max_sessions = 2
init_workers = 2
running_workers = 2
postrun_workers = 2
heartbeat_interval_ms = 300
export = "{export}"
formats = ["parquet", "jsonl"]

[gateway.policy]
upload_roots = ["{examples}"]
"#,
                state = d.join("state").display(),
                mock = mock.addr,
                export = d.join("trajectories").display(),
                examples = examples.display(),
            ),
        )?;
        std::fs::write(
            d.join("rollout.toml"),
            "[rollout]\nheartbeat_interval_ms = 300\nheartbeat_timeout_ms = 3000\n",
        )?;
        let command = match pause_secs {
            0 => "python3 /workspace/mini_agent.py".to_owned(),
            s => format!("sleep {s}; python3 /workspace/mini_agent.py"),
        };
        let task = serde_json::json!({
            "task_id": "slurm",
            "instruction": "Create the file polar-demo.txt.",
            "num_samples": 4,
            "timeout_secs": 120,
            "agent": {"harness": "shell", "options": {"command": command}},
            "runtime": {"prepare": [{"upload": {"from": examples.join("mini_agent.py"), "to": "mini_agent.py"}}]},
            "evaluator": {"kind": "command", "options": {"command": "test -s polar-demo.txt"}},
            "builder": {"kind": "prefix_merging"},
        });
        std::fs::write(d.join("task.json"), serde_json::to_vec(&task)?)?;
        // The job's command: what it sees of the job directory, then the task.
        std::fs::write(
            d.join("command.sh"),
            format!(
                r#"set -eu
out={out}
j="$POLAR_SLURM_JOB_DIR"
echo "$j" > "$out/job-dir"
find "$j" -mindepth 1 \( -type d -o -name '*.key' -o -path '*/tokens/*' \) -printf '%y %m %P\n' | sort > "$out/modes"
stat -c 'd %a .' "$j" >> "$out/modes"
ls "$j/tls" > "$out/tls"
env | grep -E '^POLAR_(ROLLOUT_URL|ROLLOUT_CA_FILE)=' | sort > "$out/env"
# A Python trainer's set-up in the job: the client from the environment
# (the job's URL, token and CA), over HTTPS.
PYTHONPATH={python_src} {python} -c '
import os, polar_client as pc
nodes = pc.Client(os.environ["POLAR_ROLLOUT_URL"]).nodes()
print(" ".join(sorted(n.node_id for n in nodes)))' > "$out/python-nodes"
exec polar submit {task} --json > "$out/result.json"
"#,
                out = d.join("out").display(),
                task = d.join("task.json").display(),
                python = client_python()?.display(),
                python_src = repo().join("python/src").display(),
            ),
        )?;
        Ok(Self {
            dir,
            _mock: mock,
            conf,
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    /// `sbatch` of the shipped template on both nodes; `wait`: until the
    /// job ends (its exit code), else the job id.
    fn sbatch(&self, wait: bool) -> Result<std::process::Output> {
        let bin = polar_bin()?;
        let path = format!(
            "{}:{}",
            bin.parent().context("no bin dir")?.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("sbatch");
        if wait {
            cmd.arg("--wait");
        } else {
            cmd.arg("--parsable");
        }
        let out = cmd
            .args(["--nodes=2", "--time=10"])
            .arg(format!("--output={}", self.path("out/job.log").display()))
            .arg(repo().join("deploy/slurm/polar-rollout.sbatch"))
            .args(["sh"])
            .arg(self.path("command.sh"))
            .env("SLURM_CONF", &self.conf)
            .env("PATH", path)
            .env("POLAR_AGENT_CONFIG", self.path("agent.toml"))
            .env("POLAR_ROLLOUT_CONFIG", self.path("rollout.toml"))
            .env("POLAR_SLURM_DIR", self.path("jobs"))
            .env("POLAR_SLURM_PORT", "0")
            .env("POLAR_SLURM_GATEWAY_PORT", "0")
            .output()?;
        Ok(out)
    }

    fn scontrol(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("scontrol")
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The job's state as Slurm records it (`JobState=`).
    fn job_state(&self, id: &str) -> Result<String> {
        let text = self.scontrol(&["show", "job", "-o", id])?;
        Ok(text
            .split_whitespace()
            .find_map(|f| f.strip_prefix("JobState="))
            .unwrap_or("")
            .to_owned())
    }

    fn logs(&self) -> String {
        let mut out = format!("--- job.log ---\n{}", self.read("out/job.log"));
        if let Ok(entries) = std::fs::read_dir(self.path("jobs")) {
            for e in entries.flatten() {
                let files: Vec<_> = walkdir(&e.path());
                out.push_str(&format!("\n--- {} ---\n{files:?}", e.path().display()));
                for p in walkdir(&e.path().join("nodes")) {
                    if p.extension().is_none_or(|x| x != "log") {
                        continue;
                    }
                    if let Ok(t) = std::fs::read_to_string(&p) {
                        let lines: Vec<&str> = t.lines().collect();
                        out.push_str(&format!(
                            "\n--- {} ---\n{}",
                            p.display(),
                            lines[lines.len().saturating_sub(30)..].join("\n")
                        ));
                    }
                }
            }
        }
        out
    }
}

/// Every path below `dir`.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.path());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walkdir(&e.path()));
        }
    }
    out
}

/// The job's `polar` processes are gone (they take a moment after Slurm
/// reports the job's end).
fn no_process_left(needle: &str) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let left = processes_with(needle);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("processes of the job left: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_rollout_runs_in_a_two_node_slurm_job_with_fresh_secrets_and_leaves_nothing() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let job = rt.block_on(Job::new(0))?;
    let out = job.sbatch(true)?;
    let logs = job.logs();
    ensure!(
        out.status.success(),
        "sbatch --wait: {out:?}\n{logs}\nresult: {}",
        job.read("out/result.json")
    );

    // Every sample done, rewarded, on both nodes.
    // `polar submit --json`: its progress lines, then the task as JSON.
    let text = job.read("out/result.json");
    let result: serde_json::Value = text
        .find("\n{")
        .and_then(|i| serde_json::from_str(&text[i..]).ok())
        .with_context(|| format!("result.json: {text}\n{logs}"))?;
    let samples = result["samples"].as_array().context("no samples")?;
    ensure!(samples.len() == 4, "{result:#}");
    let mut nodes = std::collections::BTreeSet::new();
    for s in samples {
        ensure!(
            s["state"] == "done" && s["result"]["reward"] == 1.0,
            "{s:#}\n{logs}"
        );
        if let Some(n) = s["node"].as_str() {
            nodes.insert(n.to_owned());
        }
    }
    ensure!(
        nodes == NODES.iter().map(|n| (*n).to_owned()).collect(),
        "both nodes should have run sessions: {nodes:?}\n{result:#}"
    );
    let exported = std::fs::read_dir(job.path("trajectories/task=slurm"))
        .with_context(|| format!("no exported trajectories\n{logs}"))?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "parquet"))
        .count();
    ensure!(exported == 4, "{exported} trajectories exported");

    // What the command saw: the server over HTTPS on the batch node, a
    // private job directory with fresh keys and tokens, the CA's key gone.
    let python = job.read("out/python-nodes");
    ensure!(
        python.trim() == NODES.join(" "),
        "the Python client in the job saw {python:?}\n{logs}"
    );
    let env = job.read("out/env");
    ensure!(
        env.contains("POLAR_ROLLOUT_URL=https://127.0.0.1:"),
        "{env}"
    );
    let tls = job.read("out/tls");
    ensure!(
        !tls.lines().any(|l| l == "ca.key") && tls.lines().any(|l| l == "ca.crt"),
        "the CA's key should be deleted once the certificates are issued: {tls}"
    );
    for n in NODES.iter().chain(&["rollout"]) {
        ensure!(tls.lines().any(|l| l == format!("{n}.key")), "{tls}");
    }
    // Directories 0700, keys and token files 0600.
    let modes = job.read("out/modes");
    for line in modes.lines() {
        let f: Vec<&str> = line.splitn(3, ' ').collect();
        let want = if f[0] == "d" { "700" } else { "600" };
        ensure!(f.get(1) == Some(&want), "{line}: want {want}\n{modes}");
    }
    for entry in [
        "d 700 .",
        "d 700 tokens/nodes",
        "f 600 tokens/trainer",
        "f 600 tokens/gateway",
        "f 600 tokens/nodes/polar-n1",
        "f 600 tokens/nodes/polar-n2",
        "f 600 tls/rollout.key",
        "f 600 tls/polar-n2.key",
    ] {
        ensure!(
            modes.lines().any(|l| l == entry),
            "no {entry:?} in\n{modes}"
        );
    }

    // Nothing of the job left: its directory, its processes, its state.
    let job_dir = job.read("out/job-dir");
    let job_dir = job_dir.trim();
    ensure!(
        !job_dir.is_empty() && !Path::new(job_dir).exists(),
        "{job_dir} left"
    );
    no_process_left(job_dir)?;
    let state = job.path("state/slurm");
    let left: Vec<_> = std::fs::read_dir(&state)
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    ensure!(left.is_empty(), "node state left: {left:?}");
    let id = job_dir.rsplit('/').next().unwrap_or_default();
    ensure!(
        job.job_state(id)? == "COMPLETED",
        "{}",
        job.scontrol(&["show", "job", id])?
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_cancelled_job_drains_its_gateways_and_removes_its_secrets() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    // Sessions long enough to be running when the job is cancelled.
    let job = rt.block_on(Job::new(60))?;
    let out = job.sbatch(false)?;
    ensure!(out.status.success(), "sbatch: {out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let scancel = |id: &str| {
        Command::new("scancel")
            .arg(id)
            .env("SLURM_CONF", &job.conf)
            .status()
    };
    // Cancelled once its sessions run (the command has started: it wrote
    // the job directory's path).
    let until = Instant::now() + Duration::from_secs(240);
    let job_dir = loop {
        let d = job.read("out/job-dir");
        if !d.trim().is_empty() && !job.read("out/modes").is_empty() {
            break d.trim().to_owned();
        }
        if Instant::now() > until {
            let _ = scancel(&id);
            bail!("the job's command did not start\n{}", job.logs());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(3));
    let cancelled_at = Instant::now();
    ensure!(scancel(&id)?.success(), "scancel {id}");
    // Slurm's KillWait (20 s on the test cluster) bounds the tear-down.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let state = job.job_state(&id)?;
        if state == "CANCELLED" && processes_with(&job_dir).is_empty() {
            break;
        }
        if Instant::now() > until {
            bail!("job {id} is {state} after scancel\n{}", job.logs());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let took = cancelled_at.elapsed();
    let root = Path::new(&job_dir);
    ensure!(
        !root.join("tokens").exists(),
        "the job's tokens are left after cancellation ({took:?})\n{}",
        job.logs()
    );
    let keys: Vec<_> = std::fs::read_dir(root.join("tls"))
        .map(|r| {
            r.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "key"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    ensure!(keys.is_empty(), "keys left: {keys:?}");
    // The gateways drained: each logged its drain on SIGTERM.
    let logs = job.logs();
    ensure!(
        logs.matches("draining the sessions").count() >= 2,
        "both gateways should drain on the job's SIGTERM\n{logs}"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn an_operator_file_setting_the_jobs_keys_fails_the_job_before_anything_is_made() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let job = rt.block_on(Job::new(0))?;
    std::fs::write(
        job.path("rollout.toml"),
        "[rollout]\ntokens = [\"an-operator-token\"]\n",
    )?;
    let out = job.sbatch(true)?;
    let log = job.read("out/job.log");
    ensure!(!out.status.success(), "the job succeeded: {log}");
    ensure!(
        log.contains("rollout.tokens: set by `polar slurm` for each job"),
        "{log}"
    );
    let made: Vec<_> = std::fs::read_dir(job.path("jobs"))
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    ensure!(made.is_empty(), "made before the check: {made:?}");
    ensure!(job.read("out/job-dir").is_empty(), "the command ran: {log}");
    Ok(())
}
