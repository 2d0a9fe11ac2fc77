//! Encoding one event into the bytes a reader of the stream sees.

/// Encodes one event: an optional `event:` line, one `data:` line per line
/// of `data` (so a payload with newlines reads back unchanged; a `\r`
/// before a `\n` is dropped), and the blank line that ends the event.
pub fn encode(event: Option<&str>, data: &str) -> String {
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
    out
}
