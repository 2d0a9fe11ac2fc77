//! Reading a capture log ([`read_log`], [`parse_calls`], [`parse_log`]),
//! streaming, for the agent and `polar export` alike: never panics; one
//! record per whole line or completion, in file order, a completion joined
//! with its request part. A last line without its newline is torn (a crash
//! mid-write): everything before it is returned with a
//! [`LogProblem::TornTail`] warning. A line that is not a record, or a
//! completion without its request part, is reported with its line number
//! and byte offset and skipped; so is a request part whose call never ended
//! ([`LogProblem::Unfinished`]). A whole record supersedes a request part
//! of the same call (the fallback after a part whose sync failed).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use crate::error::{LogError, LogProblem};
use crate::lines::{Joiner, LogLine, parse_line};
use polar_record::CompletionRecord;

/// Reads a log line by line from `reader`: the records in the order of
/// their whole lines and completions, and the problems found, in line
/// order. Only one line is held at a time besides the records and the
/// request parts still waiting for their completion (`polar export` reads
/// logs of hundreds of megabytes this way).
pub fn parse_calls(
    mut reader: impl BufRead,
) -> std::io::Result<(Vec<CompletionRecord>, Vec<LogProblem>)> {
    let mut records = Vec::new();
    let mut problems = Vec::new();
    let mut join = Joiner::default();
    let mut buf = Vec::new();
    let mut offset = 0u64;
    let mut line = 0usize;
    loop {
        buf.clear();
        let len = reader.read_until(b'\n', &mut buf)?;
        if len == 0 {
            break;
        }
        line += 1;
        if buf.last() != Some(&b'\n') {
            problems.push(LogProblem::TornTail { line, offset, len });
            break;
        }
        if !buf.iter().all(u8::is_ascii_whitespace) {
            let malformed = |reason: String| LogProblem::Malformed {
                line,
                offset,
                reason,
            };
            match parse_line(&buf) {
                Ok(LogLine::Whole(r)) => {
                    join.superseded(&r.call_id);
                    records.push(*r);
                }
                Ok(LogLine::Request(part)) => {
                    if let Some(p) = join.request(*part, line, offset) {
                        problems.push(p);
                    }
                }
                Ok(LogLine::Completion(c)) => match join.complete(*c) {
                    Ok(r) => records.push(r),
                    Err(reason) => problems.push(malformed(reason)),
                },
                Err(e) => problems.push(malformed(e.to_string())),
            }
        }
        offset += len as u64;
    }
    problems.extend(join.unfinished());
    problems.sort_by_key(LogProblem::line);
    Ok((records, problems))
}

/// Parses a log's bytes (see [`parse_calls`]).
pub fn parse_log(bytes: &[u8]) -> (Vec<CompletionRecord>, Vec<LogProblem>) {
    // Reading from a slice cannot fail.
    parse_calls(bytes).unwrap_or_default()
}

/// Reads the log at `path` (see [`parse_calls`]); problems are also logged
/// as warnings.
pub fn read_log(path: &Path) -> Result<(Vec<CompletionRecord>, Vec<LogProblem>), LogError> {
    let file = File::open(path).map_err(|e| LogError::io("opening", path, e))?;
    let (records, problems) = parse_calls(BufReader::with_capacity(1 << 20, file))
        .map_err(|e| LogError::io("reading", path, e))?;
    for p in &problems {
        tracing::warn!(log = %path.display(), problem = %p, "capture log");
    }
    Ok((records, problems))
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
