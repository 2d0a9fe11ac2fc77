//! The mock's scripted policy: what the "model" answers on each turn of a
//! session.
//!
//! A script file is TOML, or JSON when its name ends in `.json`:
//!
//! ```toml
//! final_text = "done"            # answer once a session's turns run out (default "done")
//!
//! [[sessions]]
//! id = "*"                       # a session id, or "*" for every session without its own entry
//!
//! [[sessions.turns]]             # turn 1
//! think = "I should write the file."            # optional <think> text
//! text = "Writing it."                          # optional answer text
//! tool_calls = [
//!   { shell = "echo hi > a.txt" },              # the offered shell tool, argument name from its schema
//!   { name = "write_file", arguments = { path = "a.txt", content = "hi" } },
//! ]
//!
//! [[sessions.turns]]             # turn 2: an HTTP error
//! error = { status = 500, message = "injected" }
//!
//! [[sessions.turns]]             # turn 3: the connection is cut after 3 generated tokens
//! text = "a long answer that never arrives whole"
//! disconnect_after = 3
//!
//! [[sessions.turns]]             # turn 4: reported as cut by the token limit
//! text = "partial"
//! finish_reason = "length"       # "stop" (default) or "length": no <|im_end|>, finish_reason length
//! delay_ms = 200                 # extra wait before the first token
//!
//! [[sessions.turns]]             # turn 5: aborted after 4 generated tokens (0: before any)
//! text = "Step 3. <tool_call> never finished"
//! abort_after = 4                # finish_reason "abort", as SGLang/vLLM answer an aborted request
//! ```
//!
//! Each request of a session consumes its next turn, errors included, so a
//! retry after an error gets the following turn. The session is the
//! `x-polar-session` header, else the request's `user` field, else `h-` and a
//! hash of the first user message.
//!
//! With `step_by = "tool_results"` on a session's entry, the turn is chosen
//! by the conversation's progress instead: turn `n` (from 0) answers a
//! request whose conversation holds `n` tool results, so side calls, retries
//! and resent requests never shift it. A request that offers no tools (a
//! title, a router, a summary), or whose last message is a user message
//! asking for a summary after tool results (a harness compacting), is
//! answered `Steps done: N. polar-progress: N` instead; when a summary like it comes back in a later conversation (the
//! harness compacted its history), the count restarts from its `N` (see
//! [`PROGRESS_NOTE`]), so the script goes on where it was.
//!
//! A `tool_results` session may also say when its context "fills": once a
//! conversation holds `context_fills_after` tool results after its last
//! progress note, replies report `context_tokens` prompt tokens in their
//! usage (the ids stay the real ones), so that a harness that compacts on a
//! nearly full context does; a summary request is never filled. With
//! `context_tokens` at or past the mock's `--max-model-len` the request is
//! refused instead, with vLLM's 400 for a prompt over the context, so that
//! a harness that compacts only when its provider says the prompt is too
//! long (Claude Code without a configured window) does.
//!
//! ```toml
//! [[sessions]]
//! id = "*"
//! step_by = "tool_results"
//! context_fills_after = 3        # optional
//! context_tokens = 190000        # the prompt tokens then reported
//! turns = [
//!   { tool_calls = [{ shell = "printf 'polar 1\\n' > notes.txt" }] },
//!   { tool_calls = [{ shell = "grep -q 'polar 2' notes.txt" }] },
//! ]
//! ```
//!
//! Without a script file the built-in policy answers: when tools are offered
//! and no tool result follows the last user message, a call of the shell tool
//! (a tool named bash, shell, exec_command, run_shell_command, Bash or
//! terminal (Hermes Agent's), else the first tool) running
//! `echo polar > polar-demo.txt`, with the argument
//! named as the tool's schema names it (`command` or `cmd`; an array-typed
//! `command` gets `["bash", "-lc", ...]`); otherwise the text "done".

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::MockError;
use super::template::PromptFacts;
use polar_chat::Tool;

/// The command the built-in policy runs.
pub const DEMO_COMMAND: &str = "echo polar > polar-demo.txt";

/// The note a `tool_results` session's answer to a tool-less request ends
/// with, followed by the progress (a decimal count): a conversation holding
/// it counts its progress from there.
pub const PROGRESS_NOTE: &str = "polar-progress: ";

/// The progress count of the last [`PROGRESS_NOTE`] in `text`.
pub fn progress_note(text: &str) -> Option<usize> {
    let (_, after) = text.rsplit_once(PROGRESS_NOTE)?;
    let digits = after.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

/// A script file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// Answer once a session's turns run out.
    #[serde(default)]
    pub final_text: Option<String>,
    /// Per-session turn lists.
    #[serde(default)]
    pub sessions: Vec<SessionScript>,
}

/// The turns of one session (or of every session, with id `*`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionScript {
    /// Session id or `*`.
    pub id: String,
    /// How the turn of a request is chosen.
    #[serde(default)]
    pub step_by: StepBy,
    /// (`tool_results` sessions) After this many tool results since the
    /// last progress note, report a full context.
    #[serde(default)]
    pub context_fills_after: Option<usize>,
    /// The prompt tokens a full context reports.
    #[serde(default)]
    pub context_tokens: Option<usize>,
    /// Turns, in order.
    #[serde(default)]
    pub turns: Vec<Turn>,
}

/// How a session's turn is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepBy {
    /// Each request takes the next turn, errors included.
    #[default]
    Requests,
    /// The turn is the conversation's progress (its tool results); requests
    /// offering no tools get the progress note.
    ToolResults,
}

/// One scripted turn.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// Reasoning text.
    #[serde(default)]
    pub think: Option<String>,
    /// Answer text.
    #[serde(default)]
    pub text: Option<String>,
    /// Tool calls.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// Answer with this HTTP error instead.
    #[serde(default)]
    pub error: Option<ScriptedError>,
    /// Cut the connection after this many generated tokens.
    #[serde(default)]
    pub disconnect_after: Option<u32>,
    /// Finish reason override.
    #[serde(default)]
    pub finish_reason: Option<ScriptedFinish>,
    /// Abort the request after this many generated tokens (HTTP 200,
    /// finish reason `abort`).
    #[serde(default)]
    pub abort_after: Option<u32>,
    /// Extra wait before the first token, in milliseconds.
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

/// A scripted tool call: either `name` + `arguments`, or `shell`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    /// Tool name.
    #[serde(default)]
    pub name: Option<String>,
    /// Arguments (any JSON; TOML tables work).
    #[serde(default)]
    pub arguments: Option<Value>,
    /// A shell command for the offered shell tool.
    #[serde(default)]
    pub shell: Option<String>,
}

/// A scripted HTTP error.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedError {
    /// HTTP status.
    pub status: u16,
    /// Error message.
    #[serde(default)]
    pub message: Option<String>,
}

/// A scripted finish reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptedFinish {
    /// A normal end (the default).
    Stop,
    /// Reported as cut by the token limit.
    Length,
}

/// What to generate for one request, resolved against the offered tools.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Reasoning text.
    pub think: Option<String>,
    /// Answer text.
    pub text: String,
    /// Tool calls: name and arguments JSON text.
    pub tool_calls: Vec<(String, String)>,
    /// Answer with an HTTP error: status and message.
    pub error: Option<(u16, String)>,
    /// Cut the connection after this many tokens.
    pub disconnect_after: Option<usize>,
    /// Report `length` and leave out the end-of-turn token.
    pub force_length: bool,
    /// Finish with `abort` after this many tokens.
    pub abort_after: Option<usize>,
    /// Extra wait before the first token.
    pub delay: Option<Duration>,
    /// The prompt tokens to report in the usage instead of the real count.
    pub usage_prompt_tokens: Option<usize>,
    /// The tool choice that forces the calls, when one does: they are
    /// generated as guided decoding makes them (bare JSON, see
    /// [`crate::forced`]).
    pub forced: Option<crate::forced::Forced>,
}

impl Script {
    /// Loads a script: JSON when the name ends in `.json`, TOML otherwise.
    pub fn load(path: &Path) -> Result<Self, MockError> {
        let text = std::fs::read_to_string(path).map_err(|source| MockError::ScriptRead {
            path: path.to_owned(),
            source,
        })?;
        let invalid = |reason: String| MockError::ScriptInvalid {
            path: path.to_owned(),
            reason,
        };
        let script: Self = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?
        } else {
            toml::from_str(&text).map_err(|e| invalid(e.to_string()))?
        };
        for (s, session) in script.sessions.iter().enumerate() {
            if session.context_fills_after.is_some() != session.context_tokens.is_some()
                || (session.context_fills_after.is_some() && session.step_by != StepBy::ToolResults)
            {
                return Err(invalid(format!(
                    "sessions[{s}]: `context_fills_after` and `context_tokens` go together, in a `tool_results` session"
                )));
            }
            for (t, turn) in session.turns.iter().enumerate() {
                for (c, call) in turn.tool_calls.iter().enumerate() {
                    if call.name.is_some() == call.shell.is_some() {
                        return Err(invalid(format!(
                            "sessions[{s}].turns[{t}].tool_calls[{c}]: give either `name` or `shell`"
                        )));
                    }
                }
            }
        }
        Ok(script)
    }
}

/// The policy: a script with per-session cursors, or the built-in one.
#[derive(Debug, Default)]
pub struct Policy {
    script: Option<Script>,
    cursors: Mutex<HashMap<String, usize>>,
}

impl Policy {
    /// The built-in policy.
    pub fn builtin() -> Self {
        Self::default()
    }

    /// A scripted policy.
    pub fn scripted(script: Script) -> Self {
        Self {
            script: Some(script),
            cursors: Mutex::default(),
        }
    }

    /// The plan for the next request of `session`.
    pub fn next(&self, session: &str, facts: &PromptFacts) -> Plan {
        let Some(script) = &self.script else {
            return builtin_plan(facts);
        };
        let entry = session_entry(script, session);
        if let Some(e) = entry.filter(|e| e.step_by == StepBy::ToolResults) {
            return progress_plan(script, e, facts);
        }
        let index = {
            let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
            let cursor = cursors.entry(session.to_owned()).or_insert(0);
            *cursor += 1;
            *cursor - 1
        };
        plan_at(script, entry, index, facts)
    }

    /// The plan of the turn `session` got last, again (a request sent
    /// again: see `resume`); its next turn when it got none.
    pub fn repeat(&self, session: &str, facts: &PromptFacts) -> Plan {
        let Some(script) = &self.script else {
            return builtin_plan(facts);
        };
        if let Some(e) = session_entry(script, session).filter(|e| e.step_by == StepBy::ToolResults)
        {
            return progress_plan(script, e, facts);
        }
        let index = {
            let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
            let cursor = cursors.entry(session.to_owned()).or_insert(0);
            if *cursor == 0 {
                *cursor = 1;
            }
            *cursor - 1
        };
        plan_at(script, session_entry(script, session), index, facts)
    }

    /// The plans of every turn `session` may get (a continuation looks for
    /// its own: see `resume`), without using one up.
    pub fn turns_of(&self, session: &str, facts: &PromptFacts) -> Vec<Plan> {
        let Some(script) = &self.script else {
            return vec![builtin_plan(facts)];
        };
        let entry = session_entry(script, session);
        if let Some(e) = entry.filter(|e| e.step_by == StepBy::ToolResults) {
            return vec![progress_plan(script, e, facts)];
        }
        let turns = entry.map_or(0, |e| e.turns.len());
        (0..=turns)
            .map(|i| plan_at(script, entry, i, facts))
            .collect()
    }
}

fn session_entry<'a>(script: &'a Script, session: &str) -> Option<&'a SessionScript> {
    script
        .sessions
        .iter()
        .find(|s| s.id == session)
        .or_else(|| script.sessions.iter().find(|s| s.id == "*"))
}

/// The plan of turn `index` of `entry` (the final text past its turns).
fn plan_at(
    script: &Script,
    entry: Option<&SessionScript>,
    index: usize,
    facts: &PromptFacts,
) -> Plan {
    match entry.and_then(|e| e.turns.get(index)) {
        Some(turn) => plan_of(turn, &facts.tools),
        None => final_plan(script),
    }
}

/// The answer once a session's turns run out.
fn final_plan(script: &Script) -> Plan {
    Plan {
        text: script
            .final_text
            .clone()
            .unwrap_or_else(|| "done".to_owned()),
        ..Plan::default()
    }
}

/// The plan of a `tool_results` session: the turn its progress reached.
fn progress_plan(script: &Script, entry: &SessionScript, facts: &PromptFacts) -> Plan {
    // A summary request (what a harness sends to compact) is not filled:
    // the harness sends it to make room.
    let summary = facts.tools.is_empty() || facts.summary_request;
    let full = entry
        .context_fills_after
        .filter(|&n| facts.fresh_tool_results >= n && !summary)
        .and(entry.context_tokens);
    let mut plan = progress_turn(script, entry, facts);
    plan.usage_prompt_tokens = full;
    plan
}

fn progress_turn(script: &Script, entry: &SessionScript, facts: &PromptFacts) -> Plan {
    if facts.tools.is_empty() || facts.summary_request {
        let n = facts.progress;
        return Plan {
            text: format!("Steps done: {n}. {PROGRESS_NOTE}{n}"),
            ..Plan::default()
        };
    }
    match entry.turns.get(facts.progress) {
        Some(turn) => plan_of(turn, &facts.tools),
        None => final_plan(script),
    }
}

fn builtin_plan(facts: &PromptFacts) -> Plan {
    if facts.tools.is_empty() || facts.tool_result_after_last_user {
        return Plan {
            text: "done".to_owned(),
            ..Plan::default()
        };
    }
    Plan {
        tool_calls: vec![shell_call(&facts.tools, DEMO_COMMAND)],
        ..Plan::default()
    }
}

fn plan_of(turn: &Turn, tools: &[Tool]) -> Plan {
    Plan {
        think: turn.think.clone(),
        text: turn.text.clone().unwrap_or_default(),
        tool_calls: turn
            .tool_calls
            .iter()
            .map(|c| match (&c.shell, &c.name) {
                (Some(cmd), _) => shell_call(tools, cmd),
                (None, name) => (
                    name.clone().unwrap_or_default(),
                    c.arguments.clone().unwrap_or_else(|| json!({})).to_string(),
                ),
            })
            .collect(),
        error: turn.error.as_ref().map(|e| {
            let message = e.message.clone();
            (
                e.status,
                message.unwrap_or_else(|| "scripted error".to_owned()),
            )
        }),
        disconnect_after: turn.disconnect_after.map(|n| n as usize),
        force_length: turn.finish_reason == Some(ScriptedFinish::Length),
        abort_after: turn.abort_after.map(|n| n as usize),
        delay: turn.delay_ms.map(Duration::from_millis),
        usage_prompt_tokens: None,
        forced: None,
    }
}

/// A call of the offered shell tool running `command`.
pub fn shell_call(tools: &[Tool], command: &str) -> (String, String) {
    const SHELLS: [&str; 6] = [
        "bash",
        "shell",
        "exec_command",
        "run_shell_command",
        "Bash",
        "terminal",
    ];
    let tool = tools
        .iter()
        .find(|t| SHELLS.contains(&t.name.as_str()))
        .or_else(|| {
            tools
                .iter()
                .find(|t| SHELLS.iter().any(|s| t.name.eq_ignore_ascii_case(s)))
        })
        .or_else(|| tools.first());
    let Some(tool) = tool else {
        return ("bash".to_owned(), json!({ "command": command }).to_string());
    };
    let parameters = tool.parameters.to_value();
    let props = parameters.get("properties");
    let key = ["command", "cmd"]
        .into_iter()
        .find(|k| props.and_then(|p| p.get(k)).is_some())
        .unwrap_or("command");
    let is_array = props
        .and_then(|p| p.get(key))
        .and_then(|p| p.get("type"))
        .and_then(Value::as_str)
        == Some("array");
    let value = if is_array {
        json!(["bash", "-lc", command])
    } else {
        json!(command)
    };
    let mut args = serde_json::Map::new();
    args.insert(key.to_owned(), value);
    (tool.name.clone(), Value::Object(args).to_string())
}

#[cfg(test)]
#[path = "script_tests.rs"]
mod tests;
