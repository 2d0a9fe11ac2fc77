//! A session's model calls as the dashboard's timeline shows them: one
//! small entry per call (when it arrived, left for its replica, its first
//! token, its end; its
//! API, model, finish reason, token counts, outcome; which earlier call it
//! retried), built from the capture log in POSTRUN and sent in the
//! result's `stats.calls` (the rollout server keeps it with the sample:
//! the node's capture log is removed once the session is exported).
//! The same entries go out live, one per call as it ends ([`entry`],
//! `live`). Pure: records in, JSON out. At most [`MAX_CALLS`] entries
//! (`stats.calls_total` says how many there were), error texts cut to
//! [`MAX_ERROR_CHARS`], so a result stays small.

use serde_json::{Value, json};

use polar_chat::FinishReason;
use polar_record::{CallStatus, CompletionRecord};

/// The most calls listed in a result.
pub const MAX_CALLS: usize = 512;
/// The longest error text kept per call.
pub const MAX_ERROR_CHARS: usize = 300;

/// The timeline entries of `records` (in their order, `seq`), at most
/// [`MAX_CALLS`]: `(entries, total calls)`.
pub fn calls(records: &[CompletionRecord]) -> (Vec<Value>, usize) {
    let mut out = Vec::with_capacity(records.len().min(MAX_CALLS));
    for (i, r) in records.iter().enumerate().take(MAX_CALLS) {
        // A retry: the same normalized request as an earlier call (the
        // harness sent it again, usually after an error).
        let retry_of = records[..i]
            .iter()
            .rev()
            .find(|p| p.request == r.request)
            .map(|p| p.seq);
        out.push(entry(r, retry_of));
    }
    (out, records.len())
}

/// The timeline entry of one call; `retry_of`: the earlier call it sent
/// again, when known (the live timeline does not look: its entries are
/// superseded by the result's).
pub fn entry(r: &CompletionRecord, retry_of: Option<u64>) -> Value {
    let (status, side, error) = match &r.status {
        CallStatus::Completed => ("completed", None, None),
        CallStatus::Failed { side, error } => (
            "failed",
            Some(side.clone()),
            Some(error.chars().take(MAX_ERROR_CHARS).collect::<String>()),
        ),
    };
    json!({
        "call_id": r.call_id,
        "seq": r.seq,
        "api": r.native_request.api,
        "model": r.request.model,
        "served_model": r.backend.served_model,
        "backend": r.backend.name,
        "received_ms": r.timings.received_ms,
        "sent_ms": r.timings.sent_ms,
        "first_token_ms": r.timings.first_token_ms,
        "finished_ms": r.timings.finished_ms,
        "finish_reason": r.finish_reason.as_ref().map(finish_name),
        "prompt_tokens": r.prompt_token_ids.as_ref().map(Vec::len),
        "response_tokens": r.response_token_ids.as_ref().map(Vec::len),
        "token_ids_missing": r.token_ids_missing,
        "status": status,
        "side": side,
        "error": error,
        "retry_of": retry_of,
        "policy_version": r.policy_version,
    })
}

fn finish_name(f: &FinishReason) -> String {
    match f {
        FinishReason::Stop => "stop".into(),
        FinishReason::Length => "length".into(),
        FinishReason::ToolCalls => "tool_calls".into(),
        FinishReason::ContentFilter => "content_filter".into(),
        FinishReason::Abort => "abort".into(),
        FinishReason::Other(s) => s.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, prompt: &str, status: CallStatus) -> CompletionRecord {
        let text = format!(
            r#"{{"version":1,"call_id":"c{seq}","seq":{seq},"session_id":"s",
               "native_request":{{"api":"openai_chat","method":"POST","host":"api.openai.com","path":"/v1/chat/completions","body":{{}}}},
               "request":{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"{prompt}"}}]}}]}},
               "prompt_token_ids":[1,2,3],"response_token_ids":[4,5],"response_logprobs":[-0.1,-0.2],
               "token_ids_missing":false,"finish_reason":"tool_calls",
               "backend":{{"name":"local","replica":"http://127.0.0.1:1","served_model":"default"}},
               "timings":{{"received_ms":{r},"sent_ms":{q},"first_token_ms":{f},"finished_ms":{e}}},"status":"completed"}}"#,
            r = 1000 + seq * 100,
            q = 1004 + seq * 100,
            f = 1010 + seq * 100,
            e = 1050 + seq * 100,
        );
        let mut r: CompletionRecord = serde_json::from_str(&text).unwrap();
        r.status = status;
        r
    }

    #[test]
    fn each_call_has_its_times_tokens_outcome_and_retries() {
        let failed = CallStatus::Failed {
            side: "backend".into(),
            error: "x".repeat(1000),
        };
        let records = [
            record(0, "hi", CallStatus::Completed),
            record(1, "go", failed),
            record(2, "go", CallStatus::Completed),
        ];
        let (calls, total) = calls(&records);
        assert_eq!(total, 3);
        assert_eq!(calls[0]["api"], "openai_chat");
        assert_eq!(calls[0]["model"], "m");
        assert_eq!(calls[0]["received_ms"], 1000);
        assert_eq!(calls[0]["sent_ms"], 1004);
        assert_eq!(calls[0]["first_token_ms"], 1010);
        assert_eq!(calls[0]["finished_ms"], 1050);
        assert_eq!(calls[0]["finish_reason"], "tool_calls");
        assert_eq!(calls[0]["prompt_tokens"], 3);
        assert_eq!(calls[0]["response_tokens"], 2);
        assert_eq!(calls[0]["retry_of"], Value::Null);
        assert_eq!(calls[1]["status"], "failed");
        assert_eq!(calls[1]["side"], "backend");
        assert_eq!(
            calls[1]["error"].as_str().unwrap().chars().count(),
            MAX_ERROR_CHARS
        );
        // The same request again: a retry of call 1.
        assert_eq!(calls[2]["retry_of"], 1);
        assert_eq!(calls[2]["status"], "completed");
    }

    #[test]
    fn long_sessions_are_cut_and_counted() {
        let records: Vec<_> = (0..(MAX_CALLS as u64 + 5))
            .map(|i| record(i, &format!("p{i}"), CallStatus::Completed))
            .collect();
        let (calls, total) = calls(&records);
        assert_eq!(calls.len(), MAX_CALLS);
        assert_eq!(total, MAX_CALLS + 5);
    }
}
