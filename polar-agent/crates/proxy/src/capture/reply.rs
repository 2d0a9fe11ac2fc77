//! Answering a model call from the backend's [`ChatStream`], in the
//! harness's API:
//!
//! - [`whole`]: the reply is collected, recorded, then sent as one body;
//! - [`streamed`]: the first output is awaited (so a backend that fails
//!   before it, an `abort` finish included, gets a proper error status
//!   that the harness retries), then every event is encoded by
//!   the API's stream encoder and sent as it arrives, through a channel
//!   body fed by a task. The bytes of the final event (or of the mid-stream
//!   error event) are held back until the record is on disk. A harness that
//!   goes away ends the backend call; that call is recorded as failed on the
//!   harness's side.
//!
//! While the backend generates, the record's big parts are serialized on
//! blocking threads (the requests from the start, the prompt ids from the
//! first event; small ones on the spot, [`polar_capture::build::INLINE_REQUEST_BYTES`])
//! and, when they are big, appended to the log as the call's request part
//! ([`RequestPartWrite`]), so the end of a reply waits only for the
//! completion's few kilobytes: serialized, written, synced. A streamed
//! reply's token ids and logprobs are serialized as they arrive, by the
//! task sending the events ([`ReplyTokensJson`]), and its prompt ids are
//! not compared with the part's at the end when the stream did not set
//! them again ([`ChatStream::prompt_ids_version`]): the completion copies
//! the one and leaves out the other. A call whose requests were small, or
//! whose reply came whole from the backend (all its events at once), is
//! recorded as one whole line at its end, like a call that failed before
//! its first event.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use tracing::Instrument;

use polar_capture::SessionLog;
use polar_capture::build::{Draft, EarlyEncoding, Produced, PromptEncoding, keep_event};
use polar_capture::encode::RecordParts;
use polar_capture::part::RequestPartWrite;
use polar_capture::tokens_json::ReplyTokensJson;
use polar_chat::Api;
use polar_chat::StreamEvent;
use polar_chat::provider::{self, ErrorKind, ProviderError, ReplyOptions, Side, StreamEncoder};
use polar_inference::{ChatStream, InferenceError};
use polar_io::tasks::Tasks;
use polar_record::CompletionRecord;

use super::super::body::{BodySender, ProxyBody, channel};
use super::super::error::json_response;
use super::call::{append, record_failed};
use super::errors::{self, provider_error};

/// Longest error text kept in a record.
const MAX_RECORDED_ERROR: usize = 2000;

/// A call ready to be answered.
pub(super) struct Call {
    pub log: Arc<SessionLog>,
    pub draft: Draft,
    pub early: EarlyEncoding,
    pub api: Api,
    pub opts: ReplyOptions,
}

/// The record's big parts, serialized or written ahead.
enum Ahead {
    /// The requests being serialized (and the prompt ids, for a reply
    /// that came whole): the record will be one whole line.
    Early {
        early: EarlyEncoding,
        prompt: Option<PromptEncoding>,
    },
    /// The call's request part being written from the prompt ids of
    /// `prompt_version`; `prompt_kept` once the stream ended with ids of
    /// that version.
    Part {
        write: RequestPartWrite,
        prompt_version: u32,
        prompt_kept: bool,
    },
}

impl Ahead {
    fn new(early: EarlyEncoding) -> Self {
        Self::Early {
            early,
            prompt: None,
        }
    }

    /// After the backend's first event: starts writing the request part
    /// with the prompt ids known now, unless the whole reply is already in
    /// (the end is as near as the part's write) or the requests were small
    /// enough to be serialized already ([`EarlyEncoding::is_done`]: the end
    /// writes a few kilobytes either way, and one write costs less than
    /// two). Then the record goes as one line, its prompt ids serialized
    /// meanwhile.
    fn first_event(self, log: &Arc<SessionLog>, draft: &Draft, stream: &ChatStream) -> Self {
        let Self::Early {
            early,
            prompt: None,
        } = self
        else {
            return self;
        };
        let ids = stream.prompt_token_ids().map(<[u32]>::to_vec);
        if stream.timings().finished.is_some() || early.is_done() {
            Self::Early {
                early,
                prompt: ids.map(PromptEncoding::start),
            }
        } else {
            Self::Part {
                write: RequestPartWrite::start(Arc::clone(log), draft, early, ids),
                prompt_version: stream.prompt_ids_version(),
                prompt_kept: false,
            }
        }
    }

    /// What the backend produced; the stream's token data is moved out (the
    /// stream is done with). Notes first whether the stream's prompt ids are
    /// still the ones the request part is written from.
    fn produced<'a>(&mut self, stream: &mut ChatStream, events: &'a [StreamEvent]) -> Produced<'a> {
        if let Self::Part {
            prompt_version,
            prompt_kept,
            ..
        } = self
        {
            *prompt_kept = *prompt_version == stream.prompt_ids_version();
        }
        let resumed = stream.resumed();
        Produced {
            events,
            tokens: stream.take_tokens(),
            backend: Some(stream.backend().clone()),
            timings: Some(stream.timings().clone()),
            backend_name: None,
            resumed,
        }
    }

    /// The record of the call and where its big parts are.
    async fn record(
        self,
        mut draft: Draft,
        produced: Produced<'_>,
        failure: Option<(Side, String)>,
    ) -> (CompletionRecord, RecordParts) {
        let parts = match self {
            Self::Early { early, prompt } => {
                let mut pre = draft.restore(early).await;
                if let Some(p) = prompt {
                    pre.prompt_token_ids = p.finish().await;
                }
                RecordParts::Whole(pre)
            }
            Self::Part {
                write, prompt_kept, ..
            } => {
                let parts = write.finish(&mut draft).await;
                if prompt_kept {
                    parts.prompt_unchanged()
                } else {
                    parts
                }
            }
        };
        (draft.finish(produced, failure), parts)
    }
}

fn recorded_error(e: &InferenceError) -> String {
    e.to_string().chars().take(MAX_RECORDED_ERROR).collect()
}

fn no_finish() -> ProviderError {
    ProviderError::new(
        Side::Backend,
        ErrorKind::BackendError,
        "the inference backend ended its reply without finishing it",
    )
}

/// Collects the reply, records it, then answers with one body.
pub(super) async fn whole(call: Call, mut stream: ChatStream) -> Response<ProxyBody> {
    let Call {
        log,
        draft,
        early,
        api,
        opts,
    } = call;
    let mut ahead = Ahead::new(early);
    let mut events = Vec::new();
    let mut failure = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(ev) => {
                keep_event(&mut events, ev);
                if events.len() == 1 {
                    ahead = ahead.first_event(&log, &draft, &stream);
                }
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let produced = ahead.produced(&mut stream, &events);
    drop(stream);
    if let Some(e) = failure {
        tracing::warn!(seq = draft.seq, error = %e, "inference reply failed");
        let err = provider_error(&e);
        errors::count_backend(&log, &err);
        let failure = Some((Side::Backend, recorded_error(&e)));
        let (record, parts) = ahead.record(draft, produced, failure).await;
        if let Err(resp) = append(&log, record, parts, api).await {
            return resp;
        }
        return errors::respond(api, &err);
    }
    let (record, parts) = ahead.record(draft, produced, None).await;
    let body = record
        .response
        .as_ref()
        .map(|r| provider::response_body(api, r, &opts));
    if let Err(resp) = append(&log, record, parts, api).await {
        return resp;
    }
    match body {
        Some(body) => json_response(StatusCode::OK, body),
        None => errors::respond(api, &no_finish()),
    }
}

/// Streams the reply as it is generated (see the module docs). The reply
/// head waits for the first event that is not the reply's `Start` (which
/// carries nothing the harness needs yet): a backend that fails before any
/// output (an error, a cut, an `abort` finish) is answered with an error
/// status, which every harness retries, instead of an error inside a
/// stream, which most harnesses do not.
pub(super) async fn streamed(
    call: Call,
    mut stream: ChatStream,
    tasks: &Tasks,
) -> Response<ProxyBody> {
    let mut held = Vec::with_capacity(2);
    let failed = loop {
        match stream.next().await {
            Some(Ok(ev)) => {
                let start = matches!(ev, StreamEvent::Start { .. });
                held.push(ev);
                if !start || held.len() == 2 {
                    break None;
                }
            }
            Some(Err(e)) => break Some((provider_error(&e), recorded_error(&e))),
            None => break Some((no_finish(), no_finish().message)),
        }
    };
    if let Some((err, text)) = failed {
        errors::count_backend(&call.log, &err);
        tracing::warn!(seq = call.draft.seq, error = %text, "inference reply failed before its first output");
        let mut ahead = Ahead::new(call.early);
        let failure = Some((Side::Backend, text));
        let produced = ahead.produced(&mut stream, &held);
        let (record, parts) = ahead.record(call.draft, produced, failure).await;
        if let Err(resp) = append(&call.log, record, parts, call.api).await {
            return resp;
        }
        return errors::respond(call.api, &err);
    }
    let framing = call.opts.framing;
    let (tx, body) = channel();
    tasks.spawn(pump(call, stream, held, tx).instrument(tracing::Span::current()));
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(framing.content_type()),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// How a stream ended.
enum End {
    /// The backend finished; these are the final event's bytes.
    Finished(Bytes),
    /// The backend failed.
    Failed(ProviderError, String),
    /// The harness closed the connection.
    HarnessGone,
}

/// Sends `held` (the events already pulled), then the rest of the stream.
async fn pump(call: Call, mut stream: ChatStream, held: Vec<StreamEvent>, tx: BodySender) {
    let Call {
        log,
        draft,
        early,
        api,
        opts,
    } = call;
    let mut ahead = Ahead::new(early);
    let mut first_sent = false;
    let mut enc = provider::encoder(api, &opts);
    let mut events = Vec::with_capacity(8);
    let mut tokens = ReplyTokensJson::default();
    let mut held = held.into_iter();
    let end = loop {
        let item = match held.next() {
            Some(ev) => Some(Ok(ev)),
            None => tokio::select! {
                biased;
                () = tx.closed() => break End::HarnessGone,
                item = stream.next() => item,
            },
        };
        match item {
            Some(Ok(ev)) => {
                let bytes = enc.push(&ev);
                let finish = matches!(ev, StreamEvent::Finish { .. });
                keep_event(&mut events, ev);
                if finish {
                    break End::Finished(bytes);
                }
                if !tx.send(bytes).await {
                    break End::HarnessGone;
                }
                // The tokens that came with the event, off the end's path.
                let (ids, logprobs) = stream.response_tokens();
                tokens.catch_up(ids, logprobs);
                if !first_sent {
                    // Once the first event's bytes are on their way.
                    first_sent = true;
                    ahead = ahead.first_event(&log, &draft, &stream);
                }
            }
            Some(Err(e)) => break End::Failed(provider_error(&e), recorded_error(&e)),
            None => break End::Failed(no_finish(), no_finish().message),
        }
    };
    // The tokens that came with the last events (usually none).
    let (ids, logprobs) = stream.response_tokens();
    tokens.catch_up(ids, logprobs);
    let produced = ahead.produced(&mut stream, &events);
    drop(stream);
    let seq = draft.seq;
    match end {
        End::Finished(last) => {
            let (record, parts) = ahead.record(draft, produced, None).await;
            let last = match log.append(record, parts, tokens).await {
                Ok(()) => last,
                Err(e) => {
                    tracing::error!(seq, error = %e, "appending to the capture log failed; ending the stream with an error");
                    enc.error(&record_failed())
                }
            };
            let _ = tx.send(last).await;
        }
        End::Failed(err, text) => {
            errors::count_backend(&log, &err);
            tracing::warn!(seq, error = %text, "inference reply failed mid-stream");
            let failure = Some((Side::Backend, text));
            let (record, parts) = ahead.record(draft, produced, failure).await;
            if let Err(e) = log.append(record, parts, tokens).await {
                tracing::error!(seq, error = %e, "appending to the capture log failed");
            }
            let _ = tx.send(enc.error(&err)).await;
        }
        End::HarnessGone => {
            tracing::info!(
                seq,
                "the harness closed the connection before the reply ended"
            );
            let failure = Some((
                Side::Harness,
                "the harness closed the connection before the reply ended".into(),
            ));
            let (record, parts) = ahead.record(draft, produced, failure).await;
            if let Err(e) = log.append(record, parts, tokens).await {
                tracing::error!(seq, error = %e, "appending to the capture log failed");
            }
        }
    }
}
