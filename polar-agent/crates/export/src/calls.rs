//! A session's calls file: every capture record of the session (completed
//! and failed calls, resumed parts, faults, weight versions, as the capture
//! log holds them) with its `session.json`, exported beside its
//! trajectories as `task=<task>/<session>.calls.jsonl.zst`, the source of
//! truth the trajectories can be re-derived from once the node dropped its
//! copy (docs/EXPORT-SCHEMA.md, "Calls files").
//!
//! The file is one zstd frame of JSON lines: a header line
//! ([`CallsHeader`]: `polar_calls` (the layout version), the session, the
//! number of calls, the first and last call's arrival, the session's
//! `session.json`), then one [`CompletionRecord`] per line, in the log's
//! order. Encoding and decoding are pure (bytes in, bytes out); the
//! reader refuses, naming the file and the byte offset, what is not a
//! whole calls file of a version it knows: a foreign file, a truncated
//! stream, a line that is not a record, fewer or more records than the
//! header says, and a newer layout version.

use std::io::{BufRead as _, BufReader, Read, Write as _};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use polar_record::{CallStatus, CompletionRecord};

/// Version of the calls file layout, in every file's header.
pub const CALLS_SCHEMA_VERSION: u32 = 1;
/// The calls file's name after the session's escaped id.
pub const CALLS_SUFFIX: &str = ".calls.jsonl.zst";
/// zstd's frame magic number, as the first four bytes of a file.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// zstd compression level: 3 (zstd's default) compresses a synthetic
/// 200-call session 81-fold at about 180 MB/s of JSON (BENCHMARKS.md,
/// "Calls files").
pub const ZSTD_LEVEL: i32 = 3;

/// Why a calls file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CallsError {
    /// The file does not start with a zstd frame: not a calls file.
    #[error("{file}: not a Polar calls file: no zstd frame at byte offset 0")]
    NotZstd {
        /// The file (path or URL).
        file: String,
    },
    /// The compressed stream is cut short or corrupt.
    #[error("{file}: truncated or corrupt zstd stream at byte offset {offset} of {len}: {why}")]
    Stream {
        /// The file.
        file: String,
        /// Compressed bytes read when the stream failed.
        offset: u64,
        /// The file's size.
        len: u64,
        /// The decoder's word.
        why: String,
    },
    /// The first line is not a calls header: another kind of JSONL.
    #[error("{file}: not a Polar calls file: the first line (decompressed byte offset 0) {why}")]
    Foreign {
        /// The file.
        file: String,
        /// What is wrong with it.
        why: String,
    },
    /// A layout version this build does not know.
    #[error(
        "{file}: calls file schema version {version} is newer than this build reads \
         ({CALLS_SCHEMA_VERSION}): upgrade polar"
    )]
    NewerVersion {
        /// The file.
        file: String,
        /// Its version.
        version: u32,
    },
    /// A record line is not a record.
    #[error("{file}: line {line} (decompressed byte offset {offset}) is not a call record: {why}")]
    BadRecord {
        /// The file.
        file: String,
        /// Its line number (1-based; the header is line 1).
        line: u64,
        /// Its offset in the decompressed stream.
        offset: u64,
        /// Why.
        why: String,
    },
    /// The number of records differs from the header's.
    #[error(
        "{file}: the header says {expected} calls, the file holds {found} \
         (stream ends at decompressed byte offset {offset})"
    )]
    Count {
        /// The file.
        file: String,
        /// The header's count.
        expected: u64,
        /// Records found.
        found: u64,
        /// Where the stream ended.
        offset: u64,
    },
    /// Encoding failed (a record that does not serialize).
    #[error("encoding the calls of session {session}: {why}")]
    Encode {
        /// The session.
        session: String,
        /// Why.
        why: String,
    },
}

/// The first line of a calls file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallsHeader {
    /// The layout version ([`CALLS_SCHEMA_VERSION`]).
    pub polar_calls: u32,
    /// The session.
    pub session_id: String,
    /// Its task.
    pub task_id: Option<String>,
    /// How many record lines follow.
    pub calls: u64,
    /// The earliest call's arrival (Unix ms), when there is a call.
    pub first_call_ms: Option<u64>,
    /// The latest call's end (Unix ms), when there is a call.
    pub last_call_ms: Option<u64>,
    /// The session's `session.json` as the node had it (outcome, rewards,
    /// evaluation, attempt, ...); null when there was none.
    pub session: Value,
}

impl CallsHeader {
    /// The header of `records` of session `session_id`.
    pub fn new(
        session_id: &str,
        task_id: Option<&str>,
        session: Option<&Value>,
        records: &[CompletionRecord],
    ) -> Self {
        Self {
            polar_calls: CALLS_SCHEMA_VERSION,
            session_id: session_id.to_owned(),
            task_id: task_id.map(str::to_owned),
            calls: records.len() as u64,
            first_call_ms: records.iter().map(|r| r.timings.received_ms).min(),
            last_call_ms: records.iter().map(|r| r.timings.finished_ms).max(),
            session: session.cloned().unwrap_or(Value::Null),
        }
    }

    /// Whether the session's calls overlap `[since, until)` (Unix ms; a
    /// bound left out is open). A session without calls matches only an
    /// open range.
    pub fn in_range(&self, since: Option<u64>, until: Option<u64>) -> bool {
        match (self.first_call_ms, self.last_call_ms) {
            (Some(first), Some(last)) => {
                since.is_none_or(|s| last >= s) && until.is_none_or(|u| first < u)
            }
            _ => since.is_none() && until.is_none(),
        }
    }
}

/// A calls file read back.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportedCalls {
    /// Its header.
    pub header: CallsHeader,
    /// The records, in file order.
    pub records: Vec<CompletionRecord>,
}

/// Encodes a calls file: the header, then each record on its line, in one
/// zstd frame. Pure; CPU-bound (run it off the async workers).
pub fn encode_calls(
    header: &CallsHeader,
    records: &[CompletionRecord],
) -> Result<Vec<u8>, CallsError> {
    let bad = |e: &dyn std::fmt::Display| CallsError::Encode {
        session: header.session_id.clone(),
        why: e.to_string(),
    };
    let mut z = zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL).map_err(|e| bad(&e))?;
    // The size is unknown up front: the frame says nothing about it.
    serde_json::to_writer(&mut z, header).map_err(|e| bad(&e))?;
    z.write_all(b"\n").map_err(|e| bad(&e))?;
    for r in records {
        serde_json::to_writer(&mut z, r).map_err(|e| bad(&e))?;
        z.write_all(b"\n").map_err(|e| bad(&e))?;
    }
    z.finish().map_err(|e| bad(&e))
}

/// Counts the compressed bytes the decoder has taken.
struct Counted<'a> {
    inner: &'a [u8],
    taken: u64,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.taken += n as u64;
        Ok(n)
    }
}

/// Reads a whole calls file (`file` names it in errors).
pub fn decode_calls(file: &str, bytes: &[u8]) -> Result<ExportedCalls, CallsError> {
    let mut records = Vec::new();
    let header = decode_with(file, bytes, true, &mut records)?;
    Ok(ExportedCalls { header, records })
}

/// Reads only a calls file's header (to select by task or time before
/// decoding every record).
pub fn decode_header(file: &str, bytes: &[u8]) -> Result<CallsHeader, CallsError> {
    decode_with(file, bytes, false, &mut Vec::new())
}

fn decode_with(
    file: &str,
    bytes: &[u8],
    all: bool,
    records: &mut Vec<CompletionRecord>,
) -> Result<CallsHeader, CallsError> {
    let name = || file.to_owned();
    if !bytes.starts_with(&ZSTD_MAGIC) {
        return Err(CallsError::NotZstd { file: name() });
    }
    let len = bytes.len() as u64;
    let mut counted = Counted {
        inner: bytes,
        taken: 0,
    };
    let stream_error = |taken: u64, e: std::io::Error| CallsError::Stream {
        file: name(),
        offset: taken,
        len,
        why: e.to_string(),
    };
    let decoder = zstd::stream::read::Decoder::with_buffer(BufReader::new(&mut counted))
        .map_err(|e| stream_error(0, e))?
        .single_frame();
    let mut lines = BufReader::new(decoder);
    let mut line = Vec::new();
    let mut offset = 0_u64;
    let mut read_line = |line: &mut Vec<u8>| -> Result<usize, CallsError> {
        line.clear();
        lines.read_until(b'\n', line).map_err(|e| {
            let taken = lines.get_ref().get_ref().get_ref().taken;
            stream_error(taken, e)
        })
    };
    let n = read_line(&mut line)?;
    let header: CallsHeader = header_of(file, &line[..n])?;
    offset += n as u64;
    if !all {
        return Ok(header);
    }
    let mut number = 1_u64;
    loop {
        let n = read_line(&mut line)?;
        if n == 0 {
            break;
        }
        number += 1;
        if line.last() != Some(&b'\n') {
            return Err(CallsError::BadRecord {
                file: name(),
                line: number,
                offset,
                why: "the line has no end (cut short)".into(),
            });
        }
        let record = serde_json::from_slice::<CompletionRecord>(&line).map_err(|e| {
            CallsError::BadRecord {
                file: name(),
                line: number,
                offset,
                why: e.to_string(),
            }
        })?;
        offset += n as u64;
        records.push(record);
    }
    if records.len() as u64 != header.calls {
        return Err(CallsError::Count {
            file: name(),
            expected: header.calls,
            found: records.len() as u64,
            offset,
        });
    }
    Ok(header)
}

/// The header in `line`, or why it is none.
fn header_of(file: &str, line: &[u8]) -> Result<CallsHeader, CallsError> {
    let foreign = |why: String| CallsError::Foreign {
        file: file.to_owned(),
        why,
    };
    if line.last() != Some(&b'\n') {
        return Err(foreign("has no end".into()));
    }
    let value: Value =
        serde_json::from_slice(line).map_err(|e| foreign(format!("is not JSON: {e}")))?;
    let Some(version) = value.get("polar_calls") else {
        return Err(foreign("has no \"polar_calls\" version".into()));
    };
    let Some(version) = version.as_u64().and_then(|v| u32::try_from(v).ok()) else {
        return Err(foreign(format!(
            "has a version that is no integer: {version}"
        )));
    };
    if version > CALLS_SCHEMA_VERSION {
        return Err(CallsError::NewerVersion {
            file: file.to_owned(),
            version,
        });
    }
    serde_json::from_value(value).map_err(|e| foreign(format!("is not a calls header: {e}")))
}

/// One call as the dashboard's session page shows it (the rollout
/// server's calls endpoint): its outcome, model, backend, timings and
/// token counts, the native request and the reply. Pure.
pub fn view(r: &CompletionRecord) -> Value {
    let (status, side, error) = match &r.status {
        CallStatus::Completed => ("completed", None, None),
        CallStatus::Failed { side, error } => ("failed", Some(side.as_str()), Some(error.as_str())),
    };
    json!({
        "call_id": r.call_id,
        "seq": r.seq,
        "status": status,
        "side": side,
        "error": error,
        "model": r.request.model,
        "backend": r.backend.name,
        "replica": r.backend.replica,
        "weight_version": r.backend.weight_version,
        "received_ms": r.timings.received_ms,
        "finished_ms": r.timings.finished_ms,
        "finish_reason": r.finish_reason,
        "prompt_tokens": r.prompt_token_ids.as_ref().map(Vec::len),
        "response_tokens": r.response_token_ids.as_ref().map(Vec::len),
        "resumed": r.resumed,
        "native_request": r.native_request,
        "response": r.response,
    })
}

/// The calls file's name for session `session` (escaped as the
/// trajectories' names are).
pub fn file_name(session: &str) -> String {
    format!("{}{CALLS_SUFFIX}", super::partition::escape(session))
}

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;
