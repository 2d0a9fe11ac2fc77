//! The SGLang dialect: `/v1/chat/completions` where, without streaming,
//! `return_prompt_token_ids` adds `choices[].prompt_token_ids` and
//! `return_meta_info` adds `choices[].token_ids` and `choices[].meta_info`
//! (`output_token_logprobs` as `[logprob, id, text]` triples when `logprobs`
//! is set); streamed replies carry no ids and reasoning as
//! `reasoning_content`. `/generate` with `text` or `input_ids`,
//! `sampling_params`, `return_logprob`, `stream` (each streamed event carries
//! the text and `output_ids` so far, cumulative).

use std::ops::Range;
use std::sync::Arc;

use http::{HeaderMap, Response};
use serde_json::{Map, Value, json};

use super::body::RespBody;
use super::emit::{self, Frame};
use super::generate::{Delta, Generation};
use super::openai;
use super::server::{Admitted, GenRequest, State, now_secs};
use super::template::PromptFacts;
use super::vllm::{chat_delta, visible_text};
use super::{MockError, tokenizer};

/// SGLang's `meta_info` of a generation.
fn meta_info(adm: &Admitted, id: &str, logprobs: bool) -> Value {
    let g = &adm.generation;
    let mut finish = json!({"type": g.finish.sglang_type()});
    if g.finish.sglang_type() == "stop" {
        finish["matched"] = json!(tokenizer::IM_END);
    }
    let mut meta = json!({
        "id": id, "finish_reason": finish,
        "prompt_tokens": g.prompt_ids.len(), "completion_tokens": g.ids.len(),
        "cached_tokens": adm.cached_tokens, "weight_version": adm.weight_version(),
        "e2e_latency": 0.0,
    });
    if logprobs {
        meta["output_token_logprobs"] = emit::sglang_logprobs(g);
    }
    meta
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    state: &Arc<State>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response<RespBody>, MockError> {
    let (req, adm, call_ids) = match openai::admit_chat(state, headers, body).await? {
        Ok(admitted) => admitted,
        Err(resp) => return Ok(resp),
    };
    let top = if req.logprobs { req.top_logprobs } else { 0 };
    let id = format!("{:032x}", adm.number);
    let model = adm.cfg().served_model.clone();
    let created = now_secs();
    if !req.stream {
        let g = &adm.generation;
        let p = &g.parsed;
        let calls: Vec<Value> = p
            .tool_calls
            .iter()
            .zip(&call_ids)
            .enumerate()
            .map(|(i, (c, id))| json!({"id": id, "index": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        let content = if p.content.is_empty() {
            Value::Null
        } else {
            json!(p.content)
        };
        let mut choice = json!({
            "index": 0,
            "message": {"role": "assistant", "content": content, "reasoning_content": p.reasoning,
                        "tool_calls": if calls.is_empty() { Value::Null } else { Value::Array(calls) }},
            "logprobs": if req.logprobs { emit::chat_logprobs(g, 0..g.ids.len(), top) } else { Value::Null },
            "finish_reason": g.finish.as_str(),
            "matched_stop": if g.finish.sglang_type() == "stop" { json!(tokenizer::IM_END) } else { Value::Null },
        });
        if req.flag("return_prompt_token_ids") {
            choice["prompt_token_ids"] = json!(g.prompt_ids);
        }
        if req.flag("return_meta_info") {
            choice["token_ids"] = json!(g.ids);
            choice["meta_info"] = meta_info(&adm, &id, req.logprobs);
        }
        let reply = json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [choice], "usage": emit::usage(&adm),
        });
        return Ok(emit::whole(adm, reply).await);
    }
    let head =
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model});
    let mut first = head.clone();
    first["choices"] = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
    let mut tail = Vec::new();
    if req.include_usage {
        let mut u = head.clone();
        u["choices"] = json!([]);
        u["usage"] = emit::usage(&adm);
        tail.push(u);
    }
    let logprobs = req.logprobs;
    let chunk = move |g: &Generation, range: Range<usize>, d: Delta, last: bool| {
        let mut c = head.clone();
        c["choices"] = json!([{
            "index": 0,
            "delta": chat_delta(g, &d, "reasoning_content", &call_ids),
            "logprobs": if logprobs { emit::chat_logprobs(g, range, top) } else { Value::Null },
            "finish_reason": if last { Value::from(g.finish.as_str()) } else { Value::Null },
        }]);
        c
    };
    let frame = Frame {
        first: Some(first),
        tail,
        done: true,
    };
    Ok(emit::stream(adm, frame, Box::new(chunk)))
}

/// `POST /generate`.
pub async fn generate(
    state: &Arc<State>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response<RespBody>, MockError> {
    let req: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| MockError::BadRequest(format!("invalid JSON body: {e}")))?;
    let prompt_ids = match (req.get("input_ids"), req.get("text")) {
        (Some(Value::Array(ids)), _) => ids
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                MockError::BadRequest("`input_ids` must be one list of token ids".into())
            })?,
        (_, Some(Value::String(text))) => tokenizer::encode(text),
        _ => return Err(MockError::BadRequest("give `text` or `input_ids`".into())),
    };
    let sampling = req.get("sampling_params");
    let gen_req = GenRequest {
        headers,
        user: None,
        facts: PromptFacts::sniff(&tokenizer::decode(&prompt_ids)?),
        prompt_ids,
        max_tokens: sampling
            .and_then(|s| s.get("max_new_tokens"))
            .and_then(Value::as_u64)
            .map(|n| n as usize),
    };
    let adm = match state.admit(gen_req).await {
        Ok(a) => a,
        Err(resp) => return Ok(resp),
    };
    let logprobs = openai::flag(&req, "return_logprob");
    let id = format!("{:032x}", adm.number);
    let reply_of = |g: &Generation, upto: usize, meta: Value| json!({"text": visible_text(g, 0..upto), "output_ids": g.ids[..upto], "meta_info": meta});
    let meta = meta_info(&adm, &id, logprobs);
    if !openai::flag(&req, "stream") {
        let reply = reply_of(&adm.generation, adm.generation.ids.len(), meta);
        return Ok(emit::whole(adm, reply).await);
    }
    let chunk = move |g: &Generation, range: Range<usize>, _d: Delta, last: bool| {
        let mut m = meta.clone();
        m["completion_tokens"] = json!(range.end);
        if !last {
            m["finish_reason"] = Value::Null;
        }
        if let Some(all) = m
            .get_mut("output_token_logprobs")
            .and_then(Value::as_array_mut)
        {
            all.truncate(range.end);
        }
        reply_of(g, range.end, m)
    };
    Ok(emit::stream(
        adm,
        Frame {
            first: None,
            tail: Vec::new(),
            done: true,
        },
        Box::new(chunk),
    ))
}
