//! A call's log lines, with its big parts serialized ahead of time.
//!
//! The native request, the normalized request and the prompt token ids make
//! up most of a record's bytes, and all three are known long before the
//! call ends. The capture stage serializes them while the backend generates
//! ([`PreEncoded`]) and writes them to the log as the call's request part
//! ([`encode_request_part`]); when the call ends only the completion is
//! left ([`encode_completion`]: the reply's part, a few kilobytes), which is
//! what the harness waits for; its token data was serialized while the
//! reply streamed ([`ReplyTokensJson`]) and is copied in, and its prompt
//! ids are left out without comparing them when they are known to be the
//! part's ([`PartPrompt::Same`]). When no request part was written, the
//! record goes as one whole line ([`encode_record`]: exactly the bytes
//! `serde_json` writes for the [`CompletionRecord`] itself). See
//! the crate's documentation for the layout and `lines` for reading it.

use serde::Serialize;
use serde::ser::Serializer;
use serde_json::value::{RawValue, to_raw_value};

use crate::error::LogError;
use crate::lines::{COMPLETION_PART, REQUEST_PART};
use crate::tokens_json::{self, ReplyTokensJson};
use polar_chat::{ChatRequest, ChatResponse, FinishReason};
use polar_record::{
    BackendInfo, CallStatus, CompletionRecord, NativeRequest, RECORD_VERSION, Resumed, Timings,
};

/// Parts of a record already serialized. A part that is absent is
/// serialized from the record when the line is written.
#[derive(Clone, Debug, Default)]
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

/// Where a record's big parts are when its call ends.
#[derive(Debug)]
pub enum RecordParts {
    /// Not in the log: the record is written as one whole line, with the
    /// parts that were serialized ahead.
    Whole(PreEncoded),
    /// In the log, in the call's request part, which holds these prompt
    /// token ids; the record is written as its completion.
    InRequestPart(PartPrompt),
}

impl Default for RecordParts {
    fn default() -> Self {
        Self::Whole(PreEncoded::default())
    }
}

impl RecordParts {
    /// The record's prompt ids are known to be the ones its request part
    /// was written from (the backend did not set them again since): they
    /// are not compared at the end.
    pub fn prompt_unchanged(self) -> Self {
        match self {
            Self::InRequestPart(PartPrompt::Ids(_)) => Self::InRequestPart(PartPrompt::Same),
            other => other,
        }
    }
}

/// The prompt token ids a call's request part holds, as its completion
/// needs to know them: the completion carries the record's own ids only
/// when they are not the part's.
#[derive(Debug)]
pub enum PartPrompt {
    /// The part holds none.
    Absent,
    /// The part holds these, compared with the record's at the end (48k
    /// ids take a few microseconds).
    Ids(Vec<u32>),
    /// The part holds the record's own ids, whatever they are (see
    /// [`RecordParts::prompt_unchanged`]): the completion has none.
    Same,
}

impl From<Option<Vec<u32>>> for PartPrompt {
    fn from(ids: Option<Vec<u32>>) -> Self {
        ids.map_or(Self::Absent, Self::Ids)
    }
}

/// What a request part says of its call besides the big parts.
#[derive(Clone, Debug)]
pub struct PartHead {
    /// [`CompletionRecord::call_id`].
    pub call_id: String,
    /// [`CompletionRecord::seq`].
    pub seq: u64,
    /// [`CompletionRecord::session_id`].
    pub session_id: String,
}

/// A request part's line.
#[derive(Serialize)]
struct RequestLine<'a> {
    part: &'static str,
    version: u32,
    call_id: &'a str,
    seq: u64,
    session_id: &'a str,
    native_request: &'a RawValue,
    request: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<&'a [u32]>,
}

/// [`CompletionRecord`]'s serialized layout, field for field, up to the
/// reply's token data; as a completion, with `part` first and without the
/// fields in its request part.
#[derive(Serialize)]
struct Head<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<&'static str>,
    version: u32,
    call_id: &'a str,
    seq: u64,
    session_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<&'a String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy_version: Option<&'a String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    native_request: Option<Part<'a, NativeRequest>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<Part<'a, ChatRequest>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<&'a ChatResponse>,
    /// Absent, `null` (`Some(None)`) or the ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<Option<Part<'a, Vec<u32>>>>,
}

/// The layout's fields after the reply's token data.
#[derive(Serialize)]
struct Tail<'a> {
    token_ids_missing: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'a FinishReason>,
    backend: &'a BackendInfo,
    timings: &'a Timings,
    #[serde(skip_serializing_if = "Option::is_none")]
    resumed: Option<&'a Resumed>,
    #[serde(flatten)]
    status: &'a CallStatus,
}

/// A record's line: the head, the reply's token data
/// ([`tokens_json::write_fields`]), the tail; the same bytes as the one
/// struct `serde_json` would write.
struct Line<'a> {
    record: &'a CompletionRecord,
    head: Head<'a>,
}

impl<'a> Line<'a> {
    /// The fields of `record` that are not in a request part, after `part`.
    fn small(record: &'a CompletionRecord, part: Option<&'static str>) -> Self {
        let head = Head {
            part,
            version: record.version,
            call_id: &record.call_id,
            seq: record.seq,
            session_id: &record.session_id,
            task_id: record.task_id.as_ref(),
            policy_version: record.policy_version.as_ref(),
            native_request: None,
            request: None,
            response: record.response.as_ref(),
            prompt_token_ids: None,
        };
        Self { record, head }
    }

    /// Serializes with its newline into a buffer of `big` bytes (the parts
    /// serialized ahead) and room for the rest: one allocation of about the
    /// line's size instead of a doubling buffer copying the big parts over
    /// and over (the reply's message is the unknown part: a long one costs
    /// one reallocation). The reply's token data is copied from `tokens`
    /// when it was serialized there.
    fn to_line(&self, tokens: &ReplyTokensJson, big: usize) -> Result<Vec<u8>, LogError> {
        let r = self.record;
        let ids = r.response_token_ids.as_deref();
        let lps = r.response_logprobs.as_deref();
        let ids_len = ids.map_or(0, |v| tokens.ids(v).map_or(v.len() * 8, <[u8]>::len));
        let lps_len = lps.map_or(0, |v| tokens.logprobs(v).map_or(v.len() * 24, <[u8]>::len));
        let mut out = Vec::with_capacity(big + ids_len + lps_len + 8 * 1024);
        serde_json::to_writer(&mut out, &self.head)?;
        // Reopened (it has `version`, so it ends with `}`, not `{}`)...
        debug_assert_eq!(out.last(), Some(&b'}'));
        out.pop();
        tokens_json::write_fields(&mut out, ids, lps, tokens)?;
        let tail = Tail {
            token_ids_missing: r.token_ids_missing,
            finish_reason: r.finish_reason.as_ref(),
            backend: &r.backend,
            timings: &r.timings,
            resumed: r.resumed.as_ref(),
            status: &r.status,
        };
        let at = out.len();
        serde_json::to_writer(&mut out, &tail)?;
        // ...and the tail's `{` is the comma before its first field.
        debug_assert_eq!(out.get(at), Some(&b'{'));
        out[at] = b',';
        out.push(b'\n');
        Ok(out)
    }
}

fn raw_len(r: Option<&RawValue>) -> usize {
    r.map_or(0, |r| r.get().len())
}

/// The whole log line of `record` (JSON and a newline), using the parts of
/// `pre` and `tokens` that match it.
pub fn encode_record(
    record: &CompletionRecord,
    pre: &PreEncoded,
    tokens: &ReplyTokensJson,
) -> Result<Vec<u8>, LogError> {
    let prompt = match (&record.prompt_token_ids, &pre.prompt_token_ids) {
        (None, _) => None,
        (Some(ids), Some((print, raw))) if IdsFingerprint::of(ids) == *print => {
            Some(Part::Raw(raw))
        }
        (Some(ids), _) => Some(Part::Value(ids)),
    };
    let mut line = Line::small(record, None);
    line.head.native_request = Some(
        pre.native_request
            .as_deref()
            .map_or(Part::Value(&record.native_request), Part::Raw),
    );
    line.head.request = Some(
        pre.request
            .as_deref()
            .map_or(Part::Value(&record.request), Part::Raw),
    );
    line.head.prompt_token_ids = prompt.map(Some);
    let big = raw_len(pre.native_request.as_deref())
        + raw_len(pre.request.as_deref())
        + raw_len(pre.prompt_token_ids.as_ref().map(|(_, r)| &**r));
    line.to_line(tokens, big)
}

/// The request part's line of the call `head`, from the requests
/// serialized ahead in `pre` and the prompt ids known (serialized here, into
/// the line); `None` when the requests were not serialized (that failed).
pub fn encode_request_part(
    head: &PartHead,
    pre: &PreEncoded,
    prompt: Option<&[u32]>,
) -> Result<Option<Vec<u8>>, LogError> {
    let (Some(native_request), Some(request)) = (&pre.native_request, &pre.request) else {
        return Ok(None);
    };
    request_line(head, native_request, request, prompt).map(Some)
}

fn request_line(
    head: &PartHead,
    native_request: &RawValue,
    request: &RawValue,
    prompt: Option<&[u32]>,
) -> Result<Vec<u8>, LogError> {
    let line = RequestLine {
        part: REQUEST_PART,
        version: RECORD_VERSION,
        call_id: &head.call_id,
        seq: head.seq,
        session_id: &head.session_id,
        native_request,
        request,
        prompt_token_ids: prompt,
    };
    // Up to 11 bytes per id ("4294967295,"), usually 6 or 7.
    let mut out = Vec::with_capacity(
        raw_len(Some(native_request))
            + raw_len(Some(request))
            + prompt.map_or(0, |ids| ids.len() * 8)
            + 256,
    );
    serde_json::to_writer(&mut out, &line)?;
    out.push(b'\n');
    Ok(out)
}

/// `record` as its request part and its completion, both serialized now
/// (for writers of sample logs; the agent writes the part while the backend
/// generates).
pub fn encode_two_parts(record: &CompletionRecord) -> Result<(Vec<u8>, Vec<u8>), LogError> {
    let head = PartHead {
        call_id: record.call_id.clone(),
        seq: record.seq,
        session_id: record.session_id.clone(),
    };
    let part = request_line(
        &head,
        &to_raw_value(&record.native_request)?,
        &to_raw_value(&record.request)?,
        record.prompt_token_ids.as_deref(),
    )?;
    let end = encode_completion(record, &PartPrompt::Same, &ReplyTokensJson::default())?;
    Ok((part, end))
}

/// The completion's line of `record`, whose request part holds the prompt
/// ids `part_prompt`: the record's are written only when they are not the
/// part's (an array, or `null` when the record has none). The reply's
/// token data is copied from `tokens` when it was serialized there.
pub fn encode_completion(
    record: &CompletionRecord,
    part_prompt: &PartPrompt,
    tokens: &ReplyTokensJson,
) -> Result<Vec<u8>, LogError> {
    let prompt = match (&record.prompt_token_ids, part_prompt) {
        (_, PartPrompt::Same) | (None, PartPrompt::Absent) => None,
        (Some(ids), PartPrompt::Ids(part)) if ids == part => None,
        (None, PartPrompt::Ids(_)) => Some(None),
        (Some(ids), _) => Some(Some(Part::Value(ids))),
    };
    let big = match prompt {
        Some(Some(_)) => record.prompt_token_ids.as_ref().map_or(0, |v| v.len() * 8),
        _ => 0,
    };
    let mut line = Line::small(record, Some(COMPLETION_PART));
    line.head.prompt_token_ids = prompt;
    line.to_line(tokens, big)
}

/// The line that ends `record`'s call: its completion, or the whole record
/// (the reply's token data copied from `tokens` when it was serialized
/// there).
pub fn encode_end(
    record: &CompletionRecord,
    parts: &RecordParts,
    tokens: &ReplyTokensJson,
) -> Result<Vec<u8>, LogError> {
    match parts {
        RecordParts::Whole(pre) => encode_record(record, pre, tokens),
        RecordParts::InRequestPart(prompt) => encode_completion(record, prompt, tokens),
    }
}

/// One record as its whole log line (JSON and a newline); see
/// [`encode_record`] for a line with parts serialized ahead and
/// [`encode_two_parts`] for the two parts.
pub fn encode_line(record: &CompletionRecord) -> Result<Vec<u8>, LogError> {
    let mut line = serde_json::to_vec(record)?;
    line.push(b'\n');
    Ok(line)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fixture::two_parts;
    use polar_chat::Api;

    fn json(line: &[u8]) -> serde_json::Value {
        assert!(line.ends_with(b"\n"));
        serde_json::from_slice(line).unwrap()
    }

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
        let mut record = crate::fixture::record(3, Api::OpenaiResponses, "hi");
        let none = ReplyTokensJson::default();
        let plain = encode_line(&record).unwrap();
        let mut pre = PreEncoded::requests(&record.native_request, &record.request);
        pre.prompt_token_ids = PreEncoded::prompt(&[1, 2, 3]);
        assert_eq!(encode_record(&record, &pre, &none).unwrap(), plain);
        assert_eq!(
            encode_end(&record, &RecordParts::Whole(pre), &none).unwrap(),
            plain
        );
        let mut pre = PreEncoded::requests(&record.native_request, &record.request);
        pre.prompt_token_ids = PreEncoded::prompt(&[1, 2, 3]);
        // Stale prompt ids are not used.
        record.prompt_token_ids = Some(vec![1, 2, 4]);
        assert_ne!(
            IdsFingerprint::of(&[1, 2, 3]),
            IdsFingerprint::of(&[1, 2, 4])
        );
        assert_eq!(
            encode_record(&record, &pre, &none).unwrap(),
            encode_line(&record).unwrap()
        );
        // Every optional field absent, a failure status.
        record.task_id = None;
        record.policy_version = None;
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
            encode_record(&record, &PreEncoded::default(), &none).unwrap(),
            encode_line(&record).unwrap()
        );
        let back: CompletionRecord =
            serde_json::from_slice(&encode_record(&record, &pre, &none).unwrap()).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn a_request_part_holds_the_big_fields_and_starts_with_its_kind() {
        let record = crate::fixture::record(3, Api::OpenaiChat, "hi");
        let (part, end) = two_parts(&record, Some(&[1, 2, 3]));
        assert!(part.starts_with(b"{\"part\":\"request\",\"version\":1,"));
        let p = json(&part);
        let whole = serde_json::to_value(&record).unwrap();
        for k in ["call_id", "seq", "session_id", "native_request", "request"] {
            assert_eq!(p[k], whole[k], "{k}");
        }
        assert_eq!(p["prompt_token_ids"], serde_json::json!([1, 2, 3]));
        assert!(p.get("response").is_none() && p.get("status").is_none());
        // The completion: the rest, its prompt ids in the part.
        assert!(end.starts_with(b"{\"part\":\"completion\",\"version\":1,"));
        let c = json(&end);
        for k in ["native_request", "request", "prompt_token_ids"] {
            assert!(c.get(k).is_none(), "{k}");
        }
        for k in [
            "call_id",
            "seq",
            "task_id",
            "policy_version",
            "response",
            "response_token_ids",
            "response_logprobs",
            "token_ids_missing",
            "finish_reason",
            "backend",
            "timings",
            "status",
        ] {
            assert_eq!(c[k], whole[k], "{k}");
        }
        assert!(end.len() < encode_line(&record).unwrap().len());
    }

    #[test]
    fn a_completion_carries_prompt_ids_the_part_lacks_or_differs_on() {
        let mut record = crate::fixture::record(3, Api::OpenaiChat, "hi");
        // The part has none, the record has some.
        let (part, end) = two_parts(&record, None);
        assert!(json(&part).get("prompt_token_ids").is_none());
        assert_eq!(json(&end)["prompt_token_ids"], serde_json::json!([1, 2, 3]));
        // The part's differ.
        let (_, end) = two_parts(&record, Some(&[9]));
        assert_eq!(json(&end)["prompt_token_ids"], serde_json::json!([1, 2, 3]));
        // The part has some, the record none: an explicit null.
        record.prompt_token_ids = None;
        let (_, end) = two_parts(&record, Some(&[1, 2, 3]));
        assert_eq!(json(&end)["prompt_token_ids"], serde_json::Value::Null);
        // Neither.
        let (_, end) = two_parts(&record, None);
        assert!(json(&end).get("prompt_token_ids").is_none());
    }

    #[test]
    fn a_part_known_to_hold_the_records_prompt_ids_is_not_compared() {
        let mut record = crate::fixture::record(3, Api::OpenaiChat, "hi");
        let none = ReplyTokensJson::default();
        let (_, compared) = two_parts(&record, Some(&[1, 2, 3]));
        let same = RecordParts::InRequestPart(Some(vec![1, 2, 3]).into()).prompt_unchanged();
        assert!(matches!(same, RecordParts::InRequestPart(PartPrompt::Same)));
        assert_eq!(encode_end(&record, &same, &none).unwrap(), compared);
        // Only the part's ids become "the record's"; none stay none.
        let absent = RecordParts::InRequestPart(None.into()).prompt_unchanged();
        assert!(matches!(
            absent,
            RecordParts::InRequestPart(PartPrompt::Absent)
        ));
        assert!(matches!(
            RecordParts::default().prompt_unchanged(),
            RecordParts::Whole(_)
        ));
        record.prompt_token_ids = None;
        let (_, compared) = two_parts(&record, None);
        assert_eq!(encode_end(&record, &absent, &none).unwrap(), compared);
    }

    #[test]
    fn token_data_serialized_while_streaming_gives_the_same_lines() {
        let mut record = crate::fixture::record(3, Api::OpenaiChat, "hi");
        record.response_token_ids = Some((0..200).map(|i| i * 7919).collect());
        record.response_logprobs = Some((0..200).map(|i| -0.013 * i as f32).collect());
        let ids = record.response_token_ids.clone().unwrap();
        let lps = record.response_logprobs.clone().unwrap();
        let mut streamed = ReplyTokensJson::default();
        for n in 0..=ids.len() {
            streamed.catch_up(&ids[..n], &lps[..n]);
        }
        let none = ReplyTokensJson::default();
        let parts = RecordParts::InRequestPart(PartPrompt::Same);
        assert_eq!(
            encode_end(&record, &parts, &streamed).unwrap(),
            encode_end(&record, &parts, &none).unwrap()
        );
        let whole = RecordParts::default();
        assert_eq!(
            encode_end(&record, &whole, &streamed).unwrap(),
            encode_line(&record).unwrap()
        );
        // Logprobs the record does not keep (not one per token): the ids'
        // text only.
        record.response_logprobs = None;
        assert_eq!(
            encode_end(&record, &whole, &streamed).unwrap(),
            encode_line(&record).unwrap()
        );
        // A failure without token data.
        record.response_token_ids = None;
        record.status = CallStatus::Failed {
            side: "harness".into(),
            error: "gone \"quoted\"".into(),
        };
        assert_eq!(
            encode_end(&record, &whole, &streamed).unwrap(),
            encode_line(&record).unwrap()
        );
    }

    /// A resumed call's `resumed` is written in the whole line and in the
    /// completion (byte-identical to `serde_json`'s), and read back from
    /// both; a line without it (older logs) reads as not resumed.
    #[test]
    fn a_resumed_call_round_trips_through_both_layouts() {
        let mut record = crate::fixture::record(3, Api::OpenaiChat, "hi");
        let plain_line = encode_line(&record).unwrap();
        assert!(!String::from_utf8_lossy(&plain_line).contains("resumed"));
        record.resumed = Some(polar_record::Resumed {
            replicas: vec!["http://a:1".into(), "http://b:1".into()],
            part_tokens: vec![4, 7],
            weight_versions: vec!["3".into(), "4".into()],
            faults: vec!["reply cut".into()],
        });
        let none = ReplyTokensJson::default();
        let pre = PreEncoded::requests(&record.native_request, &record.request);
        let line = encode_record(&record, &pre, &none).unwrap();
        assert_eq!(line, encode_line(&record).unwrap());
        let (records, problems) = crate::read::parse_log(&line);
        assert!(problems.is_empty());
        assert_eq!(records, vec![record.clone()]);
        let (part, end) = two_parts(&record, record.prompt_token_ids.as_deref());
        let (records, problems) = crate::read::parse_log(&[part, end].concat());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(records, vec![record.clone()]);
        record.resumed = None;
        let (records, _) = crate::read::parse_log(&plain_line);
        assert_eq!(records, vec![record]);
    }

    #[test]
    fn two_parts_at_once_are_the_parts_written_ahead() {
        let record = crate::fixture::record(3, Api::OpenaiChat, "hi");
        let (part, end) = encode_two_parts(&record).unwrap();
        assert_eq!((part, end), two_parts(&record, Some(&[1, 2, 3])));
    }

    #[test]
    fn no_request_part_without_serialized_requests() {
        let head = PartHead {
            call_id: "c".into(),
            seq: 0,
            session_id: "s".into(),
        };
        assert!(
            encode_request_part(&head, &PreEncoded::default(), Some(&[1]))
                .unwrap()
                .is_none()
        );
    }
}
