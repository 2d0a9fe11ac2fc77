//! The six real harness CLIs, unmodified, end to end (root only; needs the
//! capture stage, whose `[[backend]]` answers each harness's model calls in
//! its own API): each runs in a `native` sandbox with `polar sandbox run
//! --harness NAME`, against `polar mock-backend` on loopback, whose built-in
//! policy makes it call its shell tool to write `polar-demo.txt`, then
//! answers "done". Asserted for each: the harness exits with 0, the file is
//! in its workspace, and every call in the session's capture log has prompt
//! and response token ids. The six run at once, each bounded by its budget.
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
    if !problems.is_empty() {
        problems.push(format!("{name} logs:\n{}", run.main_logs()));
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
