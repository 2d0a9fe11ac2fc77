//! One model call's record, from its arrival to its durable line: the one
//! type the proxy's capture stage drives ([`Recording`]).
//!
//! A recording is started when the call arrives ([`Recording::start`]: its
//! session's log opened, its position taken, the native request kept), fed
//! the normalized request ([`Recording::set_request`]), told when it went to
//! the backend ([`Recording::sent`]: its requests are serialized from then
//! on, off the reply's path), fed each event of the reply
//! ([`Recording::event`]), the backend's first output
//! ([`Recording::first_output`]: the call's request part is written to the
//! log while the backend generates, [`super::ahead`]), the reply's token
//! data as it streams ([`Recording::stream_tokens`]) and the stream's end
//! ([`Recording::stream_done`]), and finished with the call's
//! [`Outcome`] ([`Recording::finish`]): the record built, its last line
//! appended and durable per the store's durability before `finish` returns.
//! A call that fails before any reply is finished as it stands (naming the
//! backend with [`Recording::backend`]).

use std::sync::Arc;

use polar_capture_log::{LogError, ReplyTokensJson};
use polar_chat::provider::Side;
use polar_chat::{ChatRequest, Message, StreamEvent};
use polar_ids::SessionId;
use polar_inference::{BackendInfo, ChatStream};
use polar_record::{CompletionRecord, NativeRequest};

use super::ahead::Ahead;
use super::build::{Draft, Produced, call_id, empty_request, keep_event, now_ms};
use super::stats::CaptureStats;
use super::store::{CaptureStore, SessionLog};

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The backend finished its reply.
    Completed,
    /// The call failed, at `side`'s fault.
    Failed {
        /// Who is at fault.
        side: Side,
        /// What went wrong, as the record keeps it.
        error: String,
    },
}

impl Outcome {
    fn failure(self) -> Option<(Side, String)> {
        match self {
            Self::Completed => None,
            Self::Failed { side, error } => Some((side, error)),
        }
    }
}

/// A model call being recorded (see the module docs).
#[derive(Debug)]
pub struct Recording {
    log: Arc<SessionLog>,
    draft: Draft,
    ahead: Ahead,
    first_output_seen: bool,
    events: Vec<StreamEvent>,
    tokens: ReplyTokensJson,
    produced: Produced,
}

impl Recording {
    /// Starts recording a call of `session` that arrived now with `native`
    /// (its normalized request empty until [`Recording::set_request`]):
    /// opens the session's log (an error: the call cannot be recorded and
    /// must be refused) and takes the call's position in the session.
    pub async fn start(
        store: &CaptureStore,
        session: &SessionId,
        native: NativeRequest,
    ) -> Result<Self, LogError> {
        let received_ms = now_ms();
        let log = store.session(session).await?;
        let info = store.registry().get(session).unwrap_or_default();
        let draft = Draft {
            call_id: call_id(),
            seq: log.next_seq(),
            session_id: session.to_string(),
            policy_version: info.policy_version().map(str::to_owned),
            task_id: info.task_id,
            native,
            request: empty_request(),
            received_ms,
        };
        Ok(Self {
            log,
            draft,
            ahead: Ahead::Drafting,
            first_output_seen: false,
            events: Vec::new(),
            tokens: ReplyTokensJson::default(),
            produced: Produced::default(),
        })
    }

    /// The call's position in its session.
    pub fn seq(&self) -> u64 {
        self.draft.seq
    }

    /// The call's id.
    pub fn call_id(&self) -> &str {
        &self.draft.call_id
    }

    /// The call's session.
    pub fn session(&self) -> &SessionId {
        self.log.session()
    }

    /// When the call arrived (ms since the Unix epoch).
    pub fn received_ms(&self) -> u64 {
        self.draft.received_ms
    }

    /// The capture counters (backend errors are counted by the caller).
    pub fn stats(&self) -> &CaptureStats {
        self.log.stats()
    }

    /// The conversation a Responses reply `response_id` of this session
    /// ended, if the session's log holds it.
    pub fn conversation(&self, response_id: &str) -> Option<Arc<Vec<Message>>> {
        self.log.conversation(response_id)
    }

    /// The normalized request (with any `previous_response_id` history).
    pub fn set_request(&mut self, request: ChatRequest) {
        self.draft.request = request;
    }

    /// The normalized request, to send to the backend (empty once
    /// [`Recording::sent`] lent it to the serializer).
    pub fn request(&self) -> &ChatRequest {
        &self.draft.request
    }

    /// Names the backend of a call that failed before any reply: the
    /// route's backend `name`, and the replica when one answered.
    pub fn backend(&mut self, name: String, answered: Option<BackendInfo>) {
        self.produced.backend_name = Some(name);
        self.produced.backend = answered;
    }

    /// The request went to the backend (its reply stream is open): its
    /// native and normalized requests are serialized from now on, on the
    /// spot when small, else on a blocking thread (`history_added`: the
    /// normalized request holds a `previous_response_id` conversation the
    /// native body does not).
    pub fn sent(&mut self, history_added: bool) {
        let early = self.draft.encode_early(history_added);
        self.ahead = Ahead::sent(early);
    }

    /// Keeps a reply event for the record (pieces of the same text,
    /// reasoning or tool-call arguments merged).
    pub fn event(&mut self, ev: StreamEvent) {
        keep_event(&mut self.events, ev);
    }

    /// After the backend's first output (once; later calls do nothing):
    /// the call's request part is written to the log while the backend
    /// generates, or the record is left to go whole at the end.
    pub fn first_output(&mut self, stream: &ChatStream) {
        if std::mem::replace(&mut self.first_output_seen, true) {
            return;
        }
        let ahead = std::mem::replace(&mut self.ahead, Ahead::Drafting);
        self.ahead = ahead.first_event(&self.log, &self.draft, stream);
    }

    /// Serializes the reply's token data the stream holds that is not yet
    /// serialized (call as events arrive, off the end's path).
    pub fn stream_tokens(&mut self, stream: &ChatStream) {
        let (ids, logprobs) = stream.response_tokens();
        self.tokens.catch_up(ids, logprobs);
    }

    /// The stream is done with: what it produced besides its events (token
    /// data, backend, timings) is moved into the record.
    pub fn stream_done(&mut self, stream: &mut ChatStream) {
        self.produced = self.ahead.produced(stream);
    }

    /// Finishes the call as `outcome` says: see [`Recording::finish_with`].
    pub async fn finish(self, outcome: Outcome) -> Result<(), LogError> {
        self.finish_with(outcome, |_| ()).await
    }

    /// Builds the call's record, lets `read` take what the caller needs of
    /// it (the reply's body), then appends its last line (its completion
    /// when its request part is in the log, else the whole record) and
    /// waits until it is durable per the store's durability. An error: the
    /// call is not recorded, and must not be acknowledged to the harness.
    pub async fn finish_with<R>(
        self,
        outcome: Outcome,
        read: impl FnOnce(&CompletionRecord) -> R,
    ) -> Result<R, LogError> {
        let Self {
            log,
            mut draft,
            ahead,
            events,
            tokens,
            produced,
            ..
        } = self;
        let parts = ahead.parts(&mut draft).await;
        let record = draft.finish(produced, &events, outcome.failure());
        let answer = read(&record);
        log.append(record, parts, tokens).await?;
        Ok(answer)
    }
}

#[cfg(test)]
#[path = "recording_tests.rs"]
mod tests;
