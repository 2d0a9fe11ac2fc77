//! Real harness CLIs, unmodified, whose replica fails in the middle of a
//! reply (root only): two `polar mock-backend` replicas with the same
//! script, whose first turn (some text, then a call of the shell tool
//! writing `polar-demo.txt`) is cut after 8 generated tokens on its first
//! attempt. The agent's backend names the model's `output_parser`, so the
//! reply is resumed on the other replica from the tokens already sent,
//! and the harness goes on as if nothing happened: it exits 0, the file
//! is in its workspace, and the session's first call is recorded once,
//! completed, `resumed` across both replicas. Run with pi and Codex CLI,
//! which make no model call before their first turn (no title call to use
//! up the scripted turn).
//!
//! The CLIs come from `cargo xtask harnesses` (`POLAR_HARNESS_DIR`, else
//! `.polar-cache/harnesses`).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_capture::read_log;
use polar_tests::{harness_dir, polar_bin, sandbox_tempdir, session_run, write_config, write_file};

const INSTRUCTION: &str =
    "Create the file polar-demo.txt containing the word polar, using your shell tool.";

/// The script both replicas follow.
const SCRIPT: &str = r#"final_text = "done"

[[sessions]]
id = "*"

[[sessions.turns]]
text = "I will write the file with one shell command now."
tool_calls = [{ shell = "echo polar > polar-demo.txt" }]
disconnect_after = 8
"#;

/// `polar mock-backend` with `script` on a free loopback port; killed on
/// drop.
struct Mock {
    child: Child,
    url: String,
}

impl Mock {
    fn start(script: &Path) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(polar_bin()?)
            .args(["mock-backend", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--max-model-len", "262144", "--script"])
            .arg(script)
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

fn run(harness: &str) -> Result<()> {
    let dir = harness_dir();
    ensure!(
        dir.join("node_modules/.bin").is_dir(),
        "the harness CLIs are not installed in {}: run `cargo xtask harnesses`",
        dir.display()
    );
    let tmp = sandbox_tempdir()?;
    let script = write_file(tmp.path(), "script.toml", SCRIPT)?;
    let script = Path::new(&script);
    let (a, b) = (Mock::start(script)?, Mock::start(script)?);
    let cfg = write_config(
        tmp.path(),
        &format!(
            "[[backend]]\nname = \"mock\"\ndialect = \"vllm\"\nreplicas = [\"{}\", \"{}\"]\n\
             served_model = \"polar-mock\"\noutput_parser = \"qwen3\"\n",
            a.url, b.url
        ),
    )?
    .display()
    .to_string();
    let session = format!("faults-{}", harness.replace('_', "-"));
    let run = session_run(
        &[
            "--config",
            &cfg,
            "--session",
            &session,
            "--harness",
            harness,
            "--instruction",
            INSTRUCTION,
            "--budget-secs",
            "240",
        ],
        &[],
    )
    .with_context(|| format!("running {harness}"))?;
    let mut problems = Vec::new();
    if run.code() != Some(0) {
        problems.push(format!("exit {:?}", run.code()));
    }
    match std::fs::read_to_string(run.workspace().join("polar-demo.txt")) {
        Ok(text) if text.contains("polar") => {}
        other => problems.push(format!("polar-demo.txt: {other:?}")),
    }
    let log = run.outcome["capture_log"].as_str().unwrap_or_default();
    let (calls, _) = read_log(Path::new(log)).with_context(|| format!("reading {log}"))?;
    // Read as JSON: the record's fields as the log and its readers name them.
    let calls: Vec<serde_json::Value> = calls
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    match calls.first() {
        None => problems.push("no captured call".into()),
        Some(first) => {
            if first["status"] != "completed" {
                problems.push(format!("the faulted call: {}", first["status"]));
            }
            let r = &first["resumed"];
            let replicas = r["replicas"].as_array().map(Vec::len);
            if replicas != Some(2) || r["replicas"][0] == r["replicas"][1] {
                problems.push(format!(
                    "the faulted call is not resumed on the other replica: {r}"
                ));
            }
            if r["part_tokens"][0] != 8 {
                problems.push(format!("first part: {}", r["part_tokens"]));
            }
        }
    }
    if calls.iter().any(|c| c["status"] != "completed") {
        problems.push("a call failed".into());
    }
    if !problems.is_empty() {
        bail!("{harness}: {}\n{}", problems.join("\n"), run.main_logs());
    }
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_real_cli_goes_on_when_its_reply_is_cut_mid_stream() -> Result<()> {
    let mut problems = Vec::new();
    for harness in ["pi", "codex"] {
        if let Err(e) = run(harness) {
            problems.push(format!("{e:#}"));
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n\n"));
    }
    Ok(())
}
