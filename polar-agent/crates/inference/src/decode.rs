//! Backend replies to [`StreamEvent`]s and [`Tokens`]: a decoder for
//! streamed OpenAI chunks with vLLM's token ids, and one for a whole reply
//! (SGLang `return_meta_info`, also vLLM non-streaming). Token data is only
//! ever copied from the reply, never recomputed. Replies are read with
//! `polar_json` (a tape over the text, no tree of maps and strings: this
//! runs for every chunk of every call).

use std::borrow::Cow;
use std::collections::VecDeque;

use polar_json::{Doc, Json, Kind};

use polar_chat::{FinishReason, StreamEvent, Tokens, Usage};

/// Why a reply could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Not the expected shape.
    Malformed(String),
    /// The backend reported an error inside the reply, or the stream ended
    /// early.
    Cut(String),
}

/// Token data gathered from a reply. The response ids and logprobs only
/// grow (chunk after chunk); the prompt ids are counted each time they are
/// set ([`TokenAcc::prompt_version`]).
#[derive(Debug, Default)]
pub(crate) struct TokenAcc {
    prompt: Option<Vec<u32>>,
    prompt_version: u32,
    response: Vec<u32>,
    logprobs: Vec<f32>,
    saw_ids: bool,
    ids_missing: bool,
}

impl TokenAcc {
    /// What the reply gave: `None` where it gave nothing (or not for every
    /// chunk); logprobs only when there is one per response token.
    pub(crate) fn tokens(&self) -> Tokens {
        let response = (self.saw_ids && !self.ids_missing).then(|| self.response.clone());
        let logprobs = response
            .as_ref()
            .filter(|r| r.len() == self.logprobs.len())
            .map(|_| self.logprobs.clone());
        Tokens {
            prompt_token_ids: self.prompt.clone(),
            response_token_ids: response,
            response_logprobs: logprobs,
        }
    }

    /// Like [`TokenAcc::tokens`], moving the data out (the reply is over).
    pub(crate) fn take_tokens(&mut self) -> Tokens {
        let response =
            (self.saw_ids && !self.ids_missing).then(|| std::mem::take(&mut self.response));
        let logprobs = response
            .as_ref()
            .filter(|r| r.len() == self.logprobs.len())
            .map(|_| std::mem::take(&mut self.logprobs));
        Tokens {
            prompt_token_ids: self.prompt.take(),
            response_token_ids: response,
            response_logprobs: logprobs,
        }
    }

    pub(crate) fn response_len(&self) -> usize {
        self.response.len()
    }

    /// Adds the ids and logprobs of a resumed generation's part (see
    /// `stream::failover`).
    pub(crate) fn extend_response(&mut self, ids: &[u32], logprobs: &[f32]) {
        self.response.extend_from_slice(ids);
        self.logprobs.extend_from_slice(logprobs);
    }

    /// The token data of a call sent token-in: its prompt ids are the ids
    /// sent, its response ids those the backend returns.
    pub(crate) fn start_token_in(&mut self, prompt: Vec<u32>) {
        self.set_prompt(prompt);
        self.saw_ids = true;
    }

    /// Sets the prompt ids.
    fn set_prompt(&mut self, ids: Vec<u32>) {
        self.prompt = Some(ids);
        self.prompt_version = self.prompt_version.wrapping_add(1);
    }

    /// The prompt ids so far.
    pub(crate) fn prompt(&self) -> Option<&[u32]> {
        self.prompt.as_deref()
    }

    /// How many times the prompt ids were set (0: never).
    pub(crate) fn prompt_version(&self) -> u32 {
        self.prompt_version
    }

    /// The response ids and logprobs so far, as received (whether they
    /// are complete is for [`TokenAcc::tokens`] to say).
    pub(crate) fn response(&self) -> (&[u32], &[f32]) {
        (&self.response, &self.logprobs)
    }

    fn usage_fallback(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt.as_ref().map_or(0, |p| p.len() as u32),
            completion_tokens: self.response.len() as u32,
            cached_tokens: None,
        }
    }
}

fn ids(v: Json<'_>) -> Option<Vec<u32>> {
    v.as_array()?
        .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// `v[a][b]...`, through objects.
fn path<'d>(v: Json<'d>, keys: &[&str]) -> Option<Json<'d>> {
    keys.iter().try_fold(v, |v, k| v.get(k))
}

/// The `n`th element of an array.
fn nth(v: Json<'_>, n: usize) -> Option<Json<'_>> {
    v.as_array()?.nth(n)
}

fn finish_reason(s: &str) -> FinishReason {
    match s {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "tool_calls" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        "abort" => FinishReason::Abort,
        other => FinishReason::Other(other.to_owned()),
    }
}

fn usage(v: Json<'_>) -> Option<Usage> {
    let u = v.get("usage").filter(Json::is_object)?;
    let n = |k: &str| u.get(k).and_then(|x| x.as_u64()).map(|x| x as u32);
    Some(Usage {
        prompt_tokens: n("prompt_tokens")?,
        completion_tokens: n("completion_tokens")?,
        cached_tokens: path(u, &["prompt_tokens_details", "cached_tokens"])
            .and_then(|x| x.as_u64())
            .map(|x| x as u32),
    })
}

fn backend_error(v: Json<'_>) -> Option<String> {
    let e = v.get("error")?;
    Some(
        e.get_str("message")
            .map_or_else(|| e.to_compact_string(), Cow::into_owned),
    )
}

/// Whether `v` is a non-empty string or array (output in a delta).
fn has_output(v: Option<Json<'_>>) -> bool {
    match v.map(|v| (v.kind(), v)) {
        Some((Kind::String, v)) => v.str_literal().is_some_and(|(s, _)| !s.is_empty()),
        Some((Kind::Array, v)) => v.as_array().is_some_and(|mut a| a.next().is_some()),
        _ => false,
    }
}

#[derive(Debug, Default)]
struct ToolSlot {
    id: Option<String>,
    name: Option<String>,
    started: bool,
    pending_args: String,
}

/// Decodes streamed chat chunks into events.
#[derive(Debug)]
pub(crate) struct ChunkDecoder {
    model: String,
    response_id: String,
    started: bool,
    reasoning_open: bool,
    tools: Vec<ToolSlot>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    done: bool,
    /// Token data so far.
    pub(crate) tokens: TokenAcc,
    /// The `model` the backend reported.
    pub(crate) served_model: Option<String>,
}

impl ChunkDecoder {
    /// A decoder; `model` is the name shown in `Start`.
    pub(crate) fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            response_id: String::new(),
            started: false,
            reasoning_open: false,
            tools: Vec::new(),
            finish: None,
            usage: None,
            done: false,
            tokens: TokenAcc::default(),
            served_model: None,
        }
    }

    /// Whether the final event was produced.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Decodes one event's data (a chunk or `[DONE]`).
    pub(crate) fn on_data(
        &mut self,
        data: &str,
        out: &mut VecDeque<StreamEvent>,
    ) -> Result<(), DecodeError> {
        if self.done {
            return Ok(());
        }
        if data.trim() == "[DONE]" {
            return self.end(out);
        }
        let doc = Doc::parse(data.as_bytes())
            .map_err(|e| DecodeError::Malformed(format!("chunk is not JSON: {e}")))?;
        let v = doc.root();
        if let Some(message) = backend_error(v) {
            return Err(DecodeError::Cut(format!(
                "backend error in stream: {message}"
            )));
        }
        if !self.started {
            self.started = true;
            self.response_id = v.get_str("id").unwrap_or_default().into_owned();
            self.served_model = v.get_str("model").map(Cow::into_owned);
            if let Some(p) = v.get("prompt_token_ids").and_then(ids) {
                self.tokens.set_prompt(p);
            }
            out.push_back(StreamEvent::Start {
                id: self.response_id.clone(),
                model: self.model.clone(),
                prompt_tokens: self.tokens.prompt.as_ref().map(|p| p.len() as u32),
            });
        } else if self.tokens.prompt.is_none()
            && let Some(p) = v.get("prompt_token_ids").and_then(ids)
        {
            self.tokens.set_prompt(p);
        }
        if let Some(u) = usage(v) {
            self.usage = Some(u);
        }
        let Some(choice) = v
            .get("choices")
            .and_then(|c| c.as_array())
            .and_then(|mut c| c.next())
        else {
            return Ok(());
        };
        self.on_choice(choice, out)
    }

    fn on_choice(
        &mut self,
        choice: Json<'_>,
        out: &mut VecDeque<StreamEvent>,
    ) -> Result<(), DecodeError> {
        let delta = choice.get("delta").unwrap_or_else(Json::null);
        if let Some(ids) = choice.get("token_ids").filter(|v| !v.is_null()) {
            let ids = self::ids(ids)
                .ok_or_else(|| DecodeError::Malformed("`token_ids` is not a list of ids".into()))?;
            self.tokens.saw_ids = true;
            self.tokens.response.extend(ids);
        } else {
            let has_output = ["content", "reasoning", "reasoning_content", "tool_calls"]
                .iter()
                .any(|k| has_output(delta.get(k)));
            if has_output {
                self.tokens.ids_missing = true;
            }
        }
        if let Some(content) = path(choice, &["logprobs", "content"]).and_then(|c| c.as_array()) {
            for entry in content {
                let lp = entry
                    .get("logprob")
                    .and_then(|x| x.as_f64())
                    .ok_or_else(|| {
                        DecodeError::Malformed("logprob entry without `logprob`".into())
                    })?;
                self.tokens.logprobs.push(lp as f32);
            }
        }
        let reasoning = ["reasoning", "reasoning_content"]
            .iter()
            .find_map(|k| delta.get_str(k))
            .filter(|s| !s.is_empty());
        if let Some(text) = reasoning {
            self.reasoning_open = true;
            out.push_back(StreamEvent::ReasoningDelta {
                text: text.into_owned(),
            });
        }
        if let Some(text) = delta.get_str("content").filter(|s| !s.is_empty()) {
            self.close_reasoning(out);
            out.push_back(StreamEvent::TextDelta {
                text: text.into_owned(),
            });
        }
        if let Some(calls) = delta.get("tool_calls").and_then(|c| c.as_array()) {
            self.close_reasoning(out);
            for call in calls {
                self.on_tool_delta(call, out)?;
            }
        }
        if let Some(reason) = choice.get_str("finish_reason") {
            self.finish = Some(finish_reason(&reason));
        }
        Ok(())
    }

    fn on_tool_delta(
        &mut self,
        call: Json<'_>,
        out: &mut VecDeque<StreamEvent>,
    ) -> Result<(), DecodeError> {
        let index = call
            .get("index")
            .and_then(|x| x.as_u64())
            .ok_or_else(|| DecodeError::Malformed("tool call delta without `index`".into()))?
            as usize;
        if index > 1024 {
            return Err(DecodeError::Malformed(format!(
                "tool call index {index} is out of range"
            )));
        }
        if self.tools.len() <= index {
            self.tools.resize_with(index + 1, ToolSlot::default);
        }
        let slot = &mut self.tools[index];
        if let Some(id) = call.get_str("id").filter(|s| !s.is_empty()) {
            slot.id.get_or_insert_with(|| id.into_owned());
        }
        let function = call.get("function");
        if let Some(name) = function
            .and_then(|f| f.get_str("name"))
            .filter(|s| !s.is_empty())
        {
            slot.name.get_or_insert_with(String::new).push_str(&name);
        }
        if let Some(args) = function.and_then(|f| f.get_str("arguments")) {
            slot.pending_args.push_str(&args);
        }
        let rid = &self.response_id;
        Self::flush_tool(index, slot, rid, out);
        Ok(())
    }

    fn flush_tool(
        index: usize,
        slot: &mut ToolSlot,
        response_id: &str,
        out: &mut VecDeque<StreamEvent>,
    ) {
        if !slot.started {
            let Some(name) = &slot.name else {
                return;
            };
            slot.started = true;
            let id = slot
                .id
                .clone()
                .unwrap_or_else(|| format!("{response_id}-call-{index}"));
            out.push_back(StreamEvent::ToolCallStart {
                index: index as u32,
                id,
                name: name.clone(),
            });
        }
        if !slot.pending_args.is_empty() {
            out.push_back(StreamEvent::ToolCallDelta {
                index: index as u32,
                arguments: std::mem::take(&mut slot.pending_args),
            });
        }
    }

    fn close_reasoning(&mut self, out: &mut VecDeque<StreamEvent>) {
        if self.reasoning_open {
            self.reasoning_open = false;
            out.push_back(StreamEvent::ReasoningDone { signature: None });
        }
    }

    /// The reply is over (`[DONE]`, or the body ended cleanly).
    pub(crate) fn end(&mut self, out: &mut VecDeque<StreamEvent>) -> Result<(), DecodeError> {
        if self.done {
            return Ok(());
        }
        if !self.started {
            return Err(DecodeError::Malformed(
                "the stream ended before any chunk".into(),
            ));
        }
        self.close_reasoning(out);
        if self.tools.iter().any(|t| !t.started) {
            return Err(DecodeError::Malformed(
                "a tool call never got a name".into(),
            ));
        }
        let Some(finish) = self.finish.take() else {
            return Err(DecodeError::Cut(
                "the stream ended without a finish reason".into(),
            ));
        };
        self.done = true;
        out.push_back(StreamEvent::Finish {
            finish_reason: finish,
            usage: self.usage.unwrap_or_else(|| self.tokens.usage_fallback()),
        });
        Ok(())
    }
}

/// A whole (non-streamed) reply decoded.
#[derive(Debug)]
pub(crate) struct Whole {
    /// Its events, in order.
    pub(crate) events: Vec<StreamEvent>,
    /// Its token data.
    pub(crate) tokens: TokenAcc,
    /// `meta_info.weight_version`, else the top-level
    /// `metadata.weight_version` (SGLang's chat replies).
    pub(crate) weight_version: Option<String>,
    /// The `model` it names.
    pub(crate) served_model: Option<String>,
}

/// Decodes a whole chat reply: SGLang (`choices[].prompt_token_ids`,
/// `token_ids`, `meta_info.output_token_logprobs`) or vLLM (top-level
/// `prompt_token_ids`, `choices[].token_ids`, `logprobs.content`).
pub(crate) fn decode_whole(body: &[u8], model: &str) -> Result<Whole, DecodeError> {
    let doc =
        Doc::parse(body).map_err(|e| DecodeError::Malformed(format!("reply is not JSON: {e}")))?;
    let v = doc.root();
    if let Some(message) = backend_error(v) {
        return Err(DecodeError::Cut(format!("backend error: {message}")));
    }
    let choice = v
        .get("choices")
        .and_then(|c| c.as_array())
        .and_then(|mut c| c.next())
        .ok_or_else(|| DecodeError::Malformed("reply without choices".into()))?;
    let meta = choice.get("meta_info").or_else(|| v.get("meta_info"));
    let tokens = whole_tokens(v, choice, meta);
    let message = choice.get("message").unwrap_or_else(Json::null);
    let mut events = vec![StreamEvent::Start {
        id: v.get_str("id").unwrap_or_default().into_owned(),
        model: model.to_owned(),
        prompt_tokens: tokens.prompt.as_ref().map(|p| p.len() as u32),
    }];
    message_events(message, &mut events)?;
    let reason = choice
        .get_str("finish_reason")
        .ok_or_else(|| DecodeError::Malformed("reply without finish_reason".into()))?;
    let mut usage = usage(v).unwrap_or_else(|| tokens.usage_fallback());
    if usage.cached_tokens.is_none() {
        usage.cached_tokens = meta
            .and_then(|m| m.get("cached_tokens"))
            .and_then(|x| x.as_u64())
            .map(|x| x as u32);
    }
    events.push(StreamEvent::Finish {
        finish_reason: finish_reason(&reason),
        usage,
    });
    Ok(Whole {
        events,
        tokens,
        weight_version: meta
            .and_then(|m| m.get("weight_version"))
            .or_else(|| path(v, &["metadata", "weight_version"]))
            .and_then(|w| w.as_str())
            .map(Cow::into_owned),
        served_model: v.get_str("model").map(Cow::into_owned),
    })
}

/// The token data of a whole reply `v` (its first choice `choice`, its
/// `meta_info` `meta`): the prompt ids, the response ids from `token_ids`
/// or else SGLang's `(logprob, id, _)` triples, and the logprobs from the
/// triples or else vLLM's `logprobs.content`.
fn whole_tokens(v: Json<'_>, choice: Json<'_>, meta: Option<Json<'_>>) -> TokenAcc {
    let mut tokens = TokenAcc::default();
    if let Some(p) = choice
        .get("prompt_token_ids")
        .or_else(|| v.get("prompt_token_ids"))
        .and_then(ids)
    {
        tokens.set_prompt(p);
    }
    let triples = meta
        .and_then(|m| m.get("output_token_logprobs"))
        .and_then(|t| t.as_array());
    if let Some(r) = choice.get("token_ids").and_then(ids) {
        tokens.saw_ids = true;
        tokens.response = r;
    } else if let Some(t) = triples {
        let r: Option<Vec<u32>> = t
            .map(|e| {
                nth(e, 1)
                    .and_then(|x| x.as_u64())
                    .and_then(|n| u32::try_from(n).ok())
            })
            .collect();
        if let Some(r) = r {
            tokens.saw_ids = true;
            tokens.response = r;
        }
    }
    if let Some(t) = triples {
        tokens.logprobs = t
            .filter_map(|e| nth(e, 0).and_then(|x| x.as_f64()).map(|x| x as f32))
            .collect();
    } else if let Some(content) = path(choice, &["logprobs", "content"]).and_then(|c| c.as_array())
    {
        tokens.logprobs = content
            .filter_map(|e| e.get("logprob").and_then(|x| x.as_f64()).map(|x| x as f32))
            .collect();
    }
    tokens
}

/// The events of a whole reply's `message`: its reasoning, its text and
/// its tool calls (each one start and, if it has arguments, one delta).
fn message_events(message: Json<'_>, events: &mut Vec<StreamEvent>) -> Result<(), DecodeError> {
    let reasoning = ["reasoning", "reasoning_content"]
        .iter()
        .find_map(|k| message.get_str(k))
        .filter(|s| !s.is_empty());
    if let Some(text) = reasoning {
        events.push(StreamEvent::ReasoningDelta {
            text: text.into_owned(),
        });
        events.push(StreamEvent::ReasoningDone { signature: None });
    }
    if let Some(text) = message.get_str("content").filter(|s| !s.is_empty()) {
        events.push(StreamEvent::TextDelta {
            text: text.into_owned(),
        });
    }
    for (i, call) in message
        .get("tool_calls")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let function = call.get("function");
        let name = function
            .and_then(|f| f.get_str("name"))
            .ok_or_else(|| DecodeError::Malformed("tool call without a name".into()))?;
        let id = call.get_str("id").unwrap_or_default();
        let args = match function.and_then(|f| f.get("arguments")) {
            Some(a) => a
                .as_str()
                .map_or_else(|| a.to_compact_string(), Cow::into_owned),
            None => String::new(),
        };
        events.push(StreamEvent::ToolCallStart {
            index: i as u32,
            id: id.into_owned(),
            name: name.into_owned(),
        });
        if !args.is_empty() {
            events.push(StreamEvent::ToolCallDelta {
                index: i as u32,
                arguments: args,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
