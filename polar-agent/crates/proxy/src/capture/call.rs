//! One model call through the capture stage: parse, history, backend call,
//! reply (streamed or whole), record. Every way out of here appends the
//! call's record before the harness gets the end of its reply, failures
//! included (a request that cannot be parsed is recorded with an empty
//! normalized request).

use std::sync::Arc;

use tracing::Instrument;

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use serde_json::Value;

use polar_capture::{Outcome, Recording};
use polar_chat::Api;
use polar_chat::provider::{
    self, ErrorKind, Framing, ModelCall, ParsedRequest, ProviderError, Side,
};
use polar_json::{Json, JsonError, RawJson};
use polar_record::{CompletionRecord, NativeRequest};

use super::super::body::ProxyBody;
use super::super::pipeline::RequestContext;
use super::{Capture, errors, reply};

/// A model call's body: its bytes, read as JSON (`null` when blank).
pub(super) struct Body<'a> {
    /// The decoded bytes.
    pub bytes: &'a Bytes,
    /// The body read as JSON, or why it is not JSON.
    pub json: Result<Json<'a>, &'a JsonError>,
}

/// Runs one model call.
pub(super) async fn run(
    capture: Arc<Capture>,
    ctx: RequestContext,
    head: Parts,
    body: Body<'_>,
    call: ModelCall,
    path: String,
) -> Response<ProxyBody> {
    let api = call.api;
    let session = Capture::session_of(&ctx);
    let native_body = match body.json {
        Ok(j) if j.is_null() => RawJson::null(),
        Ok(_) => RawJson::from_checked(body.bytes.clone()),
        Err(_) => RawJson::from_value(&Value::String(
            String::from_utf8_lossy(body.bytes).into_owned(),
        )),
    };
    let native = NativeRequest {
        api,
        method: head.method.to_string(),
        host: ctx.host.clone(),
        path,
        body: native_body,
    };
    let recording = match Recording::start(&capture.store, &session, native).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(session = %session, error = %e, "capture log unavailable; refusing the call");
            return errors::respond(
                api,
                &ProviderError::new(
                    Side::Agent,
                    ErrorKind::Internal,
                    "the agent cannot record this call",
                ),
            );
        }
    };
    let span = tracing::info_span!(
        "call",
        session = %session,
        seq = recording.seq(),
        call_id = %recording.call_id(),
        api = ?api
    );
    translate_and_answer(capture, ctx, recording, body.json, call)
        .instrument(span)
        .await
}

/// The rest of a call once its recording is started.
async fn translate_and_answer(
    capture: Arc<Capture>,
    ctx: RequestContext,
    mut recording: Recording,
    json: Result<Json<'_>, &JsonError>,
    call: ModelCall,
) -> Response<ProxyBody> {
    let api = call.api;
    let received_ms = recording.received_ms();
    let session = Capture::session_of(&ctx);
    let json = match json {
        Ok(j) => j,
        Err(e) => {
            let err = ProviderError::invalid(format!("the request body is not JSON: {e}"));
            return fail_early(recording, api, err).await;
        }
    };
    let parsed = match provider::parse_request(&call, json) {
        Ok(p) => p,
        Err(err) => return fail_early(recording, api, err).await,
    };
    let opts = parsed.reply_options(&call, received_ms / 1000);
    let ParsedRequest {
        request,
        previous_response_id,
        ..
    } = parsed;
    let history_added = previous_response_id.is_some();
    let request = match previous_response_id {
        None => request,
        Some(prev) => match recording.conversation(&prev) {
            Some(prior) => provider::with_history(&prior, request),
            None => {
                recording.set_request(request);
                let err = ProviderError::invalid(format!(
                    "Previous response with id '{prev}' not found."
                ));
                return fail_early(recording, api, err).await;
            }
        },
    };
    recording.set_request(request);
    let backend_name = ctx.backend.as_deref().unwrap_or_default().to_owned();
    let Some(client) = capture.backend(&backend_name).cloned() else {
        let err = ProviderError::new(
            Side::Agent,
            ErrorKind::Internal,
            format!("the route names backend {backend_name:?}, which is not configured"),
        );
        recording.backend(backend_name, None);
        return fail_early(recording, api, err).await;
    };
    let stream = match client.chat(session.as_str(), recording.request()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(session = %session, seq = recording.seq(), error = %e, "inference call failed");
            let err = errors::provider_error(&e);
            errors::count_backend(recording.stats(), &err);
            // A replica that answered (an error status, a timeout) is named
            // in the record, with the model it was asked for.
            let cfg = client.config();
            let answered = e.replica().map(|replica| polar_inference::BackendInfo {
                backend: backend_name.clone(),
                dialect: cfg.dialect,
                replica: replica.to_owned(),
                served_model: cfg.map_model(&recording.request().model).to_owned(),
                weight_version: None,
                attempts: 1,
                serving: None,
            });
            recording.backend(backend_name, answered);
            return fail_early(recording, api, err).await;
        }
    };
    recording.sent(history_added);
    let framing = opts.framing;
    let call = reply::Call {
        recording,
        api,
        opts,
    };
    match framing {
        Framing::Json => reply::whole(call, stream).await,
        Framing::Sse | Framing::JsonArray => reply::streamed(call, stream, &capture.tasks).await,
    }
}

/// A call that failed before any reply existed: recorded (with the
/// backend it was routed to and the replica, when one answered:
/// [`Recording::backend`]), then answered with an error response in the
/// API's shape.
async fn fail_early(recording: Recording, api: Api, err: ProviderError) -> Response<ProxyBody> {
    if err.side == Side::Harness {
        tracing::info!(seq = recording.seq(), error = %err, "refused a model call");
    }
    // A request the backend refused (a prompt over its context...) is
    // recorded on the harness's side: the policy's doing, not a fault of
    // the infrastructure (the backend error counters still count it).
    let side = match err.kind {
        ErrorKind::InvalidRequest | ErrorKind::TooLarge | ErrorKind::ContextOverflow { .. } => {
            Side::Harness
        }
        _ => err.side,
    };
    let outcome = Outcome::Failed {
        side,
        error: err.message.clone(),
    };
    if let Err(resp) = finish(recording, outcome, api).await {
        return resp;
    }
    errors::respond(api, &err)
}

/// Finishes a call's recording (see [`finish_with`]).
pub(super) async fn finish(
    recording: Recording,
    outcome: Outcome,
    api: Api,
) -> Result<(), Response<ProxyBody>> {
    finish_with(recording, outcome, api, |_| ()).await
}

/// Finishes a call's recording, taking what `read` needs of the record
/// first; when the record cannot be appended the harness gets a 500
/// instead of the reply (a call that cannot be recorded is not
/// acknowledged).
pub(super) async fn finish_with<R>(
    recording: Recording,
    outcome: Outcome,
    api: Api,
    read: impl FnOnce(&CompletionRecord) -> R,
) -> Result<R, Response<ProxyBody>> {
    let session = recording.session().clone();
    recording.finish_with(outcome, read).await.map_err(|e| {
        tracing::error!(session = %session, error = %e, "appending to the capture log failed");
        errors::respond(api, &record_failed())
    })
}

/// The error a harness gets when its call could not be recorded.
pub(super) fn record_failed() -> ProviderError {
    ProviderError::new(
        Side::Agent,
        ErrorKind::Internal,
        "the agent could not record this call",
    )
}
