//! Encoding one event into the bytes a reader of the stream sees.

/// Encodes one event: an optional `event:` line, one `data:` line per line
/// of `data`, and the blank line that ends the event. Lines end where a
/// reader ends them (`\n`, `\r\n` or a lone `\r`), so `data` reads back
/// with each of its line breaks as `\n` (unchanged when it has only `\n`).
pub fn encode(event: Option<&str>, data: &str) -> String {
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(name) = event {
        out.push_str("event: ");
        out.push_str(name);
        out.push('\n');
    }
    let mut rest = data;
    loop {
        out.push_str("data: ");
        let Some(end) = rest.find(['\r', '\n']) else {
            out.push_str(rest);
            out.push('\n');
            break;
        };
        out.push_str(&rest[..end]);
        out.push('\n');
        let skip = if rest[end..].starts_with("\r\n") {
            2
        } else {
            1
        };
        rest = &rest[end + skip..];
    }
    out.push('\n');
    out
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
}
