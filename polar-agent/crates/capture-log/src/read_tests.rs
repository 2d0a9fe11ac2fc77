//! The log reader: whole records round-trip, torn tails, malformed lines
//! with their positions, a missing file. The join of two-part records is
//! tested in `lines_tests.rs`.

use super::*;
use crate::encode::encode_line;
use crate::fixture::record;
use polar_chat::Api;

fn lines(records: &[CompletionRecord]) -> Vec<u8> {
    records
        .iter()
        .flat_map(|r| encode_line(r).unwrap())
        .collect()
}

#[test]
fn round_trip_without_problems() {
    let rs: Vec<_> = (0..3).map(|i| record(i, Api::OpenaiChat, "hi")).collect();
    let (back, problems) = parse_log(&lines(&rs));
    assert_eq!(back, rs);
    assert!(problems.is_empty());
    assert_eq!(parse_log(b""), (Vec::new(), Vec::new()));
}

#[test]
fn torn_last_record_keeps_everything_before_it() {
    let rs: Vec<_> = (0..3).map(|i| record(i, Api::OpenaiChat, "hi")).collect();
    let mut bytes = lines(&rs);
    let whole = bytes.len();
    let third = encode_line(&record(3, Api::OpenaiChat, "torn")).unwrap();
    for cut in [1, third.len() / 2, third.len() - 1] {
        bytes.truncate(whole);
        bytes.extend_from_slice(&third[..cut]);
        let (back, problems) = parse_log(&bytes);
        assert_eq!(back, rs, "cut at {cut}");
        assert_eq!(
            problems,
            vec![LogProblem::TornTail {
                line: 4,
                offset: whole as u64,
                len: cut
            }]
        );
    }
}

#[test]
fn malformed_lines_are_reported_with_positions_and_skipped() {
    let a = encode_line(&record(0, Api::OpenaiChat, "a")).unwrap();
    let b = encode_line(&record(1, Api::OpenaiChat, "b")).unwrap();
    let mut bytes = a.clone();
    bytes.extend_from_slice(b"{\"not\": \"a record\"}\n");
    bytes.extend_from_slice(b"\n");
    bytes.extend_from_slice(b"garbage \xff\n");
    bytes.extend_from_slice(&b);
    let (back, problems) = parse_log(&bytes);
    assert_eq!(back.len(), 2);
    assert_eq!(back[1].seq, 1);
    assert_eq!(problems.len(), 2, "{problems:?}");
    match &problems[0] {
        LogProblem::Malformed { line, offset, .. } => {
            assert_eq!((*line, *offset), (2, a.len() as u64));
        }
        other => panic!("{other:?}"),
    }
    match &problems[1] {
        LogProblem::Malformed { line, offset, .. } => {
            // Line 3 is blank (ignored); line 4 is the garbage.
            assert_eq!(*line, 4);
            assert_eq!(*offset, a.len() as u64 + 20 + 1);
        }
        other => panic!("{other:?}"),
    }
    assert!(problems[1].to_string().starts_with("line 4 (byte "));
}

#[test]
fn read_log_reports_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        read_log(&dir.path().join("nope.jsonl")),
        Err(LogError::Io { .. })
    ));
}
