//! The four APIs' stream encoders (writers) read back by the SSE reader:
//! any sequence of stream events, in any API, framing and reply options
//! (structured output, compaction), encodes to a stream that parses whole
//! (SSE: every event's data JSON or `[DONE]`; a Gemini JSON array: one
//! JSON array), and so does any prefix of it ended by the error event of
//! any error (kind and message); the complete body of the same reply, and
//! the error's body, are each one JSON object. See
//! `polar_fuzz::check_stream`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| polar_fuzz::check_stream(data));
