//! The records a builder can use: sorted into call order, with the calls
//! that carry no usable token ids set aside with their reason. Both builders
//! start here, so they drop exactly the same calls.

use polar_chat::{Api, FinishReason};
use polar_record::{CallStatus, CompletionRecord};

use super::stats::{DropReason, DroppedCall};

/// A record with usable token data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call<'a> {
    /// The record.
    pub record: &'a CompletionRecord,
    /// Its prompt ids.
    pub prompt: &'a [u32],
    /// Its generated ids.
    pub response: &'a [u32],
    /// Its logprobs (same length as `response`), when the backend gave them.
    pub logprobs: Option<&'a [f32]>,
}

impl<'a> Call<'a> {
    /// Why generation stopped (the record's field, else the reply's).
    pub fn finish_reason(&self) -> Option<&'a FinishReason> {
        self.record.finish_reason.as_ref().or(self
            .record
            .response
            .as_ref()
            .map(|r| &r.finish_reason))
    }

    /// Whether the call stopped at its token limit.
    pub fn truncated(&self) -> bool {
        self.finish_reason() == Some(&FinishReason::Length)
    }

    /// Length of prompt + response.
    pub fn seq_len(&self) -> usize {
        self.prompt.len() + self.response.len()
    }

    /// Whether the call is the summary Polar asked the backend for when the
    /// harness requested a server-side compaction (an OpenAI Responses
    /// request whose last input item is a `compaction_trigger`).
    pub fn server_compaction(&self) -> bool {
        let native = &self.record.native_request;
        if native.api != Api::OpenaiResponses {
            return false;
        }
        let Ok(doc) = polar_json::Doc::parse(native.body.as_bytes()) else {
            return false;
        };
        doc.root()
            .get("input")
            .and_then(|i| i.as_array())
            .and_then(Iterator::last)
            .and_then(|item| item.get("type"))
            .is_some_and(|t| t.is_str(COMPACTION_TRIGGER))
    }
}

/// The Responses input item type a harness sends to ask for a server-side
/// compaction.
pub(crate) const COMPACTION_TRIGGER: &str = "compaction_trigger";

/// Sorts `records` by `seq` (stably) and splits them into usable calls and
/// dropped ones.
pub(crate) fn usable(records: &[CompletionRecord]) -> (Vec<Call<'_>>, Vec<DroppedCall>) {
    let mut order: Vec<&CompletionRecord> = records.iter().collect();
    order.sort_by_key(|r| r.seq);
    let mut calls = Vec::with_capacity(order.len());
    let mut dropped = Vec::new();
    for record in order {
        match check(record) {
            Ok(call) => calls.push(call),
            Err(reason) => dropped.push(DroppedCall {
                call_id: record.call_id.clone(),
                reason,
            }),
        }
    }
    (calls, dropped)
}

fn check(record: &CompletionRecord) -> Result<Call<'_>, DropReason> {
    if let CallStatus::Failed { side, error } = &record.status {
        return Err(DropReason::CallFailed {
            side: side.clone(),
            error: error.clone(),
        });
    }
    let (Some(prompt), Some(response), false) = (
        record.prompt_token_ids.as_deref(),
        record.response_token_ids.as_deref(),
        record.token_ids_missing,
    ) else {
        return Err(DropReason::TokenIdsMissing);
    };
    let logprobs = record.response_logprobs.as_deref();
    if let Some(lp) = logprobs
        && lp.len() != response.len()
    {
        return Err(DropReason::LogprobsLengthMismatch {
            response_len: response.len(),
            logprobs_len: lp.len(),
        });
    }
    Ok(Call {
        record,
        prompt,
        response,
        logprobs,
    })
}
