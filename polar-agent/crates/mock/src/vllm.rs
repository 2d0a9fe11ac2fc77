//! The vLLM dialect: `/v1/chat/completions` with `return_token_ids`
//! (top-level `prompt_token_ids`, `choices[].token_ids`, OpenAI logprobs;
//! when streaming, prompt ids in the first chunk only and each chunk's own
//! `token_ids`, a chunk per token even when it carries no text),
//! `/v1/completions` with ids as the prompt, `/tokenize`, `/detokenize`.

use std::ops::Range;
use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};
use serde_json::{Map, Value, json};

use super::MockError;
use super::body::{RespBody, json_response};
use super::codec::Codec;
use super::constrain::Constraint;
use super::emit::{self, Frame};
use super::generate::{Delta, Generation, arguments_as_sent};
use super::openai::{self, ChatIn};
use super::server::{GenRequest, State, now_secs};

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
    let with_ids = req.flag("return_token_ids");
    let top = if req.logprobs { req.top_logprobs } else { 0 };
    let id = format!("chatcmpl-{}", adm.reply_id(16));
    let model = adm.cfg().served_model.clone();
    let field = adm.cfg().reasoning_field.as_str();
    let created = now_secs();
    if !req.stream {
        let g = &adm.generation;
        let p = &g.parsed;
        let dumps = adm.cfg().json_dumps_arguments;
        // vLLM's `ChatMessage` (`vllm/entrypoints/openai/protocol.py`;
        // `entrypoints/openai/chat_completion/protocol.py` in newer
        // releases): every field serialized, `reasoning` copied into the
        // deprecated `reasoning_content` (`handle_deprecated_reasoning_content`).
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), non_empty(&p.content));
        for key in ["refusal", "annotations", "audio", "function_call"] {
            message.insert(key.into(), Value::Null);
        }
        let reasoning = p.reasoning.clone().map_or(Value::Null, Value::from);
        message.insert(field.into(), reasoning.clone());
        if field == "reasoning" {
            message.insert("reasoning_content".into(), reasoning);
        }
        let calls: Vec<Value> = p
            .tool_calls
            .iter()
            .zip(&call_ids)
            .map(|(c, id)| json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": arguments_as_sent(&c.arguments, dumps)}}))
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
        let mut choice = json!({
            "index": 0, "message": message,
            "logprobs": if req.logprobs { emit::chat_logprobs(g, 0..g.ids.len(), top) } else { Value::Null },
            "finish_reason": g.finish.as_str(), "stop_reason": null,
        });
        let mut reply = json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [], "service_tier": null, "system_fingerprint": null,
            "usage": emit::usage(&adm), "prompt_logprobs": null, "kv_transfer_params": null,
        });
        if with_ids {
            choice["token_ids"] = json!(g.ids);
            reply["prompt_token_ids"] = json!(g.prompt_ids);
        }
        reply["choices"] = json!([choice]);
        return Ok(emit::whole(adm, reply).await);
    }
    let head = |choices: Value| json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices});
    let mut first = head(
        json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
    );
    if with_ids {
        first["prompt_token_ids"] = json!(adm.generation.prompt_ids);
    }
    let mut tail = Vec::new();
    if req.include_usage {
        let mut u = head(json!([]));
        u["usage"] = emit::usage(&adm);
        tail.push(u);
    }
    let logprobs = req.logprobs;
    let chunk_head = head(Value::Null);
    let chunk = move |g: &Generation, range: Range<usize>, d: Delta, last: bool| {
        let mut choice = json!({
            "index": 0,
            "delta": chat_delta(g, &d, field, &call_ids),
            "logprobs": if logprobs { emit::chat_logprobs(g, range.clone(), top) } else { Value::Null },
            "finish_reason": if last { Value::from(g.finish.as_str()) } else { Value::Null },
        });
        if with_ids {
            choice["token_ids"] = json!(g.ids[range]);
        }
        if last {
            choice["stop_reason"] = Value::Null;
        }
        let mut c = chunk_head.clone();
        c["choices"] = json!([choice]);
        c
    };
    let frame = Frame {
        first: Some(first),
        tail,
        done: true,
    };
    Ok(emit::stream(adm, frame, Box::new(chunk)))
}

/// The OpenAI chat `delta` of one chunk (`reasoning_field` for reasoning).
pub fn chat_delta(g: &Generation, d: &Delta, reasoning_field: &str, call_ids: &[String]) -> Value {
    let mut delta = Map::new();
    if !d.reasoning.is_empty() {
        delta.insert(reasoning_field.into(), json!(d.reasoning));
    }
    if !d.content.is_empty() {
        delta.insert("content".into(), json!(d.content));
    }
    let mut calls: Vec<Value> = Vec::new();
    for &n in &d.tool_starts {
        let name = g
            .streamed()
            .tool_calls
            .get(n)
            .map(|c| c.name.as_str())
            .unwrap_or_default();
        let id = call_ids.get(n).map(String::as_str).unwrap_or_default();
        calls.push(json!({"index": n, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}));
    }
    for (n, args) in &d.tool_args {
        match calls.iter_mut().find(|c| c["index"] == json!(n)) {
            Some(c) => c["function"]["arguments"] = json!(args),
            None => calls.push(json!({"index": n, "function": {"arguments": args}})),
        }
    }
    if !calls.is_empty() {
        delta.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(delta)
}

fn non_empty(s: &str) -> Value {
    if s.is_empty() { Value::Null } else { json!(s) }
}

/// What vLLM's `/v1/completions` generates at most when a request sets no
/// `max_tokens` (`CompletionRequest`, `vllm/entrypoints/openai/protocol.py`).
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// `POST /v1/completions`: `prompt` as token ids (or text), raw, no template.
pub async fn completions(
    state: &Arc<State>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response<RespBody>, MockError> {
    let req: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| MockError::BadRequest(format!("invalid JSON body: {e}")))?;
    let codec = state.codec();
    let prompt_ids = match req.get("prompt") {
        Some(Value::String(text)) => codec.encode(text)?,
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                MockError::BadRequest("`prompt` must be a string or one list of token ids".into())
            })?,
        _ => return Err(MockError::BadRequest("`prompt` is required".into())),
    };
    let facts = codec.sniff(&prompt_ids)?;
    // vLLM's `CompletionRequest.max_tokens` defaults to 16, not to what is
    // left of the context (as the chat endpoint's does).
    let max_tokens = Some(
        req.get("max_tokens")
            .and_then(Value::as_u64)
            .map_or(COMPLETIONS_DEFAULT_MAX_TOKENS, |n| n as usize),
    );
    let gen_req = GenRequest {
        headers,
        user: req.get("user").and_then(Value::as_str),
        facts,
        prompt_ids,
        max_tokens,
        constraint: Constraint {
            response_format: super::guided::vllm(&req)?,
            ..Constraint::default()
        },
    };
    let adm = match state.admit(gen_req).await {
        Ok(a) => a,
        Err(resp) => return Ok(resp),
    };
    let logprobs = req.get("logprobs").and_then(Value::as_u64).is_some();
    let skip = req
        .get("skip_special_tokens")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let with_ids = openai::flag(&req, "return_token_ids");
    let stream = openai::flag(&req, "stream");
    let id = format!("cmpl-{}", adm.reply_id(16));
    let head = json!({"id": id, "object": "text_completion", "created": now_secs(), "model": adm.cfg().served_model});
    if !stream {
        let g = &adm.generation;
        let mut choice = json!({
            "index": 0, "text": visible_text(g, 0..g.ids.len(), skip),
            "logprobs": if logprobs { completion_logprobs(g, 0..g.ids.len()) } else { Value::Null },
            "finish_reason": g.finish.as_str(), "stop_reason": null,
        });
        if with_ids {
            choice["prompt_token_ids"] = json!(g.prompt_ids);
            choice["token_ids"] = json!(g.ids);
        }
        let mut reply = head;
        reply["choices"] = json!([choice]);
        reply["usage"] = emit::usage(&adm);
        return Ok(emit::whole(adm, reply).await);
    }
    let prompt_ids = adm.generation.prompt_ids.clone();
    let chunk_head = head.clone();
    let chunk = move |g: &Generation, range: Range<usize>, _d: Delta, last: bool| {
        let mut choice = json!({
            "index": 0, "text": visible_text(g, range.clone(), skip),
            "logprobs": if logprobs { completion_logprobs(g, range.clone()) } else { Value::Null },
            "finish_reason": if last { Value::from(g.finish.as_str()) } else { Value::Null },
        });
        if with_ids {
            if range.start == 0 {
                choice["prompt_token_ids"] = json!(prompt_ids);
            }
            choice["token_ids"] = json!(g.ids[range]);
        }
        let mut c = chunk_head.clone();
        c["choices"] = json!([choice]);
        c
    };
    let mut tail = Vec::new();
    if req
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true)
    {
        let mut u = head;
        u["choices"] = json!([]);
        u["usage"] = emit::usage(&adm);
        tail.push(u);
    }
    let frame = Frame {
        first: None,
        tail,
        done: true,
    };
    Ok(emit::stream(adm, frame, Box::new(chunk)))
}

/// The text of tokens `range` without the end-of-turn token (and, for a
/// real model with `skip_special`, without special tokens: vLLM's
/// `skip_special_tokens`, on unless the request turns it off).
pub fn visible_text(g: &Generation, range: Range<usize>, skip_special: bool) -> String {
    let bytes = g.text.as_bytes();
    let real = matches!(g.codec, Codec::Real(_));
    let mut out = Vec::new();
    for i in range {
        let id = g.ids[i];
        if g.codec.is_stop(id) || (real && skip_special && g.codec.is_special(id)) {
            continue;
        }
        out.extend_from_slice(&bytes[g.spans[i].clone()]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn completion_logprobs(g: &Generation, range: Range<usize>) -> Value {
    let tokens: Vec<String> = g.ids[range.clone()]
        .iter()
        .map(|&id| g.codec.token_text(id))
        .collect();
    let offsets: Vec<usize> = g.spans[range.clone()].iter().map(|s| s.start).collect();
    json!({
        "tokens": tokens, "token_logprobs": g.logprobs[range].to_vec(),
        "top_logprobs": null, "text_offset": offsets,
    })
}

/// `POST /tokenize`: `{"prompt": text}` or `{"messages": [...], "tools"?,
/// "add_generation_prompt"?: true}`.
pub fn tokenize(
    state: &State,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response<RespBody>, MockError> {
    let req: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| MockError::BadRequest(format!("invalid JSON body: {e}")))?;
    let ids = if let Some(prompt) = req.get("prompt").and_then(Value::as_str) {
        state.codec().encode(prompt)?
    } else {
        let chat = ChatIn::parse(body, state.cfg.history_reasoning())?;
        let add = req
            .get("add_generation_prompt")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        chat.prompt_ids(&state.cfg, headers, add)?
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({"count": ids.len(), "max_model_len": state.cfg.max_model_len, "tokens": ids, "token_strs": null}),
    ))
}

/// `POST /detokenize`: `{"tokens": [...]}`, answered with the text under
/// `key` (vLLM's `prompt`, SGLang's `text`).
pub fn detokenize(state: &State, body: &[u8], key: &str) -> Result<Response<RespBody>, MockError> {
    let req: Value = serde_json::from_slice(body)
        .map_err(|e| MockError::BadRequest(format!("invalid JSON body: {e}")))?;
    let ids: Vec<u32> = req
        .get("tokens")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect()
        })
        .ok_or_else(|| MockError::BadRequest("`tokens` must be a list of token ids".into()))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ key: state.codec().decode(&ids, false)? }),
    ))
}
