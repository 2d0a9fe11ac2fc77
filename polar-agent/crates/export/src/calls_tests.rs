use serde_json::json;

use super::*;
use crate::sample::{SampleSpec, session};

fn sample() -> (CallsHeader, Vec<CompletionRecord>) {
    let s = session(&SampleSpec::small(), 1);
    let json = json!({"session_id": s.meta.session_id, "outcome": "completed", "reward": 0.5});
    let header = CallsHeader::new(
        &s.meta.session_id,
        s.meta.task_id.as_deref(),
        Some(&json),
        &s.records,
    );
    (header, s.records)
}

#[test]
fn a_calls_file_reads_back_whole() {
    let (header, records) = sample();
    let bytes = encode_calls(&header, &records).unwrap();
    let back = decode_calls("f", &bytes).unwrap();
    assert_eq!(back.header, header);
    assert_eq!(back.records, records);
    assert_eq!(decode_header("f", &bytes).unwrap(), header);
    assert_eq!(header.calls as usize, records.len());
    assert!(header.first_call_ms <= header.last_call_ms);
}

#[test]
fn an_empty_session_has_a_header_only() {
    let header = CallsHeader::new("s", None, None, &[]);
    let back = decode_calls("f", &encode_calls(&header, &[]).unwrap()).unwrap();
    assert!(back.records.is_empty());
    assert_eq!(back.header.session, Value::Null);
    assert!(back.header.in_range(None, None));
    assert!(!back.header.in_range(Some(0), None));
}

#[test]
fn a_truncated_file_is_refused_with_the_file_and_offset() {
    let (header, records) = sample();
    let bytes = encode_calls(&header, &records).unwrap();
    for cut in [5, bytes.len() / 2, bytes.len() - 1] {
        let e = decode_calls("task=t/s.calls.jsonl.zst", &bytes[..cut]).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(&e, CallsError::Stream { offset, len, .. } if *len == cut as u64 && *offset <= *len),
            "{cut}: {e:?}"
        );
        assert!(
            msg.starts_with("task=t/s.calls.jsonl.zst: truncated"),
            "{msg}"
        );
        assert!(msg.contains(&format!("of {cut}")), "{msg}");
    }
}

#[test]
fn a_foreign_file_is_refused() {
    let e = decode_calls("x.parquet", b"PAR1....").unwrap_err();
    assert!(matches!(e, CallsError::NotZstd { .. }), "{e:?}");
    assert!(e.to_string().contains("x.parquet") && e.to_string().contains("offset 0"));
    // zstd, but another JSONL (a trajectory export compressed).
    let other = zstd::encode_all(&b"{\"schema_version\":1,\"trace_id\":\"s/0\"}\n"[..], 3).unwrap();
    let e = decode_calls("y", &other).unwrap_err();
    assert!(
        matches!(&e, CallsError::Foreign { why, .. } if why.contains("polar_calls")),
        "{e:?}"
    );
    let text = zstd::encode_all(&b"hello"[..], 3).unwrap();
    assert!(matches!(
        decode_calls("z", &text),
        Err(CallsError::Foreign { .. })
    ));
}

#[test]
fn a_newer_version_is_refused_with_the_version() {
    let (mut header, records) = sample();
    header.polar_calls = CALLS_SCHEMA_VERSION + 1;
    let bytes = encode_calls(&header, &records).unwrap();
    let e = decode_calls("f", &bytes).unwrap_err();
    assert!(
        matches!(e, CallsError::NewerVersion { version, .. } if version == CALLS_SCHEMA_VERSION + 1)
    );
    assert!(
        e.to_string()
            .contains(&format!("version {}", CALLS_SCHEMA_VERSION + 1))
    );
    assert!(decode_header("f", &bytes).is_err());
}

#[test]
fn a_bad_record_or_a_wrong_count_is_refused_with_its_line_and_offset() {
    let (header, records) = sample();
    let mut text = Vec::new();
    serde_json::to_writer(&mut text, &header).unwrap();
    text.push(b'\n');
    let header_len = text.len() as u64;
    serde_json::to_writer(&mut text, &records[0]).unwrap();
    text.push(b'\n');
    let second = text.len() as u64;
    text.extend_from_slice(b"{\"not\":\"a record\"}\n");
    let e = decode_calls("f", &zstd::encode_all(&text[..], 3).unwrap()).unwrap_err();
    assert!(
        matches!(e, CallsError::BadRecord { line: 3, offset, .. } if offset == second),
        "{e:?}"
    );
    // Whole lines, but fewer than the header says (a file cut at a line
    // and compressed again, a writer's bug).
    text.truncate(second as usize);
    let e = decode_calls("f", &zstd::encode_all(&text[..], 3).unwrap()).unwrap_err();
    assert!(
        matches!(e, CallsError::Count { found: 1, offset, .. } if offset == second),
        "{e:?}"
    );
    assert!(header_len < second);
}

#[test]
fn time_ranges_select_overlapping_sessions() {
    let h = CallsHeader {
        first_call_ms: Some(100),
        last_call_ms: Some(200),
        ..CallsHeader::new("s", None, None, &[])
    };
    assert!(h.in_range(None, None));
    assert!(h.in_range(Some(150), None));
    assert!(h.in_range(Some(200), Some(201)));
    assert!(!h.in_range(Some(201), None));
    assert!(!h.in_range(None, Some(100)));
    assert!(h.in_range(None, Some(101)));
}

#[test]
fn names_are_escaped_like_the_trajectories() {
    assert_eq!(file_name("s-1"), "s-1.calls.jsonl.zst");
    assert_eq!(file_name("a/b"), "a%2Fb.calls.jsonl.zst");
}

#[test]
fn a_call_shows_its_native_request_and_reply() {
    let records = session(&SampleSpec::small(), 0).records;
    let v = view(&records[0]);
    assert_eq!(v["call_id"], records[0].call_id.as_str());
    assert_eq!(v["status"], "completed");
    assert_eq!(
        v["native_request"]["path"],
        records[0].native_request.path.as_str()
    );
    assert_eq!(
        v["native_request"]["body"],
        serde_json::to_value(&records[0].native_request.body).unwrap()
    );
    assert!(v["response"].is_object(), "{v}");
    let mut failed = records[1].clone();
    failed.status = polar_record::CallStatus::Failed {
        side: "backend".into(),
        error: "boom".into(),
    };
    let v = view(&failed);
    assert_eq!(
        (v["status"].as_str(), v["side"].as_str()),
        (Some("failed"), Some("backend"))
    );
}
