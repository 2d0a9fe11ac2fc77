//! The capture log's writers and reader round trip: every record the
//! reader finds in any bytes, written again each way a writer writes it,
//! reads back equal, with no problem reported.
//! - As one whole line: `encode_line` (the record as `serde_json` writes
//!   it), and the agent's way, `encode_end` with the requests serialized
//!   ahead and prompt ids serialized from the record's ids, from other ids
//!   (stale: not to be used) or none; byte for byte the same line.
//! - As a request part plus completion: `encode_two_parts` (the sample
//!   writers'), and the agent's `encode_request_part` then `encode_end`, the
//!   part holding the record's prompt ids (compared at the end, or known to
//!   be the same: `prompt_unchanged`, the same bytes), other ids or none.
//! - Each of the agent's lines again with the reply's token data
//!   serialized as it streamed (`ReplyTokensJson::catch_up`, in pieces of 1
//!   to 8 tokens chosen by the input's length): the same bytes as without.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polar_capture_log::encode::{
    PartHead, PreEncoded, RecordParts, encode_end, encode_request_part, encode_two_parts,
};
use polar_capture_log::{ReplyTokensJson, encode_line, parse_log};
use polar_record::CompletionRecord;

fuzz_target!(|data: &[u8]| {
    let (records, _) = parse_log(data);
    let piece = 1 + data.len() % 8;
    for r in records {
        let whole = encode_line(&r).expect("a record serializes");
        reads_back(&r, &whole);
        let (part, completion) = encode_two_parts(&r).expect("a record serializes");
        reads_back(&r, &[part, completion].concat());

        let own = r.prompt_token_ids.as_deref();
        let other = other_ids(own);
        let prompts = [own, Some(&other[..]), None];
        let head = PartHead {
            call_id: r.call_id.clone(),
            seq: r.seq,
            session_id: r.session_id.clone(),
        };
        let tokens = [ReplyTokensJson::default(), streamed(&r, piece)];
        let pre = PreEncoded::requests(&r.native_request, &r.request);
        for prompt in prompts {
            let ahead = RecordParts::Whole(PreEncoded {
                prompt_token_ids: prompt.and_then(PreEncoded::prompt),
                ..pre.clone()
            });
            let part = encode_request_part(&head, &pre, prompt)
                .expect("a record serializes")
                .expect("its requests were serialized");
            let in_part = || RecordParts::InRequestPart(prompt.map(<[u32]>::to_vec).into());
            let parts = in_part();
            // The part's ids known to be the record's.
            let unchanged = (prompt == own).then(|| in_part().prompt_unchanged());
            for tokens in &tokens {
                let line = encode_end(&r, &ahead, tokens).expect("a record serializes");
                assert!(
                    line == whole,
                    "prompt ids serialized ahead: {prompt:?}\n{}\n{}",
                    String::from_utf8_lossy(&line),
                    String::from_utf8_lossy(&whole)
                );
                let end = encode_end(&r, &parts, tokens).expect("a record serializes");
                reads_back(&r, &[&part[..], &end].concat());
                if let Some(unchanged) = &unchanged {
                    let same = encode_end(&r, unchanged, tokens).expect("a record serializes");
                    assert_eq!(same, end, "the part's ids known to be the record's");
                }
            }
        }
    }
});

/// `log` reads as `r` alone, with no problem.
fn reads_back(r: &CompletionRecord, log: &[u8]) {
    let (back, problems) = parse_log(log);
    assert!(
        problems.is_empty(),
        "{problems:?} in {}",
        String::from_utf8_lossy(log)
    );
    assert_eq!(back, std::slice::from_ref(r));
}

/// Prompt ids that are not `own`: the last one changed, or one id.
fn other_ids(own: Option<&[u32]>) -> Vec<u32> {
    match own {
        Some([rest @ .., last]) => [rest, &[last.wrapping_add(1)]].concat(),
        _ => vec![0],
    }
}

/// The reply's token data of `r` serialized as a stream brings it:
/// `piece` more tokens at a time.
fn streamed(r: &CompletionRecord, piece: usize) -> ReplyTokensJson {
    let ids = r.response_token_ids.as_deref().unwrap_or_default();
    let logprobs = r.response_logprobs.as_deref().unwrap_or_default();
    let mut tokens = ReplyTokensJson::default();
    let mut n = 0;
    while n < ids.len().max(logprobs.len()) {
        n += piece;
        tokens.catch_up(&ids[..n.min(ids.len())], &logprobs[..n.min(logprobs.len())]);
    }
    tokens
}

polar_fuzz::json_mutator!(include_str!("../dicts/capture_log_roundtrip.dict"));
