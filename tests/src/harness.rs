//! Real harness CLIs' sessions, shared by `tests/harness_e2e.rs`,
//! `tests/harness_faults.rs` and `tests/harness_python.rs` (which also
//! checks a session of its own with [`served_problems`] and
//! [`row_token_problems`]): each CLI runs unmodified in a `native`
//! sandbox (or a docker container) with `polar sandbox run --harness NAME`,
//! against `polar mock-backend` replicas on loopback, all of a run's CLIs
//! at once; [`run_all`] then checks every session and fails with every
//! problem of every harness.
//!
//! What is checked of a session ([`Scenario`] says which task): the
//! harness exits with 0 and the task's outcome is in its workspace; every
//! call in the capture log has prompt and response token ids; the export
//! follows `docs/CONSUMERS.md`'s row recipe; for the scripted tasks, every
//! generation the mock served (`GET /served`) is in exactly one captured
//! record (a call resumed after a fault: each of its parts in one
//! generation, [`served_problems`]) and every record is made of served
//! generations, with equal prompt ids, response ids and logprobs; every
//! captured call is in exactly one exported row, each row's tokens are its
//! last call's prompt and response with loss 1 exactly on the merged calls'
//! generated tokens. Fault scenarios ([`Faults`]) add what a fault must
//! leave: resumed calls where a step was faulted, or, when the replica set
//! stays down, a sample exported as an infrastructure fault.
//!
//! The CLIs come from `cargo xtask harnesses` (`POLAR_HARNESS_DIR`, else
//! `.polar-cache/harnesses`).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_capture::LogProblem;
use polar_capture::read_log;
use polar_chat::{ResponseFormat, Role};
use polar_record::{CallStatus, CompletionRecord};
use serde_json::Value;

use crate::docker::Engine;
use crate::{
    SessionRun, harness_dir, polar_bin, sandbox_tempdir, session_run, write_config, write_file,
};

/// The six harnesses, as `--harness` names them.
pub const SIX: [&str; 6] = [
    "codex",
    "claude_code",
    "gemini_cli",
    "qwen_code",
    "opencode",
    "pi",
];

/// The demo task (the built-in policy).
pub const INSTRUCTION: &str =
    "Create the file polar-demo.txt containing the word polar, using your shell tool.";

/// The four-step task.
pub const STEPS_INSTRUCTION: &str = "Using your shell tool, one command at a time: create notes.txt \
     holding the line 'polar 1', run the check (grep for the line 'polar 2'; it fails at first), \
     add the line 'polar 2' to notes.txt, then run the check again and write pass to result.txt.";

/// The four steps of [`STEPS_INSTRUCTION`]: the text and the shell
/// command of each scripted turn.
const STEPS: [(&str, &str); 4] = [
    ("Creating the notes.", "echo 'polar 1' > notes.txt"),
    ("Running the check.", "grep -qx 'polar 2' notes.txt"),
    (
        "The check failed: adding the line.",
        "echo 'polar 2' >> notes.txt",
    ),
    (
        "Running the check again.",
        "grep -qx 'polar 2' notes.txt && echo pass > result.txt",
    ),
];

/// The mock's script for [`STEPS_INSTRUCTION`], stepped by the
/// conversation's progress (its tool results): one shell call per tool
/// result so far, then "done". `id` is the session entry's id, `extra` its
/// other fields (TOML lines), `faults` each turn's extra fields (a scripted
/// fault, TOML inline-table fields), `last` a tool call the model makes
/// after the four steps, before "done" (a TOML inline table in the script's
/// form; empty: none).
fn steps_script(id: &str, extra: &str, faults: [&str; 4], last: &str) -> String {
    let mut turns: Vec<String> = STEPS
        .iter()
        .zip(faults)
        .map(|((text, shell), fault)| {
            let shell = toml_string(shell);
            let fault = if fault.is_empty() {
                String::new()
            } else {
                format!(", {fault}")
            };
            format!("  {{ text = \"{text}\", tool_calls = [{{ shell = {shell} }}]{fault} }},\n")
        })
        .collect();
    if !last.is_empty() {
        turns.push(format!(
            "  {{ text = \"Submitting.\", tool_calls = [{last}] }},\n"
        ));
    }
    format!(
        "final_text = \"done\"\n\n[[sessions]]\nid = \"{id}\"\n{extra}step_by = \"tool_results\"\nturns = [\n{}]\n",
        turns.concat()
    )
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    Value::from(text).to_string()
}

/// The steps' script for a session whose context fills: with
/// `fills_after` tool results since the last summary the mock reports
/// `context_tokens` prompt tokens. For Codex, 262,000 after two is more
/// than its auto-compaction threshold for its 272k window, so it compacts
/// once (server-side: a `compaction_trigger` request), after the third
/// step, and goes on from the summary to the fourth. At or past
/// [`MOCK_MAX_MODEL_LEN`] the mock refuses the request instead, with
/// vLLM's 400 for a prompt over the context (what Claude Code compacts on).
fn compact_script(fills_after: u32, context_tokens: u32) -> String {
    steps_script(
        "*",
        &format!("context_fills_after = {fills_after}\ncontext_tokens = {context_tokens}\n"),
        [""; 4],
        "",
    )
}

/// The mock's context length (Qwen Code's first prompt alone is ~40k of
/// the mock's tokens).
pub const MOCK_MAX_MODEL_LEN: u32 = 262_144;

/// Gemini CLI as the preset runs it, but without `-m`: its default model
/// choice routes each prompt with a non-streamed classifier call that asks
/// for JSON under a `responseJsonSchema` (HARNESSES.md), which must be
/// served as schema-valid JSON (else it retries five times, ~95 s). The
/// preset pins the model and so never makes that call. Defined in every
/// run's configuration; a test names it `custom:gemini-auto`.
const GEMINI_AUTO: &str = r#"
[harness.gemini-auto]
command = ["gemini", "-p", "{instruction}", "--yolo", "--skip-trust"]
api = "gemini"
shell_tool = "run_shell_command"
env = { GEMINI_API_KEY = "{api_key}" }
files = { ".gemini/settings.json" = '{"security":{"auth":{"selectedType":"gemini-api-key"}},"privacy":{"usageStatisticsEnabled":false}}' }
"#;

/// The harnesses whose run must hold a call asking for structured output.
const ASKS_FOR_JSON: &[&str] = &["custom:gemini-auto"];

/// The task's check, run in the workspace (as a `command` evaluator would).
const STEPS_CHECK: &str = "test \"$(cat notes.txt)\" = \"$(printf 'polar 1\\npolar 2')\" && test \"$(cat result.txt)\" = pass";

/// A fault scripted on one step of the four-step task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The scripted turn's fault (its extra TOML fields, see the mock's
    /// script format), e.g. `error = { status = 503 }`.
    pub script: &'static str,
    /// The generated ids of the faulted call's first part that its record
    /// keeps (`resumed.part_tokens[0]`): 0 when the request was sent again
    /// whole.
    pub first_part: u32,
}

/// A fault variant of the four-step task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    /// Its name (in the session ids).
    pub name: &'static str,
    /// The backend's dialect (`vllm`, `sglang`).
    pub dialect: &'static str,
    /// Mock replicas, each with the same script.
    pub replicas: usize,
    /// The replicas die at their first cut or abort
    /// (`--down-after-fault`): the replica set stays down, and the sample
    /// must be exported as an infrastructure fault. Otherwise each fault
    /// must be resumed (the harness never sees it) and the session must
    /// be as exact as an unfaulted one.
    pub down: bool,
    /// Each step's fault.
    pub steps: [Option<Fault>; 4],
    /// The session's budget, seconds.
    pub budget_secs: u32,
}

/// Which task the harnesses get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// The built-in policy: one shell call, then "done".
    Demo,
    /// [`steps_script`]: four shell steps, then "done".
    Steps,
    /// The same task, with every check of [`Scenario::Steps`] but the one
    /// that the main chain is one trace (what [`crate::chains`] measures).
    StepsMeasured,
    /// The four steps, then this tool call (a TOML inline table in the
    /// mock's script form), with which the harness ends its session
    /// (mini-swe-agent ends only on its submit command, OpenHands on its
    /// `finish` tool; a plain answer is a format error to the first).
    Submit(&'static str),
    /// [`compact_script`]: the same, with a context that fills after this
    /// many tool results to this many tokens (the usage the backend
    /// reports; at or past [`MOCK_MAX_MODEL_LEN`], its refusal).
    Compact(u32, u32),
    /// The four steps with the faults of [`Faults`].
    Faults(&'static Faults),
}

impl Scenario {
    fn instruction(self) -> &'static str {
        match self {
            Self::Demo => INSTRUCTION,
            Self::Steps
            | Self::StepsMeasured
            | Self::Submit(_)
            | Self::Compact(..)
            | Self::Faults(_) => STEPS_INSTRUCTION,
        }
    }

    /// The session id's suffix.
    fn suffix(self) -> String {
        match self {
            Self::Demo => String::new(),
            Self::Steps | Self::StepsMeasured | Self::Submit(_) => "-steps".into(),
            Self::Compact(..) => "-compact".into(),
            Self::Faults(f) => format!("-{}", f.name),
        }
    }

    /// The mock's script, when not the built-in policy.
    fn script(self) -> Option<String> {
        match self {
            Self::Demo => None,
            Self::Steps | Self::StepsMeasured => Some(steps_script("*", "", [""; 4], "")),
            Self::Submit(last) => Some(steps_script("*", "", [""; 4], last)),
            Self::Compact(fills_after, tokens) => Some(compact_script(fills_after, tokens)),
            Self::Faults(f) => Some(steps_script(
                "*",
                "",
                f.steps.map(|s| s.map_or("", |s| s.script)),
                "",
            )),
        }
    }

    /// The replica set down for good.
    fn down(self) -> bool {
        matches!(self, Self::Faults(f) if f.down)
    }
}

/// `polar mock-backend` on a free loopback port; killed on drop.
struct Mock {
    child: Child,
    url: String,
    /// Its stderr, for a failure's reader.
    log: tempfile::NamedTempFile,
}

impl Mock {
    /// Started with the built-in policy, or with `script` (a file) and
    /// `GET /served`; `args`: more of its flags.
    fn start(script: Option<&Path>, args: &[&str]) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut cmd = Command::new(polar_bin()?);
        cmd.args(["mock-backend", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--max-model-len", &MOCK_MAX_MODEL_LEN.to_string()]);
        if let Some(script) = script {
            cmd.arg("--script").arg(script).arg("--record-served");
        }
        cmd.args(args);
        let log = tempfile::NamedTempFile::new()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen()?)
            .spawn()?;
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("the mock backend did not start");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { child, url, log })
    }

    /// What the mock served (`GET /served`), by session; failing, with
    /// whether the mock still runs and the end of its stderr.
    fn served(&mut self) -> Result<BTreeMap<String, Vec<Value>>> {
        served_by(&self.url).with_context(|| {
            let log = std::fs::read_to_string(self.log.path()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!(
                "asking the mock at {} what it served (exit: {:?}); its stderr ends:\n{}",
                self.url,
                self.child.try_wait(),
                tail.join("\n")
            )
        })
    }
}

/// What the mock at `url` (`http://HOST:PORT`, started with
/// `--record-served`) served (`GET /served`), by session.
pub fn served_by(url: &str) -> Result<BTreeMap<String, Vec<Value>>> {
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(b"GET /served HTTP/1.1\r\nHost: mock\r\nConnection: close\r\n\r\n")?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)?;
    let text = String::from_utf8(reply)?;
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP head")?;
    ensure!(head.starts_with("HTTP/1.1 200"), "GET /served: {head}");
    let v: Value = serde_json::from_str(body)?;
    ensure!(v["dropped"] == 0, "the mock dropped served generations");
    let mut by = BTreeMap::<String, Vec<Value>>::new();
    for g in v["served"].as_array().context("no served list")? {
        by.entry(g["session"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .push(g.clone());
    }
    Ok(by)
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A configuration whose model routes (the built-in ones) are served by
/// the mocks through the capture stage (and `extra` after it); with the
/// model's `output_parser` for the fault scenarios (a reply cut after
/// output reached the harness is resumed) and `keys` (more of the
/// backend's keys, TOML lines).
fn config(
    dir: &Path,
    mocks: &[Mock],
    scenario: Scenario,
    keys: &str,
    extra: &str,
) -> Result<String> {
    let replicas: Vec<String> = mocks.iter().map(|m| format!("\"{}\"", m.url)).collect();
    let (dialect, parser) = match scenario {
        Scenario::Faults(f) => (f.dialect, "output_parser = \"qwen3\"\n"),
        _ => ("vllm", ""),
    };
    Ok(write_config(
        dir,
        &format!(
            "[[backend]]\nname = \"mock\"\ndialect = \"{dialect}\"\nreplicas = [{}]\n\
             served_model = \"polar-mock\"\n{parser}{keys}\n{extra}",
            replicas.join(", ")
        ),
    )?
    .display()
    .to_string())
}

/// What is wrong with one harness's session, if anything (`served`: what
/// the mock served this session, for [`Scenario::Steps`]).
pub(crate) fn check(
    name: &str,
    run: &SessionRun,
    scenario: Scenario,
    served: &[Value],
) -> Vec<String> {
    if scenario.down() {
        let mut problems = down_problems(name, run);
        if !problems.is_empty() {
            problems.push(format!("{name} logs:\n{}", run.main_logs()));
        }
        return problems;
    }
    let mut problems = Vec::new();
    if run.code() != Some(0) {
        problems.push(format!("exit {:?}", run.code()));
    }
    match scenario {
        Scenario::Demo => {
            let file = run.workspace().join("polar-demo.txt");
            match std::fs::read_to_string(&file) {
                Ok(text) if text.contains("polar") => {}
                Ok(text) => problems.push(format!("polar-demo.txt holds {text:?}")),
                Err(e) => problems.push(format!("no polar-demo.txt ({e})")),
            }
        }
        Scenario::Steps
        | Scenario::StepsMeasured
        | Scenario::Submit(_)
        | Scenario::Compact(..)
        | Scenario::Faults(_) => {
            problems.extend(task_check(&run.workspace()));
        }
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
    problems.extend(calls_file_problems(name, log, &calls));
    match exported_rows(Path::new(log)) {
        Ok(rows) => {
            // A call the backend refused (a prompt over the context, which
            // makes a harness compact) is in no row but counted in the
            // stats with its reason; every other call is in a row.
            let dropped = dropped_calls(&rows);
            let (refused, calls): (Vec<CompletionRecord>, Vec<CompletionRecord>) = calls
                .into_iter()
                .partition(|c| dropped.contains_key(c.call_id.as_str()));
            for c in &refused {
                let reason = &dropped[c.call_id.as_str()];
                let over = matches!(&c.status, CallStatus::Failed { error, .. }
                    if error.contains("does not fit the model's context"));
                if !over || c.response_token_ids.is_some() {
                    problems.push(format!("call {} was dropped: {reason}", c.call_id));
                }
            }
            let overflows = matches!(scenario, Scenario::Compact(_, t) if t >= MOCK_MAX_MODEL_LEN);
            if overflows == refused.is_empty() {
                problems.push(format!(
                    "{} call(s) refused for their context, {} expected",
                    refused.len(),
                    if overflows { "some" } else { "none" }
                ));
            }
            for (i, c) in calls.iter().enumerate() {
                let ids = |ids: &Option<Vec<u32>>| ids.as_ref().is_some_and(|a| !a.is_empty());
                if !ids(&c.prompt_token_ids) || !ids(&c.response_token_ids) {
                    problems.push(format!("call {i} lacks token ids: {:?}", c.status));
                }
            }
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
            problems.extend(recipe_problems(&rows, &structured, scenario.instruction()));
            problems.extend(structured_problems(&calls));
            if ASKS_FOR_JSON.contains(&name) && structured.is_empty() {
                problems.push("no call asked for structured output".into());
            }
            if scenario != Scenario::Demo {
                problems.extend(served_problems(&calls, served));
                problems.extend(row_problems(&calls, &rows, scenario));
            }
            if let Scenario::Faults(f) = scenario {
                problems.extend(fault_problems(&calls, f));
            }
        }
        Err(e) => problems.push(format!("export: {e:#}")),
    }
    if !problems.is_empty() {
        problems.push(format!("{name} logs:\n{}", run.main_logs()));
    }
    problems
}

/// What is wrong with the session's calls file, encoded as a gateway
/// exports it: it must decode to exactly the session's records. Its sizes
/// (the records as JSON lines, and compressed) and encoding time are
/// printed (BENCHMARKS.md, "Calls files").
fn calls_file_problems(name: &str, log: &str, calls: &[CompletionRecord]) -> Vec<String> {
    use polar_export::calls::{CallsHeader, decode_calls, encode_calls};
    let session = calls.first().map(|c| c.session_id.as_str()).unwrap_or("");
    let header = CallsHeader::new(session, None, None, calls);
    let started = std::time::Instant::now();
    let bytes = match encode_calls(&header, calls) {
        Ok(b) => b,
        Err(e) => return vec![format!("{log}: calls file: {e}")],
    };
    let took = started.elapsed();
    let jsonl: usize = calls
        .iter()
        .map(|c| serde_json::to_vec(c).map_or(0, |v| v.len() + 1))
        .sum();
    let n = calls.len().max(1);
    eprintln!(
        "{name}: calls file: {} calls, JSONL {jsonl} B ({} B/call), zstd {} B ({} B/call, {:.1}x), encoded in {:.2} ms",
        calls.len(),
        jsonl / n,
        bytes.len(),
        bytes.len() / n,
        jsonl as f64 / bytes.len().max(1) as f64,
        took.as_secs_f64() * 1e3
    );
    match decode_calls(log, &bytes) {
        Ok(back) if back.records == calls => Vec::new(),
        Ok(_) => vec![format!(
            "{log}: the calls file does not read back the same records"
        )],
        Err(e) => vec![format!("{log}: the calls file does not read back: {e}")],
    }
}

/// What is wrong with a session whose faults were to be resumed: a call
/// failed on the backend's or Polar's side (the harness saw a fault), or
/// no call of a faulted step (one offering tools, with as many tool
/// results as the steps before it) is resumed on another replica with the
/// expected first part.
fn fault_problems(calls: &[CompletionRecord], faults: &Faults) -> Vec<String> {
    let mut problems = Vec::new();
    for c in calls {
        if let CallStatus::Failed { side, error } = &c.status
            && side != "harness"
        {
            problems.push(format!(
                "call {} failed on the {side}'s side: {error}",
                c.call_id
            ));
        }
    }
    for (step, fault) in faults.steps.iter().enumerate() {
        let Some(fault) = fault else { continue };
        let at_step: Vec<&CompletionRecord> = calls
            .iter()
            .filter(|c| {
                !c.request.tools.is_empty()
                    && c.request
                        .messages
                        .iter()
                        .filter(|m| m.role == Role::Tool)
                        .count()
                        == step
            })
            .collect();
        let resumed = at_step.iter().filter_map(|c| c.resumed.as_ref()).any(|r| {
            r.part_tokens.first() == Some(&fault.first_part)
                && r.replicas.len() >= 2
                && (faults.replicas < 2 || r.replicas[0] != r.replicas[1])
        });
        if !resumed {
            problems.push(format!(
                "step {step} ({}): no call of it is resumed with {} ids in its first part: {:?}",
                fault.script,
                fault.first_part,
                at_step.iter().map(|c| &c.resumed).collect::<Vec<_>>()
            ));
        }
    }
    problems
}

/// What is wrong with a session whose replica set went down for good: its
/// export must be an infrastructure fault (every row `error`, labelled
/// `infra_fault` and `session_failed`, `ended_by` `backend`), never a clean
/// sample, whatever the harness did (it is reported, for the record).
fn down_problems(name: &str, run: &SessionRun) -> Vec<String> {
    let log = run.outcome["capture_log"].as_str().unwrap_or_default();
    let calls = read_log(Path::new(log)).map(|(c, _)| c).unwrap_or_default();
    let failed = calls
        .iter()
        .filter(|c| matches!(&c.status, CallStatus::Failed { side, .. } if side == "backend"))
        .count();
    eprintln!(
        "{name}: exit {:?}, {} calls, {failed} failed on the backend's side",
        run.code(),
        calls.len()
    );
    let rows = match exported_rows(Path::new(log)) {
        Ok(rows) => rows,
        Err(e) => return vec![format!("export: {e:#}")],
    };
    let mut problems = Vec::new();
    if rows.is_empty() {
        problems.push("no exported row".into());
    }
    for r in &rows {
        let labels = r["labels"].to_string();
        let ended_by = json_field(&r["trajectory_metadata"])["ended_by"].clone();
        if r["status"] != "error"
            || !labels.contains("\"infra_fault\"")
            || !labels.contains("\"session_failed\"")
            || ended_by != "backend"
        {
            problems.push(format!(
                "row {} is not an infrastructure fault: status {}, labels {labels}, ended_by {ended_by}",
                r["trace_id"], r["status"]
            ));
        }
    }
    problems
}

/// The session's rows as `polar export` writes them (JSONL,
/// `prefix_merging`), from the session directory holding `log`.
pub fn exported_rows(log: &Path) -> Result<Vec<serde_json::Value>> {
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
                rows.extend(crate::json_lines(&std::fs::read(&p)?));
            }
        }
    }
    Ok(rows)
}

/// What is wrong with `docs/CONSUMERS.md`'s recipe on a session's rows:
/// the `main` rows exist, the first holds the instruction and offers
/// tools, and every call that asked for structured output is `side`.
fn recipe_problems(
    rows: &[serde_json::Value],
    structured: &[&str],
    instruction: &str,
) -> Vec<String> {
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
            if !r["prompt_messages"].to_string().contains(instruction) {
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

/// What is wrong with the task's outcome in `workspace`: its check fails.
fn task_check(workspace: &Path) -> Vec<String> {
    let out = Command::new("sh")
        .args(["-c", STEPS_CHECK])
        .current_dir(workspace)
        .output();
    match out {
        Ok(o) if o.status.success() => Vec::new(),
        Ok(o) => vec![format!(
            "the task's check fails ({}): notes.txt {:?}, result.txt {:?}",
            o.status,
            std::fs::read_to_string(workspace.join("notes.txt")).unwrap_or_default(),
            std::fs::read_to_string(workspace.join("result.txt")).unwrap_or_default(),
        )],
        Err(e) => vec![format!("cannot run the task's check: {e}")],
    }
}

/// Token ids of a JSON array.
fn id_list(v: &Value) -> Vec<u32> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// f32 values of a JSON array.
fn f32_list(v: &Value) -> Vec<f32> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_f64().map(|f| f as f32))
        .collect()
}

/// What is wrong between the captured records and what the mock served:
/// each served generation is in exactly one record and each record is
/// served generations (prompt ids, response ids, logprobs bit for bit): one
/// for a call that never failed; for a resumed call, one per part, each
/// prompted with the call's prompt and the parts before it, its ids (up to
/// where the mock cut it) being the part's (a part with no ids, a request
/// sent again whole, may have been answered with nothing or not at all).
pub fn served_problems(calls: &[CompletionRecord], served: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    if served.is_empty() {
        problems.push("the mock served nothing for this session".into());
    }
    let bits = |l: &[f32]| l.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    // What each served generation sent: its ids up to a scripted cut.
    let sent: Vec<(Vec<u32>, Vec<u32>, Vec<f32>)> = served
        .iter()
        .map(|g| {
            let mut ids = id_list(&g["token_ids"]);
            let mut lps = f32_list(&g["logprobs"]);
            if let Some(n) = g["disconnect_after"]
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
            {
                ids.truncate(n);
                lps.truncate(n);
            }
            (id_list(&g["prompt_token_ids"]), ids, lps)
        })
        .collect();
    let mut taken = vec![false; served.len()];
    for c in calls {
        let (Some(prompt), Some(response)) = (&c.prompt_token_ids, &c.response_token_ids) else {
            problems.push(format!("call {} has no token ids", c.call_id));
            continue;
        };
        let logprobs = c.response_logprobs.as_deref().unwrap_or_default();
        let parts: Vec<usize> = match &c.resumed {
            Some(r) => r.part_tokens.iter().map(|&n| n as usize).collect(),
            None => vec![response.len()],
        };
        if parts.iter().sum::<usize>() != response.len() {
            problems.push(format!(
                "call {}: its parts {parts:?} are not its {} response ids",
                c.call_id,
                response.len()
            ));
            continue;
        }
        let mut done = 0;
        for (p, &n) in parts.iter().enumerate() {
            let part_prompt = [prompt.as_slice(), &response[..done]].concat();
            let want = &response[done..done + n];
            let found = sent.iter().enumerate().position(|(i, (gp, ids, _))| {
                !taken[i] && *gp == part_prompt && ids.as_slice() == want
            });
            match found {
                Some(i) => {
                    taken[i] = true;
                    let lps = logprobs.get(done..done + n).unwrap_or_default();
                    if bits(&sent[i].2) != bits(lps) {
                        problems.push(format!(
                            "call {} part {p}: logprobs differ from the served ones",
                            c.call_id
                        ));
                    }
                }
                None if n == 0 => {}
                None => problems.push(format!(
                    "call {} part {p} ({} prompt, {n} response ids) is no generation the mock served",
                    c.call_id,
                    part_prompt.len()
                )),
            }
            done += n;
        }
    }
    for (g, _) in served.iter().zip(&taken).filter(|(_, t)| !**t) {
        problems.push(format!(
            "served generation #{} ({} prompt ids, {}) is in no captured record",
            g["number"],
            id_list(&g["prompt_token_ids"]).len(),
            g["finish_reason"]
        ));
    }
    problems
}

/// What is wrong with the exported rows against the records:
/// [`row_token_problems`]; then, for a compacted session, its segments
/// ([`compaction_problems`]), else the main chain went through the four
/// steps (as one trace for the unfaulted tasks).
fn row_problems(calls: &[CompletionRecord], rows: &[Value], scenario: Scenario) -> Vec<String> {
    let mut problems = row_token_problems(calls, rows);
    if matches!(scenario, Scenario::Compact(..)) {
        problems.extend(compaction_problems(rows));
        return problems;
    }
    let by_id: BTreeMap<&str, &CompletionRecord> =
        calls.iter().map(|c| (c.call_id.as_str(), c)).collect();
    // The main chain's last call saw the four steps' results.
    let main_last = rows
        .iter()
        .filter(|r| r["chain_role"] == "main")
        .filter_map(|r| r["call_ids"].as_array()?.last()?.as_str())
        .filter_map(|c| by_id.get(c))
        .map(|c| {
            c.request
                .messages
                .iter()
                .filter(|m| m.role == Role::Tool)
                .count()
        })
        .max();
    match main_last {
        Some(n) if n >= 4 => {}
        n => problems.push(format!("the main chain saw {n:?} tool results, not 4")),
    }
    // Each prompt continues the last reply token for token, so the main
    // chain is one trace: no break (a template mismatch would be one).
    let main: Vec<String> = rows
        .iter()
        .filter(|r| r["chain_role"] == "main")
        .map(|r| format!("{}/{}", r["segment_kind"], r["break_reason"]))
        .collect();
    if matches!(scenario, Scenario::Steps | Scenario::Submit(_)) && main.len() != 1 {
        problems.push(format!(
            "the main chain is {} segments: {main:?}",
            main.len()
        ));
    }
    problems
}

/// What is wrong with the exported rows against the records, whatever the
/// task: every call is in exactly one row; each row's tokens are its last
/// call's prompt and response, with loss 1 exactly on the merged calls'
/// generated tokens and their logprobs there; calls offering no tools (in a
/// session that offers some) or asking for structured output are `side`.
pub fn row_token_problems(calls: &[CompletionRecord], rows: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let session_offers_tools = calls.iter().any(|c| !c.request.tools.is_empty());
    let by_id: BTreeMap<&str, &CompletionRecord> =
        calls.iter().map(|c| (c.call_id.as_str(), c)).collect();
    let mut seen = BTreeMap::<String, usize>::new();
    for r in rows {
        let id = r["trace_id"].to_string();
        let call_ids: Vec<&str> = r["call_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        for c in &call_ids {
            *seen.entry((*c).to_owned()).or_default() += 1;
        }
        let merged: Vec<&CompletionRecord> = call_ids
            .iter()
            .filter_map(|c| by_id.get(c).copied())
            .collect();
        let Some(last) = merged.last() else {
            problems.push(format!("row {id} names no captured call"));
            continue;
        };
        let prompt = id_list(&r["prompt_ids"]);
        let response = id_list(&r["response_ids"]);
        let mask: Vec<u8> = id_list(&r["loss_mask"])
            .into_iter()
            .map(|m| m as u8)
            .collect();
        let logprobs = f32_list(&r["response_logprobs"]);
        let whole = [prompt.as_slice(), response.as_slice()].concat();
        let last_seq = [
            last.prompt_token_ids.clone().unwrap_or_default(),
            last.response_token_ids.clone().unwrap_or_default(),
        ]
        .concat();
        if whole != last_seq {
            problems.push(format!(
                "row {id}: its {} tokens are not its last call's prompt + response ({})",
                whole.len(),
                last_seq.len()
            ));
            continue;
        }
        let mut want_mask = vec![0u8; response.len()];
        let mut want_lp = vec![0f32; response.len()];
        for c in &merged {
            let start = c.prompt_token_ids.as_ref().map_or(0, Vec::len);
            let generated = c.response_token_ids.as_deref().unwrap_or_default();
            let lps = c.response_logprobs.as_deref().unwrap_or_default();
            for (k, _) in generated.iter().enumerate() {
                let Some(pos) = (start + k).checked_sub(prompt.len()) else {
                    problems.push(format!(
                        "row {id}: call {} starts inside the row's prompt",
                        c.call_id
                    ));
                    break;
                };
                if let Some(m) = want_mask.get_mut(pos) {
                    *m = 1;
                }
                if let (Some(l), Some(v)) = (want_lp.get_mut(pos), lps.get(k)) {
                    *l = *v;
                }
            }
        }
        if mask != want_mask {
            problems.push(format!(
                "row {id}: loss mask has {} ones, the generated tokens are {}",
                mask.iter().filter(|m| **m == 1).count(),
                want_mask.iter().filter(|m| **m == 1).count()
            ));
        }
        let bits = |l: &[f32]| l.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        if bits(&logprobs) != bits(&want_lp) {
            problems.push(format!("row {id}: logprobs differ from the calls' own"));
        }
        let side_call = merged.iter().any(|c| {
            c.request.response_format.is_some()
                || (session_offers_tools && c.request.tools.is_empty())
        });
        let summary = r["segment_kind"] == "compaction_summary";
        let labels = r["labels"].to_string();
        if side_call && !summary && (r["chain_role"] != "side" || !labels.contains("\"side\"")) {
            problems.push(format!(
                "row {id} holds a call offering no tools or asking for structured output, but is {} {labels}",
                r["chain_role"]
            ));
        }
    }
    for c in calls {
        match seen.get(&c.call_id) {
            Some(1) => {}
            n => problems.push(format!(
                "call {} is in {} rows",
                c.call_id,
                n.copied().unwrap_or(0)
            )),
        }
    }
    problems
}

/// What is wrong with the replies to calls that asked for structured
/// output: each must be a JSON object, holding the schema's required
/// top-level properties (the backend's constrained decoding, which the mock
/// does as vLLM's guided decoding would).
fn structured_problems(calls: &[CompletionRecord]) -> Vec<String> {
    let mut problems = Vec::new();
    for c in calls {
        let Some(format) = &c.request.response_format else {
            continue;
        };
        let text = c
            .response
            .as_ref()
            .map(|r| r.message.joined_text())
            .unwrap_or_default();
        let Ok(Value::Object(reply)) = serde_json::from_str::<Value>(&text) else {
            problems.push(format!(
                "call {} asked for {format:?} but its reply is no JSON object: {text:?}",
                c.call_id
            ));
            continue;
        };
        if let ResponseFormat::JsonSchema { schema, .. } = format {
            let required = schema["required"].as_array().into_iter().flatten();
            for key in required.filter_map(Value::as_str) {
                if !reply.contains_key(key) {
                    problems.push(format!(
                        "call {}: reply {text:?} lacks the schema's required {key:?}",
                        c.call_id
                    ));
                }
            }
        }
    }
    problems
}

/// The calls the export left out (`stats.calls_dropped`), with their
/// reasons.
fn dropped_calls(rows: &[Value]) -> BTreeMap<String, String> {
    let stats = rows
        .first()
        .map_or(Value::Null, |r| json_field(&r["stats"]));
    stats["calls_dropped"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| Some((d["call_id"].as_str()?.to_owned(), d["reason"].to_string())))
        .collect()
}

/// A JSON column: an object, or its JSON text.
fn json_field(v: &Value) -> Value {
    match v {
        Value::String(t) => serde_json::from_str(t).unwrap_or(Value::Null),
        other => other.clone(),
    }
}

/// What is wrong with a compacted session's rows: the main chain holds the
/// summary call's own segment (`compaction_summary`, linked to the segment
/// it branched from) and, after it, a `compaction` break linked to it.
fn compaction_problems(rows: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let main: Vec<&Value> = rows.iter().filter(|r| r["chain_role"] == "main").collect();
    let summaries: Vec<&&Value> = main
        .iter()
        .filter(|r| r["segment_kind"] == "compaction_summary")
        .collect();
    let kinds: Vec<String> = main
        .iter()
        .map(|r| format!("{}/{}", r["segment_kind"], r["break_reason"]))
        .collect();
    if summaries.is_empty() {
        problems.push(format!(
            "no compaction_summary segment in the main chain: {kinds:?}"
        ));
    }
    for s in &summaries {
        if !s["labels"].to_string().contains("compaction_summary") {
            problems.push(format!("summary row {} lacks its label", s["trace_id"]));
        }
        let seg = &s["segment"];
        let continued = main.iter().any(|r| {
            r["segment_kind"] == "after_break"
                && r["break_reason"] == "compaction"
                && json_field(&r["trace_metadata"])["previous"]["segment"] == *seg
        });
        if !continued {
            problems.push(format!(
                "no segment continues after the summary (segment {seg}): {kinds:?}"
            ));
        }
    }
    if rows
        .iter()
        .any(|r| r["labels"].to_string().contains("superseded_retry"))
    {
        problems.push(format!("a call is labelled a superseded retry: {kinds:?}"));
    }
    problems
}

/// One `run_all` at a time: each already runs its harnesses at once, and
/// more on this machine's few cores make the CLIs too slow to start
/// (`gemini --version` alone can take 30 s under load). This holds within
/// one test process (`cargo test`); across the processes cargo-nextest
/// runs, the `harness-clis` test group of `.config/nextest.toml` does.
static ONE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How a run's backend is set up beyond its scenario.
#[derive(Clone, Debug, Default)]
pub struct Backend {
    /// More flags of `polar mock-backend` (e.g. `--model-dir DIR`).
    pub mock_args: Vec<String>,
    /// More keys of the `[[backend]]` table (TOML lines, each ending with
    /// a newline).
    pub keys: String,
    /// Put in the session ids (`e2e-NAME-TAG...`), so that runs of
    /// different set-ups are told apart.
    pub tag: String,
}

/// The finished sessions of one [`run_sessions`], with the directory
/// holding their state (removed when this is dropped).
#[derive(Debug)]
pub struct Sessions {
    /// The sessions, in the harnesses' order.
    pub list: Vec<Session>,
    _dir: tempfile::TempDir,
}

/// One harness's finished session.
#[derive(Debug)]
pub struct Session {
    /// The harness, as `--harness` names it.
    pub harness: &'static str,
    /// The session id.
    pub id: String,
    /// The run.
    pub run: SessionRun,
    /// What the mock served the session (`GET /served`; scripted
    /// scenarios only).
    pub served: Vec<Value>,
}

/// Runs the harnesses at once (in native sandboxes, or in docker
/// containers of `docker`'s engine); fails with every problem of every
/// harness.
pub fn run_all(
    harnesses: &[&'static str],
    base_url: bool,
    docker: Option<&Engine>,
    scenario: Scenario,
) -> Result<()> {
    let sessions = run_sessions(harnesses, base_url, docker, scenario, &Backend::default())?;
    let mut problems = Vec::new();
    for s in &sessions.list {
        problems.extend(
            check(s.harness, &s.run, scenario, &s.served)
                .into_iter()
                .map(|p| format!("{}: {p}", s.harness)),
        );
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(())
}

/// Runs the harnesses at once against mocks set up as `backend` says (in
/// native sandboxes, or in docker containers of `docker`'s engine), and
/// returns their sessions, unchecked.
pub fn run_sessions(
    harnesses: &[&'static str],
    base_url: bool,
    docker: Option<&Engine>,
    scenario: Scenario,
    backend: &Backend,
) -> Result<Sessions> {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = harness_dir();
    ensure!(
        dir.join("node_modules/.bin").is_dir(),
        "the harness CLIs are not installed in {}: run `cargo xtask harnesses`",
        dir.display()
    );
    let tmp = sandbox_tempdir()?;
    let script = scenario
        .script()
        .map(|text| write_file(tmp.path(), "script.toml", &text))
        .transpose()?;
    let mut args: Vec<&str> = backend.mock_args.iter().map(String::as_str).collect();
    let replicas = match scenario {
        Scenario::Faults(f) => {
            args.extend(["--dialect", f.dialect]);
            if f.down {
                args.push("--down-after-fault");
            }
            f.replicas
        }
        _ => 1,
    };
    let extra = docker.map(|e| e.sandbox_table("")).unwrap_or_default() + GEMINI_AUTO;
    // One replica set (and configuration) for all the harnesses; one each
    // when the set goes down for good, or the first session's fault would
    // take every other one's down at its first step.
    let sets = if scenario.down() { harnesses.len() } else { 1 };
    let mut mocks = Vec::new();
    let mut cfgs = Vec::new();
    for i in 0..sets {
        let set = (0..replicas)
            .map(|_| Mock::start(script.as_deref().map(Path::new), &args))
            .collect::<Result<Vec<_>>>()?;
        let dir = tmp.path().join(format!("set-{i}"));
        std::fs::create_dir(&dir)?;
        cfgs.push(config(&dir, &set, scenario, &backend.keys, &extra)?);
        mocks.extend(set);
    }
    let budget = match scenario {
        Scenario::Faults(f) => f.budget_secs,
        _ => 400,
    }
    .to_string();
    let spec = docker
        .map(|e| write_file(tmp.path(), "docker.toml", &e.spec("")))
        .transpose()?;
    let threads: Vec<_> = harnesses
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let cfg = cfgs[i.min(sets - 1)].clone();
            let (spec, budget) = (spec.clone(), budget.clone());
            let h = *h;
            let tag = if backend.tag.is_empty() {
                String::new()
            } else {
                format!("-{}", backend.tag)
            };
            std::thread::spawn(move || {
                let session = format!(
                    "e2e-{}{tag}{}{}{}",
                    h.replace(['_', ':'], "-"),
                    if base_url { "-b" } else { "" },
                    if spec.is_some() { "-d" } else { "" },
                    scenario.suffix()
                );
                let mut args = vec![
                    "--config",
                    &cfg,
                    "--session",
                    &session,
                    "--harness",
                    h,
                    "--instruction",
                    scenario.instruction(),
                    "--budget-secs",
                    &budget,
                ];
                if base_url {
                    args.push("--base-url");
                }
                if let Some(spec) = &spec {
                    args.extend(["--runtime", spec.as_str()]);
                }
                (h, session.clone(), session_run(&args, &[]))
            })
        })
        .collect();
    let mut runs = Vec::new();
    for t in threads {
        let (h, session, run) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a harness thread panicked"))?;
        runs.push((h, session, run.with_context(|| format!("running {h}"))?));
    }
    let mut served = BTreeMap::<String, Vec<Value>>::new();
    if script.is_some() && !scenario.down() {
        for m in &mut mocks {
            for (session, list) in m.served()? {
                served.entry(session).or_default().extend(list);
            }
        }
    }
    let list = runs
        .into_iter()
        .map(|(harness, id, run)| Session {
            served: served.remove(&id).unwrap_or_default(),
            harness,
            id,
            run,
        })
        .collect();
    Ok(Sessions { list, _dir: tmp })
}
