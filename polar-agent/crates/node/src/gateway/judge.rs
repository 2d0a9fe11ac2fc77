//! The judge model of the `llm_judge` evaluator on a gateway node: one
//! inference client per `[[backend]]`, made apart from the capture stage's
//! (the judge's calls never pass the proxy or the capture log, so they can
//! never enter a trajectory), without the backend's sampling overrides
//! (the judge samples deterministically: temperature 0, top-p 1, the
//! spec's seed). Each call is recorded in the session's directory as one
//! line of `judge.jsonl` (prompt, answer, token ids), beside the policy's
//! `calls.jsonl`; the evaluation's detail carries the scores.
//!
//! Also the transcript the judge reads ([`transcript`]): the session's
//! last answered call, its conversation and answer as text.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use polar_chat::{ChatRequest, Message, Part, Role, Sampling};
use polar_evaluate::{Judge, JudgeCall, JudgeFuture, JudgeReply};
use polar_inference::{BackendConfig, Client, SamplingMode, SamplingPolicy};
use polar_record::CompletionRecord;

/// The file of a session's judge calls.
pub const JUDGE_FILE: &str = "judge.jsonl";

/// The judge's clients, one per backend, in the configuration's order.
pub struct JudgeClients {
    clients: Vec<Result<Arc<Client>, String>>,
    names: Vec<String>,
}

impl JudgeClients {
    /// Clients for `backends`, their sampling overrides left out.
    pub fn new(backends: &[BackendConfig]) -> Self {
        let clients = backends
            .iter()
            .map(|b| {
                let mut cfg = b.clone();
                cfg.sampling = SamplingPolicy::default();
                Client::new(cfg).map(Arc::new).map_err(|e| e.to_string())
            })
            .collect();
        Self {
            clients,
            names: backends.iter().map(|b| b.name.clone()).collect(),
        }
    }

    /// The judge of one session, recording under `session_dir`.
    pub fn for_session(self: &Arc<Self>, session: String, session_dir: PathBuf) -> SessionJudge {
        SessionJudge {
            clients: Arc::clone(self),
            session,
            log: session_dir.join(JUDGE_FILE),
        }
    }

    fn client(&self, backend: Option<&str>) -> Result<Arc<Client>, String> {
        let index = match backend {
            None if self.names.is_empty() => {
                return Err("this node has no [[backend]] to judge with".into());
            }
            None => 0,
            Some(name) => self.names.iter().position(|n| n == name).ok_or_else(|| {
                format!(
                    "no backend {name:?} on this node (its backends: {})",
                    self.names.join(", ")
                )
            })?,
        };
        self.clients[index].clone()
    }
}

/// The judge of one session.
pub struct SessionJudge {
    clients: Arc<JudgeClients>,
    session: String,
    log: PathBuf,
}

impl SessionJudge {
    async fn ask(&self, call: JudgeCall) -> Result<JudgeReply, String> {
        let client = self.clients.client(call.backend.as_deref())?;
        let cfg = client.config();
        let model = call
            .model
            .clone()
            .unwrap_or_else(|| cfg.served_model.clone());
        let req = ChatRequest {
            model: model.clone(),
            messages: vec![Message::text(Role::User, call.prompt.clone())],
            tools: Vec::new(),
            tool_choice: None,
            response_format: None,
            sampling: Sampling {
                max_tokens: Some(call.max_tokens),
                temperature: Some(0.0),
                top_p: Some(1.0),
                seed: Some(call.seed),
                ..Sampling::default()
            },
            stream: false,
            extra: Map::new(),
        };
        // The judge's own affinity key: never the session's, whose replica
        // holds the policy's prefix.
        let key = format!("judge-{}", self.session);
        let done = client
            .chat_in_mode(&key, &req, SamplingMode::default())
            .await
            .map_err(|e| e.to_string())?
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        let text: String = done
            .response
            .message
            .content
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        let tokens = &done.response.tokens;
        let record = json!({
            "session_id": self.session,
            "backend": done.backend.backend,
            "model": model,
            "seed": call.seed,
            "max_tokens": call.max_tokens,
            "prompt": call.prompt,
            "answer": text,
            "finish_reason": done.response.finish_reason,
            "prompt_token_ids": tokens.prompt_token_ids,
            "response_token_ids": tokens.response_token_ids,
            "response_logprobs": tokens.response_logprobs,
        });
        let path = self.log.clone();
        tokio::task::spawn_blocking(move || append_line(&path, &record))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("recording the judge's call in {}: {e}", self.log.display()))?;
        Ok(JudgeReply {
            text,
            backend: done.backend.backend.clone(),
            model,
            prompt_tokens: u64::from(done.response.usage.prompt_tokens),
            response_tokens: u64::from(done.response.usage.completion_tokens),
        })
    }
}

impl Judge for SessionJudge {
    fn call<'a>(&'a self, call: JudgeCall) -> JudgeFuture<'a> {
        Box::pin(self.ask(call))
    }
}

/// Appends one JSON line to `path` (the agent's own state directory,
/// which no sandbox sees) and syncs it.
/// Appends `value` as a line of `path`, its directory (the agent's session
/// directory, which a session without model calls has not made yet) made
/// where missing.
fn append_line(path: &std::path::Path, value: &Value) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(&line)?;
    f.sync_data()
}

/// The transcript of a session for the judge: its last answered call's
/// conversation and answer, one `[role]` block per message, tool calls and
/// results with their names. Empty when no call was answered.
pub fn transcript(records: &[CompletionRecord]) -> String {
    let Some(last) = records.iter().rev().find(|r| r.response.is_some()) else {
        return String::new();
    };
    let mut out = String::new();
    let answer = last.response.as_ref().map(|r| &r.message);
    for m in last.request.messages.iter().chain(answer) {
        let role = serde_json::to_value(m.role)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        match (&m.role, &m.name) {
            (Role::Tool, Some(name)) => out.push_str(&format!("[tool {name}]\n")),
            _ => out.push_str(&format!("[{role}]\n")),
        }
        let text = m.joined_text();
        if !text.is_empty() {
            out.push_str(&text);
            out.push('\n');
        }
        for c in &m.tool_calls {
            out.push_str(&format!("-> {}({})\n", c.name, c.arguments));
        }
    }
    out
}
