//! SSE writer and reader round trip: events encoded by
//! `polar_sse::encode` (any event name without line breaks, any data; a
//! `\r` before a `\n` is dropped, as documented) read back the same with
//! `polar_sse::parse_all`; and the in-place writer the replies use,
//! `polar_sse::encode_written` (the data written straight into the
//! stream's buffer, line breaks and all), appended after any earlier
//! events, gives exactly `encode`'s bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polar_sse::{encode, encode_written, parse_all};

fuzz_target!(|input: Vec<(Option<String>, String)>| {
    let mut stream = String::new();
    let mut written = Vec::new();
    let mut want = Vec::new();
    for (event, data) in &input {
        let event = event
            .as_deref()
            .filter(|e| !e.is_empty() && !e.contains(['\r', '\n']));
        stream.push_str(&encode(event, data));
        encode_written(&mut written, event, |out| {
            out.extend_from_slice(data.as_bytes())
        });
        assert_eq!(written, stream.as_bytes());
        // What a reader sees: CRLF and lone CR are line ends too.
        let data = data.replace("\r\n", "\n").replace('\r', "\n");
        want.push((event.map(str::to_owned), data));
    }
    let got = parse_all(stream.as_bytes()).expect("an encoded stream parses");
    let got: Vec<_> = got.into_iter().map(|e| (e.event, e.data)).collect();
    assert_eq!(got, want);
});
