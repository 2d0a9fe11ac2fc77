//! Shared pieces of the capture tests: an agent in base-URL mode on
//! loopback with the capture stage, a plain hyper client, the four APIs'
//! request shapes (from the provider fixtures), and checks of replies and
//! of the capture log against the mock's tokenizer.
#![allow(
    dead_code,
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

pub mod traj;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use polar_capture::{LogProblem, SessionInfo, read_log};
use polar_chat::Api;
pub use polar_chat::provider::sse::EventJson;
use polar_config::Config;
use polar_ids::SessionId;
use polar_inference::{BackendConfig, SamplingMode, request::chat_body};
use polar_io::http::{ClientOptions, HttpClient};
use polar_mock::openai::ChatIn;
use polar_mock::template::{TemplateOptions, render_prompt};
use polar_mock::tokenizer;
use polar_node::agent::AgentParts;
use polar_proxy::base_url::{self, KEY_HEADER, SESSION_HEADER};
use polar_record::{CallStatus, CompletionRecord};
use polar_sse::{SseEvent, parse_all};
use serde_json::{Value, json};
use tempfile::TempDir;

/// The fixtures directory.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/chat/tests/fixtures/providers/requests")
}

/// A fixture request body.
pub fn fixture(name: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The `[[backend]]` of a test (short timeouts).
pub fn backend_toml(name: &str, url: &str, timeout_ms: u64) -> String {
    format!(
        "[[backend]]\nname = \"{name}\"\ndialect = \"vllm\"\nreplicas = [\"{url}\"]\n\
         served_model = \"polar-mock\"\nrequest_timeout_ms = {timeout_ms}\nconnect_timeout_ms = 200\n"
    )
}

/// An agent serving base-URL mode on loopback with the capture stage.
pub struct TestAgent {
    pub addr: SocketAddr,
    pub state: Arc<TempDir>,
    pub parts: AgentParts,
    pub config: Config,
}

impl TestAgent {
    /// Starts an agent with `extra` TOML (backends) in a fresh state dir.
    pub async fn start(extra: &str) -> Self {
        Self::start_in(Arc::new(tempfile::tempdir().unwrap()), extra).await
    }

    /// Starts an agent on an existing state dir (a restart).
    pub async fn start_in(state: Arc<TempDir>, extra: &str) -> Self {
        let text = format!(
            "[agent]\nstate_dir = \"{}\"\n{extra}",
            state.path().display()
        );
        let config = Config::from_toml_str(&text).unwrap();
        let parts = AgentParts::build(config.clone()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        parts.tasks.spawn(base_url::serve(
            listener,
            Arc::clone(&parts.sessions),
            parts.rules.clone(),
            parts.proxy.pipeline(),
            parts.proxy.limits(),
            Arc::clone(parts.proxy.shares()),
            Arc::clone(&parts.proxy.stats),
            parts.tasks.clone(),
        ));
        Self {
            addr,
            state,
            parts,
            config,
        }
    }

    /// Accepts `session` as part of `task`, its id as its key (as
    /// `polar proxy` does: [`request`] sends both).
    pub fn session(&self, id: &str, task: &str) -> SessionId {
        let s: SessionId = id.parse().unwrap();
        self.parts.sessions.register(&s, Some(id));
        self.parts.registry.register(&s, SessionInfo::task(task));
        s
    }

    /// The session's log.
    pub fn calls(&self, session: &str) -> (Vec<CompletionRecord>, Vec<LogProblem>) {
        calls_in(self.state.path(), session)
    }

    /// The first backend's settings.
    pub fn backend(&self) -> &BackendConfig {
        &self.config.backends[0]
    }

    /// Stops serving.
    pub async fn stop(self) -> Arc<TempDir> {
        self.parts.tasks.drain(Duration::from_secs(2)).await;
        self.state
    }
}

/// A session's log under `state`.
pub fn calls_in(state: &Path, session: &str) -> (Vec<CompletionRecord>, Vec<LogProblem>) {
    read_log(&state.join("sessions").join(session).join("calls.jsonl")).unwrap()
}

/// A reply as the client saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn events(&self) -> Vec<SseEvent> {
        parse_all(&self.body).unwrap()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A plain HTTP/1.1 client.
pub fn client() -> HttpClient {
    polar_io::http::client(&ClientOptions::new())
}

/// A request to the agent.
pub fn request(
    addr: SocketAddr,
    session: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header(SESSION_HEADER, session)
        .header(KEY_HEADER, session);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body)).unwrap()
}

/// Sends a request and reads the whole reply.
pub async fn send(req: Request<Full<Bytes>>) -> Reply {
    let resp = client().request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// One harness API's request shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Harness {
    /// Claude Code: Anthropic Messages.
    Claude,
    /// Qwen Code: OpenAI Chat.
    Qwen,
    /// Codex: OpenAI Responses.
    Codex,
    /// Gemini CLI.
    Gemini,
}

pub const HARNESSES: [Harness; 4] = [
    Harness::Claude,
    Harness::Qwen,
    Harness::Codex,
    Harness::Gemini,
];

impl Harness {
    pub fn api(self) -> Api {
        match self {
            Self::Claude => Api::AnthropicMessages,
            Self::Qwen => Api::OpenaiChat,
            Self::Codex => Api::OpenaiResponses,
            Self::Gemini => Api::Gemini,
        }
    }

    /// The fixture request of the harness's second turn.
    pub fn fixture(self) -> Value {
        fixture(match self {
            Self::Claude => "claude_code_turn2.json",
            Self::Qwen => "qwen_turn2.json",
            Self::Codex => "codex_turn2.json",
            Self::Gemini => "gemini_cli_turn2.json",
        })
    }

    /// A first-turn request offering the harness's shell tool.
    pub fn first_turn(self) -> Value {
        let schema = json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]});
        match self {
            Self::Claude => json!({
                "model": "claude-opus-4-8", "max_tokens": 1024,
                "system": [{"type": "text", "text": "You are Claude Code."}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Create out.txt"}]}],
                "tools": [{"name": "Bash", "description": "Run a command.", "input_schema": schema}],
            }),
            Self::Qwen => json!({
                "model": "qwen3-coder",
                "messages": [
                    {"role": "system", "content": "You are Qwen Code."},
                    {"role": "user", "content": "Create out.txt"}
                ],
                "tools": [{"type": "function", "function": {"name": "run_shell_command", "description": "Run.", "parameters": schema}}],
                "stream_options": {"include_usage": true},
            }),
            Self::Codex => json!({
                "model": "gpt-5",
                "input": [
                    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Create out.txt"}]}
                ],
                "tools": [{"type": "function", "name": "exec_command", "description": "Run.", "strict": false,
                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}],
                "store": true,
            }),
            Self::Gemini => json!({
                "contents": [{"role": "user", "parts": [{"text": "Create out.txt"}]}],
                "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
                "tools": [{"functionDeclarations": [{"name": "run_shell_command", "description": "Run.", "parametersJsonSchema": schema}]}],
            }),
        }
    }

    /// The request for `body`, streamed or not, the way the harness sends it.
    pub fn request(
        self,
        addr: SocketAddr,
        session: &str,
        mut body: Value,
        stream: bool,
    ) -> Request<Full<Bytes>> {
        let (path, headers): (String, Vec<(&str, &str)>) = match self {
            Self::Claude => (
                "/v1/messages?beta=true".into(),
                vec![("anthropic-version", "2023-06-01"), ("x-api-key", "k")],
            ),
            Self::Qwen => ("/v1/chat/completions".into(), vec![]),
            Self::Codex => ("/v1/responses".into(), vec![]),
            Self::Gemini => (
                if stream {
                    "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse".into()
                } else {
                    "/v1beta/models/gemini-2.5-pro:generateContent".into()
                },
                vec![("x-goog-api-key", "k")],
            ),
        };
        if self != Self::Gemini {
            body["stream"] = json!(stream);
        }
        let mut h = headers;
        h.push(("content-type", "application/json"));
        request(
            addr,
            session,
            Method::POST,
            &path,
            &h,
            Bytes::from(body.to_string()),
        )
    }

    /// Checks that `reply` is a complete, valid reply in the harness's API
    /// (event order for streams); returns the tool call ids it carries.
    pub fn check_reply(self, reply: &Reply, stream: bool) -> Vec<String> {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        if stream {
            let ct = reply.headers["content-type"].to_str().unwrap();
            assert_eq!(ct, "text/event-stream");
            assert_eq!(reply.headers["cache-control"], "no-cache");
            check_events(self, &reply.events())
        } else {
            check_body(self, &reply.json())
        }
    }
}

fn check_events(h: Harness, events: &[SseEvent]) -> Vec<String> {
    assert!(!events.is_empty());
    let mut ids = Vec::new();
    match h {
        Harness::Claude => {
            let names: Vec<&str> = events.iter().filter_map(|e| e.event.as_deref()).collect();
            assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
            assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
            assert!(names.contains(&"message_delta"));
            let starts = names
                .iter()
                .filter(|n| **n == "content_block_start")
                .count();
            let stops = names.iter().filter(|n| **n == "content_block_stop").count();
            assert_eq!(starts, stops);
            for e in events {
                let v = e.json().unwrap();
                if v["type"] == "content_block_start" && v["content_block"]["type"] == "tool_use" {
                    ids.push(v["content_block"]["id"].as_str().unwrap().to_owned());
                }
            }
        }
        Harness::Qwen => {
            assert_eq!(events.last().unwrap().data, "[DONE]");
            let chunks: Vec<Value> = events[..events.len() - 1]
                .iter()
                .map(|e| e.json().unwrap())
                .collect();
            assert!(
                chunks
                    .iter()
                    .all(|c| c["object"] == "chat.completion.chunk")
            );
            assert!(
                chunks
                    .iter()
                    .any(|c| c["choices"][0]["finish_reason"].is_string())
            );
            for c in &chunks {
                if let Some(calls) = c["choices"][0]["delta"]["tool_calls"].as_array() {
                    ids.extend(
                        calls
                            .iter()
                            .filter_map(|t| t["id"].as_str().map(str::to_owned)),
                    );
                }
            }
        }
        Harness::Codex => {
            let values: Vec<Value> = events.iter().map(|e| e.json().unwrap()).collect();
            assert_eq!(values[0]["type"], "response.created");
            assert_eq!(values.last().unwrap()["type"], "response.completed");
            for (i, v) in values.iter().enumerate() {
                assert_eq!(v["sequence_number"], json!(i), "{v}");
                assert_eq!(
                    events[i].event.as_deref(),
                    v["type"].as_str(),
                    "event name matches type"
                );
                if v["type"] == "response.output_item.done" && v["item"]["type"] == "function_call"
                {
                    ids.push(v["item"]["call_id"].as_str().unwrap().to_owned());
                }
            }
        }
        Harness::Gemini => {
            let values: Vec<Value> = events.iter().map(|e| e.json().unwrap()).collect();
            assert!(
                values.last().unwrap()["candidates"][0]["finishReason"].is_string(),
                "{values:?}"
            );
            for v in &values {
                for p in v["candidates"][0]["content"]["parts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    if let Some(id) = p["functionCall"]["id"].as_str() {
                        ids.push(id.to_owned());
                    }
                }
            }
        }
    }
    ids
}

fn check_body(h: Harness, v: &Value) -> Vec<String> {
    match h {
        Harness::Claude => {
            assert_eq!(v["type"], "message", "{v}");
            assert!(v["stop_reason"].is_string());
            v["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| b["id"].as_str().unwrap().to_owned())
                .collect()
        }
        Harness::Qwen => {
            assert_eq!(v["object"], "chat.completion", "{v}");
            assert!(v["choices"][0]["finish_reason"].is_string());
            v["choices"][0]["message"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| t["id"].as_str().unwrap().to_owned())
                .collect()
        }
        Harness::Codex => {
            assert_eq!(v["object"], "response", "{v}");
            assert_eq!(v["status"], "completed");
            v["output"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|i| i["type"] == "function_call")
                .map(|i| i["call_id"].as_str().unwrap().to_owned())
                .collect()
        }
        Harness::Gemini => {
            assert!(v["candidates"][0]["finishReason"].is_string(), "{v}");
            v["candidates"][0]["content"]["parts"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|p| p["functionCall"]["id"].as_str().map(str::to_owned))
                .collect()
        }
    }
}

/// The next request of a tool-use exchange: `first` extended with the
/// harness's echo of `reply` (non-streamed) and a result for each call.
pub fn second_turn(h: Harness, mut first: Value, reply: &Value) -> Value {
    match h {
        Harness::Claude => {
            let content = reply["content"].clone();
            let results: Vec<Value> = content
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| json!({"type": "tool_result", "tool_use_id": b["id"], "content": "(no output)"}))
                .collect();
            let m = first["messages"].as_array_mut().unwrap();
            m.push(json!({"role": "assistant", "content": content}));
            m.push(json!({"role": "user", "content": results}));
        }
        Harness::Qwen => {
            let msg = reply["choices"][0]["message"].clone();
            let results: Vec<Value> = msg["tool_calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| json!({"role": "tool", "tool_call_id": t["id"], "content": "ok"}))
                .collect();
            let m = first["messages"].as_array_mut().unwrap();
            m.push(msg);
            m.extend(results);
        }
        Harness::Codex => {
            let out = reply["output"].as_array().unwrap().clone();
            let results: Vec<Value> = out
                .iter()
                .filter(|i| i["type"] == "function_call")
                .map(|i| json!({"type": "function_call_output", "call_id": i["call_id"], "output": "ok"}))
                .collect();
            let input = first["input"].as_array_mut().unwrap();
            input.extend(out);
            input.extend(results);
        }
        Harness::Gemini => {
            let content = reply["candidates"][0]["content"].clone();
            let results: Vec<Value> = content["parts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p.get("functionCall").is_some())
                .map(|p| {
                    json!({"functionResponse": {"id": p["functionCall"]["id"], "name": p["functionCall"]["name"], "response": {"output": "ok"}}})
                })
                .collect();
            let c = first["contents"].as_array_mut().unwrap();
            c.push(content);
            c.push(json!({"role": "user", "parts": results}));
        }
    }
    first
}

/// The prompt ids the mock computes for a record's normalized request: the
/// request as the inference client sends it, read back by the mock (earlier
/// reasoning from the field the dialect's server reads), rendered
/// by its template (with the tools the backend's dialect renders) and
/// tokenized.
pub fn expected_prompt_ids(backend: &BackendConfig, record: &CompletionRecord) -> Vec<u32> {
    let body = chat_body(backend, &record.request, SamplingMode::Train);
    let parsed = ChatIn::parse(
        body.to_string().as_bytes(),
        polar_mock::HistoryReasoning::default_for(backend.dialect),
    )
    .unwrap();
    tokenizer::encode(&render_prompt(
        &parsed.messages,
        &parsed.template_tools(backend.dialect),
        &TemplateOptions::default(),
        true,
    ))
}

/// Checks a completed record's token data against the mock's tokenizer.
pub fn check_tokens(backend: &BackendConfig, record: &CompletionRecord) {
    assert_eq!(record.status, CallStatus::Completed, "{record:?}");
    assert!(!record.token_ids_missing);
    let prompt = record.prompt_token_ids.as_ref().unwrap();
    assert_eq!(prompt, &expected_prompt_ids(backend, record));
    let response = record.response_token_ids.as_ref().unwrap();
    let logprobs = record.response_logprobs.as_ref().unwrap();
    assert!(!response.is_empty());
    assert_eq!(response.len(), logprobs.len());
    assert!(logprobs.iter().all(|l| *l <= 0.0));
    let resp = record.response.as_ref().unwrap();
    assert_eq!(resp.usage.completion_tokens as usize, response.len());
    assert_eq!(resp.usage.prompt_tokens as usize, prompt.len());
    let text = tokenizer::decode(response).unwrap();
    for call in &resp.message.tool_calls {
        assert!(text.contains(&call.name), "{text}");
    }
    assert!(text.contains(&resp.message.joined_text()), "{text}");
    assert!(record.finish_reason.is_some());
    assert_eq!(record.backend.served_model, "polar-mock");
    let t = record.timings;
    // The call left the agent for its replica after it arrived and before
    // its first token.
    let (first, sent) = (t.first_token_ms.unwrap(), t.sent_ms.unwrap());
    assert!(t.received_ms <= sent && sent <= first, "{t:?}");
    assert!(t.finished_ms >= t.received_ms);
}
