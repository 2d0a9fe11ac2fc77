//! The `llm_judge` evaluator end to end (root only): a rollout server, one
//! gateway (`polar agent`) and the mock backend, which serves both the
//! policy (the sandboxed agent's calls) and the judge. Two tasks run the
//! same agent; one leaves a correct `calc.py` in its workspace, the other a
//! wrong one. The mock judges from the diff the evaluator shows it (a
//! criterion quoting `return a + b` scores 10 only when the diff adds that
//! line: `polar_mock::judge`), so the two samples must score differently,
//! with the per-criterion scores in the result's evaluation detail; a
//! third task commits its correct change over a commit its prepare steps
//! made, and still scores as correct (the diff's base is the commit
//! recorded before the harness ran). The
//! judge's call is reported in that detail (its answer and token counts)
//! and appears nowhere in the exported trajectory, which holds exactly the
//! policy's calls.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_mock::{self as mock, MockConfig};
use polar_rollout::{RolloutConfig, RolloutServer};
use polar_rollout_api::{RolloutClient, SessionState, TaskView};
use polar_tests::{polar_bin, sandbox_tempdir};

const TOKEN: &str = "judge-e2e-token";
const GATEWAY_TOKEN: &str = "judge-e2e-server-token";
const NODE: &str = "gw-judge";
const NODE_TOKEN: &str = "judge-e2e-node-token";
const MARKER: &str = "# Polar judge request";

/// `polar agent`, killed on drop.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn examples() -> Result<PathBuf> {
    Ok(Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .canonicalize()?)
}

/// Starts the gateway of node `NODE` on `dir`, serving the server at
/// `server` with the mock at `mock` as its backend.
fn start_agent(dir: &Path, server: &str, mock: std::net::SocketAddr) -> Result<Agent> {
    let port = std::net::TcpListener::bind("127.0.0.42:0")?
        .local_addr()?
        .port();
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"[agent]
state_dir = "{state}"

[[backend]]
name = "local"
dialect = "vllm"
replicas = ["http://{mock}"]
served_model = "default"

[gateway]
server = "http://{server}"
node_id = "{NODE}"
listen = "127.0.0.42:{port}"
token = "{NODE_TOKEN}"
accept_tokens = ["{GATEWAY_TOKEN}"]
max_sessions = 2
heartbeat_interval_ms = 300
export = "{export}"
formats = ["jsonl"]

[gateway.policy]
upload_roots = ["{examples}"]
"#,
            state = dir.join("state").display(),
            export = dir.join("trajectories").display(),
            examples = examples()?.display(),
        ),
    )?;
    let log = dir.join("agent.log");
    let child = Command::new(polar_bin()?)
        .args(["--log-format", "json", "agent", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    Ok(Agent { child, log })
}

/// The task: the demo agent makes its model calls, then the command
/// leaves `calc.py` returning `op`. With `commit`, the prepare steps
/// commit a wrong `calc.py` to a repository, and the command commits its
/// own: the judge's diff is against the commit recorded before the
/// harness ran, not the workspace's `HEAD`.
fn task(task_id: &str, op: &str, commit: bool) -> Result<serde_json::Value> {
    let mut prepare = vec![serde_json::json!({"upload": {
        "from": examples()?.join("mini_agent.py"), "to": "mini_agent.py"
    }})];
    let mut command = format!(
        "python3 /workspace/mini_agent.py && rm mini_agent.py && \
         printf 'def add(a, b):\\n    return a {op} b\\n' > calc.py"
    );
    if commit {
        prepare.push(serde_json::json!({"run": "git init -q && \
            printf 'def add(a, b):\\n    return a - b\\n' > calc.py && git add calc.py && \
            git -c user.name=t -c user.email=t@t commit -qm task"}));
        command.push_str(" && git add -A && git -c user.name=p -c user.email=p@p commit -qm fix");
    }
    Ok(serde_json::json!({
        "task_id": task_id,
        "instruction": "Create polar-demo.txt, and calc.py whose add(a, b) returns a + b.",
        "num_samples": 1,
        "timeout_secs": 120,
        "agent": {"harness": "shell", "options": {"command": command}},
        "runtime": {"prepare": prepare},
        "evaluator": {"kind": "llm_judge", "options": {
            "rubric": [
                {"name": "correct", "description": "calc.py holds `return a + b`.", "weight": 3},
                {"name": "readable", "description": "The code is easy to read."},
            ],
            "seed": 7,
            "max_tokens": 1024,
        }},
        "builder": {"kind": "per_request"},
    }))
}

async fn wait_finished(c: &RolloutClient, task_id: &str, agent: &Agent) -> Result<TaskView> {
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        if let Ok(t) = c.task(task_id).await
            && t.status.is_finished()
        {
            return Ok(t);
        }
        if Instant::now() > until {
            bail!(
                "{task_id} did not finish: {:#?}\n{}",
                c.task(task_id).await?,
                std::fs::read_to_string(&agent.log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn the_judge_scores_a_good_and_a_bad_workspace_apart_and_stays_out_of_the_trajectory()
-> Result<()> {
    let dir = sandbox_tempdir()?;
    let mock = mock::start(MockConfig {
        served_model: "default".into(),
        ..MockConfig::default()
    })
    .await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut cfg = RolloutConfig::new(dir.path().join("rollout.sqlite"), TOKEN);
    cfg.listen = ([127, 0, 0, 1], port).into();
    cfg.heartbeat_interval = Duration::from_millis(300);
    cfg.heartbeat_timeout = Duration::from_millis(3000);
    cfg.gateway_token = GATEWAY_TOKEN.into();
    cfg.node_tokens = [(NODE.to_owned(), NODE_TOKEN.to_owned())].into();
    let server = RolloutServer::start(cfg.clone()).await?;
    let agent = start_agent(dir.path(), &cfg.listen.to_string(), mock.addr)?;
    let c = RolloutClient::new(format!("http://{}", cfg.listen), Some(TOKEN.into()));
    let until = Instant::now() + Duration::from_secs(60);
    while !c
        .nodes()
        .await
        .is_ok_and(|n| n.nodes.iter().any(|n| n.node_id == NODE))
    {
        ensure!(
            Instant::now() < until,
            "the gateway did not register: {}",
            std::fs::read_to_string(&agent.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.submit(&task("good", "+", false)?).await?;
    c.submit(&task("bad", "-", false)?).await?;
    c.submit(&task("committed", "+", true)?).await?;
    let mut rewards = Vec::new();
    for id in ["good", "bad", "committed"] {
        let t = wait_finished(&c, id, &agent).await?;
        let SessionState::Done { result, .. } = &t.samples[0].state else {
            bail!("{id}: {t:#?}");
        };
        let reward = result
            .reward
            .with_context(|| format!("{id}: no reward: {result:?}"))?;
        let eval = &result.stats.as_ref().context("no stats")?["evaluation"];
        let scores: Vec<(String, f64)> = eval["criteria"]
            .as_array()
            .with_context(|| format!("{id}: no criteria in {eval}"))?
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or_default().to_owned(),
                    c["score"].as_f64().unwrap_or(-1.0),
                )
            })
            .collect();
        let want_correct = if id == "bad" { 0.0 } else { 10.0 };
        ensure!(
            scores
                == [
                    ("correct".to_owned(), want_correct),
                    ("readable".to_owned(), 5.0)
                ],
            "{id}: {scores:?} in {eval}"
        );
        ensure!(eval["judge"]["seed"] == 7, "{eval}");
        rewards.push(reward);
        // The judge's call, answered with token counts, is in the
        // evaluation's detail; the session's `judge.jsonl` went with its
        // directory once the trajectory was exported.
        let judge = &eval["judge"];
        ensure!(
            judge["prompt_tokens"].as_u64().is_some_and(|n| n > 0)
                && judge["response_tokens"].as_u64().is_some_and(|n| n > 0)
                && judge["answer"]
                    .as_str()
                    .is_some_and(|a| a.contains("\"scores\"")),
            "{id}: {judge}"
        );
        // Not in the trajectory: every row is one of the policy's calls
        // (the capture log's count), none holds the judge's prompt.
        let uri = result.trajectory_uri.as_deref().context("no trajectory")?;
        let rows = std::fs::read_to_string(Path::new(uri).with_extension("jsonl"))?;
        let rows = polar_tests::json_lines(rows.as_bytes());
        ensure!(
            !rows.is_empty() && rows.len() as u64 == result.tokens.calls,
            "{id}: {} rows for {} calls",
            rows.len(),
            result.tokens.calls
        );
        for r in &rows {
            ensure!(
                !r["prompt_messages"].to_string().contains(MARKER)
                    && !r["response_messages"].to_string().contains("\"scores\""),
                "{id}: a judge call in the trajectory: {r}"
            );
            ensure!(r["reward"].as_f64() == Some(reward), "{id}: {r}");
        }
    }
    // correct weighs 3, readable 1: (3 * 1.0 + 0.5) / 4 and (0 + 0.5) / 4.
    ensure!(
        (rewards[0] - 0.875).abs() < 1e-9
            && (rewards[1] - 0.125).abs() < 1e-9
            && (rewards[2] - 0.875).abs() < 1e-9,
        "{rewards:?}"
    );
    drop(agent);
    server.abort();
    mock.stop().await;
    Ok(())
}
