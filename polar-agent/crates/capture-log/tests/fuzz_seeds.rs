//! The capture-log fuzz targets' hand-kept seeds (`fuzz/seeds/capture_log/`)
//! are valid logs of today's format: each reads with records and no
//! problem, and each record written again (whole, and as its two parts)
//! reads back equal. A change of the format that breaks them fails here,
//! instead of leaving the fuzzers to explore the reader's error paths only
//! (what happened to the minimized corpora before the seeds were kept apart).

use std::path::Path;

use polar_capture_log::{encode_line, encode_two_parts, parse_log};

#[test]
fn every_seed_is_a_valid_log_that_round_trips() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../fuzz/seeds/capture_log");
    let mut seeds = 0;
    let mut records = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/seeds/capture_log") {
        let path = entry.expect("a directory entry").path();
        let data = std::fs::read(&path).expect("a seed");
        let (read, problems) = parse_log(&data);
        assert!(problems.is_empty(), "{}: {problems:?}", path.display());
        assert!(!read.is_empty(), "{}: no record", path.display());
        for r in read {
            let whole = encode_line(&r).expect("a record serializes");
            assert_eq!(parse_log(&whole), (vec![r.clone()], vec![]));
            let (part, completion) = encode_two_parts(&r).expect("a record serializes");
            assert_eq!(parse_log(&[part, completion].concat()), (vec![r], vec![]));
            records += 1;
        }
        seeds += 1;
    }
    // One call per API at least, whole and in parts, and one session's log.
    assert!(
        seeds >= 9 && records >= 16,
        "{seeds} seeds, {records} records"
    );
}
