//! The reply of a token-in call that resumes a generation, read as raw
//! pieces (text, token ids, logprobs, finish): vLLM `/v1/completions`
//! streamed chunks (`choices[].text`, `token_ids`, `logprobs.token_logprobs`)
//! and SGLang `/generate` whole replies (`text`, `output_ids`,
//! `meta_info.output_token_logprobs` triples, `meta_info.finish_reason.type`,
//! `meta_info.weight_version`). The text is what the model generated: the
//! parsing into reasoning, text and tool calls is the caller's
//! ([`polar_chat::output`]).

use serde_json::Value;

use polar_chat::FinishReason;

use super::super::decode::DecodeError;

/// One piece of a continuation.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Piece {
    /// Generated text.
    pub(crate) text: String,
    /// Its token ids.
    pub(crate) ids: Vec<u32>,
    /// Their logprobs (as many as ids when the backend gave them).
    pub(crate) logprobs: Vec<f32>,
    /// Set on the last piece.
    pub(crate) finish: Option<FinishReason>,
    /// The weight version the backend reported.
    pub(crate) weight_version: Option<String>,
}

fn ids(v: &Value) -> Result<Vec<u32>, DecodeError> {
    v.as_array()
        .and_then(|a| {
            a.iter()
                .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect()
        })
        .ok_or_else(|| DecodeError::Malformed("token ids are not a list of ids".into()))
}

fn finish_reason(s: &str) -> FinishReason {
    match s {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "tool_calls" => FinishReason::ToolCalls,
        "abort" => FinishReason::Abort,
        other => FinishReason::Other(other.to_owned()),
    }
}

fn backend_error(v: &Value) -> Option<DecodeError> {
    let e = v.get("error")?;
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| e.to_string(), str::to_owned);
    Some(DecodeError::Cut(format!(
        "backend error in stream: {message}"
    )))
}

/// One vLLM completions chunk (`data:` of an SSE event, `[DONE]` is the
/// caller's); a chunk without choices (the usage) is an empty piece.
pub(crate) fn vllm_chunk(data: &str) -> Result<Piece, DecodeError> {
    let v: Value = serde_json::from_str(data)
        .map_err(|e| DecodeError::Malformed(format!("chunk is not JSON: {e}")))?;
    if let Some(e) = backend_error(&v) {
        return Err(e);
    }
    let Some(choice) = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
    else {
        return Ok(Piece::default());
    };
    let text = choice
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let ids = match choice.get("token_ids").filter(|v| !v.is_null()) {
        Some(v) => ids(v)?,
        None if text.is_empty() => Vec::new(),
        None => {
            return Err(DecodeError::Malformed(
                "a completions chunk without `token_ids`".into(),
            ));
        }
    };
    let logprobs = choice
        .pointer("/logprobs/token_logprobs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_f64().map(|f| f as f32))
                .collect()
        })
        .unwrap_or_default();
    Ok(Piece {
        text,
        ids,
        logprobs,
        finish: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(finish_reason),
        weight_version: None,
    })
}

/// A whole SGLang `/generate` reply.
pub(crate) fn sglang_whole(body: &[u8]) -> Result<Piece, DecodeError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| DecodeError::Malformed(format!("reply is not JSON: {e}")))?;
    if let Some(e) = backend_error(&v) {
        return Err(e);
    }
    let meta = v.get("meta_info").unwrap_or(&Value::Null);
    let ids = ids(v.get("output_ids").unwrap_or(&Value::Null))?;
    let logprobs = meta
        .get("output_token_logprobs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|t| t.get(0).and_then(Value::as_f64).map(|f| f as f32))
                .collect()
        })
        .unwrap_or_default();
    let finish = meta
        .pointer("/finish_reason/type")
        .and_then(Value::as_str)
        .map(finish_reason)
        .ok_or_else(|| DecodeError::Malformed("reply without finish_reason".into()))?;
    Ok(Piece {
        text: v
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        ids,
        logprobs,
        finish: Some(finish),
        weight_version: meta
            .get("weight_version")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_chunks_carry_text_ids_and_logprobs() {
        let p = vllm_chunk(
            r#"{"id":"cmpl-1","choices":[{"index":0,"text":"lo w","logprobs":{"tokens":["lo"," w"],"token_logprobs":[-0.5,-1.0]},"finish_reason":null,"token_ids":[7,8],"prompt_token_ids":[1,2]}]}"#,
        )
        .unwrap();
        assert_eq!(
            (p.text.as_str(), p.ids, p.logprobs, p.finish),
            ("lo w", vec![7, 8], vec![-0.5, -1.0], None)
        );
        let last =
            vllm_chunk(r#"{"choices":[{"text":"","token_ids":[2],"finish_reason":"stop"}]}"#)
                .unwrap();
        assert_eq!(last.finish, Some(FinishReason::Stop));
        assert_eq!(
            vllm_chunk(r#"{"choices":[],"usage":{}}"#).unwrap(),
            Piece::default()
        );
        assert!(matches!(
            vllm_chunk(r#"{"error":{"message":"boom"}}"#),
            Err(DecodeError::Cut(_))
        ));
        assert!(matches!(
            vllm_chunk(r#"{"choices":[{"text":"x"}]}"#),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn sglang_replies_carry_text_ids_logprobs_and_version() {
        let p = sglang_whole(
            br#"{"text":"ab","output_ids":[5,6],"meta_info":{"finish_reason":{"type":"abort"},"output_token_logprobs":[[-0.1,5,null],[-0.2,6,null]],"weight_version":"7"}}"#,
        )
        .unwrap();
        assert_eq!(p.ids, vec![5, 6]);
        assert_eq!(p.logprobs, vec![-0.1, -0.2]);
        assert_eq!(p.finish, Some(FinishReason::Abort));
        assert_eq!(p.weight_version.as_deref(), Some("7"));
        assert!(sglang_whole(br#"{"text":"","output_ids":[]}"#).is_err());
    }
}
