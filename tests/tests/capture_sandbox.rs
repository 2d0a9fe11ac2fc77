//! The whole data path in transparent mode (root only): a client in a
//! sandbox calls the real provider endpoints by their hard-coded names, over
//! TLS, in all four harness APIs, streamed and not; the redirect brings the
//! connections to the proxy, the capture stage translates each call for the
//! mock vLLM backend and answers in the client's API; the session's capture
//! log holds every call with prompt and response token ids and logprobs.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, ensure};
use polar_capture::read_log;
use polar_chat::Api;
use polar_mock::{self as mock, MockConfig};
use polar_tests::sandbox_run;

const CALLS: &[(&str, &str, &str, &str)] = &[
    // label, URL, body, what the reply must contain
    (
        "anthropic",
        "https://api.anthropic.com/v1/messages",
        r#"{"model":"claude-sonnet-4","max_tokens":64,"messages":[{"role":"user","content":"say hi"}]}"#,
        r#""type":"message""#,
    ),
    (
        "anthropic_stream",
        "https://api.anthropic.com/v1/messages",
        r#"{"model":"claude-sonnet-4","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"say hi"}]}"#,
        "event: message_stop",
    ),
    (
        "chat",
        "https://api.openai.com/v1/chat/completions",
        r#"{"model":"gpt-x","messages":[{"role":"user","content":"say hi"}]}"#,
        r#""object":"chat.completion""#,
    ),
    (
        "chat_stream",
        "https://api.openai.com/v1/chat/completions",
        r#"{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"say hi"}]}"#,
        "data: [DONE]",
    ),
    (
        "responses",
        "https://api.openai.com/v1/responses",
        r#"{"model":"gpt-5","input":"say hi"}"#,
        r#""object":"response""#,
    ),
    (
        "responses_stream",
        "https://api.openai.com/v1/responses",
        r#"{"model":"gpt-5","stream":true,"input":"say hi"}"#,
        "response.completed",
    ),
    (
        "gemini",
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:generateContent",
        r#"{"contents":[{"role":"user","parts":[{"text":"say hi"}]}]}"#,
        r#""candidates""#,
    ),
    (
        "gemini_stream",
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
        r#"{"contents":[{"role":"user","parts":[{"text":"say hi"}]}]}"#,
        r#""finishReason""#,
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn all_four_apis_through_redirect_tls_and_capture() -> Result<()> {
    let mock = mock::start(MockConfig::default()).await?;
    // The sandbox user passes through it: bubblewrap binds the session's
    // directories from the state directory below it.
    let tmp = polar_tests::sandbox_tempdir()?;
    let state = tmp.path().join("state");
    let config = tmp.path().join("polar.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[agent]
state_dir = "{state}"

[[backend]]
name = "mock"
dialect = "vllm"
replicas = ["{url}"]
served_model = "polar-mock"

[[route]]
host = "api.anthropic.com"
action = "model"
provider = "anthropic"
backend = "mock"

[[route]]
host = "api.openai.com"
action = "model"
provider = "auto"
backend = "mock"

[[route]]
host = "generativelanguage.googleapis.com"
action = "model"
provider = "gemini"
backend = "mock"
"#,
            state = state.display(),
            url = mock.url()
        ),
    )?;
    let mut script = String::new();
    for (label, url, body, _) in CALLS {
        script.push_str(&format!(
            "echo \"{label}|$(curl -sS -N --max-time 30 -H 'content-type: application/json' \
             -H 'x-api-key: dummy' -H 'x-goog-api-key: dummy' -H 'authorization: Bearer dummy' \
             -H 'anthropic-version: 2023-06-01' -d '{body}' '{url}' 2>&1 | tr '\\n' ' ')\"\n"
        ));
    }
    let cfg = config.display().to_string();
    let run = tokio::task::spawn_blocking(move || {
        sandbox_run(
            &[
                "--config",
                &cfg,
                "--session",
                "capture-e2e",
                "--task",
                "t-1",
            ],
            &["bash", "-c", &script],
        )
    })
    .await??;
    ensure!(run.output.status.success(), "{}", run.stderr());
    let stdout = String::from_utf8_lossy(&run.output.stdout).into_owned();
    let replies: BTreeMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('|')).collect();
    for (label, _, _, expect) in CALLS {
        let reply = replies
            .get(label)
            .with_context(|| format!("no reply for {label}: {stdout}"))?;
        ensure!(reply.contains(expect), "{label}: {reply}");
    }
    let (records, problems) = read_log(&state.join("sessions/capture-e2e/calls.jsonl"))?;
    ensure!(problems.is_empty(), "{problems:?}");
    ensure!(
        records.len() == CALLS.len(),
        "{} records: {records:?}",
        records.len()
    );
    let mut per_api: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for r in &records {
        ensure!(
            r.task_id.as_deref() == Some("t-1"),
            "task id: {:?}",
            r.task_id
        );
        ensure!(!r.token_ids_missing, "call {} without ids", r.call_id);
        let prompt = r.prompt_token_ids.as_ref().context("prompt ids")?;
        let response = r.response_token_ids.as_ref().context("response ids")?;
        let logprobs = r.response_logprobs.as_ref().context("logprobs")?;
        ensure!(
            !prompt.is_empty() && !response.is_empty(),
            "empty ids in {}",
            r.call_id
        );
        ensure!(
            logprobs.len() == response.len(),
            "logprobs of another length in {}",
            r.call_id
        );
        let e = per_api
            .entry(format!("{:?}", r.native_request.api))
            .or_default();
        if r.request.stream {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
    }
    for api in [
        Api::AnthropicMessages,
        Api::OpenaiChat,
        Api::OpenaiResponses,
        Api::Gemini,
    ] {
        ensure!(
            per_api.get(&format!("{api:?}")) == Some(&(1, 1)),
            "{api:?}: {per_api:?}"
        );
    }
    mock.stop().await;
    Ok(())
}

/// `polar sandbox run --harness shell --task ID --policy-version V`: the
/// harness session's records and `session.json` carry the task and the
/// policy version, and `polar export` writes its rows under the task's
/// partition (not `__HIVE_DEFAULT_PARTITION__`) with that policy version
/// beside the weight version the backend reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_harness_session_is_stamped_with_its_task_and_exported_under_it() -> Result<()> {
    let mock = mock::start(MockConfig::default()).await?;
    let tmp = polar_tests::sandbox_tempdir()?;
    let cfg = polar_tests::write_config(
        tmp.path(),
        &format!(
            "[[backend]]\nname = \"mock\"\ndialect = \"vllm\"\nreplicas = [\"{}\"]\n\
             served_model = \"polar-mock\"\n",
            mock.url()
        ),
    )?
    .display()
    .to_string();
    let (_, url, body, expect) = CALLS[2];
    let script = format!(
        "curl -sS --max-time 30 -H 'content-type: application/json' \
         -H 'authorization: Bearer dummy' -d '{body}' '{url}'"
    );
    let run = tokio::task::spawn_blocking({
        let cfg = cfg.clone();
        move || {
            polar_tests::session_run(
                &[
                    "--config",
                    &cfg,
                    "--session",
                    "task-stamp",
                    "--harness",
                    "shell",
                    "--task",
                    "t-7",
                    "--policy-version",
                    "w-42",
                    "--budget-secs",
                    "60",
                ],
                &["sh", "-c", &script],
            )
        }
    })
    .await??;
    run.succeeded()?;
    let session_dir = tmp.path().join("state/sessions/task-stamp");
    let (records, problems) = read_log(&session_dir.join("calls.jsonl"))?;
    ensure!(problems.is_empty(), "{problems:?}");
    ensure!(records.len() == 1, "{records:?}\n{}", run.main_logs());
    ensure!(
        records[0].task_id.as_deref() == Some("t-7")
            && records[0].policy_version.as_deref() == Some("w-42"),
        "{:?} {:?}",
        records[0].task_id,
        records[0].policy_version
    );
    let session: serde_json::Value =
        serde_json::from_slice(&std::fs::read(session_dir.join("session.json"))?)?;
    ensure!(
        session["task_id"] == "t-7" && session["metadata"]["policy_version"] == "w-42",
        "{session}"
    );
    let logs = run.main_logs();
    ensure!(logs.contains(expect), "{logs}");
    let out = tmp.path().join("export");
    let export = std::process::Command::new(polar_tests::polar_bin()?)
        .args(["export", "--json", "--format", "jsonl", "--state-dir"])
        .arg(tmp.path().join("state"))
        .arg("--out")
        .arg(&out)
        .output()?;
    ensure!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let files: Vec<_> = walk(&out)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    ensure!(
        !files.is_empty(),
        "nothing exported under {}",
        out.display()
    );
    for f in &files {
        let rel = f.strip_prefix(&out)?.display().to_string();
        ensure!(rel.starts_with("task=t-7/"), "{rel}");
        for row in polar_tests::json_lines(&std::fs::read(f)?) {
            ensure!(
                row["task_id"] == "t-7" && row["policy_version"] == "w-42",
                "{rel}: {row}"
            );
            // The mock's `x-weight-version` header: the backend's own.
            ensure!(
                row["weight_version"] == MockConfig::default().weight_version,
                "{rel}: {row}"
            );
            let spans = &row["trace_metadata"]["spans"];
            ensure!(spans[0]["policy_version"] == "w-42", "{rel}: {spans}");
        }
    }
    mock.stop().await;
    Ok(())
}

/// Every file below `dir`.
fn walk(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    Ok(out)
}
