//! Building a call's [`CompletionRecord`]: what is known when the call
//! arrives ([`Draft`]), completed with what the backend produced
//! ([`Produced`]: events, token data as the backend reported it, backend
//! facts, timings) and the outcome. The reply in the record carries no token
//! data of its own: the record's top-level `prompt_token_ids`,
//! `response_token_ids` and `response_logprobs` hold it, once.

use std::time::{SystemTime, UNIX_EPOCH};

use polar_capture_log::encode::{IdsFingerprint, PreEncoded};
use polar_chat::provider::{self, Side};
use polar_chat::{ChatRequest, ChatResponse, Sampling, StreamEvent, Tokens};
use polar_inference as inference;
use polar_record::{
    BackendInfo, CallStatus, CompletionRecord, NativeRequest, RECORD_VERSION, Resumed, Timings,
};

/// A record's fields known before the backend answers.
#[derive(Debug)]
pub struct Draft {
    /// Unique id of the call ([`call_id`]).
    pub call_id: String,
    /// Position in the session.
    pub seq: u64,
    /// The session.
    pub session_id: String,
    /// The session's task.
    pub task_id: Option<String>,
    /// The session's policy version ([`crate::SessionInfo::policy_version`]).
    pub policy_version: Option<String>,
    /// What the harness sent.
    pub native: NativeRequest,
    /// The normalized request (with `previous_response_id` history applied).
    pub request: ChatRequest,
    /// When the request arrived (ms since the Unix epoch).
    pub received_ms: u64,
}

/// What the backend side produced, however far it got (besides the
/// events it yielded).
#[derive(Debug, Default)]
pub struct Produced {
    /// The token data reported.
    pub tokens: Tokens,
    /// Which backend answered, once one did.
    pub backend: Option<inference::BackendInfo>,
    /// The client's timings, once the call was made.
    pub timings: Option<inference::Timings>,
    /// The backend's name (when no replica answered).
    pub backend_name: Option<String>,
    /// The parts of a reply that was failed over.
    pub resumed: Option<inference::Resumption>,
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A fresh call id: `call_` and 16 hex digits.
pub fn call_id() -> String {
    format!("call_{:016x}", rand::random::<u64>())
}

impl Draft {
    /// The record of a call that yielded `events` and ended as `failure`
    /// says (`None`: completed).
    pub fn finish(
        self,
        produced: Produced,
        events: &[StreamEvent],
        failure: Option<(Side, String)>,
    ) -> CompletionRecord {
        let Produced {
            tokens,
            backend,
            timings,
            backend_name,
            resumed,
        } = produced;
        let response: Option<ChatResponse> = match &failure {
            None => inference::stream::assemble(events, Tokens::default()),
            // A partial reply is kept for diagnosis (finish reason `abort`).
            Some(_) if !events.is_empty() => Some(partial_reply(events, &tokens)),
            Some(_) => None,
        };
        let status = match failure {
            None if response.is_some() => CallStatus::Completed,
            None => CallStatus::Failed {
                side: Side::Backend.to_string(),
                error: "the reply has no start or no finish".into(),
            },
            Some((side, error)) => CallStatus::Failed {
                side: side.to_string(),
                error,
            },
        };
        let finish_reason = match status {
            CallStatus::Completed => response.as_ref().map(|r| r.finish_reason.clone()),
            CallStatus::Failed { .. } => None,
        };
        let token_ids_missing =
            tokens.prompt_token_ids.is_none() || tokens.response_token_ids.is_none();
        let sent_ms = timings.as_ref().map(|t| epoch_ms(t.started_at + t.paused));
        let first_token_ms = timings.as_ref().and_then(|t| {
            t.first_token
                .map(|ft| epoch_ms(t.started_at + t.paused + ft))
        });
        let backend = match backend {
            Some(b) => BackendInfo {
                name: b.backend,
                replica: b.replica,
                served_model: b.served_model,
                weight_version: b.weight_version,
                serving: b.serving,
            },
            None => BackendInfo {
                name: backend_name.unwrap_or_default(),
                ..BackendInfo::default()
            },
        };
        CompletionRecord {
            version: RECORD_VERSION,
            call_id: self.call_id,
            seq: self.seq,
            session_id: self.session_id,
            task_id: self.task_id,
            policy_version: self.policy_version,
            native_request: self.native,
            request: self.request,
            response,
            prompt_token_ids: tokens.prompt_token_ids,
            response_token_ids: tokens.response_token_ids,
            response_logprobs: tokens.response_logprobs,
            token_ids_missing,
            finish_reason,
            backend,
            timings: Timings {
                received_ms: self.received_ms,
                sent_ms,
                first_token_ms,
                finished_ms: epoch_ms(SystemTime::now()),
            },
            resumed: resumed.map(|r| Resumed {
                replicas: r.replicas,
                part_tokens: r.part_tokens,
                weight_versions: r.weight_versions,
                faults: r.faults,
            }),
            status,
        }
    }
}

/// The reply of a call that failed after `events`: assembled as far as it
/// got. A reply cut before its finish has no usage from the backend: its
/// token counts are those of the token ids received (never estimated from
/// text).
fn partial_reply(events: &[StreamEvent], tokens: &Tokens) -> ChatResponse {
    let mut reply = provider::assemble(events);
    let finished = events
        .iter()
        .any(|e| matches!(e, StreamEvent::Finish { .. }));
    let len = |ids: &Option<Vec<u32>>| ids.as_ref().map(|i| i.len() as u32);
    if !finished && let Some(n) = len(&tokens.response_token_ids) {
        reply.usage.completion_tokens = n;
    }
    if reply.usage.prompt_tokens == 0
        && let Some(n) = len(&tokens.prompt_token_ids)
    {
        reply.usage.prompt_tokens = n;
    }
    reply
}

/// Keeps `ev` for the record, merged into the previous event when both are
/// pieces of the same text, reasoning or tool-call arguments: the reply
/// assembled from the kept events is the same, and a long reply is held as
/// a few events instead of one per token.
pub fn keep_event(events: &mut Vec<StreamEvent>, ev: StreamEvent) {
    match (events.last_mut(), ev) {
        (Some(StreamEvent::TextDelta { text }), StreamEvent::TextDelta { text: more })
        | (
            Some(StreamEvent::ReasoningDelta { text }),
            StreamEvent::ReasoningDelta { text: more },
        ) => text.push_str(&more),
        (
            Some(StreamEvent::ToolCallDelta { index, arguments }),
            StreamEvent::ToolCallDelta {
                index: i,
                arguments: more,
            },
        ) if *index == i => arguments.push_str(&more),
        (_, ev) => events.push(ev),
    }
}

/// A request with nothing in it (the normalized request of a call that
/// could not be parsed).
pub(crate) fn empty_request() -> ChatRequest {
    ChatRequest {
        model: String::new(),
        messages: Vec::new(),
        tools: Vec::new(),
        tool_choice: None,
        response_format: None,
        sampling: Sampling::default(),
        stream: false,
        extra: Default::default(),
    }
}

/// A request is serialized on the calling task when its native body is at
/// most this many bytes and nothing was added to its normalized form (no
/// `previous_response_id` history): a few tens of microseconds, less than
/// handing it to a blocking thread and back costs a busy core (two thread
/// switches; BENCHMARKS.md, "Capture log durability"). Larger ones go to a
/// blocking thread, off the async workers.
pub const INLINE_REQUEST_BYTES: usize = 16 * 1024;

/// Prompt ids serialized on the calling task: at most this many (about
/// 24 KB of JSON), as for [`INLINE_REQUEST_BYTES`].
pub(crate) const INLINE_PROMPT_IDS: usize = 4096;

/// A draft's native and normalized requests on loan while they are
/// serialized: already done (a small request), or by a blocking task while
/// the backend generates ([`Draft::encode_early`], [`Draft::restore`]).
#[derive(Debug)]
pub(crate) struct EarlyEncoding(Pending<(ChatRequest, PreEncoded)>);

/// Work done on the calling task, or running on a blocking thread.
#[derive(Debug)]
enum Pending<T> {
    Done(Box<T>),
    Blocking(tokio::task::JoinHandle<T>),
}

impl<T: Send + 'static> Pending<T> {
    /// Runs `work` here when `inline`, else on a blocking thread.
    fn start(inline: bool, work: impl FnOnce() -> T + Send + 'static) -> Self {
        if inline {
            Self::Done(Box::new(work()))
        } else {
            Self::Blocking(tokio::task::spawn_blocking(work))
        }
    }

    async fn finish(self) -> Result<T, tokio::task::JoinError> {
        match self {
            Self::Done(done) => Ok(*done),
            Self::Blocking(task) => task.await,
        }
    }
}

type EncodedPrompt = Option<(IdsFingerprint, Box<serde_json::value::RawValue>)>;

impl EarlyEncoding {
    /// Whether the requests are serialized already (they were small): their
    /// record is best written as one whole line when the call ends, a
    /// request part ahead of it would only add a write.
    pub fn is_done(&self) -> bool {
        matches!(self.0, Pending::Done(_))
    }

    /// The normalized request lent and the requests' serialized form;
    /// `None` if the task failed.
    pub async fn finish(self) -> Option<(ChatRequest, PreEncoded)> {
        match self.0.finish().await {
            Ok(done) => Some(done),
            Err(e) => {
                tracing::error!(error = %e, "serializing a record's requests failed; the normalized request is lost");
                None
            }
        }
    }
}

/// Prompt token ids being serialized (on the calling task when there are
/// at most [`INLINE_PROMPT_IDS`], else on a blocking thread).
#[derive(Debug)]
pub(crate) struct PromptEncoding(Pending<EncodedPrompt>);

impl PromptEncoding {
    /// Starts serializing `ids`.
    pub fn start(ids: Vec<u32>) -> Self {
        Self(Pending::start(ids.len() <= INLINE_PROMPT_IDS, move || {
            PreEncoded::prompt(&ids)
        }))
    }

    /// The serialized ids and their fingerprint (`None` if the task failed).
    pub async fn finish(self) -> EncodedPrompt {
        self.0.finish().await.ok().flatten()
    }
}

impl Draft {
    /// Serializes the native and normalized requests: here when they are
    /// small ([`INLINE_REQUEST_BYTES`]; `history_added`: the normalized
    /// request holds a `previous_response_id` conversation the native body
    /// does not), else on a blocking task. The normalized request is lent
    /// (the draft holds an empty one until [`Draft::restore`]); the native
    /// one is shared (its body is the request's bytes).
    pub(crate) fn encode_early(&mut self, history_added: bool) -> EarlyEncoding {
        let inline = !history_added && self.native.body.as_bytes().len() <= INLINE_REQUEST_BYTES;
        let native = self.native.clone();
        let request = std::mem::replace(&mut self.request, empty_request());
        EarlyEncoding(Pending::start(inline, move || {
            let pre = PreEncoded::requests(&native, &request);
            (request, pre)
        }))
    }

    /// Takes the requests back; returns their serialized form.
    pub(crate) async fn restore(&mut self, early: EarlyEncoding) -> PreEncoded {
        match early.finish().await {
            Some((request, pre)) => {
                self.request = request;
                pre
            }
            None => PreEncoded::default(),
        }
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    epoch_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_chat::{FinishReason, Usage};

    fn draft() -> Draft {
        Draft {
            call_id: "call_1".into(),
            seq: 0,
            session_id: "s".into(),
            task_id: None,
            policy_version: None,
            native: NativeRequest {
                api: polar_chat::Api::OpenaiChat,
                method: "POST".into(),
                host: "api.openai.com".into(),
                path: "/v1/chat/completions".into(),
                body: polar_json::RawJson::null(),
            },
            request: empty_request(),
            received_ms: 0,
        }
    }

    /// Small requests and prompt ids are serialized on the calling task,
    /// larger ones (or a request with history added) on a blocking thread;
    /// both give the same bytes and lend the request back unchanged.
    #[tokio::test]
    async fn requests_and_prompts_serialize_the_same_here_or_on_a_blocking_thread() {
        let body = |n: usize| polar_json::RawJson::from_value(&"x".repeat(n).into());
        let cases = [
            (body(10), false, true),
            (body(INLINE_REQUEST_BYTES - 2), false, true),
            (body(INLINE_REQUEST_BYTES - 1), false, false),
            (body(10), true, false),
        ];
        for (native_body, history_added, inline) in cases {
            let mut d = draft();
            d.native.body = native_body;
            d.request.model = "m".into();
            let want_request = d.request.clone();
            let want = PreEncoded::requests(&d.native, &d.request);
            let early = d.encode_early(history_added);
            assert_eq!(early.is_done(), inline);
            let got = d.restore(early).await;
            assert_eq!(d.request, want_request);
            let text = |p: &PreEncoded| {
                (
                    p.native_request.as_ref().map(|r| r.get().to_owned()),
                    p.request.as_ref().map(|r| r.get().to_owned()),
                )
            };
            assert_eq!(text(&got), text(&want));
        }
        for (n, inline) in [(INLINE_PROMPT_IDS, true), (INLINE_PROMPT_IDS + 1, false)] {
            let ids: Vec<u32> = (0..n as u32).collect();
            let p = PromptEncoding::start(ids.clone());
            assert_eq!(matches!(p.0, Pending::Done(_)), inline);
            let (fp, raw) = p.finish().await.unwrap();
            let (want_fp, want_raw) = PreEncoded::prompt(&ids).unwrap();
            assert_eq!((fp, raw.get()), (want_fp, want_raw.get()));
        }
    }

    #[test]
    fn a_cut_replys_usage_counts_the_token_ids_it_got() {
        let events = [
            StreamEvent::Start {
                id: "r".into(),
                model: "m".into(),
                prompt_tokens: Some(3),
            },
            StreamEvent::TextDelta {
                text: "Step 3.".into(),
            },
        ];
        let produced = Produced {
            tokens: Tokens {
                prompt_token_ids: Some(vec![1, 2, 3]),
                response_token_ids: Some((0..11).collect()),
                response_logprobs: Some(vec![-0.5; 11]),
            },
            ..Produced::default()
        };
        let r = draft().finish(produced, &events, Some((Side::Backend, "cut".into())));
        let usage = r.response.map(|r| r.usage);
        assert_eq!(
            usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
            Some((3, 11))
        );
        assert_eq!(r.response_token_ids.map(|t| t.len()), Some(11));
        assert!(matches!(r.status, CallStatus::Failed { .. }));
    }

    #[test]
    fn kept_events_assemble_to_the_same_reply() {
        let all = vec![
            StreamEvent::Start {
                id: "r".into(),
                model: "m".into(),
                prompt_tokens: Some(3),
            },
            StreamEvent::ReasoningDelta { text: "th".into() },
            StreamEvent::ReasoningDelta { text: "ink".into() },
            StreamEvent::ReasoningDone { signature: None },
            StreamEvent::TextDelta { text: "a ".into() },
            StreamEvent::TextDelta { text: "b".into() },
            StreamEvent::ToolCallStart {
                index: 0,
                id: "c0".into(),
                name: "x".into(),
            },
            StreamEvent::ToolCallDelta {
                index: 0,
                arguments: "{\"a\":".into(),
            },
            StreamEvent::ToolCallDelta {
                index: 0,
                arguments: "1}".into(),
            },
            StreamEvent::ToolCallStart {
                index: 1,
                id: "c1".into(),
                name: "y".into(),
            },
            StreamEvent::ToolCallDelta {
                index: 1,
                arguments: "{}".into(),
            },
            StreamEvent::Finish {
                finish_reason: FinishReason::ToolCalls,
                usage: Usage::default(),
            },
        ];
        let mut kept = Vec::new();
        for ev in all.clone() {
            keep_event(&mut kept, ev);
        }
        assert_eq!(kept.len(), 9);
        assert_eq!(
            inference::stream::assemble(&kept, Tokens::default()),
            inference::stream::assemble(&all, Tokens::default())
        );
        assert_eq!(provider::assemble(&kept), provider::assemble(&all));
    }
}
