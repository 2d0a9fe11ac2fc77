//! Server-sent events framing: bytes in, `data` payloads out. Lines end in
//! `\n` or `\r\n`; an empty line ends an event; `data:` lines of one event
//! are joined with `\n`; comments and other fields are ignored.

/// An incremental SSE parser.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Option<String>,
}

impl SseParser {
    /// Feeds bytes; returns the data of every event completed by them, or
    /// the reason a line is not UTF-8.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let mut line = &self.buf[start..start + nl];
            start += nl + 1;
            if let Some(l) = line.strip_suffix(b"\r") {
                line = l;
            }
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    out.push(data);
                }
                continue;
            }
            let Some(value) = line.strip_prefix(b"data:") else {
                continue;
            };
            let value = value.strip_prefix(b" ").unwrap_or(value);
            let value =
                std::str::from_utf8(value).map_err(|e| format!("event data is not UTF-8: {e}"))?;
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        self.buf.drain(..start);
        Ok(out)
    }

    /// The data of an event left unterminated at the end of the body.
    pub fn finish(&mut self) -> Option<String> {
        self.data.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_pushes() {
        let mut p = SseParser::default();
        assert_eq!(p.push(b"data: {\"a\"").unwrap(), Vec::<String>::new());
        assert_eq!(
            p.push(b":1}\n\n: comment\r\ndata:x\r\ndata: y\r\n\r\ndata: [DONE]\n\n")
                .unwrap(),
            vec![
                "{\"a\":1}".to_owned(),
                "x\ny".to_owned(),
                "[DONE]".to_owned()
            ]
        );
        assert_eq!(p.finish(), None);
    }
}
