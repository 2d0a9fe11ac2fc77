//! A call's request part (see `polar-capture-log`), appended to its session's
//! log while the backend generates. Once the backend's first event is in
//! (vLLM sends the prompt token ids with it), [`RequestPartWrite::start`]
//! spawns a task that waits for the requests' serialization
//! ([`EarlyEncoding`]), serializes the prompt ids, and appends the part
//! (one write, journaled in `power` mode, not synced) on a blocking
//! thread; the reply's events go on meanwhile. At the call's end [`RequestPartWrite::finish`] waits for the
//! task if it still runs and says whether only the completion is left to
//! write, or the whole record (the part could not be written).

use std::sync::Arc;

use tokio::task::JoinHandle;
use tracing::Instrument;

use super::build::{Draft, EarlyEncoding};
use super::store::SessionLog;
use polar_capture_log::LogError;
use polar_capture_log::encode::{PartHead, PreEncoded, RecordParts, encode_request_part};
use polar_chat::ChatRequest;

/// What the task gives back: the normalized request lent and where the big
/// parts are.
#[derive(Debug)]
struct Done {
    request: ChatRequest,
    parts: RecordParts,
}

/// A call's request part being written.
#[derive(Debug)]
pub(crate) struct RequestPartWrite(JoinHandle<Option<Done>>);

impl RequestPartWrite {
    /// Starts writing the request part of `draft`'s call to `log`, with
    /// the requests `early` serializes and the prompt ids known now.
    pub fn start(
        log: Arc<SessionLog>,
        draft: &Draft,
        early: EarlyEncoding,
        prompt: Option<Vec<u32>>,
    ) -> Self {
        let head = PartHead {
            call_id: draft.call_id.clone(),
            seq: draft.seq,
            session_id: draft.session_id.clone(),
        };
        let task = async move {
            let (request, mut pre) = early.finish().await?;
            let write = move || {
                let written = match write_part(&log, &head, &pre, prompt.as_deref()) {
                    Ok(written) => written,
                    Err(e) => {
                        tracing::warn!(error = %e, "writing a call's request part failed; the record will be written whole");
                        false
                    }
                };
                let parts = if written {
                    // The ids are kept (not their JSON) to tell at the end
                    // whether the record's are the same, unless the stream
                    // says they are (`RecordParts::prompt_unchanged`).
                    RecordParts::InRequestPart(prompt.into())
                } else {
                    pre.prompt_token_ids = prompt.as_deref().and_then(PreEncoded::prompt);
                    RecordParts::Whole(pre)
                };
                Done { request, parts }
            };
            match tokio::task::spawn_blocking(write).await {
                Ok(done) => Some(done),
                Err(e) => {
                    tracing::error!(error = %e, "the request part's writer failed; the normalized request is lost");
                    None
                }
            }
        };
        Self(tokio::spawn(task.instrument(tracing::Span::current())))
    }

    /// Waits for the part, gives the normalized request back to `draft`, and tells
    /// where the record's big parts are.
    pub async fn finish(self, draft: &mut Draft) -> RecordParts {
        match self.0.await {
            Ok(Some(done)) => {
                draft.request = done.request;
                done.parts
            }
            Ok(None) => RecordParts::default(),
            Err(e) => {
                tracing::error!(error = %e, "the request part's writer failed; the normalized request is lost");
                RecordParts::default()
            }
        }
    }
}

/// Appends the part; `Ok(true)` once it is in the log,
/// `Ok(false)` when the requests were not serialized. Blocking.
fn write_part(
    log: &SessionLog,
    head: &PartHead,
    pre: &PreEncoded,
    prompt: Option<&[u32]>,
) -> Result<bool, LogError> {
    let Some(line) = encode_request_part(head, pre, prompt)? else {
        return Ok(false);
    };
    log.append_request_part(&line)?;
    Ok(true)
}
