//! Sending a generation: as a whole JSON reply after the simulated
//! generation time, or as server-sent events, one chunk per
//! `tokens_per_chunk` tokens, paced by the latency knobs, cut where the plan
//! says. Also the OpenAI logprob entries both dialects use.

use std::ops::Range;
use std::time::Duration;

use http::{Response, StatusCode};
use serde_json::{Value, json};

use super::body::{RespBody, channel, json_response, stream_response};
use super::codec::Codec;
use super::generate::{Delta, DeltaSplitter, Generation, logprob};
use super::server::Admitted;

/// What surrounds the per-token chunks of a stream.
#[derive(Debug, Default)]
pub struct Frame {
    /// The first event, sent after the time to first token.
    pub first: Option<Value>,
    /// Events after the last chunk (usage).
    pub tail: Vec<Value>,
    /// Whether to end with `data: [DONE]`.
    pub done: bool,
}

/// Builds one chunk: the generation, the token range, its delta, and whether
/// it is the last chunk (the one that carries the finish reason).
pub type ChunkFn = Box<dyn FnMut(&Generation, Range<usize>, Delta, bool) -> Value + Send>;

/// Streams a generation as server-sent events.
pub fn stream(adm: Admitted, frame: Frame, mut chunk: ChunkFn) -> Response<RespBody> {
    let (tx, body) = channel();
    let tasks = adm.tasks();
    tasks.spawn(async move {
        let cfg = adm.cfg().clone();
        pause(adm.first_delay).await;
        if let Some(first) = &frame.first
            && !tx.event(first).await
        {
            return;
        }
        let g = &adm.generation;
        let n = g.ids.len();
        let cut = g.disconnect_after.map(|d| d.min(n));
        let limit = cut.unwrap_or(n);
        let per = cfg.tokens_per_chunk.max(1);
        let mut splitter = DeltaSplitter::new(g).json_dumps_arguments(cfg.json_dumps_arguments);
        let mut i = 0;
        loop {
            let j = (i + per).min(limit);
            if i == j && (i > 0 || cut.is_some()) {
                break;
            }
            let waits = (j - i).saturating_sub(usize::from(i == 0));
            pause(cfg.token_latency * waits as u32).await;
            let delta = splitter.chunk(i..j);
            let last = j == n && cut.is_none();
            let event = chunk(g, i..j, delta, last);
            adm.count_generated(j - i);
            if !tx.event(&event).await {
                return;
            }
            i = j;
            if last {
                break;
            }
        }
        if cut.is_some() {
            tx.cut().await;
            return;
        }
        for event in &frame.tail {
            if !tx.event(event).await {
                return;
            }
        }
        if frame.done {
            tx.done().await;
        }
    });
    stream_response(body, true)
}

/// Sends a whole reply after the simulated generation time; a scripted
/// disconnect sends the first half of the JSON, then drops the connection.
pub async fn whole(adm: Admitted, reply: Value) -> Response<RespBody> {
    let g = &adm.generation;
    let n = g.ids.len();
    let sent = g.disconnect_after.map_or(n, |d| d.min(n));
    let wait = adm.first_delay + adm.cfg().token_latency * sent.saturating_sub(1) as u32;
    pause(wait).await;
    adm.count_generated(sent);
    if g.disconnect_after.is_none() {
        return json_response(StatusCode::OK, &reply);
    }
    let text = reply.to_string();
    let half = text.len() / 2;
    let (tx, body) = channel();
    adm.tasks().spawn(async move {
        if tx.send(text[..half].to_owned()).await {
            tx.cut().await;
        }
    });
    stream_response(body, false)
}

/// Sleeps, without a trip through the timer when there is nothing to wait.
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// OpenAI chat logprob entries (`{token, logprob, bytes, top_logprobs}`) of
/// tokens `range`, with `top` alternatives each (the sampled token first).
pub fn chat_logprobs(g: &Generation, range: Range<usize>, top: usize) -> Value {
    let base = g.prompt_ids.len();
    let content: Vec<Value> = range
        .map(|i| {
            let id = g.ids[i];
            let lp = g.logprobs[i];
            let tops: Vec<Value> = (0..top)
                .map(|k| {
                    let alt = if k == 0 {
                        id
                    } else {
                        (id + k as u32) % g.codec.vocab_size()
                    };
                    let alt_lp = if k == 0 {
                        lp
                    } else {
                        lp.min(logprob(base + i, alt)) - k as f32
                    };
                    entry(&g.codec, alt, alt_lp, Vec::new())
                })
                .collect();
            entry(&g.codec, id, lp, tops)
        })
        .collect();
    json!({ "content": content })
}

fn entry(codec: &Codec, id: u32, lp: f32, top: Vec<Value>) -> Value {
    let bytes = codec.token_bytes(id);
    json!({
        "token": String::from_utf8_lossy(&bytes),
        "logprob": lp,
        "bytes": bytes,
        "top_logprobs": top,
    })
}

/// SGLang `[logprob, token_id, text]` triples of every generated token.
pub fn sglang_logprobs(g: &Generation) -> Value {
    Value::Array(
        g.ids
            .iter()
            .zip(&g.logprobs)
            .map(|(&id, &lp)| json!([lp, id, g.codec.token_text(id)]))
            .collect(),
    )
}

/// `usage` of a reply.
pub fn usage(adm: &Admitted) -> Value {
    let g = &adm.generation;
    json!({
        "prompt_tokens": adm.usage_prompt_tokens,
        "completion_tokens": g.ids.len(),
        "total_tokens": adm.usage_prompt_tokens + g.ids.len(),
        "prompt_tokens_details": {"cached_tokens": adm.cached_tokens},
    })
}
