//! The capture-log reader that rebuilds a session's state after a crash
//! (`polar_capture_log::parse_log`, the reader the agent and `polar export` use), on
//! any bytes: never a panic; problems in line order, each on a line that
//! exists; a torn tail only on the last line; every record's call id
//! unique per whole line or completion; the same answer read through a
//! small buffer (the streaming reader) as from the slice.
#![no_main]

use std::io::BufReader;

use libfuzzer_sys::fuzz_target;
use polar_capture_log::{LogProblem, parse_calls, parse_log};

fuzz_target!(|data: &[u8]| {
    let (records, problems) = parse_log(data);
    let lines = data.split_inclusive(|&b| b == b'\n').count();
    let mut last = 0;
    for p in &problems {
        assert!(
            p.line() >= last && p.line() >= 1 && p.line() <= lines,
            "{p:?}"
        );
        last = p.line();
        if let LogProblem::TornTail { line, .. } = p {
            assert_eq!(*line, lines);
            assert!(!data.ends_with(b"\n"));
        }
    }
    assert!(records.len() <= lines);
    let (again, again_problems) =
        parse_calls(BufReader::with_capacity(7, data)).expect("reading a slice");
    assert_eq!(again, records);
    assert_eq!(again_problems, problems);
});

polar_fuzz::json_mutator!(include_str!("../dicts/capture_log.dict"));
