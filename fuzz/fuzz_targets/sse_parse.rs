//! SSE framing (`polar_sse::SseParser`) on any bytes, fed in the chunks the
//! first bytes choose: never a panic, and the same events, error, last
//! event id and retry as the whole stream parsed at once (a stream's reads
//! split it anywhere, inside a UTF-8 sequence or a CRLF included).
#![no_main]

use libfuzzer_sys::fuzz_target;
use polar_sse::{SseParser, parse_all};

fuzz_target!(|data: &[u8]| {
    let Some((&sizes, stream)) = data.split_first() else {
        return;
    };
    let whole = parse_all(stream);
    let mut whole_parser = SseParser::new();
    let whole_ok = whole_parser.push(stream).is_ok();

    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let mut rest = stream;
    let mut n = 0usize;
    let chunked = loop {
        if rest.is_empty() {
            break Ok(());
        }
        // Chunks of 1 to 16 bytes, by the bits of the first byte.
        let len = (usize::from(sizes.rotate_left(n as u32 % 8)) % 16 + 1).min(rest.len());
        n += 1;
        let (chunk, tail) = rest.split_at(len);
        rest = tail;
        match parser.push(chunk) {
            Ok(mut e) => events.append(&mut e),
            Err(e) => break Err(e),
        }
    };
    match (&whole, chunked) {
        (Ok(want), Ok(())) => {
            assert_eq!(&events, want);
            assert_eq!(parser.last_event_id(), whole_parser.last_event_id());
            assert_eq!(parser.retry_ms(), whole_parser.retry_ms());
            assert!(parser.finish().is_ok());
        }
        (Err(want), Err(got)) => assert_eq!(want, &got),
        (Err(want), Ok(())) => {
            // The whole stream ended inside an event: so do the chunks
            // (bad UTF-8 is found in chunks as it is whole).
            assert!(whole_ok, "bad UTF-8 found whole, not in chunks");
            assert_eq!(parser.finish().err().as_ref(), Some(want));
        }
        (Ok(_), Err(got)) => panic!("chunks failed ({got}) where the whole stream parsed"),
    }
});
