//! A harness defined only in the node's configuration (`[harness.NAME]`,
//! named `custom:NAME`), run end to end (root only): the pinned pi CLI,
//! unmodified, set up by the configuration alone to speak OpenAI Chat (the
//! pi preset speaks Anthropic Messages) at `{base_url}`, which in
//! transparent mode is `https://api.openai.com/v1`: the redirect and the
//! agent's CA bring it to the capture stage, which the mock vLLM backend
//! answers. The mock's script walks a multi-step task: write a module with
//! a bug, run a check that fails, fix the bug, run the check again, answer.
//! Asserted: the harness exits with 0, the fix is in the workspace, every
//! scripted turn was one captured OpenAI Chat call with prompt and response
//! token ids, the failing check's output reached the model before the fix,
//! and the session's metadata carries the API and shell tool the
//! configuration declared.
//!
//! Without root: a task naming a harness the configuration does not define
//! is refused before anything runs, naming what is defined.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use polar_capture::{LogProblem, read_log};
use polar_chat::Api;
use polar_mock::{self as mock, MockConfig};
use polar_tests::{harness_dir, polar_bin, sandbox_tempdir, session_run, write_config};

const SESSION: &str = "custom-pi-chat";
const INSTRUCTION: &str = "calc.py must define add(a, b) returning a + b; check it with python3.";
const BUGGY: &str = "printf 'def add(a, b):\\n    return a - b\\n' > calc.py";
/// Prints `check-ok-42` when it passes: text its command line lacks. `-B`:
/// no bytecode cache, which a fix of the same size made within the same
/// second as the first check would leave stale.
const CHECK: &str = "python3 -B -c 'import calc; assert calc.add(2, 3) == 5, calc.add(2, 3)' && echo check-ok-$((6 * 7))";
const PASSED: &str = "check-ok-42";
const FIX: &str = "sed -i 's/a - b/a + b/' calc.py";

/// The configured harness: pi, its model on an OpenAI-compatible provider
/// whose base URL and key are the placeholders.
fn harness_table(bin_dir: &Path) -> String {
    format!(
        r#"
[harness.pi-chat]
command = ["pi", "-p", "--model", "polar/polar-model", "{{instruction}}"]
api = "openai_chat"
shell_tool = "bash"
bin_dir = "{}"
files = {{ ".pi/agent/models.json" = '{{"providers": {{"polar": {{"baseUrl": "{{base_url}}", "api": "openai-completions", "apiKey": "{{api_key}}", "models": [{{"id": "polar-model"}}]}}}}}}' }}
"#,
        bin_dir.display()
    )
}

/// The mock's turns for the session.
fn script() -> Result<mock::script::Script> {
    let shell = |cmd: &str| serde_json::json!({"tool_calls": [{"shell": cmd}]});
    Ok(serde_json::from_value(serde_json::json!({
        "sessions": [{"id": SESSION, "turns": [
            shell(BUGGY),
            shell(CHECK),
            shell(FIX),
            shell(CHECK),
            {"text": "calc.add is fixed and the check passes."},
        ]}]
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_harness_defined_only_in_the_configuration_completes_a_multi_step_task() -> Result<()> {
    let bin = harness_dir().join("node_modules/.bin");
    ensure!(
        bin.join("pi").is_file(),
        "the harness CLIs are not installed in {}: run `cargo xtask harnesses`",
        bin.display()
    );
    let mock = mock::start(MockConfig {
        script: Some(script()?),
        max_model_len: 262_144,
        ..MockConfig::default()
    })
    .await?;
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(
        tmp.path(),
        &format!(
            "[[backend]]\nname = \"mock\"\ndialect = \"vllm\"\nreplicas = [\"{}\"]\n\
             served_model = \"polar-mock\"\n{}",
            mock.url(),
            harness_table(&std::fs::canonicalize(&bin)?)
        ),
    )?
    .display()
    .to_string();
    let run = tokio::task::spawn_blocking(move || {
        session_run(
            &[
                "--config",
                &cfg,
                "--session",
                SESSION,
                "--harness",
                "custom:pi-chat",
                "--instruction",
                INSTRUCTION,
                "--budget-secs",
                "240",
            ],
            &[],
        )
    })
    .await??;
    run.succeeded()?;
    ensure!(
        run.outcome["harness"] == "custom:pi-chat",
        "{}",
        run.outcome["harness"]
    );
    let calc = std::fs::read_to_string(run.workspace().join("calc.py"))
        .with_context(|| format!("no calc.py\n{}", run.main_logs()))?;
    ensure!(calc.contains("return a + b"), "calc.py: {calc:?}");
    let log = run.outcome["capture_log"]
        .as_str()
        .context("no capture log")?;
    let (calls, problems) = read_log(Path::new(log))?;
    ensure!(
        problems
            .iter()
            .all(|p| matches!(p, LogProblem::Unfinished { .. })),
        "{problems:?}"
    );
    ensure!(
        calls.len() == 5,
        "{} calls, not one per scripted turn\n{}",
        calls.len(),
        run.main_logs()
    );
    let prompts: Vec<String> = calls
        .iter()
        .map(|c| serde_json::to_string(&c.request))
        .collect::<Result<_, _>>()?;
    for (i, c) in calls.iter().enumerate() {
        ensure!(
            c.native_request.api == Api::OpenaiChat,
            "call {i} spoke {:?}",
            c.native_request.api
        );
        let ids = |ids: &Option<Vec<u32>>| ids.as_ref().is_some_and(|a| !a.is_empty());
        ensure!(
            !c.token_ids_missing && ids(&c.prompt_token_ids) && ids(&c.response_token_ids),
            "call {i} lacks token ids: {:?}",
            c.status
        );
    }
    // The failing check (AssertionError: -1) reached the model before the
    // fix, the passing one after it.
    ensure!(
        prompts[2].contains("AssertionError: -1") && !prompts[2].contains(PASSED),
        "the third call does not carry the failed check: {}",
        prompts[2]
    );
    ensure!(
        prompts[4].contains(PASSED),
        "the last call does not carry the passing check: {}",
        prompts[4]
    );
    let session: serde_json::Value = serde_json::from_slice(&std::fs::read(
        Path::new(log).with_file_name("session.json"),
    )?)?;
    ensure!(
        session["metadata"]["harness_api"] == "openai_chat"
            && session["metadata"]["shell_tool"] == "bash",
        "{session}"
    );
    mock.stop().await;
    Ok(())
}

#[test]
fn a_harness_the_configuration_does_not_define_is_refused_before_anything_runs() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let cfg = tmp.path().join("polar.toml");
    std::fs::write(
        &cfg,
        format!(
            "[agent]\nstate_dir = \"{}\"\n{}",
            tmp.path().join("state").display(),
            harness_table(Path::new("/nonexistent/bin"))
        ),
    )?;
    let out = std::process::Command::new(polar_bin()?)
        .args(["sandbox", "run", "--config"])
        .arg(&cfg)
        .args(["--harness", "custom:pi-chatt", "--instruction", "x"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "{err}");
    ensure!(
        err.contains("custom:pi-chatt is not defined on this node") && err.contains("pi-chat"),
        "{err}"
    );
    ensure!(
        !tmp.path().join("state/sessions").exists(),
        "a session was started"
    );
    Ok(())
}
