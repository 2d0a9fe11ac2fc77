//! The reader's join of two-part records: interleaved calls, a request
//! part never completed, a completion without its part, torn lines of
//! either kind, whole records mixed in, and a property test that any
//! record written in two parts reads back equal.

use proptest::prelude::*;

use super::*;
use crate::encode::encode_line;
use crate::fixture::{record, two_parts};
use crate::read::parse_log;
use polar_chat::Api;
use polar_record::CallStatus;

fn cat(lines: &[&[u8]]) -> Vec<u8> {
    lines.concat()
}

fn seqs(records: &[CompletionRecord]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

#[test]
fn interleaved_parts_of_concurrent_calls_join_in_completion_order() {
    let rs: Vec<_> = (0..3).map(|i| record(i, Api::OpenaiChat, "hi")).collect();
    let (p0, c0) = two_parts(&rs[0], Some(&[1, 2, 3]));
    let (p1, c1) = two_parts(&rs[1], None);
    let (p2, c2) = two_parts(&rs[2], Some(&[1, 2, 3]));
    let old = encode_line(&record(7, Api::OpenaiResponses, "old")).unwrap();
    let bytes = cat(&[&p0, &p1, &old, &p2, &c1, &c2, &c0]);
    let (back, problems) = parse_log(&bytes);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(seqs(&back), [7, 1, 2, 0]);
    assert_eq!(back[1], rs[1]);
    assert_eq!(back[2], rs[2]);
    assert_eq!(back[3], rs[0]);
    assert_eq!(back[0], record(7, Api::OpenaiResponses, "old"));
}

#[test]
fn a_request_part_never_completed_is_reported_and_skipped() {
    let a = record(0, Api::OpenaiChat, "a");
    let b = record(1, Api::OpenaiChat, "b");
    let (pa, ca) = two_parts(&a, Some(&[1, 2, 3]));
    let (pb, _) = two_parts(&b, Some(&[1, 2, 3]));
    let bytes = cat(&[&pb, &pa, &ca]);
    let (back, problems) = parse_log(&bytes);
    assert_eq!(back, [a]);
    assert_eq!(
        problems,
        [LogProblem::Unfinished {
            line: 1,
            offset: 0,
            call_id: "c-1".into()
        }]
    );
    assert!(
        problems[0]
            .to_string()
            .contains("call c-1, which never ended")
    );
}

#[test]
fn a_completion_without_its_request_part_is_malformed() {
    let a = record(0, Api::OpenaiChat, "a");
    let b = record(1, Api::OpenaiChat, "b");
    let (pa, ca) = two_parts(&a, None);
    let (_, cb) = two_parts(&b, None);
    // b's completion has no part; a's completion comes before a's part.
    let bytes = cat(&[&cb, &ca, &pa]);
    let (back, problems) = parse_log(&bytes);
    assert!(back.is_empty());
    assert_eq!(problems.len(), 3, "{problems:?}");
    match &problems[0] {
        LogProblem::Malformed {
            line: 1,
            offset: 0,
            reason,
        } => assert!(reason.contains("c-1 has no request part"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(&problems[1], LogProblem::Malformed { line: 2, offset, .. } if *offset == cb.len() as u64)
    );
    assert!(matches!(
        &problems[2],
        LogProblem::Unfinished { line: 3, .. }
    ));
}

#[test]
fn a_completion_that_disagrees_with_its_part_is_malformed() {
    let a = record(0, Api::OpenaiChat, "a");
    let (pa, _) = two_parts(&a, None);
    let mut other_seq = a.clone();
    other_seq.seq = 5;
    let (_, c) = two_parts(&other_seq, None);
    let (back, problems) = parse_log(&cat(&[&pa, &c]));
    assert!(back.is_empty());
    assert!(
        matches!(&problems[..], [LogProblem::Malformed { line: 2, reason, .. }] if reason.contains("does not match")),
        "{problems:?}"
    );
}

#[test]
fn a_torn_line_of_either_kind_keeps_everything_before_it() {
    let a = record(0, Api::OpenaiChat, "a");
    let b = record(1, Api::OpenaiChat, "b");
    let (pa, ca) = two_parts(&a, Some(&[1, 2, 3]));
    let (pb, cb) = two_parts(&b, Some(&[1, 2, 3]));
    let before = cat(&[&pa, &ca]);
    // A torn request part: the call never ended.
    for cut in [1, pb.len() / 2, pb.len() - 1] {
        let bytes = cat(&[&before, &pb[..cut]]);
        let (back, problems) = parse_log(&bytes);
        assert_eq!(back, std::slice::from_ref(&a));
        assert_eq!(
            problems,
            [LogProblem::TornTail {
                line: 3,
                offset: before.len() as u64,
                len: cut
            }]
        );
    }
    // A torn completion: its part is unfinished, reported before the tail.
    for cut in [1, cb.len() / 2, cb.len() - 1] {
        let bytes = cat(&[&before, &pb, &cb[..cut]]);
        let (back, problems) = parse_log(&bytes);
        assert_eq!(back, std::slice::from_ref(&a));
        assert_eq!(
            problems,
            [
                LogProblem::Unfinished {
                    line: 3,
                    offset: before.len() as u64,
                    call_id: "c-1".into()
                },
                LogProblem::TornTail {
                    line: 4,
                    offset: (before.len() + pb.len()) as u64,
                    len: cut
                }
            ]
        );
    }
}

#[test]
fn a_whole_record_supersedes_its_calls_request_part() {
    // The fallback after a part whose sync failed: the part may be in the
    // log, followed by the whole record.
    let a = record(0, Api::OpenaiChat, "a");
    let (pa, _) = two_parts(&a, Some(&[1, 2, 3]));
    let whole = encode_line(&a).unwrap();
    let (back, problems) = parse_log(&cat(&[&pa, &whole]));
    assert_eq!(back, [a]);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn the_kind_is_found_with_whitespace_or_anywhere() {
    let a = record(0, Api::OpenaiChat, "a");
    let (pa, ca) = two_parts(&a, None);
    // Reformatted: spaces around the first key; `part` moved to the end.
    let spaced = [
        b" { \"part\" : \"request\" ,".as_slice(),
        &pa[b"{\"part\":\"request\",".len()..],
    ]
    .concat();
    let mut moved: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&ca).unwrap();
    let kind = moved.remove("part").unwrap();
    moved.insert("part".into(), kind);
    let mut moved = serde_json::to_vec(&moved).unwrap();
    assert!(!moved.starts_with(b"{\"part\""));
    moved.push(b'\n');
    let (back, problems) = parse_log(&cat(&[&spaced, &moved]));
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(back, [a]);
    assert!(leading_part(b"{\"part\":\"re\\\"quest\"").is_none());
    assert!(matches!(
        parse_line(b"{\"part\":\"other\"}"),
        Err(e) if e.to_string().contains("missing field")
    ));
}

fn a_record() -> impl Strategy<Value = CompletionRecord> {
    (
        0u64..1000,
        "[a-z \"\\\\é]{0,40}",
        proptest::option::of(proptest::collection::vec(any::<u32>(), 0..50)),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(seq, text, prompt, task, failed)| {
            let mut r = record(seq, Api::OpenaiChat, &text);
            r.call_id = format!("call_{seq:016x}");
            r.prompt_token_ids = prompt;
            if !task {
                r.task_id = None;
            }
            if failed {
                r.response = None;
                r.finish_reason = None;
                r.status = CallStatus::Failed {
                    side: "harness".into(),
                    error: text,
                };
            }
            r
        })
}

/// What the request part holds as prompt ids.
#[derive(Clone, Copy, Debug)]
enum PartPrompt {
    Same,
    Other,
    Absent,
}

proptest! {
    #[test]
    fn records_written_in_two_parts_read_back_equal(
        calls in proptest::collection::vec(
            (a_record(), prop_oneof![Just(PartPrompt::Same), Just(PartPrompt::Other), Just(PartPrompt::Absent)], any::<bool>()),
            1..6,
        ),
        order in proptest::collection::vec(any::<u32>(), 12),
    ) {
        // Distinct calls.
        let calls: Vec<_> = calls
            .into_iter()
            .enumerate()
            .map(|(i, (mut r, p, whole))| {
                r.call_id = format!("{}-{i}", r.call_id);
                (r, p, whole)
            })
            .collect();
        // Every call's lines (a part, then its end; or one whole line),
        // interleaved in an arbitrary order that keeps each part first.
        let mut lines: Vec<(u32, usize, Vec<u8>)> = Vec::new();
        for (i, (r, p, whole)) in calls.iter().enumerate() {
            if *whole {
                lines.push((order[2 * i], i, encode_line(r).unwrap()));
                continue;
            }
            let other = [7u32, 7];
            let ids = match p {
                PartPrompt::Same => r.prompt_token_ids.as_deref(),
                PartPrompt::Other => Some(&other[..]),
                PartPrompt::Absent => None,
            };
            let (part, end) = two_parts(r, ids);
            let (a, b) = (order[2 * i], order[2 * i + 1]);
            lines.push((a.min(b), i, part));
            lines.push((a.max(b).saturating_add(1), i, end));
        }
        lines.sort_by_key(|(k, _, _)| *k);
        let bytes: Vec<u8> = lines.iter().flat_map(|(_, _, l)| l.clone()).collect();
        let (back, problems) = parse_log(&bytes);
        prop_assert!(problems.is_empty(), "{:?}", problems);
        // One record per call, in the order of its last line.
        let mut expected: Vec<(usize, &CompletionRecord)> = Vec::new();
        for (pos, (_, i, l)) in lines.iter().enumerate() {
            if !l.starts_with(b"{\"part\":\"request\"") {
                expected.push((pos, &calls[*i].0));
            }
        }
        let expected: Vec<CompletionRecord> = expected.into_iter().map(|(_, r)| r.clone()).collect();
        prop_assert_eq!(back, expected);
    }
}
