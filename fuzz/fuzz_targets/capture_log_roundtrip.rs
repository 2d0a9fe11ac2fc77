//! The capture log's writer and reader round trip: every record the
//! reader finds in any bytes, written again as a whole line
//! (`encode_line`) and as a request part plus completion
//! (`encode_two_parts`), reads back equal, with no problem reported.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polar_capture::encode::encode_two_parts;
use polar_capture::log::encode_line;
use polar_capture::parse_log;

fuzz_target!(|data: &[u8]| {
    let (records, _) = parse_log(data);
    for r in records {
        let whole = encode_line(&r).expect("a record serializes");
        let (back, problems) = parse_log(&whole);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(back, std::slice::from_ref(&r));
        let (part, completion) = encode_two_parts(&r).expect("a record serializes");
        let (back, problems) = parse_log(&[part, completion].concat());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(back, [r]);
    }
});

polar_fuzz::json_mutator!(include_str!("../dicts/capture_log_roundtrip.dict"));
