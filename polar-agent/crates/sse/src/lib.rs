//! Server-sent events framing, the one copy of it in Polar: [`SseParser`],
//! an incremental parser of `text/event-stream` bytes into [`SseEvent`]s
//! (the inference client, the rollout event reader, the provider tests
//! and fixtures all read SSE through it), and [`encode`], which frames one
//! event (appended to a buffer: [`encode_into`]; with its data written
//! straight into the buffer, such as compact JSON: [`encode_written`]).
//!
//! The parser follows the WHATWG EventSource rules ("Interpreting an event
//! stream"): lines end in CRLF, LF or a bare CR (also when a CRLF is split
//! between two reads); a UTF-8 byte order mark at the very start is
//! skipped; `:` lines are comments; a field's value loses one space after
//! the colon; `data` lines of one event are joined with `\n`; `event`,
//! `id` (ignored when it holds U+0000) and `retry` (ASCII digits only) are
//! kept; other fields are ignored; a blank line dispatches the event when
//! it has data. One difference, on purpose: bytes that are not UTF-8 are
//! an error ([`SseError::InvalidUtf8`]), never replaced with U+FFFD, so a
//! corrupted stream is noticed rather than recorded.
//!
//! Pure: bytes in, events out. This crate must stay free of I/O: it depends
//! on nothing but `std` and `thiserror` (no tokio, no HTTP, no JSON, no
//! Polar crate).
#![forbid(unsafe_code)]

mod encode;
mod parse;

#[cfg(test)]
mod tests;

pub use encode::{encode, encode_into, encode_written};
pub use parse::{SseError, SseEvent, SseParser, parse_all};
