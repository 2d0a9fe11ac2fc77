//! Reading the lines of a capture log (see the crate's documentation for the layout):
//! which kind a line is ([`parse_line`]), and joining a call's request part
//! with its completion into the call's [`CompletionRecord`] ([`Joiner`]).
//!
//! The writer puts `"part"` first in a part's line, so the kind is told
//! from the line's first bytes and the line parsed once; a line that does
//! not start that way (an older whole record, or one rewritten by a tool)
//! is parsed as a whole record, and only if that fails is it looked at for
//! a `part` field anywhere.

use std::collections::HashMap;

use serde::{Deserialize, Deserializer};

use crate::error::LogProblem;
use polar_chat::{ChatRequest, ChatResponse, FinishReason};
use polar_record::{BackendInfo, CallStatus, CompletionRecord, NativeRequest, Resumed, Timings};

/// The `part` of a request part's line.
pub const REQUEST_PART: &str = "request";
/// The `part` of a completion's line.
pub const COMPLETION_PART: &str = "completion";

/// One line of a log (each kind boxed: they differ in size).
#[derive(Debug)]
pub enum LogLine {
    /// A whole record (no `part` field).
    Whole(Box<CompletionRecord>),
    /// A call's request part.
    Request(Box<RequestPart>),
    /// A call's completion.
    Completion(Box<CompletionPart>),
}

/// A call's big fields, written while the backend generates.
#[derive(Debug, Deserialize)]
pub struct RequestPart {
    /// [`CompletionRecord::version`]; the joined record takes the
    /// completion's.
    #[expect(dead_code, reason = "part of the line's layout, read as written")]
    pub version: u32,
    /// The call.
    pub call_id: String,
    /// [`CompletionRecord::seq`].
    pub seq: u64,
    /// [`CompletionRecord::session_id`].
    pub session_id: String,
    /// [`CompletionRecord::native_request`].
    pub native_request: NativeRequest,
    /// [`CompletionRecord::request`].
    pub request: ChatRequest,
    /// [`CompletionRecord::prompt_token_ids`], when known by then.
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A call's other fields, written when it ends.
#[derive(Debug, Deserialize)]
pub struct CompletionPart {
    version: u32,
    call_id: String,
    seq: u64,
    session_id: String,
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    policy_version: Option<String>,
    #[serde(default)]
    response: Option<ChatResponse>,
    /// Absent: the request part's; `null`: none; an array: these.
    #[serde(default, deserialize_with = "present")]
    prompt_token_ids: Option<Option<Vec<u32>>>,
    #[serde(default)]
    response_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    response_logprobs: Option<Vec<f32>>,
    token_ids_missing: bool,
    #[serde(default)]
    finish_reason: Option<FinishReason>,
    backend: BackendInfo,
    timings: Timings,
    #[serde(default)]
    resumed: Option<Resumed>,
    #[serde(flatten)]
    status: CallStatus,
}

/// A field that is present (`null` included) is `Some`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl CompletionPart {
    /// The record of the call whose request part is `part`.
    fn join(self, part: RequestPart) -> CompletionRecord {
        CompletionRecord {
            version: self.version,
            call_id: self.call_id,
            seq: self.seq,
            session_id: self.session_id,
            task_id: self.task_id,
            policy_version: self.policy_version,
            native_request: part.native_request,
            request: part.request,
            response: self.response,
            prompt_token_ids: self.prompt_token_ids.unwrap_or(part.prompt_token_ids),
            response_token_ids: self.response_token_ids,
            response_logprobs: self.response_logprobs,
            token_ids_missing: self.token_ids_missing,
            finish_reason: self.finish_reason,
            backend: self.backend,
            timings: self.timings,
            resumed: self.resumed,
            status: self.status,
        }
    }
}

/// The kind a line's first bytes name: `{"part":"<kind>"`, with any
/// whitespace JSON allows.
fn leading_part(line: &[u8]) -> Option<&[u8]> {
    fn skip_ws(b: &[u8]) -> &[u8] {
        let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
        &b[n..]
    }
    let rest = skip_ws(line).strip_prefix(b"{")?;
    let rest = skip_ws(rest).strip_prefix(b"\"part\"")?;
    let rest = skip_ws(rest).strip_prefix(b":")?;
    let rest = skip_ws(rest).strip_prefix(b"\"")?;
    let end = rest.iter().position(|&c| c == b'"' || c == b'\\')?;
    (rest.get(end) == Some(&b'"')).then(|| &rest[..end])
}

/// Parses one line (without caring for its newline).
pub fn parse_line(line: &[u8]) -> Result<LogLine, serde_json::Error> {
    match leading_part(line) {
        Some(k) if k == REQUEST_PART.as_bytes() => {
            return serde_json::from_slice(line).map(|p| LogLine::Request(Box::new(p)));
        }
        Some(k) if k == COMPLETION_PART.as_bytes() => {
            return serde_json::from_slice(line).map(|c| LogLine::Completion(Box::new(c)));
        }
        _ => {}
    }
    let whole_error = match serde_json::from_slice::<CompletionRecord>(line) {
        Ok(r) => return Ok(LogLine::Whole(Box::new(r))),
        Err(e) => e,
    };
    #[derive(Deserialize)]
    struct Kind {
        part: Option<String>,
    }
    match serde_json::from_slice::<Kind>(line)
        .ok()
        .and_then(|k| k.part)
    {
        Some(k) if k == REQUEST_PART => {
            serde_json::from_slice(line).map(|p| LogLine::Request(Box::new(p)))
        }
        Some(k) if k == COMPLETION_PART => {
            serde_json::from_slice(line).map(|c| LogLine::Completion(Box::new(c)))
        }
        _ => Err(whole_error),
    }
}

/// Request parts waiting for their completion, while a log is read.
#[derive(Debug, Default)]
pub struct Joiner {
    waiting: HashMap<String, Waiting>,
}

#[derive(Debug)]
struct Waiting {
    line: usize,
    offset: u64,
    part: RequestPart,
}

fn unfinished(call_id: String, w: &Waiting) -> LogProblem {
    LogProblem::Unfinished {
        line: w.line,
        offset: w.offset,
        call_id,
    }
}

impl Joiner {
    /// Holds a request part found at `line` (`offset`) until its
    /// completion; a part of the same call already waiting is returned as
    /// unfinished.
    pub fn request(&mut self, part: RequestPart, line: usize, offset: u64) -> Option<LogProblem> {
        let id = part.call_id.clone();
        let old = self
            .waiting
            .insert(id.clone(), Waiting { line, offset, part })?;
        Some(unfinished(id, &old))
    }

    /// The record of a completion, joined with its request part; or why it
    /// is not one.
    pub fn complete(&mut self, c: CompletionPart) -> Result<CompletionRecord, String> {
        let Some(w) = self.waiting.remove(&c.call_id) else {
            return Err(format!(
                "the completion of call {} has no request part before it",
                c.call_id
            ));
        };
        if w.part.seq != c.seq || w.part.session_id != c.session_id {
            return Err(format!(
                "the completion of call {} (seq {}, session {}) does not match its request part on line {} (seq {}, session {})",
                c.call_id, c.seq, c.session_id, w.line, w.part.seq, w.part.session_id
            ));
        }
        Ok(c.join(w.part))
    }

    /// A whole record of `call_id` was found: a request part of the same
    /// call (written before a fallback to the whole line) is not needed.
    pub fn superseded(&mut self, call_id: &str) {
        if !self.waiting.is_empty() {
            self.waiting.remove(call_id);
        }
    }

    /// The request parts never completed, in line order.
    pub fn unfinished(self) -> Vec<LogProblem> {
        let mut left: Vec<_> = self.waiting.into_iter().collect();
        left.sort_by_key(|(_, w)| w.line);
        left.into_iter().map(|(id, w)| unfinished(id, &w)).collect()
    }
}

#[cfg(test)]
#[path = "lines_tests.rs"]
mod tests;
