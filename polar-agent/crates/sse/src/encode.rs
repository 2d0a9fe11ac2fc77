//! Encoding one event into the bytes a reader of the stream sees.

/// Encodes one event: an optional `event:` line, one `data:` line per line
/// of `data`, and the blank line that ends the event. Lines end where a
/// reader ends them (`\n`, `\r\n` or a lone `\r`), so `data` reads back
/// with each of its line breaks as `\n` (unchanged when it has only `\n`).
pub fn encode(event: Option<&str>, data: &str) -> String {
    let mut out = Vec::with_capacity(data.len() + 32);
    encode_into(&mut out, event, data);
    // Only `data`'s text and ASCII were written.
    String::from_utf8(out).unwrap_or_default()
}

/// [`encode`], appended to `out`.
pub fn encode_into(out: &mut Vec<u8>, event: Option<&str>, data: &str) {
    event_line(out, event);
    let mut rest = data;
    loop {
        out.extend_from_slice(b"data: ");
        let Some(end) = rest.find(['\r', '\n']) else {
            out.extend_from_slice(rest.as_bytes());
            out.push(b'\n');
            break;
        };
        out.extend_from_slice(&rest.as_bytes()[..end]);
        out.push(b'\n');
        let skip = if rest[end..].starts_with("\r\n") {
            2
        } else {
            1
        };
        rest = &rest[end + skip..];
    }
    out.push(b'\n');
}

/// Appends one event whose data `write` writes straight into `out` (such
/// as compact JSON, which has no line break): framed as [`encode_into`]
/// frames it, also if what `write` wrote has line breaks or is not UTF-8
/// (then as its text with U+FFFD for what is not).
pub fn encode_written(out: &mut Vec<u8>, event: Option<&str>, write: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    event_line(out, event);
    out.extend_from_slice(b"data: ");
    let data_start = out.len();
    write(out);
    let written = &out[data_start..];
    if written.contains(&b'\r') || written.contains(&b'\n') || std::str::from_utf8(written).is_err()
    {
        let data = String::from_utf8_lossy(written).into_owned();
        out.truncate(start);
        encode_into(out, event, &data);
        return;
    }
    out.extend_from_slice(b"\n\n");
}

fn event_line(out: &mut Vec<u8>, event: Option<&str>) {
    if let Some(name) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_all;

    #[test]
    fn every_line_break_reads_back_as_a_newline() {
        // Found writing the `sse_roundtrip` fuzz target: a lone `\r` was written
        // inside a `data:` line, where a reader ends the line, losing the
        // rest of it.
        for (data, back) in [
            ("a\rb", "a\nb"),
            ("a\r\nb", "a\nb"),
            ("a\nb\n", "a\nb\n"),
            ("\r", "\n"),
            ("", ""),
            ("x\r\r\ny", "x\n\ny"),
        ] {
            let events = parse_all(encode(Some("e"), data).as_bytes()).unwrap();
            assert_eq!(events.len(), 1, "{data:?}");
            assert_eq!(events[0].data, back, "{data:?}");
            assert_eq!(events[0].event.as_deref(), Some("e"));
        }
    }

    #[test]
    fn written_data_is_framed_as_encode_frames_it() {
        for (event, data) in [
            (Some("e"), r#"{"a":1}"#),
            (None, ""),
            (None, "a\nb"),
            (Some("x"), "a\r\nb\rc"),
        ] {
            let mut out = b"before".to_vec();
            encode_written(&mut out, event, |o| o.extend_from_slice(data.as_bytes()));
            assert_eq!(
                out,
                [b"before".as_slice(), encode(event, data).as_bytes()].concat()
            );
        }
        let mut out = Vec::new();
        encode_written(&mut out, None, |o| o.extend_from_slice(b"a\xffb"));
        assert_eq!(out, encode(None, "a\u{fffd}b").as_bytes());
    }
}
