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

use polar_capture::SessionLog;
use polar_chat::Api;
use polar_chat::provider::{
    self, ErrorKind, Framing, ModelCall, ParsedRequest, ProviderError, Side,
};
use polar_json::{Json, JsonError, RawJson};
use polar_record::{CompletionRecord, NativeRequest};

use super::super::body::ProxyBody;
use super::super::pipeline::RequestContext;
use super::{Capture, errors, reply};
use polar_capture::build::{Draft, Produced, call_id, empty_request, now_ms};
use polar_capture::encode::RecordParts;
use polar_capture::tokens_json::ReplyTokensJson;

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
    let received_ms = now_ms();
    let api = call.api;
    let session = Capture::session_of(&ctx);
    let log = match capture.store.session(&session).await {
        Ok(l) => l,
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
    let info = capture.store.registry().get(&session).unwrap_or_default();
    let policy_version = info.policy_version().map(str::to_owned);
    let task_id = info.task_id;
    let native_body = match body.json {
        Ok(j) if j.is_null() => RawJson::null(),
        Ok(_) => RawJson::from_checked(body.bytes.clone()),
        Err(_) => RawJson::from_value(&Value::String(
            String::from_utf8_lossy(body.bytes).into_owned(),
        )),
    };
    let draft = Draft {
        call_id: call_id(),
        seq: log.next_seq(),
        session_id: session.to_string(),
        task_id,
        policy_version,
        native: NativeRequest {
            api,
            method: head.method.to_string(),
            host: ctx.host.clone(),
            path,
            body: native_body,
        },
        request: empty_request(),
        received_ms,
    };
    let span = tracing::info_span!(
        "call",
        session = %session,
        seq = draft.seq,
        call_id = %draft.call_id,
        api = ?api
    );
    translate_and_answer(capture, ctx, log, draft, body.json, call)
        .instrument(span)
        .await
}

/// The rest of a call once its record is drafted.
async fn translate_and_answer(
    capture: Arc<Capture>,
    ctx: RequestContext,
    log: Arc<SessionLog>,
    mut draft: Draft,
    json: Result<Json<'_>, &JsonError>,
    call: ModelCall,
) -> Response<ProxyBody> {
    let api = call.api;
    let received_ms = draft.received_ms;
    let session = Capture::session_of(&ctx);
    let json = match json {
        Ok(j) => j,
        Err(e) => {
            let err = ProviderError::invalid(format!("the request body is not JSON: {e}"));
            return fail_early(&log, draft, api, err, None, None).await;
        }
    };
    let parsed = match provider::parse_request(&call, json) {
        Ok(p) => p,
        Err(err) => return fail_early(&log, draft, api, err, None, None).await,
    };
    let opts = parsed.reply_options(&call, received_ms / 1000);
    let ParsedRequest {
        request,
        previous_response_id,
        ..
    } = parsed;
    draft.request = request;
    let history_added = previous_response_id.is_some();
    if let Some(prev) = previous_response_id {
        match log.conversation(&prev) {
            Some(prior) => {
                let req = std::mem::replace(&mut draft.request, empty_request());
                draft.request = provider::with_history(&prior, req);
            }
            None => {
                let err = ProviderError::invalid(format!(
                    "Previous response with id '{prev}' not found."
                ));
                return fail_early(&log, draft, api, err, None, None).await;
            }
        }
    }
    let backend_name = ctx.backend.as_deref().unwrap_or_default().to_owned();
    let Some(client) = capture.backend(&backend_name).cloned() else {
        let err = ProviderError::new(
            Side::Agent,
            ErrorKind::Internal,
            format!("the route names backend {backend_name:?}, which is not configured"),
        );
        return fail_early(&log, draft, api, err, Some(backend_name), None).await;
    };
    let stream = match client.chat(session.as_str(), &draft.request).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(session = %session, seq = draft.seq, error = %e, "inference call failed");
            let err = errors::provider_error(&e);
            errors::count_backend(&log, &err);
            // A replica that answered (an error status, a timeout) is named
            // in the record, with the model it was asked for.
            let cfg = client.config();
            let answered = e.replica().map(|replica| polar_inference::BackendInfo {
                backend: backend_name.clone(),
                dialect: cfg.dialect,
                replica: replica.to_owned(),
                served_model: cfg.map_model(&draft.request.model).to_owned(),
                weight_version: None,
                attempts: 1,
                serving: None,
            });
            return fail_early(&log, draft, api, err, Some(backend_name), answered).await;
        }
    };
    let early = draft.encode_early(history_added);
    let framing = opts.framing;
    let call = reply::Call {
        log,
        draft,
        early,
        api,
        opts,
    };
    match framing {
        Framing::Json => reply::whole(call, stream).await,
        Framing::Sse | Framing::JsonArray => reply::streamed(call, stream, &capture.tasks).await,
    }
}

/// A call that failed before any reply existed: recorded (with the
/// replica, when one answered), then answered with an error response in
/// the API's shape.
async fn fail_early(
    log: &SessionLog,
    draft: Draft,
    api: Api,
    err: ProviderError,
    backend_name: Option<String>,
    backend: Option<polar_inference::BackendInfo>,
) -> Response<ProxyBody> {
    if err.side == Side::Harness {
        tracing::info!(seq = draft.seq, error = %err, "refused a model call");
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
    let record = draft.finish(
        Produced {
            backend_name,
            backend,
            ..Produced::default()
        },
        Some((side, err.message.clone())),
    );
    if let Err(resp) = append(log, record, RecordParts::default(), api).await {
        return resp;
    }
    errors::respond(api, &err)
}

/// Appends a record's last line (its completion, or the whole record, as
/// `parts` says; the reply's token data serialized now: nothing of these
/// calls was streamed to the harness); when that fails the harness gets a
/// 500 instead of the reply (a call that cannot be recorded is not
/// acknowledged).
pub(super) async fn append(
    log: &SessionLog,
    record: CompletionRecord,
    parts: RecordParts,
    api: Api,
) -> Result<(), Response<ProxyBody>> {
    let tokens = ReplyTokensJson::default();
    log.append(record, parts, tokens).await.map_err(|e| {
        tracing::error!(session = %log.session(), error = %e, "appending to the capture log failed");
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
