//! Answering a model call from the backend's [`ChatStream`], in the
//! harness's API:
//!
//! - [`whole`]: the reply is collected, recorded, then sent as one body;
//! - [`streamed`]: the first event is awaited (so a backend that fails
//!   before it gets a proper error status), then every event is encoded by
//!   the API's stream encoder and sent as it arrives, through a channel
//!   body fed by a task. The bytes of the final event (or of the mid-stream
//!   error event) are held back until the record is on disk. A harness that
//!   goes away ends the backend call; that call is recorded as failed on the
//!   harness's side.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::capture::SessionLog;
use crate::capture::record::Api;
use crate::chat::StreamEvent;
use crate::inference::{ChatStream, InferenceError};
use crate::provider::{self, ErrorKind, ProviderError, ReplyOptions, Side, StreamEncoder};
use crate::tasks::Tasks;

use super::super::body::{BodySender, ProxyBody, channel};
use super::super::error::json_response;
use super::call::{append, record_failed};
use super::errors::{self, provider_error};
use super::record::{Draft, Produced};

/// Longest error text kept in a record.
const MAX_RECORDED_ERROR: usize = 2000;

/// A call ready to be answered.
pub(super) struct Call {
    pub log: Arc<SessionLog>,
    pub draft: Draft,
    pub api: Api,
    pub opts: ReplyOptions,
}

fn recorded_error(e: &InferenceError) -> String {
    e.to_string().chars().take(MAX_RECORDED_ERROR).collect()
}

fn produced<'a>(stream: &ChatStream, events: &'a [StreamEvent]) -> Produced<'a> {
    Produced {
        events,
        tokens: stream.tokens(),
        backend: Some(stream.backend().clone()),
        timings: Some(stream.timings().clone()),
        backend_name: None,
    }
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
        api,
        opts,
    } = call;
    let mut events = Vec::new();
    let mut failure = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(ev) => events.push(ev),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let produced = produced(&stream, &events);
    drop(stream);
    if let Some(e) = failure {
        tracing::warn!(seq = draft.seq, error = %e, "inference reply failed");
        let err = provider_error(&e);
        let record = draft.finish(produced, Some((Side::Backend, recorded_error(&e))));
        if let Err(resp) = append(&log, record, api).await {
            return resp;
        }
        return errors::respond(api, &err);
    }
    let record = draft.finish(produced, None);
    let body = record
        .response
        .as_ref()
        .map(|r| Bytes::from(provider::response_body(api, r, &opts).to_string()));
    if let Err(resp) = append(&log, record, api).await {
        return resp;
    }
    match body {
        Some(body) => json_response(StatusCode::OK, body),
        None => errors::respond(api, &no_finish()),
    }
}

/// Streams the reply as it is generated (see the module docs).
pub(super) async fn streamed(
    call: Call,
    mut stream: ChatStream,
    tasks: &Tasks,
) -> Response<ProxyBody> {
    let first = match stream.next().await {
        Some(Ok(ev)) => ev,
        failed => {
            let (err, text) = match failed {
                Some(Err(e)) => (provider_error(&e), recorded_error(&e)),
                _ => (no_finish(), no_finish().message),
            };
            tracing::warn!(seq = call.draft.seq, error = %text, "inference reply failed before its first event");
            let record = call
                .draft
                .finish(produced(&stream, &[]), Some((Side::Backend, text)));
            if let Err(resp) = append(&call.log, record, call.api).await {
                return resp;
            }
            return errors::respond(call.api, &err);
        }
    };
    let framing = call.opts.framing;
    let (tx, body) = channel();
    tasks.spawn(pump(call, stream, first, tx));
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

async fn pump(call: Call, mut stream: ChatStream, first: StreamEvent, tx: BodySender) {
    let Call {
        log,
        draft,
        api,
        opts,
    } = call;
    let mut enc = provider::encoder(api, &opts);
    let mut events = Vec::with_capacity(64);
    let mut next = Some(Ok(first));
    let end = loop {
        let item = match next.take() {
            Some(item) => Some(item),
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
                events.push(ev);
                if finish {
                    break End::Finished(bytes);
                }
                if !tx.send(bytes).await {
                    break End::HarnessGone;
                }
            }
            Some(Err(e)) => break End::Failed(provider_error(&e), recorded_error(&e)),
            None => break End::Failed(no_finish(), no_finish().message),
        }
    };
    let produced = produced(&stream, &events);
    drop(stream);
    let seq = draft.seq;
    match end {
        End::Finished(last) => {
            let record = draft.finish(produced, None);
            let last = match log.append(record).await {
                Ok(()) => last,
                Err(e) => {
                    tracing::error!(seq, error = %e, "appending to the capture log failed; ending the stream with an error");
                    enc.error(&record_failed())
                }
            };
            let _ = tx.send(last).await;
        }
        End::Failed(err, text) => {
            tracing::warn!(seq, error = %text, "inference reply failed mid-stream");
            let record = draft.finish(produced, Some((Side::Backend, text)));
            if let Err(e) = log.append(record).await {
                tracing::error!(seq, error = %e, "appending to the capture log failed");
            }
            let _ = tx.send(enc.error(&err)).await;
        }
        End::HarnessGone => {
            tracing::info!(
                seq,
                "the harness closed the connection before the reply ended"
            );
            let record = draft.finish(
                produced,
                Some((
                    Side::Harness,
                    "the harness closed the connection before the reply ended".into(),
                )),
            );
            if let Err(e) = log.append(record).await {
                tracing::error!(seq, error = %e, "appending to the capture log failed");
            }
        }
    }
}
