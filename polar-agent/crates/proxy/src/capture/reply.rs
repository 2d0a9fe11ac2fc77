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
//! The call's [`Recording`] is fed as the reply goes: every event, the
//! backend's first output (from then on the record's big parts are
//! written to the log while the backend generates, so the end of a reply
//! waits only for the completion's few kilobytes), a streamed reply's
//! token data as it arrives (serialized by the task sending the events),
//! and the stream's end; then it is finished, and only once the record is
//! durable do the reply's last bytes go.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use tracing::Instrument;

use polar_capture::{Outcome, Recording};
use polar_chat::Api;
use polar_chat::StreamEvent;
use polar_chat::provider::{self, ErrorKind, ProviderError, ReplyOptions, Side, StreamEncoder};
use polar_inference::{ChatStream, InferenceError};
use polar_io::tasks::Tasks;

use super::super::body::{BodySender, ProxyBody, channel};
use super::super::error::json_response;
use super::call::{finish, finish_with, record_failed};
use super::errors::{self, provider_error};

/// Longest error text kept in a record.
const MAX_RECORDED_ERROR: usize = 2000;

/// A call ready to be answered.
pub(super) struct Call {
    pub recording: Recording,
    pub api: Api,
    pub opts: ReplyOptions,
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
        mut recording,
        api,
        opts,
    } = call;
    let mut failure = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(ev) => {
                recording.event(ev);
                recording.first_output(&stream);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    recording.stream_done(&mut stream);
    drop(stream);
    if let Some(e) = failure {
        tracing::warn!(seq = recording.seq(), error = %e, "inference reply failed");
        let err = provider_error(&e);
        errors::count_backend(recording.stats(), &err);
        let outcome = Outcome::Failed {
            side: Side::Backend,
            error: recorded_error(&e),
        };
        if let Err(resp) = finish(recording, outcome, api).await {
            return resp;
        }
        return errors::respond(api, &err);
    }
    let body = finish_with(recording, Outcome::Completed, api, |record| {
        record
            .response
            .as_ref()
            .map(|r| provider::response_body(api, r, &opts))
    })
    .await;
    match body {
        Ok(Some(body)) => json_response(StatusCode::OK, body),
        Ok(None) => errors::respond(api, &no_finish()),
        Err(resp) => resp,
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
        let Call {
            mut recording, api, ..
        } = call;
        errors::count_backend(recording.stats(), &err);
        tracing::warn!(seq = recording.seq(), error = %text, "inference reply failed before its first output");
        for ev in held {
            recording.event(ev);
        }
        recording.stream_done(&mut stream);
        let outcome = Outcome::Failed {
            side: Side::Backend,
            error: text,
        };
        if let Err(resp) = finish(recording, outcome, api).await {
            return resp;
        }
        return errors::respond(api, &err);
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
        mut recording,
        api,
        opts,
    } = call;
    let mut enc = provider::encoder(api, &opts);
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
                recording.event(ev);
                if finish {
                    break End::Finished(bytes);
                }
                if !tx.send(bytes).await {
                    break End::HarnessGone;
                }
                // The tokens that came with the event, off the end's path.
                recording.stream_tokens(&stream);
                // Once the first event's bytes are on their way.
                recording.first_output(&stream);
            }
            Some(Err(e)) => break End::Failed(provider_error(&e), recorded_error(&e)),
            None => break End::Failed(no_finish(), no_finish().message),
        }
    };
    // The tokens that came with the last events (usually none).
    recording.stream_tokens(&stream);
    recording.stream_done(&mut stream);
    drop(stream);
    let seq = recording.seq();
    match end {
        End::Finished(last) => {
            let last = match recording.finish(Outcome::Completed).await {
                Ok(()) => last,
                Err(e) => {
                    tracing::error!(seq, error = %e, "appending to the capture log failed; ending the stream with an error");
                    enc.error(&record_failed())
                }
            };
            let _ = tx.send(last).await;
        }
        End::Failed(err, text) => {
            errors::count_backend(recording.stats(), &err);
            tracing::warn!(seq, error = %text, "inference reply failed mid-stream");
            let outcome = Outcome::Failed {
                side: Side::Backend,
                error: text,
            };
            if let Err(e) = recording.finish(outcome).await {
                tracing::error!(seq, error = %e, "appending to the capture log failed");
            }
            let _ = tx.send(enc.error(&err)).await;
        }
        End::HarnessGone => {
            tracing::info!(
                seq,
                "the harness closed the connection before the reply ended"
            );
            let outcome = Outcome::Failed {
                side: Side::Harness,
                error: "the harness closed the connection before the reply ended".into(),
            };
            if let Err(e) = recording.finish(outcome).await {
                tracing::error!(seq, error = %e, "appending to the capture log failed");
            }
        }
    }
}
