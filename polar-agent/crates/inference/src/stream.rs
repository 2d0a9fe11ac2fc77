//! [`ChatStream`]: the reply of one inference call as events, pulled from
//! the backend as the consumer asks, with the token data, timings and
//! backend facts gathered on the way. A replica that fails in the middle
//! of the reply is failed over ([`failover`]): the stream goes on from
//! another part, read by [`continuation`] when it is token-in.

mod continuation;
pub mod failover;

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use polar_sse::SseParser;
use serde::Serialize;

use super::decode::{ChunkDecoder, DecodeError, TokenAcc, decode_whole};
use super::guided::Reader;
use super::pool::{Admission, Pool};
use super::token_in::FaithfulEnd;
use super::{Dialect, InferenceError};
use failover::{Continuing, Failover, Resumption};
use polar_chat::{ChatResponse, FinishReason, StreamEvent, Tokens};
use polar_faithful::Serving;

/// Which backend answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendInfo {
    /// Backend name.
    pub backend: String,
    /// Its dialect.
    pub dialect: Dialect,
    /// The replica's base URL.
    pub replica: String,
    /// The model name sent (or the one the reply names).
    pub served_model: String,
    /// The weight version, when the backend reports one (SGLang
    /// `meta_info.weight_version`, or an `x-weight-version` header).
    pub weight_version: Option<String>,
    /// Replicas tried (1 unless earlier ones were unreachable).
    pub attempts: usize,
    /// How the prompt was rendered and sent (`None` in what a failed
    /// call's record says of a replica that answered it).
    pub serving: Option<Serving>,
}

/// When things happened, relative to the call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Timings {
    /// Wall-clock start of the call (before waiting on a pause).
    pub started_at: SystemTime,
    /// Time spent held by a pause.
    pub paused: Duration,
    /// Until the reply head.
    pub head: Option<Duration>,
    /// Until the first generated output (token ids or text).
    pub first_token: Option<Duration>,
    /// Until the reply was complete.
    pub finished: Option<Duration>,
}

enum Source {
    Sse(Incoming, SseParser),
    Whole(Incoming),
    Resumed(Box<Continuing>),
    Finished,
}

/// The events of one reply, in generation order.
pub struct ChatStream {
    info: BackendInfo,
    model: String,
    source: Source,
    decoder: ChunkDecoder,
    whole_tokens: Option<TokenAcc>,
    pending: VecDeque<StreamEvent>,
    yielded: usize,
    timeout: Duration,
    started: Instant,
    timings: Timings,
    pool: Pool,
    replica: usize,
    admission: Admission,
    failover: Option<Box<Failover>>,
    faithful: Option<Box<FaithfulEnd>>,
}

impl std::fmt::Debug for ChatStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatStream")
            .field("info", &self.info)
            .field("yielded", &self.yielded)
            .finish_non_exhaustive()
    }
}

/// Everything a consumed stream produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Completed {
    /// The reply as one response.
    pub response: ChatResponse,
    /// The events, in order.
    pub events: Vec<StreamEvent>,
    /// Which backend answered.
    pub backend: BackendInfo,
    /// When.
    pub timings: Timings,
}

/// What [`ChatStream::new`] needs.
pub(crate) struct StreamParts {
    pub(crate) info: BackendInfo,
    pub(crate) body: Incoming,
    pub(crate) streaming: bool,
    pub(crate) model: String,
    pub(crate) timeout: Duration,
    pub(crate) started: Instant,
    pub(crate) timings: Timings,
    pub(crate) pool: Pool,
    pub(crate) replica: usize,
    pub(crate) admission: Admission,
    pub(crate) failover: Option<Box<Failover>>,
}

impl ChatStream {
    pub(crate) fn new(p: StreamParts) -> Self {
        let streaming = p.streaming;
        Self::from_parts(p, |body, _| {
            if streaming {
                Source::Sse(body, SseParser::default())
            } else {
                Source::Whole(body)
            }
        })
    }

    /// The stream of a token-in call on the prompt `ids` (token-faithful
    /// serving): its raw output parsed by `parser`, `start` yielded first,
    /// `end` told the reply once it finished.
    pub(crate) fn token_in(
        p: StreamParts,
        ids: Vec<u32>,
        parser: Reader,
        start: StreamEvent,
        end: FaithfulEnd,
    ) -> Self {
        let prompt_len = ids.len() as u32;
        let mut s = Self::from_parts(p, |body, info| {
            Source::Resumed(Box::new(Continuing::new(
                body,
                info.dialect,
                parser,
                prompt_len,
            )))
        });
        s.decoder.tokens.start_token_in(ids);
        s.pending.push_back(start);
        s.faithful = Some(Box::new(end));
        s
    }

    /// The stream of `p`, its body read as `source` makes it.
    fn from_parts(p: StreamParts, source: impl FnOnce(Incoming, &BackendInfo) -> Source) -> Self {
        let source = source(p.body, &p.info);
        Self {
            info: p.info,
            decoder: ChunkDecoder::new(&p.model),
            model: p.model,
            source,
            whole_tokens: None,
            pending: VecDeque::new(),
            yielded: 0,
            timeout: p.timeout,
            started: p.started,
            timings: p.timings,
            pool: p.pool,
            replica: p.replica,
            admission: p.admission,
            failover: p.failover,
            faithful: None,
        }
    }

    /// The next event; `None` after the last one (`Finish`) or after an error.
    /// A `Finish` with the reason `abort` is yielded as
    /// [`InferenceError::Aborted`]: the backend stopped the turn, it did
    /// not end it (the replica is not counted as failing: it was told to
    /// stop). A failure in the middle of the reply is failed over when it
    /// can be ([`failover`]): the stream then goes on as if nothing happened.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, InferenceError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                if matches!(
                    event,
                    StreamEvent::Finish {
                        finish_reason: FinishReason::Abort,
                        ..
                    }
                ) {
                    let e = InferenceError::Aborted {
                        backend: self.info.backend.clone(),
                        replica: self.info.replica.clone(),
                        events: self.yielded,
                    };
                    match self.fail(e).await {
                        Ok(()) => continue,
                        Err(e) => return Some(Err(e)),
                    }
                }
                if let Some(f) = self.failover.as_deref_mut() {
                    if f.skip_start && matches!(event, StreamEvent::Start { .. }) {
                        f.skip_start = false;
                        continue;
                    }
                    f.observe(&event);
                }
                if let Some(end) = self.faithful.as_deref_mut() {
                    end.observe(&event);
                }
                if matches!(event, StreamEvent::Finish { .. })
                    && let Some(end) = self.faithful.take()
                {
                    end.finish(self.token_acc().response().0);
                }
                self.yielded += 1;
                return Some(Ok(event));
            }
            if matches!(self.source, Source::Finished) {
                return None;
            }
            if let Err(e) = self.pull().await {
                self.pool.note_failure(self.replica);
                if let Err(e) = self.fail(e).await {
                    return Some(Err(e));
                }
            }
        }
    }

    /// The parts of a reply that was failed over (`None` if it was not).
    pub fn resumed(&self) -> Option<Resumption> {
        let mut r = self.failover.as_deref()?.resumed.clone()?;
        failover::set_last_part(
            &mut r,
            self.token_acc().response_len(),
            self.info.weight_version.as_deref(),
        );
        Some(r)
    }

    /// The token data so far (complete once `Finish` was yielded).
    pub fn tokens(&self) -> Tokens {
        match &self.whole_tokens {
            Some(t) => t.tokens(),
            None => self.decoder.tokens.tokens(),
        }
    }

    /// The prompt token ids, once the backend reported them (no copy).
    pub fn prompt_token_ids(&self) -> Option<&[u32]> {
        self.token_acc().prompt()
    }

    /// A version of the prompt token ids: it changes whenever the backend's
    /// reply sets them, so ids read at two moments of the same version are
    /// the same ids (0 until they are known).
    pub fn prompt_ids_version(&self) -> u32 {
        self.token_acc().prompt_version()
    }

    /// The response token ids and logprobs received so far, as received
    /// (whether the reply's token data holds them is told at its end, by
    /// [`ChatStream::take_tokens`]). Both only grow: what an earlier call
    /// returned is the start of what a later one does, until the token data
    /// is taken.
    pub fn response_tokens(&self) -> (&[u32], &[f32]) {
        self.token_acc().response()
    }

    fn token_acc(&self) -> &TokenAcc {
        self.whole_tokens.as_ref().unwrap_or(&self.decoder.tokens)
    }

    fn token_acc_mut(&mut self) -> &mut TokenAcc {
        match &mut self.whole_tokens {
            Some(t) => t,
            None => &mut self.decoder.tokens,
        }
    }

    /// The token data, moved out: for the record once the reply is over
    /// (the stream has none left afterwards).
    pub fn take_tokens(&mut self) -> Tokens {
        match &mut self.whole_tokens {
            Some(t) => t.take_tokens(),
            None => self.decoder.tokens.take_tokens(),
        }
    }

    /// Which backend answers.
    pub fn backend(&self) -> &BackendInfo {
        &self.info
    }

    /// Timings so far.
    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    /// Events yielded so far.
    pub fn events_yielded(&self) -> usize {
        self.yielded
    }

    /// Consumes the stream into one response (for harness calls that did not
    /// ask for a stream, and for tests).
    pub async fn collect(mut self) -> Result<Completed, InferenceError> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event?);
        }
        let response =
            assemble(&events, self.tokens()).ok_or_else(|| InferenceError::Malformed {
                backend: self.info.backend.clone(),
                replica: self.info.replica.clone(),
                reason: "the reply has no start or no finish".into(),
            })?;
        Ok(Completed {
            response,
            events,
            backend: self.info.clone(),
            timings: self.timings.clone(),
        })
    }

    async fn pull(&mut self) -> Result<(), InferenceError> {
        match std::mem::replace(&mut self.source, Source::Finished) {
            Source::Finished => Ok(()),
            Source::Resumed(r) => self.pull_resumed(r).await,
            Source::Whole(mut body) => {
                let mut bytes = Vec::new();
                while let Some(chunk) = self.frame(&mut body).await? {
                    bytes.extend_from_slice(&chunk);
                }
                let whole = decode_whole(&bytes, &self.model).map_err(|e| self.decode_error(e))?;
                if whole.weight_version.is_some() {
                    self.info.weight_version = whole.weight_version;
                }
                if let Some(m) = whole.served_model {
                    self.info.served_model = m;
                }
                self.whole_tokens = Some(whole.tokens);
                let now = self.started.elapsed();
                self.timings.first_token = Some(now);
                self.timings.finished = Some(now);
                let mut events = whole.events;
                if let Some(f) = self.failover.as_deref() {
                    f.hold_aborted(&mut events);
                }
                self.pending.extend(events);
                Ok(())
            }
            Source::Sse(mut body, mut parser) => {
                let frame = match self.frame(&mut body).await {
                    Ok(f) => f,
                    Err(_) if self.decoder.is_done() => return Ok(()),
                    Err(e) => return Err(e),
                };
                let before = self.pending.len();
                let had_tokens = self.decoder.tokens.response_len() > 0;
                match frame {
                    Some(bytes) => {
                        let events = parser.push(&bytes).map_err(|e| {
                            self.decode_error(DecodeError::Malformed(e.to_string()))
                        })?;
                        for event in events {
                            self.decoder
                                .on_data(&event.data, &mut self.pending)
                                .map_err(|e| self.decode_error(e))?;
                        }
                        self.source = Source::Sse(body, parser);
                    }
                    None => {
                        // A last event without its blank line still counts.
                        if let Some(event) = parser.into_unterminated() {
                            self.decoder
                                .on_data(&event.data, &mut self.pending)
                                .map_err(|e| self.decode_error(e))?;
                        }
                        self.decoder
                            .end(&mut self.pending)
                            .map_err(|e| self.decode_error(e))?;
                    }
                }
                self.note_progress(before, had_tokens);
                Ok(())
            }
        }
    }

    fn note_progress(&mut self, before: usize, had_tokens: bool) {
        let now = self.started.elapsed();
        let output = self.pending.iter().skip(before).any(|e| {
            matches!(
                e,
                StreamEvent::ReasoningDelta { .. }
                    | StreamEvent::TextDelta { .. }
                    | StreamEvent::ToolCallStart { .. }
            )
        });
        if self.timings.first_token.is_none()
            && (output || (!had_tokens && self.decoder.tokens.response_len() > 0))
        {
            self.timings.first_token = Some(now);
        }
        if self.decoder.is_done() && self.timings.finished.is_none() {
            self.timings.finished = Some(now);
        }
        if let Some(m) = self.decoder.served_model.take() {
            self.info.served_model = m;
        }
    }

    /// Reads one body frame with the request timeout; `None` at the end.
    async fn frame(&self, body: &mut Incoming) -> Result<Option<Bytes>, InferenceError> {
        loop {
            match tokio::time::timeout(self.timeout, body.frame()).await {
                Err(_) => {
                    return Err(InferenceError::Timeout {
                        backend: self.info.backend.clone(),
                        replica: self.info.replica.clone(),
                        timeout: self.timeout,
                        waiting_for: "reply body",
                        events: self.yielded,
                    });
                }
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => {
                    return Err(InferenceError::StreamCut {
                        backend: self.info.backend.clone(),
                        replica: self.info.replica.clone(),
                        events: self.yielded,
                        reason: e.to_string(),
                    });
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    fn decode_error(&self, e: DecodeError) -> InferenceError {
        match e {
            DecodeError::Malformed(reason) => InferenceError::Malformed {
                backend: self.info.backend.clone(),
                replica: self.info.replica.clone(),
                reason,
            },
            DecodeError::Cut(reason) => InferenceError::StreamCut {
                backend: self.info.backend.clone(),
                replica: self.info.replica.clone(),
                events: self.yielded,
                reason,
            },
        }
    }
}

/// Builds the response from the events of a complete reply (one with its
/// start and its finish), with the backend's token data.
pub fn assemble(events: &[StreamEvent], tokens: Tokens) -> Option<ChatResponse> {
    let started = events
        .iter()
        .any(|e| matches!(e, StreamEvent::Start { .. }));
    let finished = events
        .iter()
        .any(|e| matches!(e, StreamEvent::Finish { .. }));
    (started && finished).then(|| ChatResponse {
        tokens,
        ..polar_chat::assemble(events)
    })
}
