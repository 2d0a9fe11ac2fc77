//! `command` with real processes: exit status, reward files (stale, missing,
//! garbled, escaping), variables, timeouts, a runner that fails.

use std::time::Instant;

use serde_json::json;

use super::super::SessionFacts;
use super::{BrokenRunner, HostRunner, evaluator, facts, run};

#[tokio::test]
async fn exit_status_scores_one_for_zero_and_zero_otherwise() {
    let ws = tempfile::tempdir().unwrap();
    let ok = evaluator("command", json!({"command": "test -d ."}));
    let e = run(&ok, ws.path()).await;
    assert_eq!(
        (e.reward, e.usable, e.error.as_deref()),
        (Some(1.0), true, None)
    );
    assert_eq!(e.detail["reward_source"], json!("exit_status"));
    let bad = evaluator(
        "command",
        json!({"command": "echo out; echo err >&2; exit 3"}),
    );
    let e = run(&bad, ws.path()).await;
    assert_eq!((e.reward, e.usable), (Some(0.0), true));
    assert_eq!(e.detail["exit"], json!(3));
    assert_eq!(e.detail["stdout_tail"], json!("out\n"));
    assert_eq!(e.detail["stderr_tail"], json!("err\n"));
}

#[tokio::test]
async fn argv_form_env_and_working_directory() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("marker"), "").unwrap();
    let e = evaluator(
        "command",
        json!({"command": ["sh", "-c", "test -f marker && test \"$ANSWER\" = 42"], "env": {"ANSWER": "42"}}),
    );
    assert_eq!(run(&e, ws.path()).await.reward, Some(1.0));
}

#[tokio::test]
async fn a_session_that_did_not_end_is_scored_but_not_usable() {
    let ws = tempfile::tempdir().unwrap();
    let e = evaluator("command", json!({"command": "true"}));
    let f = SessionFacts {
        timed_out: true,
        ..facts(ws.path())
    };
    let out = e.evaluate(&f, &HostRunner::new(ws.path())).await;
    assert_eq!((out.reward, out.usable), (Some(1.0), false));
}

#[tokio::test]
async fn a_command_timing_out_scores_zero_and_says_so() {
    let ws = tempfile::tempdir().unwrap();
    let e = evaluator("command", json!({"command": "sleep 30", "timeout_secs": 1}));
    let started = Instant::now();
    let out = run(&e, ws.path()).await;
    assert!(started.elapsed().as_secs() < 10);
    assert_eq!((out.reward, out.usable), (Some(0.0), true));
    assert!(
        out.error
            .as_deref()
            .unwrap()
            .contains("timed out after 1 s"),
        "{out:?}"
    );
    assert_eq!(out.detail["timed_out"], json!(true));
}

#[tokio::test]
async fn reward_file_number_and_object() {
    let ws = tempfile::tempdir().unwrap();
    let e = evaluator(
        "command",
        json!({"command": "printf 0.75 > \"$POLAR_REWARD_FILE\"", "reward": "file"}),
    );
    let out = run(&e, ws.path()).await;
    assert_eq!(
        (out.reward, out.usable, out.error.as_deref()),
        (Some(0.75), true, None),
        "{out:?}"
    );
    let e = evaluator(
        "command",
        json!({
            "command": "mkdir -p out && echo '{\"reward\": 0.5, \"passed\": 2, \"total\": 4}' > out/score.json; exit 1",
            "reward": "file",
            "reward_file": "out/score.json",
        }),
    );
    let out = run(&e, ws.path()).await;
    assert_eq!(out.reward, Some(0.5), "{out:?}");
    assert_eq!(out.detail["file"], json!({"passed": 2, "total": 4}));
    assert_eq!(out.detail["exit"], json!(1));
}

#[tokio::test]
async fn a_reward_file_left_by_the_harness_is_never_read() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join(".polar")).unwrap();
    std::fs::write(ws.path().join(".polar/reward"), "1.0").unwrap();
    let e = evaluator("command", json!({"command": "true", "reward": "file"}));
    let out = run(&e, ws.path()).await;
    assert_eq!((out.reward, out.usable), (None, false));
    assert_eq!(
        out.error.as_deref(),
        Some("reward file .polar/reward: not found in the workspace (the command exited with 0)")
    );
}

#[tokio::test]
async fn a_garbled_reward_file_is_an_error() {
    let ws = tempfile::tempdir().unwrap();
    let e = evaluator(
        "command",
        json!({"command": "echo 'all good' > .polar/reward", "reward": "file"}),
    );
    let out = run(&e, ws.path()).await;
    assert_eq!((out.reward, out.usable), (None, false));
    let error = out.error.unwrap();
    assert!(
        error.starts_with("reward file holds \"all good\""),
        "{error}"
    );
}

#[tokio::test]
async fn a_reward_file_symlinked_outside_the_workspace_is_refused() {
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, "1.0").unwrap();
    let command = format!("ln -s {} .polar/reward", secret.display());
    let e = evaluator("command", json!({"command": command, "reward": "file"}));
    let out = run(&e, ws.path()).await;
    // The symlink is the policy's leftover (its code ran in the command):
    // scored 0.0, labelled, never the file outside.
    assert_eq!((out.reward, out.usable), (Some(0.0), true), "{out:#?}");
    assert_eq!(
        (
            &out.detail["broken"]["cause"],
            &out.detail["broken"]["side"]
        ),
        (&json!("escapes"), &json!("policy"))
    );
    let error = out.error.unwrap();
    assert!(error.contains("resolves outside the workspace"), "{error}");
    assert!(error.contains(&secret.display().to_string()), "{error}");
    // A directory symlink on the way out is refused too.
    let e = evaluator(
        "command",
        json!({
            "command": format!("rmdir out && ln -s {} out", outside.path().display()),
            "reward": "file",
            "reward_file": "out/secret",
        }),
    );
    let ws = tempfile::tempdir().unwrap();
    let out = run(&e, ws.path()).await;
    assert!(
        out.error
            .unwrap()
            .contains("resolves outside the workspace")
    );
}

#[tokio::test]
async fn a_runner_that_fails_gives_no_reward() {
    let ws = tempfile::tempdir().unwrap();
    for options in [
        json!({"command": "true"}),
        json!({"command": "true", "reward": "file"}),
    ] {
        let out = evaluator("command", options)
            .evaluate(&facts(ws.path()), &BrokenRunner)
            .await;
        assert_eq!((out.reward, out.usable), (None, false));
        assert!(out.error.unwrap().contains("the sandbox is gone"));
    }
}
