//! A synthetic rollout for tests, benchmarks and demos: deterministic
//! multi-turn tool-using sessions (a main agent and optionally one
//! interleaved sub-agent, ChatML-like token layout, reasoning, logprobs,
//! messages with text of realistic size), grouped into tasks, with
//! outcomes and rewards; and the writer of the session directories
//! `polar export` reads (`calls.jsonl`, `session.json`).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use polar_capture_log::encode_two_parts;
use polar_chat::Api;
use polar_chat::{
    ChatRequest, ChatResponse, FinishReason, Message, Reasoning, Role, Sampling, Tokens, Tool,
    ToolCall, Usage,
};
use polar_record::{
    BackendInfo, CallStatus, CompletionRecord, NativeRequest, RECORD_VERSION, Timings,
};
use polar_trajectory::{EndedBy, Rewards, SessionMeta, SessionOutcome, TemplateInfo};

use super::source::{CALLS_FILE, SESSION_FILE, SESSIONS_DIR};

const IM_START: u32 = 1;
const IM_END: u32 = 2;
const THINK: u32 = 3;
const END_THINK: u32 = 4;
const NL: u32 = 5;
const SYSTEM: u32 = 6;
const USER: u32 = 7;
const ASSISTANT: u32 = 8;
const TOOL_RESP: u32 = 9;
const END_TOOL_RESP: u32 = 10;

/// The special token ids of the sample's template.
pub fn template() -> TemplateInfo {
    TemplateInfo {
        end_of_turn: vec![IM_END],
        think: vec![THINK, END_THINK],
        whitespace: Vec::new(),
    }
}

const WORDS: &[&str] = &[
    "the", "file", "function", "returns", "error", "test", "passes", "import", "module", "value",
    "list", "check", "build", "cargo", "python", "line", "changed", "fix", "patch", "diff",
    "should", "config", "parse", "string", "number", "output", "input", "read", "write", "path",
    "struct", "impl",
];

/// Sizes of the synthetic rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleSpec {
    /// Sessions.
    pub sessions: usize,
    /// Distinct tasks (sessions are spread over them).
    pub tasks: usize,
    /// Main-agent calls per session.
    pub calls: usize,
    /// Calls of one sub-agent per session, interleaved (0: none).
    pub sub_agent_calls: usize,
    /// Tokens of the system prompt.
    pub system_tokens: usize,
    /// Reasoning tokens per reply.
    pub reasoning_tokens: usize,
    /// Answer tokens per reply.
    pub answer_tokens: usize,
    /// Tokens of each tool result.
    pub tool_tokens: usize,
    /// Seed.
    pub seed: u64,
}

impl SampleSpec {
    /// A few small sessions: fast tests.
    pub fn small() -> Self {
        Self {
            sessions: 4,
            tasks: 2,
            calls: 4,
            sub_agent_calls: 2,
            system_tokens: 50,
            reasoning_tokens: 8,
            answer_tokens: 12,
            tool_tokens: 30,
            seed: 7,
        }
    }

    /// Sessions shaped like a coding agent's: 40 main calls with 2,000
    /// tokens of system prompt and 600-token tool results (about 40,000
    /// tokens of context by the end), plus an 8-call sub-agent.
    pub fn realistic() -> Self {
        Self {
            sessions: 16,
            tasks: 4,
            calls: 40,
            sub_agent_calls: 8,
            system_tokens: 2_000,
            reasoning_tokens: 120,
            answer_tokens: 200,
            tool_tokens: 600,
            seed: 42,
        }
    }
}

/// One synthetic session.
#[derive(Clone, Debug)]
pub struct SampleSession {
    /// Its metadata (task, group, outcome).
    pub meta: SessionMeta,
    /// Its calls, in `seq` order.
    pub records: Vec<CompletionRecord>,
    /// Its outcome reward.
    pub rewards: Rewards,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn ids(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| 100 + u32::try_from(self.next() % 150_000).unwrap_or(0))
            .collect()
    }
}

fn text(ids: &[u32]) -> String {
    let mut out = String::with_capacity(ids.len() * 6);
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[*id as usize % WORDS.len()]);
    }
    out
}

fn turn(role: u32, body: &[u32]) -> Vec<u32> {
    let mut out = vec![IM_START, role, NL];
    out.extend(body);
    out.extend([IM_END, NL]);
    out
}

/// One agent's conversation: token history and messages.
struct Agent {
    name: &'static str,
    tokens: Vec<u32>,
    messages: Vec<Message>,
}

impl Agent {
    fn new(rng: &mut Rng, name: &'static str, spec: &SampleSpec) -> Self {
        let system = rng.ids(spec.system_tokens);
        let user = rng.ids(spec.answer_tokens);
        let mut tokens = turn(SYSTEM, &system);
        tokens.extend(turn(USER, &user));
        tokens.extend([IM_START, ASSISTANT, NL]);
        Self {
            name,
            tokens,
            messages: vec![
                Message::text(Role::System, text(&system)),
                Message::text(Role::User, text(&user)),
            ],
        }
    }

    /// The request of the next call: the conversation so far.
    fn request(&self) -> ChatRequest {
        ChatRequest {
            model: "policy".into(),
            messages: self.messages.clone(),
            tools: tools(),
            tool_choice: None,
            response_format: None,
            sampling: Sampling {
                max_tokens: Some(4096),
                temperature: Some(1.0),
                ..Sampling::default()
            },
            stream: true,
            extra: Map::new(),
        }
    }

    /// The next prompt: the reply as generated (`response`, `reply`), then
    /// a random result of call `call_id`.
    fn answer(
        &mut self,
        rng: &mut Rng,
        spec: &SampleSpec,
        response: &[u32],
        reply: Message,
        call_id: String,
    ) {
        let tool_result = rng.ids(spec.tool_tokens);
        self.tokens.extend(response);
        self.tokens.push(NL);
        let mut body = vec![TOOL_RESP];
        body.extend(&tool_result);
        body.push(END_TOOL_RESP);
        self.tokens.extend(turn(USER, &body));
        self.tokens.extend([IM_START, ASSISTANT, NL]);
        self.messages.push(reply);
        let mut tool_msg = Message::text(Role::Tool, text(&tool_result));
        tool_msg.tool_call_id = Some(call_id);
        self.messages.push(tool_msg);
    }
}

fn tools() -> Vec<Tool> {
    vec![Tool {
        name: "bash".into(),
        description: Some("Run a shell command".into()),
        parameters: polar_json::RawJson::from_value(&json!({
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"]
        })),
    }]
}

struct CallCtx<'a> {
    spec: &'a SampleSpec,
    session: &'a str,
    task: &'a str,
    seq: u64,
    last: bool,
}

fn call(rng: &mut Rng, agent: &mut Agent, c: &CallCtx<'_>) -> CompletionRecord {
    let reasoning = rng.ids(c.spec.reasoning_tokens);
    let answer = rng.ids(c.spec.answer_tokens);
    let mut response = vec![THINK];
    response.extend(&reasoning);
    response.push(END_THINK);
    response.extend(&answer);
    response.push(IM_END);
    let logprobs: Vec<f32> = (0..response.len())
        .map(|j| -((rng.next() % 4096) as f32) / 1024.0 - 0.001 * (j % 7) as f32)
        .collect();
    let finish = if c.last {
        FinishReason::Stop
    } else {
        FinishReason::ToolCalls
    };
    let tool_call = ToolCall {
        id: format!("call_{}_{}", agent.name, c.seq),
        name: "bash".into(),
        arguments: json!({"command": text(&answer[..answer.len().min(6)])}).to_string(),
    };
    let mut reply = Message::text(Role::Assistant, text(&answer));
    reply.reasoning = Some(Reasoning {
        text: text(&reasoning),
        signature: None,
        encrypted: None,
    });
    if !c.last {
        reply.tool_calls = vec![tool_call.clone()];
    }
    let prompt = agent.tokens.clone();
    let request = agent.request();
    let started = 1_700_000_000_000 + c.seq * 2_000;
    let record = CompletionRecord {
        version: RECORD_VERSION,
        call_id: format!("{}-c{}", c.session, c.seq),
        seq: c.seq,
        session_id: c.session.to_owned(),
        task_id: Some(c.task.to_owned()),
        policy_version: Some("policy-7".into()),
        native_request: NativeRequest {
            api: Api::OpenaiChat,
            method: "POST".into(),
            host: "api.openai.com".into(),
            path: "/v1/chat/completions".into(),
            body: polar_json::RawJson::null(),
        },
        request,
        response: Some(ChatResponse {
            id: format!("resp-{}", c.seq),
            model: "policy".into(),
            message: reply.clone(),
            finish_reason: finish.clone(),
            usage: Usage {
                prompt_tokens: u32::try_from(prompt.len()).unwrap_or(u32::MAX),
                completion_tokens: u32::try_from(response.len()).unwrap_or(u32::MAX),
                cached_tokens: None,
            },
            tokens: Tokens::default(),
        }),
        prompt_token_ids: Some(prompt),
        response_token_ids: Some(response.clone()),
        response_logprobs: Some(logprobs),
        token_ids_missing: false,
        finish_reason: Some(finish),
        backend: BackendInfo {
            name: "vllm".into(),
            replica: "http://127.0.0.1:8000".into(),
            served_model: "policy".into(),
            weight_version: Some("step-100".into()),
            serving: None,
        },
        timings: Timings {
            sent_ms: Some(started + 20),
            received_ms: started,
            first_token_ms: Some(started + 100),
            finished_ms: started + 1_500,
        },
        resumed: None,
        status: CallStatus::Completed,
    };
    agent.answer(rng, c.spec, &response, reply, tool_call.id);
    record
}

/// Session `index` of `spec`.
pub fn session(spec: &SampleSpec, index: usize) -> SampleSession {
    let mut rng = Rng(spec.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (index as u64 + 1) | 1);
    let session = format!("s-{index:04}");
    let task = format!("task-{}", index % spec.tasks.max(1));
    let mut main = Agent::new(&mut rng, "main", spec);
    let mut sub = Agent::new(&mut rng, "sub", spec);
    let mut records = Vec::with_capacity(spec.calls + spec.sub_agent_calls);
    let mut sub_left = spec.sub_agent_calls;
    for i in 0..spec.calls {
        let ctx = CallCtx {
            spec,
            session: &session,
            task: &task,
            seq: records.len() as u64,
            last: i + 1 == spec.calls,
        };
        records.push(call(&mut rng, &mut main, &ctx));
        if sub_left > 0 && i >= 1 {
            sub_left -= 1;
            let ctx = CallCtx {
                seq: records.len() as u64,
                last: sub_left == 0,
                ..ctx
            };
            records.push(call(&mut rng, &mut sub, &ctx));
        }
    }
    let (outcome, ended_by) = if index % 4 == 3 {
        (SessionOutcome::Timeout, EndedBy::Budget)
    } else {
        (SessionOutcome::Completed, EndedBy::Policy)
    };
    // Every other session ran on the rollout path, some after earlier
    // attempts set apart; the others (`polar harness run`) have no attempt.
    let attempt = index.is_multiple_of(2).then(|| 1 + (index / 2 % 3) as u32);
    SampleSession {
        meta: SessionMeta {
            session_id: session,
            task_id: Some(task.clone()),
            group_id: Some(task),
            attempt,
            superseded_attempts: attempt.map_or(0, |a| a as usize - 1),
            outcome,
            ended_by: Some(ended_by),
            evaluation: Some(json!({"tests_passed": index % 3, "tests_total": 2})),
            policy_version: Some("policy-7".into()),
            instruction: None,
        },
        records,
        rewards: Rewards::Outcome((index % 3) as f64 / 2.0),
    }
}

/// Writes `s` as a captured session under `state_dir`
/// (`sessions/<id>/calls.jsonl` and `session.json`); returns its directory.
pub fn write_session_dir(state_dir: &Path, s: &SampleSession) -> std::io::Result<PathBuf> {
    let dir = state_dir.join(SESSIONS_DIR).join(&s.meta.session_id);
    std::fs::create_dir_all(&dir)?;
    let mut calls = std::io::BufWriter::new(std::fs::File::create(dir.join(CALLS_FILE))?);
    for r in &s.records {
        // As the agent writes them: a completed call (streamed by the
        // backend) as its request part and its completion, a failed one as
        // one whole line.
        if r.status == CallStatus::Completed {
            let (part, end) = encode_two_parts(r).map_err(std::io::Error::other)?;
            calls.write_all(&part)?;
            calls.write_all(&end)?;
        } else {
            serde_json::to_writer(&mut calls, r)?;
            calls.write_all(b"\n")?;
        }
    }
    calls.flush()?;
    let mut info = serde_json::to_value(&s.meta)?;
    if let (Value::Object(m), Rewards::Outcome(r)) = (&mut info, &s.rewards) {
        m.insert("reward".into(), json!(r));
    }
    std::fs::write(dir.join(SESSION_FILE), serde_json::to_vec_pretty(&info)?)?;
    Ok(dir)
}
