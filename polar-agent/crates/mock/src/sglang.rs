//! The SGLang dialect: `/v1/chat/completions` where, without streaming,
//! `return_prompt_token_ids` adds `choices[].prompt_token_ids` and
//! `return_meta_info` adds `choices[].meta_info` (`output_token_logprobs`
//! as `[logprob, id, text]` triples when `logprobs` is set: the only place
//! the response ids are, as in real SGLang, whose chat replies carry no
//! `token_ids`), with `metadata.weight_version` at the top (see
//! [`whole_chat`]); streamed replies carry no ids and reasoning as
//! `reasoning_content`. `/v1/tokenize` (and `/tokenize`) with a prompt or
//! messages. `/generate` with `text` or `input_ids`,
//! `sampling_params`, `return_logprob`, `stream` (each streamed event carries
//! the text and `output_ids` so far, cumulative).

use std::ops::Range;
use std::sync::Arc;

use http::{HeaderMap, Response};
use serde_json::{Map, Value, json};

use super::MockError;
use super::body::RespBody;
use super::codec::Codec;
use super::constrain::Constraint;
use super::emit::{self, Frame};
use super::generate::{Delta, Generation, arguments_as_sent};
use super::openai;
use super::server::{Admitted, GenRequest, State, now_secs};
use super::vllm::{chat_delta, visible_text};

/// SGLang's `meta_info` of a generation.
fn meta_info(adm: &Admitted, id: &str, logprobs: bool) -> Value {
    let g = &adm.generation;
    let mut finish = json!({"type": g.finish.sglang_type()});
    if g.finish.sglang_type() == "stop" {
        finish["matched"] = json!(g.codec.end_of_turn_id());
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

/// A whole (non-streamed) chat reply, field by field as SGLang's
/// `OpenAIServingChat._build_chat_response`
/// (`python/sglang/srt/entrypoints/openai/serving_chat.py`) builds it from
/// the models of `python/sglang/srt/entrypoints/openai/protocol.py`:
/// - `ChatCompletionResponse`: `id` (the request id of `meta_info.id`),
///   `object`, `created`, `model` (the request's `model`, echoed),
///   `choices`, `usage` (`UsageInfo`), `metadata: {"weight_version"}`;
/// - `ChatCompletionResponseChoice`: `index`, `message`, `logprobs`,
///   `finish_reason` (`tool_calls` when the tool parser found calls),
///   `matched_stop` (the stop token, `null` after tool calls), and only when
///   asked `prompt_token_ids` (`return_prompt_token_ids`) and `meta_info`
///   (`return_meta_info`); `hidden_states` and `token_ids` are dropped when
///   unset, and the chat endpoint never sets `token_ids`: the response ids
///   are in `meta_info.output_token_logprobs`;
/// - `ChatMessage`: `role`, `content` (`""` when empty, never `null`),
///   `reasoning_content` (`null` when empty), `tool_calls` (`null` when
///   none).
fn whole_chat(
    req: &openai::ChatIn,
    adm: &Admitted,
    call_ids: &[String],
    (id, model, created): (&str, &str, u64),
    top: usize,
) -> Value {
    let g = &adm.generation;
    let p = &g.parsed;
    let calls: Vec<Value> = p
        .tool_calls
        .iter()
        .zip(call_ids)
        .enumerate()
        .map(|(i, (c, id))| json!({"id": id, "index": i, "type": "function", "function": {"name": c.name, "arguments": arguments_as_sent(&c.arguments, adm.cfg().json_dumps_arguments)}}))
        .collect();
    let tool_calls = !calls.is_empty();
    let matched = if g.finish.sglang_type() == "stop" && !tool_calls {
        json!(g.codec.end_of_turn_id())
    } else {
        Value::Null
    };
    // With a real model, SGLang's tool detectors strip the text before the
    // first call (`normal_text = text[:idx].strip()` in
    // `python/sglang/srt/function_call/qwen25_detector.py`): no "\n\n".
    let content = if tool_calls && matches!(g.codec, Codec::Real(_)) {
        p.content.trim()
    } else {
        p.content.as_str()
    };
    let mut choice = json!({
        "index": 0,
        "message": {"role": "assistant", "content": content,
                    "reasoning_content": p.reasoning.as_deref().filter(|r| !r.is_empty()),
                    "tool_calls": if tool_calls { Value::Array(calls) } else { Value::Null }},
        "logprobs": if req.logprobs { emit::chat_logprobs(g, 0..g.ids.len(), top) } else { Value::Null },
        "finish_reason": g.finish.as_str(),
        "matched_stop": matched,
    });
    if req.flag("return_prompt_token_ids") {
        choice["prompt_token_ids"] = json!(g.prompt_ids);
    }
    if req.flag("return_meta_info") {
        let mut meta = meta_info(adm, id, req.logprobs);
        if tool_calls {
            // `_process_tool_calls` rewrites the shared finish dict.
            meta["finish_reason"] = json!({"type": "tool_calls", "matched": null});
        }
        choice["meta_info"] = meta;
    }
    let mut usage = emit::usage(adm);
    usage["reasoning_tokens"] = json!(0);
    json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [choice], "usage": usage,
        "metadata": {"weight_version": adm.weight_version()},
    })
}

/// `POST /v1/tokenize` (also `/tokenize`), as SGLang's `TokenizeRequest`
/// (`python/sglang/srt/entrypoints/openai/protocol.py`) reads it: exactly
/// one of `prompt` (a string or a list of strings, no template) and
/// `messages` (with `tools`, `tool_choice`, `chat_template_kwargs`, rendered
/// as the chat endpoint renders them, generation prompt included); the
/// answer is its `TokenizeResponse`, `{tokens, count, max_model_len}`.
pub fn tokenize(
    state: &State,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response<RespBody>, MockError> {
    let req: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| MockError::BadRequest(format!("invalid JSON body: {e}")))?;
    let max = state.cfg.max_model_len;
    let reply = match (req.get("prompt"), req.get("messages")) {
        (Some(Value::String(text)), None) => {
            let ids = state.codec().encode(text)?;
            json!({"tokens": ids, "count": ids.len(), "max_model_len": max})
        }
        (Some(Value::Array(texts)), None) => {
            let lists = texts
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| {
                            MockError::BadRequest(
                                "`prompt` must be a string or a list of strings".into(),
                            )
                        })
                        .and_then(|t| state.codec().encode(t))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let counts: Vec<usize> = lists.iter().map(Vec::len).collect();
            json!({"tokens": lists, "count": counts, "max_model_len": max})
        }
        (None, Some(_)) => {
            let chat = openai::ChatIn::parse(body, state.cfg.history_reasoning())?;
            let ids = chat.prompt_ids(&state.cfg, headers, true)?;
            json!({"tokens": ids, "count": ids.len(), "max_model_len": max})
        }
        _ => {
            return Err(MockError::BadRequest(
                "Exactly one of 'prompt' or 'messages' must be provided.".into(),
            ));
        }
    };
    Ok(super::body::json_response(http::StatusCode::OK, &reply))
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    state: &Arc<State>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response<RespBody>, MockError> {
    let streamed_ids = serde_json::from_slice::<Map<String, Value>>(body)
        .ok()
        .filter(|b| openai::flag(b, "stream"))
        .and_then(|b| {
            ["return_prompt_token_ids", "return_meta_info"]
                .into_iter()
                .find(|k| openai::flag(&b, k))
        });
    if let Some(key) = streamed_ids {
        // `_convert_to_internal_request` in serving_chat.py refuses it.
        return Err(MockError::BadRequest(format!(
            "{key} is not supported with streaming. Please set stream=false when using {key}=true."
        )));
    }
    let (req, adm, call_ids) = match openai::admit_chat(state, headers, body).await? {
        Ok(admitted) => admitted,
        Err(resp) => return Ok(resp),
    };
    let top = if req.logprobs { req.top_logprobs } else { 0 };
    let id = adm.reply_id(32);
    // Both reply kinds name the request's model (`model=request.model`).
    let model = req
        .body
        .get("model")
        .and_then(Value::as_str)
        .map_or_else(|| adm.cfg().served_model.clone(), str::to_owned);
    let created = now_secs();
    if !req.stream {
        let reply = whole_chat(&req, &adm, &call_ids, (&id, &model, created), top);
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

/// What SGLang's `/generate` generates at most when `sampling_params` sets
/// no `max_new_tokens` (`SamplingParams`, `python/sglang/srt/sampling/sampling_params.py`).
pub const GENERATE_DEFAULT_MAX_NEW_TOKENS: usize = 128;

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
        (_, Some(Value::String(text))) => state.codec().encode(text)?,
        _ => return Err(MockError::BadRequest("give `text` or `input_ids`".into())),
    };
    let sampling = req.get("sampling_params");
    let gen_req = GenRequest {
        headers,
        user: None,
        facts: state.codec().sniff(&prompt_ids)?,
        prompt_ids,
        // SGLang's `SamplingParams.max_new_tokens` defaults to 128.
        max_tokens: Some(
            sampling
                .and_then(|s| s.get("max_new_tokens"))
                .and_then(Value::as_u64)
                .map_or(GENERATE_DEFAULT_MAX_NEW_TOKENS, |n| n as usize),
        ),
        constraint: Constraint {
            response_format: super::guided::sglang(sampling)?,
            ..Constraint::default()
        },
    };
    let adm = match state.admit(gen_req).await {
        Ok(a) => a,
        Err(resp) => return Ok(resp),
    };
    let logprobs = openai::flag(&req, "return_logprob");
    let skip = sampling
        .and_then(|s| s.get("skip_special_tokens"))
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let id = adm.reply_id(32);
    let reply_of = move |g: &Generation, upto: usize, meta: Value| json!({"text": visible_text(g, 0..upto, skip), "output_ids": g.ids[..upto], "meta_info": meta});
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
