//! The Python harness presets, unmodified, end to end (root only; needs
//! the capture stage, whose `[[backend]]` answers their model calls): each
//! runs from its own virtual environment (`cargo xtask harnesses`:
//! `.polar-cache/venvs/<name>`) in a `native` sandbox with `polar sandbox
//! run --harness NAME`, against `polar mock-backend` on loopback, in
//! transparent mode: LiteLLM's OpenAI client keeps `api.openai.com`, which
//! the redirect and the agent's CA (trusted through `SSL_CERT_FILE`) bring
//! to the capture stage.
//!
//! mini-swe-agent does the four-step task of `tests/src/harness.rs` (create
//! `notes.txt`, a check that fails, the fix, the check again writing its
//! result), each step a call of its `bash` tool, then ends the only way it
//! ends: by running `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`. Asserted
//! as for the six ([`run_all`] with [`Scenario::Submit`]): it exits with 0
//! and the task's check passes in its workspace; every generation the mock
//! served is in exactly one captured record with equal prompt ids,
//! response ids and logprobs, and every record is one the mock served;
//! every call is in exactly one exported row with loss 1 exactly on the
//! generated tokens; the main chain saw the four tool results and is one
//! trace. OpenHands' default agent does the same task with its `terminal`
//! tool and ends with its `finish` tool.
//!
//! Aider runs the task of [`aider_edits_fails_its_check_fixes_and_every_call_is_captured_exactly`]
//! in its own terms (edit blocks in its replies, its own test command).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::path::PathBuf;

use anyhow::{Context as _, Result, ensure};
use polar_capture::read_log;
use polar_chat::Api;
use polar_tests::harness::{
    Scenario, exported_rows, row_token_problems, run_all, served_by, served_problems,
};
use polar_tests::{sandbox_tempdir, session_run, write_config, write_file};

/// mini-swe-agent's way to end a session: its submit command, run alone.
const MINI_SUBMIT: &str = r#"{ shell = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" }"#;
/// OpenHands' way to end a session: its `finish` tool.
const OPENHANDS_FINISH: &str =
    r#"{ name = "finish", arguments = { message = "The check passes." } }"#;

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn mini_swe_agent_does_the_four_step_task_and_submits_with_every_served_call_captured_exactly()
-> Result<()> {
    run_all(
        &["mini_swe_agent"],
        false,
        None,
        Scenario::Submit(MINI_SUBMIT),
    )
}

/// The same in base-URL mode: `OPENAI_BASE_URL` points LiteLLM at the
/// agent's base-URL listener, and the session's key attributes its calls.
#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn mini_swe_agent_in_base_url_mode_is_captured_by_its_session_key() -> Result<()> {
    run_all(
        &["mini_swe_agent"],
        true,
        None,
        Scenario::Submit(MINI_SUBMIT),
    )
}

/// OpenHands' default agent does the four-step task with its `terminal`
/// tool, then calls `finish`; asserted as for mini-swe-agent.
#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn openhands_does_the_four_step_task_and_finishes_with_every_served_call_captured_exactly()
-> Result<()> {
    run_all(
        &["openhands"],
        false,
        None,
        Scenario::Submit(OPENHANDS_FINISH),
    )
}

/// Aider's session: its own id in the mock's script.
const AIDER_SESSION: &str = "e2e-aider-edits";
const AIDER_INSTRUCTION: &str = "calc.py must define add(a, b) returning a + b.";
/// The task's check, run by Aider itself after each edit (`--test-cmd` as
/// `AIDER_TEST_CMD`, with `AIDER_AUTO_TEST`, from the runtime spec's
/// environment). `-B`: no bytecode cache, which a fix of the same size made
/// within the same second as the first check would leave stale.
const AIDER_CHECK: &str = "python3 -B -c 'import calc; assert calc.add(2, 3) == 5, calc.add(2, 3)'";
/// What the failing check prints, which Aider sends back to the model.
const AIDER_FAILED: &str = "AssertionError: -1";

/// A reply in Aider's `whole` edit format (the default for a model it does
/// not know): the file's name, then its whole new content in a fence.
fn whole_edit(said: &str, body: &str) -> String {
    format!("{said}\n\ncalc.py\n```python\n{body}```\n")
}

/// The mock's turns for Aider: an edit with a bug, then, after Aider's
/// check fails and its output comes back, the fix.
fn aider_script() -> Result<polar_mock::script::Script> {
    Ok(serde_json::from_value(serde_json::json!({
        "sessions": [{"id": AIDER_SESSION, "turns": [
            {"text": whole_edit("Writing calc.py.", "def add(a, b):\n    return a - b\n")},
            {"text": whole_edit(
                "The check failed: add subtracts. Fixing it.",
                "def add(a, b):\n    return a + b\n",
            )},
        ]}]
    }))?)
}

/// Aider has no shell tool: its multi-step task is in its own terms. The
/// model writes `calc.py` with a bug as an edit block in its reply text;
/// Aider applies it and runs the task's check, which fails; the check's
/// output goes back to the model as a user message; the model's reply
/// fixes the file; Aider checks again, the check passes and it exits.
/// Asserted: it exits with 0 and the fix is in the workspace; exactly two
/// calls, OpenAI Chat with no tools offered, each with prompt and response
/// token ids; the failed check's output reached the model in the second
/// call only; every generation the mock served is in exactly one record
/// with equal ids and logprobs, and every record is one it served; the
/// export's `main` chain holds both calls, the second after a
/// `rewritten_history` break (Aider rebuilds its prompt on every call: the
/// files it shares and its reminders move, so a prompt never continues the
/// one before), each row with loss 1 exactly on its reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn aider_edits_fails_its_check_fixes_and_every_call_is_captured_exactly() -> Result<()> {
    let mock = polar_mock::start(polar_mock::MockConfig {
        script: Some(aider_script()?),
        max_model_len: 262_144,
        record_served: true,
        ..polar_mock::MockConfig::default()
    })
    .await?;
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(
        tmp.path(),
        &format!(
            "[[backend]]\nname = \"mock\"\ndialect = \"vllm\"\nreplicas = [\"{}\"]\n\
             served_model = \"polar-mock\"\n",
            mock.url()
        ),
    )?
    .display()
    .to_string();
    let spec = write_file(
        tmp.path(),
        "aider.toml",
        &format!(
            "environment = {{ AIDER_TEST_CMD = {}, AIDER_AUTO_TEST = \"true\" }}\n",
            serde_json::Value::from(AIDER_CHECK)
        ),
    )?;
    let run = tokio::task::spawn_blocking(move || {
        session_run(
            &[
                "--config",
                &cfg,
                "--session",
                AIDER_SESSION,
                "--harness",
                "aider",
                "--instruction",
                AIDER_INSTRUCTION,
                "--runtime",
                &spec,
                "--budget-secs",
                "240",
            ],
            &[],
        )
    })
    .await??;
    run.succeeded()?;
    let calc = std::fs::read_to_string(run.workspace().join("calc.py"))
        .with_context(|| format!("no calc.py\n{}", run.main_logs()))?;
    ensure!(calc.contains("return a + b"), "calc.py: {calc:?}");
    let log = PathBuf::from(
        run.outcome["capture_log"]
            .as_str()
            .context("no capture log")?,
    );
    let (calls, problems) = read_log(&log)?;
    ensure!(problems.is_empty(), "{problems:?}");
    ensure!(
        calls.len() == 2,
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
            c.native_request.api == Api::OpenaiChat && c.request.tools.is_empty(),
            "call {i}: {:?} with {} tools",
            c.native_request.api,
            c.request.tools.len()
        );
    }
    ensure!(
        !prompts[0].contains(AIDER_FAILED) && prompts[1].contains(AIDER_FAILED),
        "the failed check is not in the second call's prompt alone: {}",
        prompts[1]
    );
    let served = served_by(&mock.url())?;
    let served = served.get(AIDER_SESSION).map_or(&[][..], Vec::as_slice);
    let mut problems = served_problems(&calls, served);
    let rows = exported_rows(&log)?;
    problems.extend(row_token_problems(&calls, &rows));
    // Aider rebuilds its prompt on every call: the second is a segment of
    // the main chain after a `rewritten_history` break, linked to the first.
    let shape: Vec<(String, String, usize)> = rows
        .iter()
        .map(|r| {
            (
                format!(
                    "{}/{}",
                    r["chain_role"].as_str().unwrap_or_default(),
                    r["segment_kind"].as_str().unwrap_or_default()
                ),
                r["break_reason"].to_string(),
                r["call_ids"].as_array().map_or(0, Vec::len),
            )
        })
        .collect();
    let want = [
        ("main/start".to_owned(), "null".to_owned(), 1),
        (
            "main/after_break".to_owned(),
            "\"rewritten_history\"".to_owned(),
            1,
        ),
    ];
    if shape != want {
        problems.push(format!("rows {shape:?}, not {want:?}"));
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    mock.stop().await;
    Ok(())
}
