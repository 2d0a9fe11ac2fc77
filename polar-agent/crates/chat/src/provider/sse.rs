//! SSE with JSON data, over [`polar_sse`] (which owns the framing, the
//! parser included): encoding one event into the bytes a harness reads,
//! and reading an event's data as JSON.

use bytes::Bytes;
use polar_sse::SseEvent;
use serde::Serialize;
use serde_json::Value;

/// Encode one event. `data` may hold newlines: each line becomes a `data:`
/// line, so the payload reads back unchanged.
pub fn encode(event: Option<&str>, data: &str) -> Bytes {
    Bytes::from(polar_sse::encode(event, data))
}

/// [`encode`], appended to `out`.
pub fn write(out: &mut Vec<u8>, event: Option<&str>, data: &str) {
    polar_sse::encode_into(out, event, data);
}

/// Appends one event whose data is `value` as compact JSON (one line),
/// serialized straight into `out`.
pub fn write_json(out: &mut Vec<u8>, event: Option<&str>, value: &impl Serialize) {
    polar_sse::encode_written(out, event, |out| super::write_json(out, value));
}

/// An event's data read as JSON.
pub trait EventJson {
    /// The data parsed as JSON.
    fn json(&self) -> Result<Value, serde_json::Error>;
}

impl EventJson for SseEvent {
    fn json(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(&self.data)
    }
}

#[cfg(test)]
mod tests {
    use polar_sse::parse_all;

    use super::*;

    #[test]
    fn encodes_named_event() {
        let b = encode(Some("message_stop"), r#"{"type":"message_stop"}"#);
        assert_eq!(
            &b[..],
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        let mut b = b"before\n\n".to_vec();
        write_json(&mut b, None, &serde_json::json!({"a": [1, "x\ny"]}));
        assert_eq!(&b[..], b"before\n\ndata: {\"a\":[1,\"x\\ny\"]}\n\n");
    }

    /// The framing (CRLF, comments, split input) is `polar-sse`'s test of
    /// the same stream; here, an event's data read as JSON.
    #[test]
    fn event_data_reads_as_json() {
        let raw = b": ping\r\nevent: x\r\ndata:{\"a\":1}\r\nid: 7\r\n\r\n";
        let evs = parse_all(raw).unwrap();
        assert_eq!(evs[0].json().unwrap()["a"], 1);
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
}
