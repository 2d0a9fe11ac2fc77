//! The dashboard (`/ui`): its static files, embedded in the binary
//! (`assets`), and the endpoints only it needs beyond the trainer API: who
//! the token is (`GET /v1/whoami`), one sample in full (`GET
//! /v1/tasks/{id}/samples/{index}`) and its exported trajectory (`GET
//! /v1/tasks/{id}/samples/{index}/trajectory`, read by `exports` beneath
//! the operator's `[rollout.dashboard] export_roots` or `s3_roots`) and its
//! exported calls (`GET /v1/tasks/{id}/samples/{index}/calls`, `calls`,
//! read the same way); `settings` is
//! `[rollout.dashboard]`. The pages (plain JavaScript modules and CSS, no
//! build step) live in `polar-agent/crates/rollout/ui/`; docs/DASHBOARD.md
//! shows them.
//!
//! The static files need no token (they hold no data); every request for
//! data carries the bearer token the page asked for once and kept in the
//! tab's `sessionStorage`, never in a URL. The files are served with a
//! Content-Security-Policy allowing scripts, styles and connections to this
//! origin only (nothing fetched from elsewhere, no inline script).

mod assets;
pub mod calls;
pub mod exports;
pub mod settings;
pub mod token_text;

use std::sync::Arc;

use http::StatusCode;
use serde_json::json;

use super::core::Core;
use super::server::ApiError;
use polar_rollout_api::API_VERSION;
use polar_rollout_api::http::{Body, json};

pub use assets::asset;
#[cfg(test)]
pub use assets::names as assets_names;
use exports::ExportReadError;

/// `GET /v1/whoami`: what the caller's token may do, so that the
/// dashboard shows controls only to tokens that may use them.
pub fn whoami(may_control: bool) -> http::Response<Body> {
    json(
        StatusCode::OK,
        &json!({
            "version": API_VERSION,
            "role": if may_control { "trainer" } else { "viewer" },
            "may_control": may_control,
        }),
    )
}

/// Parses a sample index from the path.
pub(crate) fn index_of(s: &str) -> Result<u32, ApiError> {
    s.parse::<u32>().map_err(|_| {
        ApiError::Invalid(polar_rollout_api::validate::ValidationError {
            field: "index".into(),
            reason: format!("{s:?}: not a sample index"),
        })
    })
}

/// `GET /v1/tasks/{id}/samples/{index}`: one sample as in the task view,
/// with the task's group and policy version.
pub async fn sample(
    core: &Arc<Core>,
    task: &str,
    index: &str,
) -> Result<http::Response<Body>, ApiError> {
    let i = index_of(index)?;
    let found = core.read(|s| s.sample_view(task, i)).await?;
    let Some((view, group_id, policy_version)) = found else {
        return Err(ApiError::NotFound(format!("unknown sample {task:?}/{i}")));
    };
    let mut body = serde_json::to_value(&view).unwrap_or_default();
    if let Some(o) = body.as_object_mut() {
        o.insert("version".into(), API_VERSION.into());
        o.insert("task_id".into(), task.into());
        o.insert("group_id".into(), group_id.into());
        o.insert("policy_version".into(), policy_version.into());
    }
    Ok(json(StatusCode::OK, &body))
}

/// The reply of the trajectory endpoint.
#[derive(serde::Serialize)]
struct TrajectoryReply<'a> {
    version: u32,
    task_id: &'a str,
    sample_index: u32,
    session_id: &'a str,
    uri: &'a str,
    format: &'static str,
    file_bytes: u64,
    rows: &'a [polar_export::Row<'static>],
    token_text: TokenTexts,
}

/// The text of each distinct token id of the rows, or why there is none.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum TokenTexts {
    /// From the configured tokenizer.
    Decoded {
        /// The tokenizer file's name (not its directory).
        tokenizer: String,
        /// Id (as a JSON key) to its piece.
        pieces: std::collections::BTreeMap<u32, token_text::Piece>,
    },
    /// No tokenizer configured.
    Missing {
        /// Why (for the page).
        reason: &'static str,
    },
}

/// Decodes every distinct id of `rows` (blocks).
fn token_texts(
    tokenizer: Option<&token_text::TokenText>,
    rows: &[polar_export::Row<'_>],
) -> TokenTexts {
    let Some(t) = tokenizer else {
        return TokenTexts::Missing {
            reason: "this server has no tokenizer: set [rollout.dashboard] tokenizer to the \
                     policy's tokenizer.json to see token text",
        };
    };
    let ids = rows
        .iter()
        .flat_map(|r| r.prompt_ids.iter().chain(r.response_ids.iter()).copied());
    TokenTexts::Decoded {
        tokenizer: t
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        pieces: t.pieces(ids),
    }
}

/// `GET /v1/tasks/{id}/samples/{index}/trajectory`: the rows of the
/// sample's session in its exported file.
pub async fn trajectory(
    core: &Arc<Core>,
    task: &str,
    index: &str,
) -> Result<http::Response<Body>, ApiError> {
    let i = index_of(index)?;
    let found = core.read(|s| s.sample_view(task, i)).await?;
    let Some((view, ..)) = found else {
        return Err(ApiError::NotFound(format!("unknown sample {task:?}/{i}")));
    };
    let uri = match &view.state {
        polar_rollout_api::SessionState::Done { result, .. } => result.trajectory_uri.clone(),
        _ => None,
    };
    let Some(uri) = uri else {
        return Err(ApiError::Export(ExportReadError::NoFile(view.session_id)));
    };
    let settings = &core.cfg.dashboard;
    // An object is fetched here, on the runtime; a local file is read
    // (and everything decoded) on the blocking pool.
    let fetched = if uri.starts_with("s3://") {
        Some(exports::fetch_s3(&uri, &settings.s3_roots, settings.max_file_bytes).await?)
    } else {
        None
    };
    let (roots, max) = (settings.export_roots.clone(), settings.max_file_bytes);
    let tokenizer = settings.tokenizer.clone();
    let session = view.session_id.clone();
    let task = task.to_owned();
    let body = tokio::task::spawn_blocking(move || {
        let (format, file_bytes, rows) = match fetched {
            Some((format, bytes)) => {
                let n = bytes.len() as u64;
                let rows = exports::decode_session_rows(&uri, format, bytes, &session)?;
                (format, n, rows)
            }
            None => exports::read_session_rows(&uri, &session, &roots, max)?,
        };
        // Token text is decoded here (one decode per distinct id) and
        // everything encoded: a 200,000-token trace is megabytes of JSON.
        let token_text = token_texts(tokenizer.as_deref(), &rows);
        let reply = TrajectoryReply {
            version: API_VERSION,
            task_id: &task,
            sample_index: i,
            session_id: &session,
            uri: &uri,
            format: format.as_str(),
            file_bytes,
            rows: &rows,
            token_text,
        };
        serde_json::to_vec(&reply).map_err(|e| ExportReadError::Decode {
            path: uri.clone(),
            reason: e.to_string(),
        })
    })
    .await
    .map_err(|e| ApiError::Internal(format!("reading the export: {e}")))??;
    Ok(polar_rollout_api::http::json_bytes(
        http::StatusCode::OK,
        body,
    ))
}
