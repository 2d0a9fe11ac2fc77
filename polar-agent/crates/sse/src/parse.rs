//! The incremental parser: lines are cut out of the bytes as they arrive
//! and interpreted one by one; only a line split between two reads is
//! copied (into the parser's line buffer), a whole line is read where it
//! lies.

/// The UTF-8 byte order mark, skipped once at the start of a stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Why SSE bytes could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    /// A line of the stream is not UTF-8 (the stream is not SSE; its bytes
    /// are never replaced).
    #[error("SSE stream is not valid UTF-8")]
    InvalidUtf8,
    /// The stream ended inside an event (no blank line after its last
    /// field, or a last line with no line end).
    #[error("SSE stream ended inside an event")]
    Incomplete,
}

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when the event had one (`None` is the default
    /// type, `message`).
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The `id:` field of this event, when it had one. (The stream's last
    /// event ID, which carries over to later events, is
    /// [`SseParser::last_event_id`].)
    pub id: Option<String>,
}

/// An incremental SSE parser: feed it bytes as they arrive, take the events
/// they complete. A line split between two reads (even inside a UTF-8
/// sequence or between the CR and LF of a CRLF) is kept until the rest
/// arrives. Not to be fed again after it returned an error.
#[derive(Debug)]
pub struct SseParser {
    /// The start of a line whose end has not arrived yet.
    line: Vec<u8>,
    /// The data buffer, without the spec's trailing `\n`.
    data: String,
    /// Whether a `data` field was read since the last dispatch.
    has_data: bool,
    event: Option<String>,
    id: Option<String>,
    last_event_id: String,
    retry_ms: Option<u64>,
    /// Whether a field was read since the last blank line.
    has_field: bool,
    /// The last line ended in a CR at the end of a read: an LF starting the
    /// next read belongs to it.
    after_cr: bool,
    /// How many bytes of a BOM the stream started with, while that is still
    /// undecided (they are held in `line`); `None` once decided.
    bom_seen: Option<usize>,
}

impl Default for SseParser {
    fn default() -> Self {
        Self {
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            event: None,
            id: None,
            last_event_id: String::new(),
            retry_ms: None,
            has_field: false,
            after_cr: false,
            bom_seen: Some(0),
        }
    }
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut out = Vec::new();
        self.push_into(bytes, &mut out)?;
        Ok(out)
    }

    /// Signals the end of the stream: an error if it stopped inside an
    /// event (the spec drops such an event; a reader of a whole body
    /// usually wants to know).
    pub fn finish(self) -> Result<(), SseError> {
        if self.line.is_empty() && !self.has_field {
            Ok(())
        } else {
            Err(SseError::Incomplete)
        }
    }

    /// Ends the stream leniently: the event whose lines were read but
    /// whose blank line never came, if it has data, for readers that take
    /// the end of the body as the end of its last event (the spec drops
    /// it). A last line with no line end is dropped.
    pub fn into_unterminated(mut self) -> Option<SseEvent> {
        self.dispatch()
    }

    /// The stream's last event ID: the value of the last `id` field read
    /// (empty before any), carried over from event to event.
    pub fn last_event_id(&self) -> &str {
        &self.last_event_id
    }

    /// The reconnection time the stream asked for (`retry:`), in
    /// milliseconds.
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry_ms
    }

    fn push_into(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let mut rest = self.skip_bom(bytes);
        if self.after_cr
            && let Some((&first, tail)) = rest.split_first()
        {
            self.after_cr = false;
            if first == b'\n' {
                rest = tail;
            }
        }
        while let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            let (head, tail) = rest.split_at(end);
            rest = &tail[1..];
            if tail[0] == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            if self.line.is_empty() {
                self.line(head, out)?;
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(head);
                let read = self.line(&line, out);
                // Keep the buffer's allocation for the next split line.
                line.clear();
                self.line = line;
                read?;
            }
        }
        self.line.extend_from_slice(rest);
        Ok(())
    }

    /// Skips a BOM at the start of the stream, which may come in pieces.
    fn skip_bom<'a>(&mut self, bytes: &'a [u8]) -> &'a [u8] {
        let Some(seen) = self.bom_seen else {
            return bytes;
        };
        let want = &BOM[seen..];
        let n = want.len().min(bytes.len());
        if bytes[..n] != want[..n] {
            // No BOM: what was held is the start of the first line.
            self.bom_seen = None;
            return bytes;
        }
        if n == want.len() {
            self.bom_seen = None;
            self.line.clear();
        } else {
            self.line.extend_from_slice(&bytes[..n]);
            self.bom_seen = Some(seen + n);
        }
        &bytes[n..]
    }

    /// Interprets one line (without its line end).
    fn line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let line = std::str::from_utf8(line).map_err(|_| SseError::InvalidUtf8)?;
        if line.is_empty() {
            self.has_field = false;
            out.extend(self.dispatch());
            return Ok(());
        }
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            "id" => {
                if !value.contains('\0') {
                    self.last_event_id.clear();
                    self.last_event_id.push_str(value);
                    self.id = Some(value.to_owned());
                }
            }
            "retry" => {
                if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
                    // Too large for a u64: ignored like any invalid value.
                    if let Ok(ms) = value.parse() {
                        self.retry_ms = Some(ms);
                    }
                }
            }
            _ => return Ok(()),
        }
        self.has_field = true;
        Ok(())
    }

    /// Ends the current event: it is dispatched if it has data; its type
    /// and id go either way.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        let id = self.id.take();
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        Some(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
            id,
        })
    }
}

/// Parses a complete stream; an error if it ends inside an event.
pub fn parse_all(bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
    let mut p = SseParser::new();
    let events = p.push(bytes)?;
    p.finish()?;
    Ok(events)
}
