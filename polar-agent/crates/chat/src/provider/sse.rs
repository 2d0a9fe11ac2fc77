//! Server-sent events framing: encoding one event into the bytes a harness
//! reads, and an incremental parser (for tests, fixtures and any SSE the
//! agent reads from a backend). Pure: bytes in, events out.
//!
//! Encoding follows the WHATWG rules: an optional `event:` line, one `data:`
//! line per line of the payload, a blank line to end the event. The parser
//! accepts `\n`, `\r\n` and `\r` line ends, comments (`:` lines), an optional
//! single space after the colon, and fields it does not know (ignored).

use bytes::Bytes;
use serde_json::Value;

/// Why SSE bytes could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    /// The stream is not UTF-8.
    #[error("SSE stream is not valid UTF-8")]
    InvalidUtf8,
    /// The stream ended inside an event (no blank line after its last field).
    #[error("SSE stream ended inside an event")]
    Incomplete,
}

/// One parsed event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The `id:` field, when present.
    pub id: Option<String>,
}

impl SseEvent {
    /// The data parsed as JSON.
    pub fn json(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(&self.data)
    }
}

/// Encode one event. `data` may hold newlines: each line becomes a `data:`
/// line, so the payload reads back unchanged.
pub fn encode(event: Option<&str>, data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(name) = event {
        out.push_str("event: ");
        out.push_str(name);
        out.push('\n');
    }
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line.strip_suffix('\r').unwrap_or(line));
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

/// Encode one event whose data is a JSON value (compact, one line).
pub fn encode_json(event: Option<&str>, value: &Value) -> Bytes {
    encode(event, &value.to_string())
}

/// An incremental SSE parser: feed it bytes as they arrive, take the events
/// that are complete. Bytes of an incomplete UTF-8 sequence or line are kept
/// until the rest arrives.
#[derive(Debug, Default)]
pub struct SseParser {
    pending: Vec<u8>,
    current: SseEvent,
    has_field: bool,
    last_was_cr: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; returns the events completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut out = Vec::new();
        for &b in bytes {
            if self.last_was_cr {
                self.last_was_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.last_was_cr = b == b'\r';
                    let line = std::mem::take(&mut self.pending);
                    let line = String::from_utf8(line).map_err(|_| SseError::InvalidUtf8)?;
                    if let Some(ev) = self.line(&line) {
                        out.push(ev);
                    }
                }
                _ => self.pending.push(b),
            }
        }
        Ok(out)
    }

    /// Signal the end of the stream: an error if it stopped inside an event.
    pub fn finish(self) -> Result<(), SseError> {
        if self.pending.is_empty() && !self.has_field {
            Ok(())
        } else {
            Err(SseError::Incomplete)
        }
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            if !self.has_field {
                return None;
            }
            self.has_field = false;
            let mut ev = std::mem::take(&mut self.current);
            if ev.data.ends_with('\n') {
                ev.data.pop();
            }
            return Some(ev);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => {
                self.current.event = Some(value.to_owned());
                self.has_field = true;
            }
            "data" => {
                self.current.data.push_str(value);
                self.current.data.push('\n');
                self.has_field = true;
            }
            "id" => {
                self.current.id = Some(value.to_owned());
                self.has_field = true;
            }
            _ => {}
        }
        None
    }
}

/// Parse a complete stream.
pub fn parse_all(bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
    let mut p = SseParser::new();
    let events = p.push(bytes)?;
    p.finish()?;
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn encodes_named_event() {
        let b = encode(Some("message_stop"), r#"{"type":"message_stop"}"#);
        assert_eq!(
            &b[..],
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
    }

    #[test]
    fn multiline_data_round_trips() {
        let b = encode(None, "a\nb\n\nc");
        let evs = parse_all(&b).unwrap();
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data, "a\nb\n\nc");
        assert_eq!(evs[0].event, None);
    }

    #[test]
    fn parses_crlf_comments_and_split_input() {
        let raw = b": ping\r\nevent: x\r\ndata:{\"a\":1}\r\nid: 7\r\n\r\ndata: [DONE]\r\n\r\n";
        let mut p = SseParser::new();
        let mut evs = Vec::new();
        for chunk in raw.chunks(3) {
            evs.extend(p.push(chunk).unwrap());
        }
        p.finish().unwrap();
        assert_eq!(evs.len(), 2);
        assert_eq!(evs[0].event.as_deref(), Some("x"));
        assert_eq!(evs[0].id.as_deref(), Some("7"));
        assert_eq!(evs[0].json().unwrap()["a"], 1);
        assert_eq!(evs[1].data, "[DONE]");
    }

    #[test]
    fn incomplete_stream_is_an_error() {
        assert_eq!(parse_all(b"data: x\n"), Err(SseError::Incomplete));
        assert_eq!(parse_all(b"\xff\n\n"), Err(SseError::InvalidUtf8));
    }

    #[test]
    fn parses_recorded_fixtures() {
        for (name, n) in [
            ("anthropic_tool_stream.body", 6),
            ("chat_text_stream.body", 5),
            ("gemini_tool_sse.body", 1),
            ("responses_text_stream.body", 9),
        ] {
            let evs = parse_all(super::super::fixtures::response(name)).unwrap();
            assert_eq!(evs.len(), n, "{name}");
        }
    }

    proptest! {
        #[test]
        fn encode_parse_round_trip(name in proptest::option::of("[a-z_.]{1,20}"), data in "[^\r]{0,80}") {
            let b = encode(name.as_deref(), &data);
            let evs = parse_all(&b).unwrap();
            prop_assert_eq!(evs.len(), 1);
            prop_assert_eq!(&evs[0].data, &data);
            prop_assert_eq!(evs[0].event.as_deref(), name.as_deref());
        }

        #[test]
        fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut p = SseParser::new();
            let _ = p.push(&bytes);
        }
    }
}
