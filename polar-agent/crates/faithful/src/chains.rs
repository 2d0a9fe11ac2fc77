//! The chains of one session: for each, the exact token sequence the model
//! saw and generated in its latest call, and the conversation that call
//! was asked with; [`Chains::prompt`] builds the next call's prompt ids.
//!
//! A request *extends* a chain's latest call when its messages are that
//! call's messages, then the reply the harness got (however it wrote it
//! back: see [`same_reply`]), then new messages none of which is the
//! model's; its tools and template arguments are the call's. Its prompt is
//! then the call's prompt and response ids as they were, followed by the
//! ids of what the template renders after that reply: the rest of the
//! reply's turn (the text after its end-of-turn token, such as a newline)
//! and the new messages, with the generation prompt ([`bridge`]). What the
//! template renders for the earlier turns is not used: the model saw its
//! own tokens there, and sees them again.
//!
//! The renderings a bridge compares are of a window of the conversation
//! ([`crate::window`]) once the chain has shown that the template writes
//! the same after the reply in a window of that shape as in the whole
//! conversation, so
//! that a call costs what its new messages cost to render and tokenize,
//! not what the conversation does.
//!
//! A request that repeats a call's messages (a retry) gets that call's
//! prompt again. Anything else is rendered whole and starts a chain, with
//! the reason ([`Fresh`]): a first call, a new conversation (a sub-agent, a
//! title call), a history that differs from every chain's (compaction, an
//! edit), a reply the harness changed, tools or template arguments that
//! changed, a reply that was cut before its end-of-turn token, or a
//! template whose rendering of the history changes once new messages
//! follow.
//!
//! A chain keeps only its latest call: a call that extends or repeats
//! another replaces it, but for a call that may branch off
//! ([`Chains::finish_branch`], a constrained side call), which is kept
//! beside the call it extends. At most [`Chains::CAPACITY`] chains are kept per
//! session; the one used longest ago goes first.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::render::{Conversation, RenderFailure, Renderer};
use super::window::{Windows, shape, window};

/// How a prompt was built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// It extends call `call`'s ids: `kept` ids as that call had them
    /// (its prompt and response), then `added` ids for what follows.
    Extends {
        /// The call extended (its number in the session, from 0).
        call: u64,
        /// Ids kept.
        kept: usize,
        /// Ids added.
        added: usize,
    },
    /// The same messages as call `call`: its prompt again.
    Repeats {
        /// The call repeated.
        call: u64,
    },
    /// Rendered whole: a new chain.
    Fresh {
        /// Why.
        reason: Fresh,
    },
}

/// Why a prompt was rendered whole rather than extending a chain (told
/// against the session's latest call).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Fresh {
    /// The session's first call.
    FirstCall,
    /// The messages differ from those of call `call` at `message` (0: a
    /// new conversation, such as a sub-agent's; later: compaction, an
    /// edited history).
    HistoryDiffers {
        /// The call compared with.
        call: u64,
        /// The first message that differs.
        message: usize,
    },
    /// The assistant message where call `call`'s reply belongs is not that
    /// reply.
    ReplyChanged {
        /// The call.
        call: u64,
    },
    /// The tools are not call `call`'s.
    ToolsChanged {
        /// The call.
        call: u64,
    },
    /// The template arguments are not call `call`'s.
    TemplateArgsChanged {
        /// The call.
        call: u64,
    },
    /// Call `call`'s reply did not end with an end-of-turn token (cut by
    /// its length, or failed).
    ReplyCut {
        /// The call.
        call: u64,
    },
    /// The template renders call `call`'s conversation differently once
    /// the new messages follow it, so where the new messages start cannot
    /// be told.
    NotPrefixStable {
        /// The call.
        call: u64,
    },
    /// The template's rendering of call `call`'s reply has no end-of-turn
    /// token to join the new messages at.
    NoEndOfTurn {
        /// The call.
        call: u64,
    },
}

/// How a call's prompt reached the backend (recorded with the call).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Serving {
    /// Polar rendered the prompt and sent its ids token-in.
    TokenIn {
        /// How the ids were built.
        prompt: Origin,
    },
    /// The backend's chat endpoint rendered it: a backend without the
    /// model's files, or one of the few constrained requests a backend
    /// with them leaves to its chat endpoint (structured output and a
    /// forced tool choice together, a forced tool that is not offered, a
    /// forced choice in a format whose own calls the forced JSON cannot be
    /// told from), which `reason` tells.
    ChatEndpoint {
        /// Why, on a backend with the model's files.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// A call's conversation, owned: what [`Chains::finish`] keeps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Asked {
    /// vLLM's conversation messages.
    pub messages: Vec<Value>,
    /// The tools, `None` when there are none.
    pub tools: Option<Vec<Value>>,
    /// The template arguments.
    pub kwargs: Map<String, Value>,
}

impl Asked {
    /// The conversation as a template gets it.
    pub fn conversation(&self) -> Conversation<'_> {
        Conversation {
            messages: &self.messages,
            tools: self.tools.as_deref(),
            kwargs: &self.kwargs,
        }
    }
}

/// A call's prompt ids and how they were built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    /// The ids to send.
    pub ids: Vec<u32>,
    /// How.
    pub origin: Origin,
    /// What the call's chain knows of windows of the conversation (what
    /// [`Chains::finish`] keeps for it; [`Windows::whole`] makes the chain
    /// render the whole conversation for every call).
    pub windows: Windows,
}

/// A chain's latest call.
#[derive(Clone, Debug)]
struct Call {
    number: u64,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    kwargs: Map<String, Value>,
    /// The prompt ids, then the response ids.
    ids: Vec<u32>,
    prompt_len: usize,
    /// The reply as a conversation message.
    reply: Value,
    /// Whether the response ended with an end-of-turn id.
    ended: bool,
    /// What its chain knows of windows.
    windows: Windows,
}

/// What a request is to a call.
enum Relation {
    /// It extends the call, whose reply is its message `n`.
    Extends(usize),
    Repeats,
    /// It does not, for this reason, after this many of its messages
    /// matched the call's.
    Not(Fresh, usize),
}

impl Call {
    fn relation(&self, conv: &Conversation<'_>) -> Relation {
        let call = self.number;
        let n = self.messages.len();
        let len = conv.messages.len();
        if let Some(i) = (0..n.min(len)).find(|&i| !same(&conv.messages[i], &self.messages[i])) {
            return Relation::Not(Fresh::HistoryDiffers { call, message: i }, i);
        }
        if len < n {
            return Relation::Not(Fresh::HistoryDiffers { call, message: len }, len);
        }
        if conv.tools != self.tools.as_deref() {
            return Relation::Not(Fresh::ToolsChanged { call }, n);
        }
        if conv.kwargs != &self.kwargs {
            return Relation::Not(Fresh::TemplateArgsChanged { call }, n);
        }
        if len == n {
            return Relation::Repeats;
        }
        if !same_reply(&conv.messages[n], &self.reply) {
            return Relation::Not(Fresh::ReplyChanged { call }, n);
        }
        let new = &conv.messages[n + 1..];
        if let Some(k) = new.iter().position(|m| role(m) == Some("assistant")) {
            let message = n + 1 + k;
            return Relation::Not(Fresh::HistoryDiffers { call, message }, message);
        }
        if new.is_empty() {
            return Relation::Not(
                Fresh::HistoryDiffers {
                    call,
                    message: n + 1,
                },
                n + 1,
            );
        }
        if !self.ended {
            return Relation::Not(Fresh::ReplyCut { call }, n + 1);
        }
        Relation::Extends(n)
    }
}

/// `a == b`, told without hashing keys when the objects in both have the
/// same keys in the same order (as the request's messages and the chain's,
/// converted alike, do); objects whose keys differ in order are compared
/// as maps.
pub(crate) fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && if x.keys().eq(y.keys()) {
                    x.values().zip(y.values()).all(|(p, q)| same(p, q))
                } else {
                    x == y
                }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        _ => a == b,
    }
}

fn role(m: &Value) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

/// A message's text content: a string, or a list's text parts joined.
fn text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Whether `echoed` (an assistant message of a request) is the reply
/// `served` as the harness wrote it back: the same tool calls (name,
/// arguments as JSON, id where both have one), the same text up to
/// surrounding whitespace (harnesses drop or keep whitespace-only text),
/// and the same reasoning up to whitespace if it kept any (many drop it).
pub fn same_reply(echoed: &Value, served: &Value) -> bool {
    if role(echoed) != Some("assistant") {
        return false;
    }
    if text(echoed).trim() != text(served).trim() {
        return false;
    }
    let reasoning = |m: &Value| {
        m.get("reasoning_content")
            .or_else(|| m.get("reasoning"))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::to_owned)
    };
    if let Some(r) = reasoning(echoed)
        && reasoning(served).as_deref() != Some(r.as_str())
    {
        return false;
    }
    let calls = |m: &Value| -> Vec<Value> {
        m.get("tool_calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (a, b) = (calls(echoed), calls(served));
    a.len() == b.len()
        && a.iter().zip(&b).all(|(x, y)| {
            let f = |c: &Value, k: &str| c.get("function").and_then(|f| f.get(k)).cloned();
            let ids = (
                x.get("id").and_then(Value::as_str),
                y.get("id").and_then(Value::as_str),
            );
            let same_id = match ids {
                (Some(p), Some(q)) => p == q,
                _ => true,
            };
            same_id && f(x, "name") == f(y, "name") && f(x, "arguments") == f(y, "arguments")
        })
}

/// `m` without reasoning when it is the model's: both renderings a bridge
/// compares are made of such messages, so that a template that keeps or
/// drops reasoning by position renders the history alike in both.
fn without_reasoning(m: &Value) -> Value {
    let mut m = m.clone();
    if role(&m) == Some("assistant")
        && let Some(o) = m.as_object_mut()
    {
        o.remove("reasoning");
        o.remove("reasoning_content");
    }
    m
}

/// A user message no conversation has: what follows the reply in the
/// renderings that locate the reply's turn.
fn sentinel() -> Value {
    json!({"role": "user", "content": "\u{e000}polar: where the next message starts\u{e000}"})
}

/// The length of the common prefix of `a` and `b`, at a character
/// boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// Why a bridge could not be built.
#[derive(Debug, PartialEq)]
enum BridgeError {
    Fresh(Fresh),
    Render(RenderFailure),
}

/// The ids that follow `call`'s ids for `conv`, whose message `n` is the
/// call's reply: what the template writes after the reply's end-of-turn
/// token, through the new messages and the generation prompt, tokenized.
///
/// Where the reply's turn ends in the rendering of `conv` is told by two
/// more renderings, with a sentinel user message in place of what follows
/// the reply and in place of the reply itself: the reply's turn is where
/// the first differs from `conv`'s rendering and the second agrees with
/// it, and it ends at the last end-of-turn token (the reply's own, else
/// any of the model's) inside it. Every assistant message is rendered
/// without its reasoning in all three, so that a template that keeps or
/// drops reasoning by position renders the history alike in each. A
/// template whose rendering of the reply changes with what follows it, or
/// that refuses the sentinel, starts a new chain.
///
/// The renderings are of the conversation's [`window`] when the call's
/// chain has checked a window of its shape ([`Windows`]); a window of a
/// new shape is checked against the whole conversation, whose ids are the
/// ones used. Returns the ids and what the chain now knows of windows.
fn bridge(
    r: &dyn Renderer,
    call: &Call,
    conv: &Conversation<'_>,
    n: usize,
) -> (Result<Vec<u32>, BridgeError>, Windows) {
    let whole = || {
        let messages: Vec<Value> = conv.messages.iter().map(without_reasoning).collect();
        bridge_over(r, call, conv, &messages, n)
    };
    let at = match window(conv.messages, n) {
        Some(at) if !call.windows.refuted() => at,
        _ => return (whole(), call.windows.clone()),
    };
    let messages: Vec<Value> = at
        .iter()
        .map(|&i| without_reasoning(&conv.messages[i]))
        .collect();
    let reply = at.iter().position(|&i| i == n).unwrap_or(n);
    let windowed = bridge_over(r, call, conv, &messages, reply);
    let shape = shape(conv.messages, &at);
    if call.windows.trusts(&shape) {
        return (windowed, call.windows.clone());
    }
    let whole = whole();
    let windows = call.windows.checked(shape, whole == windowed);
    (whole, windows)
}

/// [`bridge`] over `messages` (the conversation's, or a window of them,
/// without reasoning), whose message `n` is the reply.
fn bridge_over(
    r: &dyn Renderer,
    call: &Call,
    conv: &Conversation<'_>,
    messages: &[Value],
    n: usize,
) -> Result<Vec<u32>, BridgeError> {
    let fresh = |f: fn(u64) -> Fresh| BridgeError::Fresh(f(call.number));
    let unstable = || fresh(|call| Fresh::NotPrefixStable { call });
    let render =
        |messages: &[Value], prompt: bool| r.render(&Conversation { messages, ..*conv }, prompt);
    let whole = render(messages, true).map_err(BridgeError::Render)?;
    let mut upto_reply = messages[..=n].to_vec();
    upto_reply.push(sentinel());
    let with_reply = render(&upto_reply, false).map_err(|_| unstable())?;
    upto_reply.truncate(n);
    upto_reply.push(sentinel());
    let without_reply = render(&upto_reply, false).map_err(|_| unstable())?;
    let start = common_prefix(&without_reply, &whole);
    let end_region = common_prefix(&with_reply, &whole);
    if end_region <= start {
        return Err(unstable());
    }
    let region = &whole[start..end_region];
    let own = call.ids.last().and_then(|&id| r.token_text(id));
    let end = own
        .as_ref()
        .and_then(|t| region.rfind(t.as_str()).map(|at| at + t.len()))
        .or_else(|| {
            r.stop_ids()
                .iter()
                .filter_map(|&id| r.token_text(id))
                .filter_map(|t| region.rfind(&t).map(|at| at + t.len()))
                .max()
        })
        .ok_or_else(|| {
            // The reply's turn ends when the sentinel follows it, not when
            // the new messages do: the template renders it differently.
            let ends = own.as_ref().is_some_and(|t| {
                with_reply
                    .get(start..)
                    .is_some_and(|w| w.contains(t.as_str()))
            });
            if ends {
                unstable()
            } else {
                fresh(|call| Fresh::NoEndOfTurn { call })
            }
        })?;
    r.encode(&whole[start + end..]).map_err(BridgeError::Render)
}

/// The chains of one session.
#[derive(Clone, Debug, Default)]
pub struct Chains {
    calls: VecDeque<Call>,
    next: u64,
}

impl Chains {
    /// Chains kept per session.
    pub const CAPACITY: usize = 32;

    /// No chains yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The prompt ids of a call asked with `conv`. A fresh prompt's reason
    /// is told against the call whose messages it matched furthest (the
    /// latest of those).
    pub fn prompt(
        &self,
        r: &dyn Renderer,
        conv: &Conversation<'_>,
    ) -> Result<Prompt, RenderFailure> {
        let mut reason: Option<(Fresh, usize)> = None;
        let mut note = |f: Fresh, depth: usize| {
            if reason.as_ref().is_none_or(|(_, d)| depth > *d) {
                reason = Some((f, depth));
            }
        };
        for call in self.calls.iter().rev() {
            match call.relation(conv) {
                Relation::Repeats => {
                    return Ok(Prompt {
                        ids: call.ids[..call.prompt_len].to_vec(),
                        origin: Origin::Repeats { call: call.number },
                        windows: call.windows.clone(),
                    });
                }
                Relation::Extends(n) => match bridge(r, call, conv, n) {
                    (Ok(added), windows) => {
                        let mut ids = Vec::with_capacity(call.ids.len() + added.len());
                        ids.extend_from_slice(&call.ids);
                        ids.extend_from_slice(&added);
                        return Ok(Prompt {
                            ids,
                            origin: Origin::Extends {
                                call: call.number,
                                kept: call.ids.len(),
                                added: added.len(),
                            },
                            windows,
                        });
                    }
                    (Err(BridgeError::Render(e)), _) => return Err(e),
                    (Err(BridgeError::Fresh(f)), _) => note(f, n + 1),
                },
                Relation::Not(f, depth) => note(f, depth),
            }
        }
        let ids = r.encode(&r.render(conv, true)?)?;
        Ok(Prompt {
            ids,
            origin: Origin::Fresh {
                reason: reason.map_or(Fresh::FirstCall, |(f, _)| f),
            },
            windows: Windows::default(),
        })
    }

    /// Records a call asked with `conv` whose prompt was `prompt` and which
    /// generated `response` (ids) and answered `reply` (the reply as a
    /// conversation message, written as the harness's next request would
    /// carry it). Returns the call's number.
    pub fn finish(
        &mut self,
        r: &dyn Renderer,
        conv: Asked,
        prompt: Prompt,
        response: &[u32],
        reply: Value,
    ) -> u64 {
        self.finish_as(r, (conv, prompt), response, reply, false)
    }

    /// [`Chains::finish`] for a call that may be a side call branching off
    /// its chain (a constrained one: a harness's structured-output check
    /// asked with the main conversation and a question after it): the
    /// call it extends is kept beside it, so the main chain's next call
    /// still extends that one; a later call that extends this one is
    /// found first.
    pub fn finish_branch(
        &mut self,
        r: &dyn Renderer,
        conv: Asked,
        prompt: Prompt,
        response: &[u32],
        reply: Value,
    ) -> u64 {
        self.finish_as(r, (conv, prompt), response, reply, true)
    }

    fn finish_as(
        &mut self,
        r: &dyn Renderer,
        (conv, prompt): (Asked, Prompt),
        response: &[u32],
        reply: Value,
        branch: bool,
    ) -> u64 {
        let number = self.next;
        self.next += 1;
        let replaced = match prompt.origin {
            Origin::Extends { .. } if branch => None,
            Origin::Extends { call, .. } | Origin::Repeats { call } => Some(call),
            Origin::Fresh { .. } => None,
        };
        if let Some(old) = replaced {
            self.calls.retain(|c| c.number != old);
        }
        let prompt_len = prompt.ids.len();
        let mut ids = prompt.ids;
        ids.extend_from_slice(response);
        let ended = response.last().is_some_and(|id| r.stop_ids().contains(id));
        self.calls.push_back(Call {
            number,
            messages: conv.messages,
            tools: conv.tools,
            kwargs: conv.kwargs,
            ids,
            prompt_len,
            reply,
            ended,
            windows: prompt.windows,
        });
        while self.calls.len() > Self::CAPACITY {
            self.calls.pop_front();
        }
        number
    }

    /// The number of chains kept.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether no chain is kept.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}
