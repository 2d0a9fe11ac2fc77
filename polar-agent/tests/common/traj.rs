//! Helpers of the trajectory scenario tests: a scripted mock behind an
//! agent, a Qwen Code-shaped conversation driven through them, the
//! session's records read back from the capture log, both builders run with
//! the invariant checker, and a precise check of a merged trace against the
//! records it was built from.

use std::iter::repeat_n;

use polar_chat::FinishReason;
use polar_mock::script::{Script, ScriptedCall, SessionScript, Turn};
use polar_mock::{self as mock, Dialect, MockConfig, MockHandle, tokenizer};
use polar_record::CompletionRecord;
use polar_trajectory::{
    self, Builder, CallSpan, DropReason, DroppedCall, Join, PrefixMergingOptions,
    ReconstructionStats, RetryPolicy, SessionMeta, SessionOutcome, SpliceShape, TemplateInfo,
    Trace, Trajectory,
};
use serde_json::{Value, json};

use super::{Harness, TestAgent, backend_toml, send};

/// A turn calling the shell tool with `command`.
pub fn shell(command: &str) -> Turn {
    Turn {
        tool_calls: vec![ScriptedCall {
            shell: Some(command.into()),
            ..ScriptedCall::default()
        }],
        ..Turn::default()
    }
}

/// A turn answering `text`.
pub fn text(text: &str) -> Turn {
    Turn {
        text: Some(text.into()),
        ..Turn::default()
    }
}

/// A mock answering `session` with `turns`, and an agent in front of it.
pub async fn start(session: &str, turns: Vec<Turn>) -> (MockHandle, TestAgent) {
    start_with(session, turns, Dialect::Vllm).await
}

/// [`start`] with the mock and the agent's backend speaking `dialect`.
pub async fn start_with(
    session: &str,
    turns: Vec<Turn>,
    dialect: Dialect,
) -> (MockHandle, TestAgent) {
    let mock = mock::start(MockConfig {
        dialect,
        script: Some(Script {
            final_text: None,
            sessions: vec![SessionScript {
                id: session.into(),
                turns,
                ..SessionScript::default()
            }],
        }),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let toml = backend_toml("mock", &mock.url(), 5000).replace(
        "dialect = \"vllm\"",
        &format!("dialect = \"{}\"", dialect.as_str()),
    );
    let agent = TestAgent::start(&toml).await;
    agent.session(session, "t");
    (mock, agent)
}

/// Stops the agent, then the mock.
pub async fn stop(mock: MockHandle, agent: TestAgent) {
    agent.stop().await;
    mock.stop().await;
}

/// An OpenAI Chat conversation as Qwen Code sends it, offering its shell tool.
#[derive(Clone, Debug)]
pub struct Convo {
    pub body: Value,
}

impl Convo {
    /// A conversation with a system prompt and a first user message.
    pub fn new(system: &str, user: &str) -> Self {
        let schema = json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]});
        Self {
            body: json!({
                "model": "qwen3-coder",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": user}
                ],
                "tools": [{"type": "function", "function": {"name": "run_shell_command", "description": "Run.", "parameters": schema}}],
            }),
        }
    }

    fn messages(&mut self) -> &mut Vec<Value> {
        self.body["messages"].as_array_mut().unwrap()
    }

    /// Appends a user message.
    pub fn user(&mut self, text: &str) {
        self.messages()
            .push(json!({"role": "user", "content": text}));
    }

    /// Appends the reply's assistant message and a result for each of its
    /// tool calls.
    pub fn answer(&mut self, reply: &Value) {
        let msg = reply["choices"][0]["message"].clone();
        let results: Vec<Value> = msg["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| json!({"role": "tool", "tool_call_id": t["id"], "content": "ok"}))
            .collect();
        let m = self.messages();
        m.push(msg);
        m.extend(results);
    }

    /// Sends the conversation as it stands (non-streamed) and returns the
    /// reply, checked as a valid OpenAI Chat reply.
    pub async fn send(&self, agent: &TestAgent, session: &str) -> Value {
        let reply =
            send(Harness::Qwen.request(agent.addr, session, self.body.clone(), false)).await;
        Harness::Qwen.check_reply(&reply, false);
        reply.json()
    }

    /// Sends, then appends the reply (and tool results) to the conversation.
    pub async fn step(&mut self, agent: &TestAgent, session: &str) -> Value {
        let reply = self.send(agent, session).await;
        self.answer(&reply);
        reply
    }
}

/// The session's `n` records read back from its capture log, in `seq`
/// order. A record is on disk before its reply's last bytes go out.
pub fn records(agent: &TestAgent, session: &str, n: usize) -> Vec<CompletionRecord> {
    let (mut records, problems) = agent.calls(session);
    assert!(problems.is_empty(), "{session}: {problems:?}");
    assert_eq!(records.len(), n, "{session}");
    records.sort_by_key(|r| r.seq);
    records
}

/// The mock template's special tokens.
pub fn template() -> TemplateInfo {
    TemplateInfo {
        end_of_turn: vec![tokenizer::IM_END, tokenizer::ENDOFTEXT],
        think: vec![tokenizer::THINK, tokenizer::THINK_END],
        whitespace: Vec::new(),
    }
}

/// `prefix_merging` with the mock template's tokens and `retries`.
pub fn merging(retries: RetryPolicy) -> Builder {
    Builder::PrefixMerging(PrefixMergingOptions {
        template: Some(template()),
        retries,
        ..PrefixMergingOptions::default()
    })
}

/// Builds the session's trajectory with `builder`, checks the invariants, and
/// checks `per_request` on the same records as well (one trace per call).
pub fn build(builder: &Builder, records: &[CompletionRecord], session: &str) -> Trajectory {
    let meta = SessionMeta {
        session_id: session.into(),
        task_id: Some("t".into()),
        group_id: None,
        attempt: None,
        superseded_attempts: 0,
        outcome: SessionOutcome::Completed,
        ended_by: None,
        evaluation: None,
        policy_version: None,
        instruction: None,
    };
    let traj = polar_trajectory::build(builder, records, &meta);
    polar_trajectory::check(&traj, records).unwrap();
    let per = polar_trajectory::build(&Builder::PerRequest, records, &meta);
    polar_trajectory::check(&per, records).unwrap();
    // Both builders leave out the same unusable calls.
    let unusable: Vec<DroppedCall> = traj
        .stats
        .calls_dropped
        .iter()
        .filter(|d| d.reason != DropReason::SupersededRetry)
        .cloned()
        .collect();
    assert_eq!(per.stats.calls_dropped, unusable, "{session}");
    assert_eq!(
        per.traces.len() + unusable.len(),
        records.len(),
        "{session}"
    );
    assert_eq!(per.stats.calls_merged, 0, "{session}");
    traj
}

pub fn prompt(r: &CompletionRecord) -> &[u32] {
    r.prompt_token_ids.as_deref().unwrap()
}

pub fn response(r: &CompletionRecord) -> &[u32] {
    r.response_token_ids.as_deref().unwrap()
}

pub fn logprobs(r: &CompletionRecord) -> &[f32] {
    r.response_logprobs.as_deref().unwrap()
}

/// A record's prompt + response.
pub fn seq(r: &CompletionRecord) -> Vec<u32> {
    let mut s = prompt(r).to_vec();
    s.extend(response(r));
    s
}

/// Length of the longest common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How `next` joins after `prev`, read from the tokens: a plain extension
/// when its prompt starts with `prev`'s prompt + response, else a template
/// splice where it leaves that sequence, resuming at the end-of-turn token
/// closing the re-rendered turn (after it, when `prev`'s response ends with
/// one of its own).
pub fn join_of(prev: &CompletionRecord, next: &CompletionRecord) -> Join {
    let (before, p) = (seq(prev), prompt(next));
    if p.starts_with(&before) {
        return Join::Extend;
    }
    let d = common_prefix(p, &before);
    let eot = p[d..].iter().position(|&t| t == tokenizer::IM_END).unwrap();
    let own = usize::from(response(prev).last() == Some(&tokenizer::IM_END));
    // The mock template's mismatches: think glue of the generation prompt
    // left out of the history, or reasoning stripped from it.
    let shape = if d < prompt(prev).len() {
        SpliceShape::GenerationGlue
    } else {
        SpliceShape::StrippedReasoning
    };
    Join::Splice {
        diverged_at: d,
        resumed_from: d + eot + own,
        shape: Some(shape),
    }
}

/// How many context tokens a splice join of `next` onto `prev` makes
/// differ: `prev`'s sequence from the divergence on and `next`'s
/// re-rendering of it (its prompt from the divergence to where the glue
/// resumes), each less their longest common suffix; the longer rest.
fn splice_off_policy(prev: &CompletionRecord, next: &CompletionRecord, join: Join) -> usize {
    let Join::Splice {
        diverged_at,
        resumed_from,
        ..
    } = join
    else {
        return 0;
    };
    let kept = &seq(prev)[diverged_at..];
    let rerendered = &prompt(next)[diverged_at..resumed_from];
    let common = kept
        .iter()
        .rev()
        .zip(rerendered.iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    (kept.len() - common).max(rerendered.len() - common)
}

/// Checks that `trace` is exactly `calls` merged: the first call's prompt,
/// then each call's glue (loss 0, logprob 0.0: the rest of its prompt after
/// the previous call's prompt + response, or from where a template splice
/// resumes, see [`join_of`]) and its response (loss 1, the backend's
/// logprobs); that the spans say so; and, without splices, that the
/// trace's tokens are the last call's prompt + response.
pub fn assert_merged(trace: &Trace, calls: &[&CompletionRecord]) {
    let ids: Vec<&str> = calls.iter().map(|r| r.call_id.as_str()).collect();
    assert_eq!(trace.call_ids, ids);
    assert_eq!(trace.prompt_ids, prompt(calls[0]));
    let (mut ids, mut mask, mut lps, mut spans) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut off_policy = 0;
    for (i, r) in calls.iter().enumerate() {
        let join = match i {
            0 => Join::First,
            _ => join_of(calls[i - 1], r),
        };
        if i > 0 {
            off_policy += splice_off_policy(calls[i - 1], r, join);
        }
        let glue = match join {
            Join::First => &[][..],
            Join::Extend => &prompt(r)[seq(calls[i - 1]).len()..],
            Join::Splice { resumed_from, .. } => &prompt(r)[resumed_from..],
        };
        ids.extend_from_slice(glue);
        mask.extend(repeat_n(0u8, glue.len()));
        lps.extend(repeat_n(0.0f32, glue.len()));
        spans.push(CallSpan {
            response_start: ids.len(),
            response_len: response(r).len(),
            join,
            truncated: r.finish_reason == Some(FinishReason::Length),
            policy_version: r
                .policy_version
                .clone()
                .or_else(|| r.backend.weight_version.clone()),
            weight_version: r.backend.weight_version.clone(),
            off_policy_context_tokens: off_policy,
            serving: r.backend.serving.clone(),
        });
        ids.extend_from_slice(response(r));
        mask.extend(repeat_n(1u8, response(r).len()));
        lps.extend_from_slice(logprobs(r));
    }
    assert_eq!(trace.response_ids, ids);
    assert_eq!(trace.loss_mask, mask);
    assert_eq!(trace.response_logprobs.as_deref(), Some(&lps[..]));
    assert_eq!(trace.spans, spans);
    assert_eq!(
        trace.metadata.off_policy_context_tokens,
        spans
            .iter()
            .map(|s| s.off_policy_context_tokens)
            .sum::<usize>()
    );
    if spans.iter().all(|s| !matches!(s.join, Join::Splice { .. })) {
        let mut all = trace.prompt_ids.clone();
        all.extend(&trace.response_ids);
        let last = calls[calls.len() - 1];
        assert_eq!(
            all,
            seq(last),
            "the trace's tokens are the last call's prompt + response"
        );
    }
}

/// `base` with the token totals of `traj`'s traces and their spans'
/// off-policy context counts (checked call by call by [`assert_merged`]),
/// counted here.
pub fn with_tokens(traj: &Trajectory, base: ReconstructionStats) -> ReconstructionStats {
    let t = &traj.traces;
    let spans = || t.iter().flat_map(|t| &t.spans);
    ReconstructionStats {
        off_policy_joins: spans().filter(|s| s.off_policy_context_tokens > 0).count(),
        off_policy_context_tokens: spans().map(|s| s.off_policy_context_tokens).sum(),
        prompt_tokens: t.iter().map(|t| t.prompt_ids.len()).sum(),
        response_tokens: t.iter().map(|t| t.response_ids.len()).sum(),
        loss_tokens: t
            .iter()
            .flat_map(|t| &t.loss_mask)
            .filter(|&&m| m == 1)
            .count(),
        ..base
    }
}
