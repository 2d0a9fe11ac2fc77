use proptest::prelude::*;

use super::*;

/// The events of `chunks` fed one by one, and how the stream ended.
fn feed<'a>(
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> (Result<Vec<SseEvent>, SseError>, Result<(), SseError>) {
    let mut p = SseParser::new();
    let mut events = Vec::new();
    for chunk in chunks {
        match p.push(chunk) {
            Ok(evs) => events.extend(evs),
            Err(e) => return (Err(e), Err(SseError::Incomplete)),
        }
    }
    (Ok(events), p.finish())
}

fn data(events: Vec<SseEvent>) -> Vec<String> {
    events.into_iter().map(|e| e.data).collect()
}

#[test]
fn encodes_named_event() {
    let b = encode(Some("message_stop"), r#"{"type":"message_stop"}"#);
    assert_eq!(
        b.as_bytes(),
        b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
    );
}

#[test]
fn multiline_data_round_trips() {
    let b = encode(None, "a\nb\n\nc");
    let evs = parse_all(b.as_bytes()).unwrap();
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
    assert_eq!(evs[0].data, r#"{"a":1}"#);
    assert_eq!(evs[1].data, "[DONE]");
}

#[test]
fn incomplete_stream_is_an_error() {
    assert_eq!(parse_all(b"data: x\n"), Err(SseError::Incomplete));
    assert_eq!(parse_all(b"\xff\n\n"), Err(SseError::InvalidUtf8));
}

/// From the inference client's former parser.
#[test]
fn splits_events_across_pushes() {
    let mut p = SseParser::default();
    assert_eq!(p.push(b"data: {\"a\"").unwrap(), Vec::<SseEvent>::new());
    assert_eq!(
        data(
            p.push(b":1}\n\n: comment\r\ndata:x\r\ndata: y\r\n\r\ndata: [DONE]\n\n")
                .unwrap()
        ),
        vec![
            "{\"a\":1}".to_owned(),
            "x\ny".to_owned(),
            "[DONE]".to_owned()
        ]
    );
    assert_eq!(p.into_unterminated(), None);
}

#[test]
fn an_unterminated_last_event_is_kept_only_when_asked() {
    let mut p = SseParser::new();
    assert!(
        p.push(b"data: a\n\ndata: b\ndata: c\npartial")
            .unwrap()
            .len()
            == 1
    );
    let last = p.into_unterminated().unwrap();
    assert_eq!(last.data, "b\nc");
    assert_eq!(
        parse_all(b"data: a\n\ndata: b\n"),
        Err(SseError::Incomplete)
    );
    assert_eq!(parse_all(b"data: a\n\ndata: b"), Err(SseError::Incomplete));
}

#[test]
fn bare_cr_ends_lines_even_split_across_chunks() {
    // CR CR: a line end then a blank line.
    let mut p = SseParser::new();
    assert_eq!(p.push(b"data: a\r").unwrap(), []);
    assert_eq!(data(p.push(b"\rdata: b\r").unwrap()), ["a"]);
    // The LF of a CRLF split from its CR is not a second line end.
    assert_eq!(p.push(b"\n").unwrap(), []);
    assert_eq!(p.push(b"data: c\r").unwrap(), []);
    assert_eq!(data(p.push(b"\n\r").unwrap()), ["b\nc"]);
    p.finish().unwrap();
    // Bare CR everywhere, whole.
    let evs = parse_all(b"event: e\rdata: x\rdata: y\r\r").unwrap();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].event.as_deref(), Some("e"));
    assert_eq!(evs[0].data, "x\ny");
}

#[test]
fn invalid_utf8_is_reported_not_replaced() {
    // In data, in a comment, in a field name; and a sequence split across
    // chunks is fine while a truncated one is not.
    assert_eq!(parse_all(b"data: \xc3\x28\n\n"), Err(SseError::InvalidUtf8));
    assert_eq!(parse_all(b": \xff\n\n"), Err(SseError::InvalidUtf8));
    assert_eq!(parse_all(b"da\xfeta: x\n\n"), Err(SseError::InvalidUtf8));
    let euro = "data: \u{20ac}\n\n".as_bytes();
    let (evs, end) = feed([&euro[..7], &euro[7..]]);
    assert_eq!(data(evs.unwrap()), ["\u{20ac}"]);
    end.unwrap();
    let mut p = SseParser::new();
    assert_eq!(p.push(b"data: \xe2\x82").unwrap(), []);
    assert_eq!(p.push(b"\n\n"), Err(SseError::InvalidUtf8));
}

#[test]
fn a_leading_bom_is_skipped_once_even_in_pieces() {
    let evs = parse_all(b"\xEF\xBB\xBFdata: a\n\n").unwrap();
    assert_eq!(data(evs), ["a"]);
    let (evs, end) = feed([&b"\xEF"[..], b"\xBB", b"\xBFdata: a\n\n"]);
    assert_eq!(data(evs.unwrap()), ["a"]);
    end.unwrap();
    // A second BOM is part of the first line: the field is `\u{feff}data`,
    // unknown, so nothing is dispatched.
    assert_eq!(
        parse_all(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n").unwrap(),
        []
    );
    // Not a BOM: the held bytes start the first line.
    assert_eq!(parse_all(b"\xEF\n\n"), Err(SseError::InvalidUtf8));
    let (evs, _) = feed([&b"\xEF\xBB"[..], b"x\n"]);
    assert_eq!(evs, Err(SseError::InvalidUtf8));
}

#[test]
fn fields_follow_the_spec() {
    let raw = b"retry: 1500\nid: 1\nevent: a\ndata\ndata:  two\nignored: x\n\n\
        data: b\n\n\
        event: only-a-type\nid: 3\n\n\
        id: bad\0id\nretry: 12x\ndata: c\n\n\
        id\ndata: d\n\n";
    let mut p = SseParser::new();
    let evs = p.push(raw).unwrap();
    assert_eq!(
        evs,
        [
            SseEvent {
                event: Some("a".into()),
                data: "\n two".into(),
                id: Some("1".into()),
            },
            SseEvent {
                event: None,
                data: "b".into(),
                id: None,
            },
            SseEvent {
                event: None,
                data: "c".into(),
                id: None,
            },
            SseEvent {
                event: None,
                data: "d".into(),
                id: Some(String::new()),
            },
        ]
    );
    assert_eq!(p.retry_ms(), Some(1500));
    assert_eq!(p.last_event_id(), "");
    let mut p = SseParser::new();
    p.push(b"id: 7\ndata: x\n\ndata: y\n\n").unwrap();
    assert_eq!(p.last_event_id(), "7", "the last event ID carries over");
    // An event with no data is not dispatched; a blank line alone neither.
    assert_eq!(parse_all(b"event: x\n\n\n\n").unwrap(), []);
    assert_eq!(data(parse_all(b"data\n\n").unwrap()), [""]);
}

/// A stream of SSE lines of every kind, each with any of the three line
/// ends, sometimes after a BOM.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let value = prop_oneof![
        "[a-z0-9 :]{0,8}",
        "[\u{e9}\u{20ac}\u{1f600}\u{feff} x]{0,4}",
        Just("[DONE]".to_owned()),
    ];
    let line = prop_oneof![
        3 => ("data|event|id|retry|x", proptest::option::of(":( )?"), value).prop_map(
            |(f, colon, v)| match colon {
                Some(c) => format!("{f}{c}{v}"),
                None => f,
            }
        ),
        1 => "(:[a-z ]{0,5})?",
        1 => Just("retry: 20".to_owned()),
    ];
    let end = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
    (
        any::<bool>(),
        proptest::collection::vec((line, end), 0..24),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..4)),
    )
        .prop_map(|(bom, lines, junk)| {
            let mut out = Vec::new();
            if bom {
                out.extend_from_slice(BOM_BYTES);
            }
            for (l, e) in lines {
                out.extend_from_slice(l.as_bytes());
                out.extend_from_slice(e.as_bytes());
            }
            out.extend(junk.unwrap_or_default());
            out
        })
}

const BOM_BYTES: &[u8] = b"\xEF\xBB\xBF";

/// `bytes` cut at `cuts` (positions taken modulo its length).
fn chunks(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
}

proptest! {
    #[test]
    fn encode_parse_round_trip(name in proptest::option::of("[a-z_.]{1,20}"), data in "[^\r]{0,80}") {
        let b = encode(name.as_deref(), &data);
        let evs = parse_all(b.as_bytes()).unwrap();
        prop_assert_eq!(evs.len(), 1);
        prop_assert_eq!(&evs[0].data, &data);
        prop_assert_eq!(evs[0].event.as_deref(), name.as_deref());
    }

    #[test]
    fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut p = SseParser::new();
        let _ = p.push(&bytes);
    }

    /// However a stream is cut into reads, the parser sees the same events,
    /// the same errors and the same stream state as when it comes whole.
    #[test]
    fn chunked_input_parses_like_whole_input(
        bytes in prop_oneof![stream(), proptest::collection::vec(any::<u8>(), 0..64)],
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = feed([&bytes[..]]);
        let parts = chunks(&bytes, &cuts);
        let chunked = feed(parts.iter().map(Vec::as_slice));
        prop_assert_eq!(&chunked, &whole);
        // And byte by byte, the worst case for split line ends.
        let single = feed(bytes.chunks(1));
        prop_assert_eq!(&single, &whole);
        if whole.0.is_ok() {
            let mut a = SseParser::new();
            let mut b = SseParser::new();
            let _ = a.push(&bytes);
            for p in &parts {
                let _ = b.push(p);
            }
            prop_assert_eq!(a.last_event_id(), b.last_event_id());
            prop_assert_eq!(a.retry_ms(), b.retry_ms());
            prop_assert_eq!(a.into_unterminated(), b.into_unterminated());
        }
    }
}
