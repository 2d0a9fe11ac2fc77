//! `GET /v1/tasks/{id}/samples/{index}/calls`: a finished sample's model
//! calls read from its exported calls file (`<session>.calls.jsonl.zst`,
//! named by the result's `stats.calls_uri`, written by its gateway), so
//! the dashboard shows what the harness sent and got back after the node
//! dropped its copy. The file is read as the trajectory file is
//! (`exports`: beneath `[rollout.dashboard] export_roots` or `s3_roots`,
//! at most `max_file_bytes`), decoded with the export crate's reader (a
//! truncated, foreign or newer file is refused, naming the file), and each
//! call is shown by `polar_export::calls::view`: its outcome and timings,
//! the native request (method, host, path, body as sent) and the reply.

use std::sync::Arc;

use serde_json::{Value, json};

use super::exports::{self, ExportReadError, FileFormat};
use super::index_of;
use crate::core::Core;
use crate::server::ApiError;
use polar_export::calls::{ExportedCalls, decode_calls, view};
use polar_rollout_api::API_VERSION;

/// The reply: the file, the session as its node recorded it, the calls.
fn reply(task: &str, index: u32, uri: &str, bytes: u64, calls: &ExportedCalls) -> Value {
    json!({
        "version": API_VERSION,
        "task_id": task,
        "sample_index": index,
        "session_id": calls.header.session_id,
        "uri": uri,
        "file_bytes": bytes,
        "calls_schema_version": calls.header.polar_calls,
        "session": calls.header.session,
        "calls": calls.records.iter().map(view).collect::<Vec<_>>(),
    })
}

/// The handler.
pub async fn calls(
    core: &Arc<Core>,
    task: &str,
    index: &str,
) -> Result<http::Response<polar_rollout_api::http::Body>, ApiError> {
    let i = index_of(index)?;
    let found = core.read(|s| s.sample_view(task, i)).await?;
    let Some((view, ..)) = found else {
        return Err(ApiError::NotFound(format!("unknown sample {task:?}/{i}")));
    };
    let uri = match &view.state {
        polar_rollout_api::SessionState::Done { result, .. } => result
            .stats
            .as_ref()
            .and_then(|s| s.get("calls_uri"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    };
    let Some(uri) = uri else {
        return Err(ApiError::Export(ExportReadError::NoCalls(view.session_id)));
    };
    let settings = &core.cfg.dashboard;
    let fetched = if uri.starts_with("s3://") {
        Some(exports::fetch_s3(&uri, &settings.s3_roots, settings.max_file_bytes).await?)
    } else {
        None
    };
    let (roots, max) = (settings.export_roots.clone(), settings.max_file_bytes);
    let task = task.to_owned();
    let body = tokio::task::spawn_blocking(move || {
        let (format, bytes) = match fetched {
            Some((format, bytes)) => (format, bytes.to_vec()),
            None => exports::read_beneath(&uri, &roots, max)?,
        };
        if format != FileFormat::Calls {
            return Err(ExportReadError::Format(uri));
        }
        let calls = decode_calls(&uri, &bytes).map_err(|e| ExportReadError::Decode {
            path: uri.clone(),
            reason: e.to_string(),
        })?;
        let reply = reply(&task, i, &uri, bytes.len() as u64, &calls);
        serde_json::to_vec(&reply).map_err(|e| ExportReadError::Decode {
            path: uri.clone(),
            reason: e.to_string(),
        })
    })
    .await
    .map_err(|e| ApiError::Internal(format!("reading the calls: {e}")))??;
    Ok(polar_rollout_api::http::json_bytes(
        http::StatusCode::OK,
        body,
    ))
}
