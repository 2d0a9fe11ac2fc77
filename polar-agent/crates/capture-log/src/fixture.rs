//! For tests (feature `fixture`, and this crate's own tests): a sample
//! record ([`record`]) and a record written as its two lines
//! ([`two_parts`]).

#![allow(
    clippy::expect_used,
    reason = "test fixtures: a record that does not serialize fails the test using it"
)]

use serde_json::json;

use crate::encode::{PartHead, PreEncoded, RecordParts, encode_end, encode_request_part};
use crate::tokens_json::ReplyTokensJson;
use polar_chat::Api;
use polar_chat::{ChatRequest, ChatResponse, FinishReason, Message, Role, Sampling, Usage};
use polar_record::{
    BackendInfo, CallStatus, CompletionRecord, NativeRequest, RECORD_VERSION, Timings,
};

/// A completed call's record: call id `c-<seq>`, session `s-1`.
pub fn record(seq: u64, api: Api, text: &str) -> CompletionRecord {
    let request = ChatRequest {
        model: "m".into(),
        messages: vec![Message::text(Role::User, format!("q{seq}"))],
        tools: Vec::new(),
        tool_choice: None,
        response_format: None,
        sampling: Sampling::default(),
        stream: false,
        extra: Default::default(),
    };
    CompletionRecord {
        version: RECORD_VERSION,
        call_id: format!("c-{seq}"),
        seq,
        session_id: "s-1".into(),
        task_id: Some("t".into()),
        policy_version: Some("w-1".into()),
        native_request: NativeRequest {
            api,
            method: "POST".into(),
            host: "api.example".into(),
            path: "/v1/x".into(),
            body: polar_json::RawJson::from_value(&json!({"n": seq})),
        },
        request,
        response: Some(ChatResponse {
            id: format!("r{seq}"),
            model: "m".into(),
            message: Message::text(Role::Assistant, text),
            finish_reason: FinishReason::Stop,
            usage: Usage::default(),
            tokens: Default::default(),
        }),
        prompt_token_ids: Some(vec![1, 2, 3]),
        response_token_ids: Some(vec![4, 5]),
        response_logprobs: Some(vec![-0.5, -0.25]),
        token_ids_missing: false,
        finish_reason: Some(FinishReason::Stop),
        backend: BackendInfo::default(),
        timings: Timings::default(),
        resumed: None,
        status: CallStatus::Completed,
    }
}

/// `record` as its request part and its completion, the part holding
/// `part_prompt` as prompt ids.
pub fn two_parts(record: &CompletionRecord, part_prompt: Option<&[u32]>) -> (Vec<u8>, Vec<u8>) {
    let pre = PreEncoded::requests(&record.native_request, &record.request);
    let head = PartHead {
        call_id: record.call_id.clone(),
        seq: record.seq,
        session_id: record.session_id.clone(),
    };
    let part = encode_request_part(&head, &pre, part_prompt)
        .expect("a record serializes")
        .expect("a record has requests to write");
    let ids = part_prompt.map(<[u32]>::to_vec);
    let parts = RecordParts::InRequestPart(ids.into());
    let end = encode_end(record, &parts, &ReplyTokensJson::default()).expect("a record serializes");
    (part, end)
}
