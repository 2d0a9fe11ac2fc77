//! The six real harness CLIs, unmodified, end to end (root only; needs the
//! capture stage, whose `[[backend]]` answers each harness's model calls in
//! its own API): each runs in a `native` sandbox with `polar sandbox run
//! --harness NAME`, against `polar mock-backend` on loopback, whose built-in
//! policy makes it call its shell tool to write `polar-demo.txt`, then
//! answers "done". Asserted for each: the harness exits with 0, the file is
//! in its workspace, and every call in the session's capture log has prompt
//! and response token ids, and `docs/CONSUMERS.md`'s row recipe holds on
//! its export (a `main` row carrying the instruction and tools; calls
//! asking for structured output are `side`). The six run at once, each
//! bounded by its budget.
//!
//! The same six run in docker containers too (the test image of
//! `cargo xtask test`'s engine, the CLIs bound read-only from the host),
//! with the same assertions.
//!
//! The CLIs come from `cargo xtask harnesses` (`POLAR_HARNESS_DIR`, else
//! `.polar-cache/harnesses`).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_capture::log::LogProblem;
use polar_capture::read_log;
use polar_tests::docker::{self, Engine};
use polar_tests::{
    SessionRun, harness_dir, polar_bin, sandbox_tempdir, session_run, write_config, write_file,
};

const INSTRUCTION: &str =
    "Create the file polar-demo.txt containing the word polar, using your shell tool.";

/// `polar mock-backend` on a free loopback port; killed on drop.
struct Mock {
    child: Child,
    url: String,
}

impl Mock {
    fn start() -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(polar_bin()?)
            // Qwen Code's first prompt alone is ~40k of the mock's tokens.
            .args(["mock-backend", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--max-model-len", "262144"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("the mock backend did not start");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { child, url })
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A configuration whose model routes (the built-in ones) are served by
/// the mock through the capture stage (and `extra` after it).
fn config(dir: &Path, mock: &Mock, extra: &str) -> Result<String> {
    Ok(write_config(
        dir,
        &format!(
            "[[backend]]\nname = \"mock\"\ndialect = \"vllm\"\nreplicas = [\"{}\"]\n\
             served_model = \"polar-mock\"\n\n{extra}",
            mock.url
        ),
    )?
    .display()
    .to_string())
}

/// What is wrong with one harness's session, if anything.
fn check(name: &str, run: &SessionRun) -> Vec<String> {
    let mut problems = Vec::new();
    if run.code() != Some(0) {
        problems.push(format!("exit {:?}", run.code()));
    }
    let file = run.workspace().join("polar-demo.txt");
    match std::fs::read_to_string(&file) {
        Ok(text) if text.contains("polar") => {}
        Ok(text) => problems.push(format!("polar-demo.txt holds {text:?}")),
        Err(e) => problems.push(format!("no polar-demo.txt ({e})")),
    }
    let log = run.outcome["capture_log"].as_str().unwrap_or_default();
    // Read as the agent and `polar export` read logs: a call's request part
    // and completion are joined into one record.
    let calls = match read_log(Path::new(log)) {
        Ok((calls, log_problems)) => {
            // A call the harness gave up on mid-generation leaves its
            // request part unfinished; anything else is a broken log.
            problems.extend(
                log_problems
                    .iter()
                    .filter(|p| !matches!(p, LogProblem::Unfinished { .. }))
                    .map(|p| format!("{log}: {p}")),
            );
            calls
        }
        Err(e) => {
            problems.push(format!("{log}: {e}"));
            Vec::new()
        }
    };
    if calls.is_empty() {
        problems.push(format!("no captured call in {log}"));
    }
    for (i, c) in calls.iter().enumerate() {
        let ids = |ids: &Option<Vec<u32>>| ids.as_ref().is_some_and(|a| !a.is_empty());
        if !ids(&c.prompt_token_ids) || !ids(&c.response_token_ids) {
            problems.push(format!("call {i} lacks token ids: {:?}", c.status));
        }
    }
    match exported_rows(Path::new(log)) {
        Ok(rows) => {
            let structured: Vec<&str> = calls
                .iter()
                .filter(|c| c.request.response_format.is_some())
                .map(|c| c.call_id.as_str())
                .collect();
            let mut roles = std::collections::BTreeMap::<String, usize>::new();
            for r in &rows {
                *roles.entry(r["chain_role"].to_string()).or_default() += 1;
            }
            eprintln!(
                "{name}: {} calls, {} asking for structured output; rows by role {roles:?}",
                calls.len(),
                structured.len()
            );
            problems.extend(recipe_problems(&rows, &structured));
        }
        Err(e) => problems.push(format!("export: {e:#}")),
    }
    if !problems.is_empty() {
        problems.push(format!("{name} logs:\n{}", run.main_logs()));
    }
    problems
}

/// The session's rows as `polar export` writes them (JSONL,
/// `prefix_merging`), from the session directory holding `log`.
fn exported_rows(log: &Path) -> Result<Vec<serde_json::Value>> {
    let session = log.parent().context("capture log without a directory")?;
    let out = tempfile::tempdir()?;
    let export = Command::new(polar_bin()?)
        .args(["export", "--json", "--format", "jsonl", "--session"])
        .arg(session)
        .arg("--out")
        .arg(out.path())
        .output()?;
    ensure!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let mut rows = Vec::new();
    let mut todo = vec![out.path().to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "jsonl") {
                rows.extend(polar_tests::json_lines(&std::fs::read(&p)?));
            }
        }
    }
    Ok(rows)
}

/// What is wrong with `docs/CONSUMERS.md`'s recipe on a session's rows:
/// the `main` rows exist, the first holds the instruction and offers
/// tools, and every call that asked for structured output is `side`.
fn recipe_problems(rows: &[serde_json::Value], structured: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let role_of = |call: &str| {
        rows.iter()
            .find(|r| {
                r["call_ids"]
                    .as_array()
                    .is_some_and(|ids| ids.iter().any(|c| c == call))
            })
            .and_then(|r| r["chain_role"].as_str())
    };
    let first_main = rows
        .iter()
        .find(|r| r["chain_role"] == "main" && r["segment"] == 0);
    match first_main {
        None => problems.push(format!(
            "no main row among {:?}",
            rows.iter().map(|r| &r["chain_role"]).collect::<Vec<_>>()
        )),
        Some(r) => {
            if !r["prompt_messages"].to_string().contains(INSTRUCTION) {
                problems.push("the main row's prompt lacks the instruction".into());
            }
            if r["tools"].as_array().is_none_or(Vec::is_empty) {
                problems.push("the main row offers no tools".into());
            }
        }
    }
    for r in rows {
        let role = r["chain_role"].as_str().unwrap_or_default();
        if !["main", "sub_agent", "side"].contains(&role) {
            problems.push(format!("row {} has chain_role {role:?}", r["trace_id"]));
        }
    }
    for call in structured {
        match role_of(call) {
            Some("side") | None => {}
            Some(other) => problems.push(format!(
                "call {call} asked for structured output but is {other}"
            )),
        }
    }
    problems
}

/// Runs the harnesses at once (in native sandboxes, or in docker
/// containers of `docker`'s engine); fails with every problem of every
/// harness.
fn run_all(harnesses: &[&'static str], base_url: bool, docker: Option<&Engine>) -> Result<()> {
    let dir = harness_dir();
    ensure!(
        dir.join("node_modules/.bin").is_dir(),
        "the harness CLIs are not installed in {}: run `cargo xtask harnesses`",
        dir.display()
    );
    let tmp = sandbox_tempdir()?;
    let mock = Mock::start()?;
    let extra = docker.map(|e| e.sandbox_table("")).unwrap_or_default();
    let cfg = config(tmp.path(), &mock, &extra)?;
    let spec = docker
        .map(|e| write_file(tmp.path(), "docker.toml", &e.spec("")))
        .transpose()?;
    let threads: Vec<_> = harnesses
        .iter()
        .map(|h| {
            let (cfg, spec) = (cfg.clone(), spec.clone());
            let h = *h;
            std::thread::spawn(move || {
                let session = format!(
                    "e2e-{}{}{}",
                    h.replace('_', "-"),
                    if base_url { "-b" } else { "" },
                    if spec.is_some() { "-d" } else { "" }
                );
                let mut args = vec![
                    "--config",
                    &cfg,
                    "--session",
                    &session,
                    "--harness",
                    h,
                    "--instruction",
                    INSTRUCTION,
                    "--budget-secs",
                    "240",
                ];
                if base_url {
                    args.push("--base-url");
                }
                if let Some(spec) = &spec {
                    args.extend(["--runtime", spec.as_str()]);
                }
                (h, session_run(&args, &[]))
            })
        })
        .collect();
    let mut problems = Vec::new();
    for t in threads {
        let (h, run) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a harness thread panicked"))?;
        let run = run.with_context(|| format!("running {h}"))?;
        problems.extend(check(h, &run).into_iter().map(|p| format!("{h}: {p}")));
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_unmodified_harnesses_call_their_shell_tool_and_every_call_is_captured() -> Result<()> {
    run_all(
        &[
            "codex",
            "claude_code",
            "gemini_cli",
            "qwen_code",
            "opencode",
            "pi",
        ],
        false,
        None,
    )
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_unmodified_harnesses_in_docker_containers_are_captured_the_same() -> Result<()> {
    let engine = docker::engine()?;
    run_all(
        &[
            "codex",
            "claude_code",
            "gemini_cli",
            "qwen_code",
            "opencode",
            "pi",
        ],
        false,
        Some(&engine),
    )
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn harnesses_in_base_url_mode_are_captured_by_their_session_key() -> Result<()> {
    run_all(&["claude_code", "qwen_code"], true, None)
}
