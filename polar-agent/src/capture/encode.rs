//! A record's log line, with its big parts serialized ahead of time.
//!
//! The native request, the normalized request and the prompt token ids make
//! up most of a record's bytes, and all three are known long before the
//! call ends. The capture stage serializes them while the backend generates
//! ([`PreEncoded`]); when the call ends only the reply's part is left to
//! serialize before the line is appended and synced, which is what the
//! harness waits for. [`encode_record`] writes exactly the bytes
//! `serde_json` writes for the [`CompletionRecord`] itself.

use serde::Serialize;
use serde::ser::Serializer;
use serde_json::value::{RawValue, to_raw_value};

use super::log::LogError;
use super::record::{BackendInfo, CallStatus, CompletionRecord, NativeRequest, Timings};
use crate::chat::{ChatRequest, ChatResponse, FinishReason};

/// Parts of a record already serialized. A part that is absent is
/// serialized from the record when the line is written.
#[derive(Debug, Default)]
pub struct PreEncoded {
    /// `native_request`.
    pub native_request: Option<Box<RawValue>>,
    /// `request`.
    pub request: Option<Box<RawValue>>,
    /// `prompt_token_ids`, with the fingerprint of the ids it was made from
    /// (it is used only if the record's ids have the same).
    pub prompt_token_ids: Option<(IdsFingerprint, Box<RawValue>)>,
}

/// Length and a hash of a list of token ids: enough to tell whether the ids
/// a part was serialized from are the record's, without keeping a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdsFingerprint {
    len: usize,
    hash: u64,
}

impl IdsFingerprint {
    /// The fingerprint of `ids`: FNV-1a over the ids in four interleaved
    /// lanes (independent multiplications run in parallel: it runs before
    /// the record is written, on the path to the reply's last byte), the
    /// lanes then folded together in order.
    pub fn of(ids: &[u32]) -> Self {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut lanes: [u64; 4] = [
            0xcbf2_9ce4_8422_2325,
            0x8422_2325_cbf2_9ce4,
            0x9ce4_cbf2_2325_8422,
            0x2325_8422_9ce4_cbf2,
        ];
        let mut chunks = ids.chunks_exact(4);
        for c in &mut chunks {
            for (lane, id) in lanes.iter_mut().zip(c) {
                *lane = (*lane ^ u64::from(*id)).wrapping_mul(PRIME);
            }
        }
        for (lane, id) in lanes.iter_mut().zip(chunks.remainder()) {
            *lane = (*lane ^ u64::from(*id)).wrapping_mul(PRIME);
        }
        let hash = lanes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, l| {
            (h ^ l).wrapping_mul(PRIME)
        });
        Self {
            len: ids.len(),
            hash,
        }
    }
}

impl PreEncoded {
    /// Serializes the native and normalized requests.
    pub fn requests(native: &NativeRequest, request: &ChatRequest) -> Self {
        Self {
            native_request: to_raw_value(native).ok(),
            request: to_raw_value(request).ok(),
            prompt_token_ids: None,
        }
    }

    /// Serializes prompt token ids (with their fingerprint for the check).
    pub fn prompt(ids: &[u32]) -> Option<(IdsFingerprint, Box<RawValue>)> {
        let raw = to_raw_value(ids).ok()?;
        Some((IdsFingerprint::of(ids), raw))
    }
}

/// Either a pre-serialized part or the value to serialize.
enum Part<'a, T> {
    Raw(&'a RawValue),
    Value(&'a T),
}

impl<T: Serialize> Serialize for Part<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Raw(r) => r.serialize(s),
            Self::Value(v) => v.serialize(s),
        }
    }
}

/// [`CompletionRecord`]'s serialized layout, field for field.
#[derive(Serialize)]
struct Line<'a> {
    version: u32,
    call_id: &'a str,
    seq: u64,
    session_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<&'a String>,
    native_request: Part<'a, NativeRequest>,
    request: Part<'a, ChatRequest>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<&'a ChatResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<Part<'a, Vec<u32>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_token_ids: Option<&'a Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_logprobs: Option<&'a Vec<f32>>,
    token_ids_missing: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'a FinishReason>,
    backend: &'a BackendInfo,
    timings: &'a Timings,
    #[serde(flatten)]
    status: &'a CallStatus,
}

/// The log line of `record` (JSON and a newline), using the parts of `pre`
/// that match it.
pub fn encode_record(record: &CompletionRecord, pre: &PreEncoded) -> Result<Vec<u8>, LogError> {
    let prompt = match (&record.prompt_token_ids, &pre.prompt_token_ids) {
        (None, _) => None,
        (Some(ids), Some((print, raw))) if IdsFingerprint::of(ids) == *print => {
            Some(Part::Raw(raw))
        }
        (Some(ids), _) => Some(Part::Value(ids)),
    };
    let line = Line {
        version: record.version,
        call_id: &record.call_id,
        seq: record.seq,
        session_id: &record.session_id,
        task_id: record.task_id.as_ref(),
        native_request: pre
            .native_request
            .as_deref()
            .map_or(Part::Value(&record.native_request), Part::Raw),
        request: pre
            .request
            .as_deref()
            .map_or(Part::Value(&record.request), Part::Raw),
        response: record.response.as_ref(),
        prompt_token_ids: prompt,
        response_token_ids: record.response_token_ids.as_ref(),
        response_logprobs: record.response_logprobs.as_ref(),
        token_ids_missing: record.token_ids_missing,
        finish_reason: record.finish_reason.as_ref(),
        backend: &record.backend,
        timings: &record.timings,
        status: &record.status,
    };
    // One allocation of about the line's size instead of a doubling
    // buffer copying the big parts over and over (the reply's message is
    // the unknown part: a long one costs one reallocation).
    let raw = |r: Option<&RawValue>| r.map_or(0, |r| r.get().len());
    let guess = raw(pre.native_request.as_deref())
        + raw(pre.request.as_deref())
        + raw(pre.prompt_token_ids.as_ref().map(|(_, r)| &**r))
        + record
            .response_token_ids
            .as_ref()
            .map_or(0, |v| v.len() * 8)
        + record
            .response_logprobs
            .as_ref()
            .map_or(0, |v| v.len() * 24)
        + 8 * 1024;
    let mut out = Vec::with_capacity(guess);
    serde_json::to_writer(&mut out, &line)?;
    out.push(b'\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::log::encode_line;
    use crate::capture::record::Api;

    #[test]
    fn fingerprints_tell_order_values_and_length_apart() {
        let ids: Vec<u32> = (0..1003).collect();
        let print = IdsFingerprint::of(&ids);
        assert_eq!(print, IdsFingerprint::of(&ids.clone()));
        let mut swapped = ids.clone();
        swapped.swap(0, 1); // two lanes
        assert_ne!(IdsFingerprint::of(&swapped), print);
        let mut swapped = ids.clone();
        swapped.swap(0, 4); // the same lane
        assert_ne!(IdsFingerprint::of(&swapped), print);
        let mut changed = ids.clone();
        changed[1002] = 7; // the remainder
        assert_ne!(IdsFingerprint::of(&changed), print);
        assert_ne!(IdsFingerprint::of(&ids[..1002]), print);
        assert_ne!(IdsFingerprint::of(&[]), IdsFingerprint::of(&[0]));
    }

    #[test]
    fn pre_encoded_lines_are_byte_identical() {
        let mut record = crate::capture::log::tests::record(3, Api::OpenaiResponses, "hi");
        let plain = encode_line(&record).unwrap();
        let mut pre = PreEncoded::requests(&record.native_request, &record.request);
        pre.prompt_token_ids = PreEncoded::prompt(&[1, 2, 3]);
        assert_eq!(encode_record(&record, &pre).unwrap(), plain);
        // Stale prompt ids are not used.
        record.prompt_token_ids = Some(vec![1, 2, 4]);
        assert_ne!(
            IdsFingerprint::of(&[1, 2, 3]),
            IdsFingerprint::of(&[1, 2, 4])
        );
        assert_eq!(
            encode_record(&record, &pre).unwrap(),
            encode_line(&record).unwrap()
        );
        // Every optional field absent, a failure status.
        record.task_id = None;
        record.response = None;
        record.prompt_token_ids = None;
        record.response_token_ids = None;
        record.response_logprobs = None;
        record.finish_reason = None;
        record.status = CallStatus::Failed {
            side: "backend".into(),
            error: "x".into(),
        };
        assert_eq!(
            encode_record(&record, &PreEncoded::default()).unwrap(),
            encode_line(&record).unwrap()
        );
        let back: CompletionRecord =
            serde_json::from_slice(&encode_record(&record, &pre).unwrap()).unwrap();
        assert_eq!(back, record);
    }
}
