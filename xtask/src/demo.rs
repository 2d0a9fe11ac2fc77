//! `cargo xtask demo`: Polar's main job on embedded defaults, on one machine.
//!
//! It builds the release binary, starts the mock inference server (a
//! stand-in for vLLM with a deterministic tokenizer) on loopback, and runs
//! unmodified `curl` calls to the real Anthropic and OpenAI endpoints inside
//! `polar sandbox run`. Nothing leaves the machine: the eBPF redirect hands
//! each connection to the agent, which terminates TLS with its own CA
//! (trusted inside the sandbox only), translates each call for the inference
//! server, answers in the caller's API and records every call with its
//! token ids in the session's capture log, which the demo then summarizes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::{release, setup};

/// Bounds polar's set-up, the calls and teardown.
const DEMO_TIMEOUT: Duration = Duration::from_secs(120);
const SESSION: &str = "demo";

/// The sandboxed program: two calls in two APIs, one streamed.
const SCRIPT: &str = r#"
set -e
echo "== Anthropic Messages, https://api.anthropic.com/v1/messages"
curl -sS --max-time 30 https://api.anthropic.com/v1/messages \
  -H 'content-type: application/json' -H 'x-api-key: none' -H 'anthropic-version: 2023-06-01' \
  -d '{"model":"claude-sonnet-4","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]}'
echo
echo "== OpenAI Chat Completions, streamed, https://api.openai.com/v1/chat/completions"
curl -sS -N --max-time 30 https://api.openai.com/v1/chat/completions \
  -H 'content-type: application/json' -H 'authorization: Bearer none' \
  -d '{"model":"gpt-5","stream":true,"messages":[{"role":"user","content":"Say hello."}]}'
"#;

pub fn run() -> Result<()> {
    setup::run()?;
    release::build()?;
    let polar = release::polar_binary()?;
    let dir = workspace_root()?.join("target/polar-demo");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut mock = MockBackend::start(&polar, &dir)?;
    let config = dir.join("polar.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = \"{}\"\n\n[[backend]]\nname = \"local\"\ndialect = \"vllm\"\n\
             replicas = [\"http://{}\"]\nserved_model = \"default\"\n",
            dir.join("state").display(),
            mock.addr
        ),
    )?;
    let cmd = Cmd::new(&polar)?
        .args(["sandbox", "run", "--config"])
        .arg(&config)
        .args([
            "--session",
            SESSION,
            "--task",
            "demo-task",
            "--",
            "bash",
            "-c",
            SCRIPT,
        ]);
    say(&format!(
        "\nPolar demo\n\n\
         A mock inference server (vLLM's token-id dialect) listens on {addr}.\n\
         Running:  {cmd}\n\n\
         curl runs in a sandbox with its own cgroup and network namespace. eBPF\n\
         programs steer every connection to the Polar agent, which answers DNS,\n\
         terminates TLS with its own CA (trusted inside the sandbox only),\n\
         translates each call for the inference server, streams the answer back in\n\
         the caller's API and records every call with its token ids.\n",
        addr = mock.addr,
        cmd = cmd.shown()
    ));
    let run = cmd.capture(DEMO_TIMEOUT);
    mock.stop();
    let run = run?;
    say(&format!(
        "--- output of the sandboxed command ---\n{}",
        run.stdout.trim_end()
    ));
    say(&format!("--- polar's log ---\n{}", run.stderr.trim_end()));
    if !run.status.success() {
        bail!(
            "polar sandbox run failed ({}); its log is above",
            run.status
        );
    }
    let log = dir.join("state/sessions").join(SESSION).join("calls.jsonl");
    summarize(&log)
}

/// Prints one line per captured call and checks each has token ids.
fn summarize(log: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    say(&format!("--- captured calls in {} ---", log.display()));
    let mut calls = 0;
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line)?;
        let len = |k: &str| r[k].as_array().map_or(0, Vec::len);
        say(&format!(
            "call {}: {} {}, stream={}, {} prompt tokens, {} response tokens, {} logprobs, finish {}",
            r["seq"],
            r["native_request"]["api"].as_str().unwrap_or("?"),
            r["native_request"]["path"].as_str().unwrap_or("?"),
            r["request"]["stream"],
            len("prompt_token_ids"),
            len("response_token_ids"),
            len("response_logprobs"),
            r["finish_reason"]
        ));
        if len("prompt_token_ids") == 0 || len("response_token_ids") == 0 {
            bail!("call {} was captured without token ids", r["seq"]);
        }
        calls += 1;
    }
    if calls != 2 {
        bail!("expected 2 captured calls, found {calls}");
    }
    say("\nDemo done: both calls were answered in their own API and captured with token ids.");
    Ok(())
}

/// `polar mock-backend` on a free loopback port, stopped by its pid.
struct MockBackend {
    child: Child,
    addr: String,
}

impl MockBackend {
    fn start(polar: &Path, dir: &Path) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(log_path(dir))?;
        let mut child = Command::new(polar)
            .args([
                "mock-backend",
                "--listen",
                &addr,
                "--served-model",
                "default",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting polar mock-backend")?;
        // Ready when it accepts connections (bounded).
        for _ in 0..100 {
            if std::net::TcpStream::connect(&addr).is_ok() {
                return Ok(Self { child, addr });
            }
            if let Some(status) = child.try_wait()? {
                bail!(
                    "polar mock-backend exited early ({status}); see {}",
                    log_path(dir).display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        bail!("polar mock-backend did not listen on {addr}")
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MockBackend {
    fn drop(&mut self) {
        self.stop();
    }
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join("mock-backend.log")
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
    fn summary_requires_token_ids() {
        let dir = std::env::temp_dir().join(format!("polar-demo-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("calls.jsonl");
        let good = r#"{"seq":0,"native_request":{"api":"anthropic_messages","path":"/v1/messages"},"request":{"stream":false},"prompt_token_ids":[1,2],"response_token_ids":[3],"response_logprobs":[-0.1],"finish_reason":"stop"}"#;
        let bad = r#"{"seq":1,"native_request":{"api":"openai_chat","path":"/v1/chat/completions"},"request":{"stream":true},"finish_reason":"stop"}"#;
        std::fs::write(&log, format!("{good}\n{good}\n")).unwrap();
        assert!(summarize(&log).is_ok());
        std::fs::write(&log, format!("{good}\n{bad}\n")).unwrap();
        assert!(summarize(&log).is_err());
        std::fs::write(&log, format!("{good}\n")).unwrap();
        assert!(summarize(&log).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
