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
//! The multi-step test drives the six through a four-step task with the
//! mock's scripted policy, stepped by the conversation's progress (its tool
//! results), each step a call of the harness's own shell tool: create
//! `notes.txt`, run a check that fails, add the missing line, run the check
//! again and write its result. Asserted for each session: the harness exits
//! with 0 and the task's check passes in its workspace; every generation
//! the mock served (`GET /served`) is in exactly one captured record and
//! every record is one the mock served, with equal prompt ids, response ids
//! and logprobs; every captured call is in exactly one exported row, each
//! row's tokens are its last call's prompt and response with loss 1 exactly
//! on the merged calls' generated tokens (their logprobs there, 0.0
//! elsewhere); the main chain went through the four steps; and every call
//! that offers no tools or asks for structured output is in a `side` row.
//! Its compaction variant runs Codex against a backend that reports a
//! nearly full context after two steps: Codex compacts server-side (Polar
//! answers its `compaction_trigger` with a summary from the backend) and
//! finishes the task from the summary; the same holds, and the main chain
//! has the summary call's `compaction_summary` segment followed by a
//! `compaction` break linked to it, and no call is a superseded retry.
//! Claude Code's compaction variant fills the context past the backend's
//! length after three steps: the backend refuses the request (vLLM's 400),
//! Polar tells Claude Code "prompt is too long" in Anthropic's words, and
//! Claude Code compacts reactively and finishes; the refused calls are in
//! no row but in `stats.calls_dropped`, failed on the harness's side.
//!
//! The CLIs come from `cargo xtask harnesses` (`POLAR_HARNESS_DIR`, else
//! `.polar-cache/harnesses`).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_capture::log::LogProblem;
use polar_capture::read_log;
use polar_chat::{ResponseFormat, Role};
use polar_record::{CallStatus, CompletionRecord};
use polar_tests::docker::{self, Engine};
use polar_tests::{
    SessionRun, harness_dir, polar_bin, sandbox_tempdir, session_run, write_config, write_file,
};
use serde_json::Value;

const INSTRUCTION: &str =
    "Create the file polar-demo.txt containing the word polar, using your shell tool.";

const STEPS_INSTRUCTION: &str = "Using your shell tool, one command at a time: create notes.txt \
     holding the line 'polar 1', run the check (grep for the line 'polar 2'; it fails at first), \
     add the line 'polar 2' to notes.txt, then run the check again and write pass to result.txt.";

/// The mock's script for [`STEPS_INSTRUCTION`]: one shell call per tool
/// result so far, then "done".
const STEPS_SCRIPT: &str = r#"final_text = "done"

[[sessions]]
id = "*"
step_by = "tool_results"
turns = [
  { text = "Creating the notes.", tool_calls = [{ shell = "echo 'polar 1' > notes.txt" }] },
  { text = "Running the check.", tool_calls = [{ shell = "grep -qx 'polar 2' notes.txt" }] },
  { text = "The check failed: adding the line.", tool_calls = [{ shell = "echo 'polar 2' >> notes.txt" }] },
  { text = "Running the check again.", tool_calls = [{ shell = "grep -qx 'polar 2' notes.txt && echo pass > result.txt" }] },
]
"#;

/// [`STEPS_SCRIPT`] for a session whose context fills: with `fills_after`
/// tool results since the last summary the mock reports `context_tokens`
/// prompt tokens. For Codex, 262,000 after two is more than its
/// auto-compaction threshold for its 272k window, so it compacts once
/// (server-side: a `compaction_trigger` request), after the third step, and
/// goes on from the summary to the fourth. Past [`MOCK_MAX_MODEL_LEN`] the
/// mock refuses the request instead (what Claude Code compacts on).
fn compact_script(fills_after: u32, context_tokens: u32) -> String {
    let turns = STEPS_SCRIPT
        .split_once("turns = [")
        .map(|(_, t)| t)
        .unwrap_or_default();
    format!(
        "final_text = \"done\"\n\n[[sessions]]\nid = \"*\"\n\
         step_by = \"tool_results\"\ncontext_fills_after = {fills_after}\ncontext_tokens = {context_tokens}\n\
         turns = [{turns}"
    )
}

/// The task's check, run in the workspace (as a `command` evaluator would).
const STEPS_CHECK: &str = "test \"$(cat notes.txt)\" = \"$(printf 'polar 1\\npolar 2')\" && test \"$(cat result.txt)\" = pass";

/// Which task the harnesses get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// The built-in policy: one shell call, then "done".
    Demo,
    /// [`STEPS_SCRIPT`]: four shell steps, then "done".
    Steps,
    /// [`compact_script`]: the same, with a context that fills after this
    /// many tool results to this many tokens (the usage the backend
    /// reports; at or past the mock's context length, its refusal).
    Compact(u32, u32),
}

impl Scenario {
    fn instruction(self) -> &'static str {
        match self {
            Self::Demo => INSTRUCTION,
            Self::Steps | Self::Compact(..) => STEPS_INSTRUCTION,
        }
    }

    /// The session id's suffix.
    fn suffix(self) -> &'static str {
        match self {
            Self::Demo => "",
            Self::Steps => "-steps",
            Self::Compact(..) => "-compact",
        }
    }
}

/// Gemini CLI as the preset runs it, but without `-m`: its default model
/// choice routes each turn with a non-streamed classifier call that asks
/// for JSON under a `responseJsonSchema` (HARNESSES.md), which must be
/// served as schema-valid JSON (else it retries five times, ~95 s). The
/// preset pins the model and so never makes that call.
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

/// The mock's context length: a [`Scenario::Compact`] filled at or past it
/// is refused as over the context.
const MOCK_MAX_MODEL_LEN: u32 = 262_144;

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

/// `polar mock-backend` on a free loopback port; killed on drop.
struct Mock {
    child: Child,
    url: String,
}

impl Mock {
    /// Started with the built-in policy, or with `script` (a file) and
    /// `GET /served`.
    fn start(script: Option<&Path>) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut cmd = Command::new(polar_bin()?);
        cmd
            // Qwen Code's first prompt alone is ~40k of the mock's tokens.
            .args(["mock-backend", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--max-model-len", &MOCK_MAX_MODEL_LEN.to_string()]);
        if let Some(script) = script {
            cmd.arg("--script").arg(script).arg("--record-served");
        }
        let child = cmd
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

    /// What the mock served (`GET /served`), by session.
    fn served(&self) -> Result<BTreeMap<String, Vec<Value>>> {
        let addr = self.url.trim_start_matches("http://");
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

/// What is wrong with one harness's session, if anything (`served`: what
/// the mock served this session, for [`Scenario::Steps`]).
fn check(name: &str, run: &SessionRun, scenario: Scenario, served: &[Value]) -> Vec<String> {
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
        Scenario::Steps | Scenario::Compact(..) => problems.extend(task_check(&run.workspace())),
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
/// each served generation is in exactly one record and each record is one
/// served generation (prompt ids, response ids, logprobs bit for bit).
fn served_problems(calls: &[CompletionRecord], served: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    if served.is_empty() {
        problems.push("the mock served nothing for this session".into());
    }
    let mut taken = vec![false; served.len()];
    for c in calls {
        let (Some(prompt), Some(response)) = (&c.prompt_token_ids, &c.response_token_ids) else {
            problems.push(format!("call {} has no token ids", c.call_id));
            continue;
        };
        let found = served.iter().enumerate().position(|(i, g)| {
            !taken[i]
                && id_list(&g["prompt_token_ids"]) == *prompt
                && id_list(&g["token_ids"]) == *response
        });
        let Some(i) = found else {
            problems.push(format!(
                "call {} ({} prompt, {} response tokens) is no generation the mock served",
                c.call_id,
                prompt.len(),
                response.len()
            ));
            continue;
        };
        taken[i] = true;
        let want = f32_list(&served[i]["logprobs"]);
        let bits = |l: &[f32]| l.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        match &c.response_logprobs {
            Some(got) if bits(got) == bits(&want) => {}
            got => problems.push(format!(
                "call {}: logprobs {:?} differ from the served {:?}",
                c.call_id,
                got.as_ref().map(Vec::len),
                want.len()
            )),
        }
    }
    for (g, _) in served.iter().zip(&taken).filter(|(_, t)| !**t) {
        problems.push(format!(
            "served generation #{} ({} prompt tokens) is in no captured record",
            g["number"],
            id_list(&g["prompt_token_ids"]).len()
        ));
    }
    problems
}

/// What is wrong with the exported rows against the records: every call is
/// in exactly one row; each row's tokens are its last call's prompt and
/// response, with loss 1 exactly on the merged calls' generated tokens and
/// their logprobs there; the main chain went through the four steps; calls
/// offering no tools or asking for structured output are `side`.
fn row_problems(calls: &[CompletionRecord], rows: &[Value], scenario: Scenario) -> Vec<String> {
    let mut problems = Vec::new();
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
        let side_call = merged
            .iter()
            .any(|c| c.request.response_format.is_some() || c.request.tools.is_empty());
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
    if matches!(scenario, Scenario::Compact(..)) {
        problems.extend(compaction_problems(rows));
        return problems;
    }
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
    if main.len() != 1 {
        problems.push(format!(
            "the main chain is {} segments: {main:?}",
            main.len()
        ));
    }
    problems
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
/// (`gemini --version` alone can take 30 s under load).
static ONE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the harnesses at once (in native sandboxes, or in docker
/// containers of `docker`'s engine); fails with every problem of every
/// harness.
fn run_all(
    harnesses: &[&'static str],
    base_url: bool,
    docker: Option<&Engine>,
    scenario: Scenario,
) -> Result<()> {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = harness_dir();
    ensure!(
        dir.join("node_modules/.bin").is_dir(),
        "the harness CLIs are not installed in {}: run `cargo xtask harnesses`",
        dir.display()
    );
    let tmp = sandbox_tempdir()?;
    let script = match scenario {
        Scenario::Demo => None,
        Scenario::Steps => Some(write_file(tmp.path(), "script.toml", STEPS_SCRIPT)?),
        Scenario::Compact(fills_after, tokens) => Some(write_file(
            tmp.path(),
            "script.toml",
            &compact_script(fills_after, tokens),
        )?),
    };
    let mock = Mock::start(script.as_deref().map(Path::new))?;
    let extra = docker.map(|e| e.sandbox_table("")).unwrap_or_default() + GEMINI_AUTO;
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
                    "e2e-{}{}{}{}",
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
                    "400",
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
    let served = match scenario {
        Scenario::Demo => BTreeMap::new(),
        Scenario::Steps | Scenario::Compact(..) => mock.served()?,
    };
    let mut problems = Vec::new();
    for (h, session, run) in &runs {
        let served = served.get(session).map_or(&[][..], Vec::as_slice);
        problems.extend(
            check(h, run, scenario, served)
                .into_iter()
                .map(|p| format!("{h}: {p}")),
        );
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
        Scenario::Demo,
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
        Scenario::Demo,
    )
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn harnesses_in_base_url_mode_are_captured_by_their_session_key() -> Result<()> {
    run_all(&["claude_code", "qwen_code"], true, None, Scenario::Demo)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn six_unmodified_harnesses_do_a_four_step_task_and_every_served_call_is_captured_exactly()
-> Result<()> {
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
        Scenario::Steps,
    )
}

/// Gemini CLI choosing its model per turn asks a classifier for JSON under
/// a schema: served as schema-valid JSON by the backend's constrained
/// decoding, the session goes through the four steps with no retry.
#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn gemini_cli_routing_its_turns_gets_json_for_its_schema_and_does_the_task() -> Result<()> {
    run_all(&["custom:gemini-auto"], false, None, Scenario::Steps)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn codex_compacts_a_full_context_server_side_and_finishes_with_every_segment_labelled() -> Result<()>
{
    run_all(&["codex"], false, None, Scenario::Compact(2, 262_000))
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn claude_code_compacts_a_full_context_and_finishes_with_every_segment_labelled() -> Result<()> {
    run_all(&["claude_code"], false, None, Scenario::Compact(3, 300_000))
}
