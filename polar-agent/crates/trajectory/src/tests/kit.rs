//! A tiny tokenizer, a ChatML-like renderer with the template switches real
//! templates have (`strip_reasoning`, `generation_glue`), and a session
//! simulator that turns conversations into `CompletionRecord`s the way the
//! capture layer would.

use serde_json::Map;

use crate::{SessionMeta, SessionOutcome, TemplateInfo};
use polar_chat::Api;
use polar_chat::{ChatRequest, ChatResponse, FinishReason, Message, Role, Sampling, Tokens, Usage};
use polar_record::{
    BackendInfo, CallStatus, CompletionRecord, NativeRequest, RECORD_VERSION, Timings,
};

pub const IM_START: u32 = 1;
pub const IM_END: u32 = 2;
pub const THINK: u32 = 3;
pub const END_THINK: u32 = 4;
pub const NL: u32 = 5;
pub const SYSTEM: u32 = 6;
pub const USER: u32 = 7;
pub const ASSISTANT: u32 = 8;
pub const TOOL_RESP: u32 = 9;
pub const END_TOOL_RESP: u32 = 10;
/// Three newlines as one token (`"\n\n\n"`).
pub const WS3: u32 = 12;
/// Four newlines as one token (`"\n\n\n\n"`).
pub const WS4: u32 = 13;
/// Glue some templates put in the generation prompt only.
pub const GLUE: [u32; 6] = [THINK, NL, NL, END_THINK, NL, NL];

/// The tiny tokenizer: one id per word, from 100 up.
pub fn tok(text: &str) -> Vec<u32> {
    text.split_whitespace()
        .map(|w| {
            let h = w.bytes().fold(2_166_136_261u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(16_777_619)
            });
            100 + h % 5000
        })
        .collect()
}

/// The template's special ids, as a deployment would configure them.
pub fn template() -> TemplateInfo {
    TemplateInfo {
        end_of_turn: vec![IM_END],
        think: vec![THINK, END_THINK],
        whitespace: Vec::new(),
    }
}

/// [`template`] with the whitespace tokens, for [`Render::echo_whitespace`].
pub fn template_ws() -> TemplateInfo {
    TemplateInfo {
        whitespace: vec![NL, WS3, WS4],
        ..template()
    }
}

pub fn meta() -> SessionMeta {
    SessionMeta {
        session_id: "s-1".into(),
        task_id: Some("task-1".into()),
        group_id: None,
        attempt: None,
        superseded_attempts: 0,
        outcome: SessionOutcome::Completed,
        ended_by: None,
        evaluation: None,
        policy_version: None,
        instruction: None,
    }
}

/// One assistant turn as the model generates it.
#[derive(Clone, Debug, Default)]
pub struct Turn {
    pub reasoning: Vec<u32>,
    pub content: Vec<u32>,
    /// Cut by the token limit after this many generated tokens.
    pub cut: Option<usize>,
}

impl Turn {
    pub fn new(reasoning: &str, content: &str) -> Self {
        Self {
            reasoning: tok(reasoning),
            content: tok(content),
            cut: None,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Msg {
    System(Vec<u32>),
    User(Vec<u32>),
    Tool(Vec<u32>),
    Assistant(Turn),
}

/// The renderer's switches.
#[derive(Clone, Copy, Debug, Default)]
pub struct Render {
    /// History renders assistant turns without their reasoning.
    pub strip_reasoning: bool,
    /// The generation prompt carries an empty think block (and the model
    /// then generates no reasoning); history never shows it.
    pub generation_glue: bool,
    /// The harness echoes the whitespace between a turn's reasoning and
    /// its content (what a tool parser returns as content, `"\n\n"`) and
    /// the template merges it with its own newlines, as Qwen3's does: the
    /// history shows `assistant` + [`WS4`] + content when the reasoning is
    /// stripped, `assistant\n<think>..</think>` + [`WS3`] + content when it
    /// is kept.
    pub echo_whitespace: bool,
}

impl Render {
    /// The tokens the model generates for `turn`.
    pub fn response(&self, turn: &Turn) -> Vec<u32> {
        let mut out = Vec::new();
        if !self.generation_glue && !turn.reasoning.is_empty() {
            out.push(THINK);
            out.extend(&turn.reasoning);
            out.extend([END_THINK, NL, NL]);
        }
        out.extend(&turn.content);
        out.push(IM_END);
        if let Some(m) = turn.cut {
            out.truncate(m.clamp(1, out.len().saturating_sub(1).max(1)));
        }
        out
    }

    /// The prompt: the messages, then the generation prompt.
    pub fn prompt(&self, msgs: &[Msg]) -> Vec<u32> {
        let mut out = Vec::new();
        for m in msgs {
            let (role, body) = match m {
                Msg::System(t) => (SYSTEM, t.clone()),
                Msg::User(t) => (USER, t.clone()),
                Msg::Tool(t) => {
                    let mut b = vec![TOOL_RESP];
                    b.extend(t);
                    b.push(END_TOOL_RESP);
                    (USER, b)
                }
                Msg::Assistant(turn) => {
                    if let Some(echoed) = self.history_echoed(turn) {
                        out.extend([IM_START, ASSISTANT]);
                        out.extend(echoed);
                        out.extend([IM_END, NL]);
                        continue;
                    }
                    (ASSISTANT, self.history(turn))
                }
            };
            out.extend([IM_START, role, NL]);
            out.extend(body);
            out.extend([IM_END, NL]);
        }
        out.extend([IM_START, ASSISTANT, NL]);
        if self.generation_glue {
            out.extend(GLUE);
        }
        out
    }

    /// With `echo_whitespace`, a whole (not cut) turn with reasoning as
    /// history shows it after `assistant`, up to its closing IM_END.
    fn history_echoed(&self, turn: &Turn) -> Option<Vec<u32>> {
        if !self.echo_whitespace
            || self.generation_glue
            || turn.cut.is_some()
            || turn.reasoning.is_empty()
        {
            return None;
        }
        let mut out = Vec::new();
        if self.strip_reasoning {
            out.push(WS4);
        } else {
            out.extend([NL, THINK]);
            out.extend(&turn.reasoning);
            out.extend([END_THINK, WS3]);
        }
        out.extend(&turn.content);
        Some(out)
    }

    /// An assistant turn as history shows it (without the closing IM_END).
    fn history(&self, turn: &Turn) -> Vec<u32> {
        let mut generated = self.response(turn);
        if generated.last() == Some(&IM_END) {
            generated.pop();
        }
        if !self.strip_reasoning {
            return generated;
        }
        match generated.iter().position(|&t| t == END_THINK) {
            Some(p) => generated[p + 1..]
                .iter()
                .copied()
                .skip_while(|&t| t == NL)
                .collect(),
            None if generated.first() == Some(&THINK) => Vec::new(),
            None => generated,
        }
    }
}

fn text_of(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

fn chat_message(m: &Msg) -> Message {
    match m {
        Msg::System(t) => Message::text(Role::System, text_of(t)),
        Msg::User(t) => Message::text(Role::User, text_of(t)),
        Msg::Tool(t) => Message::text(Role::Tool, text_of(t)),
        Msg::Assistant(turn) => Message::text(Role::Assistant, text_of(&turn.content)),
    }
}

/// Records calls the way the capture layer does.
#[derive(Debug, Default)]
pub struct Sim {
    pub render: Render,
    pub records: Vec<CompletionRecord>,
}

impl Sim {
    pub fn new(render: Render) -> Self {
        Self {
            render,
            records: Vec::new(),
        }
    }

    /// Records a completed call of `msgs` answered with `turn`; returns its
    /// index.
    pub fn call(&mut self, msgs: &[Msg], turn: &Turn) -> usize {
        let seq = self.records.len() as u64;
        let prompt = self.render.prompt(msgs);
        let response = self.render.response(turn);
        let logprobs: Vec<f32> = (0..response.len())
            .map(|j| -0.01 * (seq as f32 + 1.0) - 0.0001 * j as f32)
            .collect();
        let finish = if turn.cut.is_some() {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let request = ChatRequest {
            model: "m".into(),
            messages: msgs.iter().map(chat_message).collect(),
            tools: Vec::new(),
            tool_choice: None,
            response_format: None,
            sampling: Sampling::default(),
            stream: true,
            extra: Map::new(),
        };
        let reply = ChatResponse {
            id: format!("r{seq}"),
            model: "m".into(),
            message: Message::text(Role::Assistant, text_of(&turn.content)),
            finish_reason: finish.clone(),
            usage: Usage {
                prompt_tokens: prompt.len() as u32,
                completion_tokens: response.len() as u32,
                cached_tokens: None,
            },
            tokens: Tokens::default(),
        };
        self.records.push(CompletionRecord {
            version: RECORD_VERSION,
            call_id: format!("c{seq}"),
            seq,
            session_id: "s-1".into(),
            task_id: Some("task-1".into()),
            policy_version: None,
            native_request: NativeRequest {
                api: Api::OpenaiChat,
                method: "POST".into(),
                host: "api.openai.com".into(),
                path: "/v1/chat/completions".into(),
                body: polar_json::RawJson::null(),
            },
            request,
            response: Some(reply),
            prompt_token_ids: Some(prompt),
            response_token_ids: Some(response),
            response_logprobs: Some(logprobs),
            token_ids_missing: false,
            finish_reason: Some(finish),
            backend: BackendInfo {
                name: "mock".into(),
                replica: "http://127.0.0.1:1".into(),
                served_model: "m".into(),
                weight_version: Some("v1".into()),
                serving: None,
            },
            timings: Timings::default(),
            resumed: None,
            status: CallStatus::Completed,
        });
        self.records.len() - 1
    }

    /// Records a call whose backend gave no token ids.
    pub fn call_without_ids(&mut self, msgs: &[Msg], turn: &Turn) -> usize {
        let i = self.call(msgs, turn);
        let r = &mut self.records[i];
        r.prompt_token_ids = None;
        r.response_token_ids = None;
        r.response_logprobs = None;
        r.token_ids_missing = true;
        i
    }

    /// Records a failed call.
    pub fn call_failed(&mut self, msgs: &[Msg]) -> usize {
        let i = self.call(msgs, &Turn::default());
        let r = &mut self.records[i];
        r.response = None;
        r.response_token_ids = None;
        r.response_logprobs = None;
        r.finish_reason = None;
        r.status = CallStatus::Failed {
            side: "backend".into(),
            error: "upstream reset".into(),
        };
        i
    }

    pub fn prompt(&self, i: usize) -> &[u32] {
        self.records[i]
            .prompt_token_ids
            .as_deref()
            .unwrap_or_default()
    }

    pub fn response(&self, i: usize) -> &[u32] {
        self.records[i]
            .response_token_ids
            .as_deref()
            .unwrap_or_default()
    }

    pub fn logprobs(&self, i: usize) -> &[f32] {
        self.records[i]
            .response_logprobs
            .as_deref()
            .unwrap_or_default()
    }
}

/// A conversation of one agent.
#[derive(Clone, Debug)]
pub struct Convo {
    pub msgs: Vec<Msg>,
}

impl Convo {
    pub fn new(system: &str, task: &str) -> Self {
        Self {
            msgs: vec![Msg::System(tok(system)), Msg::User(tok(task))],
        }
    }

    /// Calls the model and appends its turn to the history.
    pub fn step(&mut self, sim: &mut Sim, turn: Turn) -> usize {
        let i = sim.call(&self.msgs, &turn);
        self.msgs.push(Msg::Assistant(turn));
        i
    }

    pub fn tool(&mut self, result: &str) {
        self.msgs.push(Msg::Tool(tok(result)));
    }
}

/// Expected trace content built by hand: glue (loss 0, logprob 0) and
/// responses (loss 1, their logprobs).
#[derive(Debug, Default)]
pub struct Expect {
    pub ids: Vec<u32>,
    pub mask: Vec<u8>,
    pub logprobs: Vec<f32>,
}

impl Expect {
    pub fn glue(mut self, tokens: &[u32]) -> Self {
        self.ids.extend(tokens);
        self.mask.extend(std::iter::repeat_n(0, tokens.len()));
        self.logprobs.extend(std::iter::repeat_n(0.0, tokens.len()));
        self
    }

    pub fn generated(mut self, sim: &Sim, i: usize) -> Self {
        self.ids.extend(sim.response(i));
        self.mask
            .extend(std::iter::repeat_n(1, sim.response(i).len()));
        self.logprobs.extend(sim.logprobs(i));
        self
    }
}
