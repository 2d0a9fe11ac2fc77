//! Chain roles: whether each trace belongs to the main agent, a sub-agent,
//! or a side request, decided by what its conversation's calls are, never
//! by their order (a harness's title call often comes first).
//!
//! The traces are grouped into conversations: a chain's traces
//! (`prefix_merging`), or the calls sharing a system prompt and first user
//! message (`per_request`, where each call is its own chain). Then:
//!
//! - a conversation is `side` when its opening call asks for structured
//!   output (a title, a router's decision, a check asked with another
//!   conversation: prefix merging forks such a check off that
//!   conversation, and `per_request` groups structured calls apart; a
//!   structured turn a conversation goes on from leaves it what it is), or
//!   when the session offers
//!   tools somewhere but this conversation never does (a summary, a
//!   classifier, a quota probe);
//! - of the others, the main one carries the session's task (a user
//!   message of its first call mentions the task's instruction, when the
//!   session names one: see [`mentions`]), then has the most calls, then
//!   came first;
//! - the rest are sub-agents.
//!
//! When no conversation qualifies (every one is a side request), none is
//! `main`. Traces of sub-agents are labelled `sub_agent`, of side requests
//! `side`.

use std::collections::HashMap;

use polar_chat::{ChatRequest, Role};
use polar_record::CompletionRecord;

use super::types::{ChainRole, Label, Trace};

/// How traces are grouped into conversations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// By chain (`prefix_merging`).
    Chain,
    /// By the system prompt and first user message of the trace's first
    /// call (`per_request`).
    Opening,
}

/// What the role rules look at in one conversation.
#[derive(Debug, Default)]
struct Conversation {
    traces: Vec<usize>,
    calls: usize,
    offers_tools: bool,
    structured: bool,
    carries_task: bool,
}

/// Whether `req` asks for structured output (a JSON schema or JSON mode).
pub(crate) fn asks_structured(req: &ChatRequest) -> bool {
    req.response_format.is_some()
}

/// Whether `req` offers the model tools it may call.
fn offers_tools(req: &ChatRequest) -> bool {
    !req.tools.is_empty() && req.tool_choice != Some(polar_chat::ToolChoice::None)
}

/// Which calls are side requests by their own shape, as [`assign`] reads a
/// conversation: asking for structured output, or offering no tools in a
/// session that offers tools somewhere. Such a call never starts the main
/// chain (`prefix_merging` does not continue a conversation from it).
pub(crate) fn side_shaped<'a>(
    requests: impl Iterator<Item = &'a ChatRequest> + Clone,
) -> Vec<bool> {
    let session_offers_tools = requests.clone().any(offers_tools);
    requests
        .map(|r| asks_structured(r) || (session_offers_tools && !offers_tools(r)))
        .collect()
}

/// What opens `req`'s conversation: its system prompt and first user
/// message (a title call quoting the task has a system prompt of its own).
fn opening(req: &ChatRequest) -> Option<String> {
    let first = |role: Role| {
        req.messages
            .iter()
            .find(|m| m.role == role)
            .map(polar_chat::Message::joined_text)
    };
    let user = first(Role::User)?;
    let system = first(Role::System)
        .or_else(|| first(Role::Developer))
        .unwrap_or_default();
    Some(format!("{system}\u{0}{user}"))
}

/// Whether a user message of `req` mentions `instruction` (Codex sends its
/// environment and AGENTS.md as user messages before the task's).
fn names_task(req: &ChatRequest, instruction: &Instruction) -> bool {
    req.messages
        .iter()
        .filter(|m| m.role == Role::User)
        .any(|m| mentions(&m.joined_text(), instruction))
}

/// Shingles (runs of this many words) compared when the instruction is not
/// found whole.
const SHINGLE: usize = 3;
/// The share of the instruction's shingles a message must hold.
const OVERLAP: f64 = 0.8;

/// A task's instruction, prepared for [`mentions`].
#[derive(Debug)]
pub(crate) struct Instruction {
    /// Whitespace runs collapsed to one space.
    squashed: String,
    /// Its word shingles (lowercase, punctuation dropped), when it has
    /// enough words to compare that way.
    shingles: Vec<String>,
}

impl Instruction {
    /// Prepares `text`.
    pub(crate) fn new(text: &str) -> Self {
        let words = words(text);
        let shingles = if words.len() >= 2 * SHINGLE {
            let mut s = shingles(&words);
            s.sort_unstable();
            s.dedup();
            s
        } else {
            Vec::new()
        };
        Self {
            squashed: squash(text),
            shingles,
        }
    }
}

fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

fn shingles(words: &[String]) -> Vec<String> {
    words.windows(SHINGLE).map(|w| w.join(" ")).collect()
}

/// Whether `text` mentions the instruction: holds it whole once whitespace
/// runs are collapsed (a harness that wraps the task in tags, indents it or
/// re-flows it), or, for an instruction of at least six words, holds at
/// least 80% of its three-word runs, compared in lowercase without
/// punctuation (a harness that escapes, quotes or lightly rewrites it).
pub(crate) fn mentions(text: &str, instruction: &Instruction) -> bool {
    if instruction.squashed.is_empty() {
        return false;
    }
    if squash(text).contains(&instruction.squashed) {
        return true;
    }
    if instruction.shingles.is_empty() {
        return false;
    }
    let have: std::collections::HashSet<String> = shingles(&words(text)).into_iter().collect();
    let held = instruction
        .shingles
        .iter()
        .filter(|s| have.contains(*s))
        .count();
    held as f64 >= OVERLAP * instruction.shingles.len() as f64
}

/// Sets every trace's role and its `sub_agent` / `side` label.
/// `instruction`: the session's task instruction, when known.
pub(crate) fn assign(
    traces: &mut [Trace],
    records: &[CompletionRecord],
    instruction: Option<&str>,
    grouping: Grouping,
) {
    let by_id: HashMap<&str, &CompletionRecord> =
        records.iter().map(|r| (r.call_id.as_str(), r)).collect();
    let instruction = instruction
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(Instruction::new);
    let mut order: Vec<String> = Vec::new();
    let mut convos: HashMap<String, Conversation> = HashMap::new();
    for (i, t) in traces.iter().enumerate() {
        let calls: Vec<&CompletionRecord> = t
            .call_ids
            .iter()
            .filter_map(|c| by_id.get(c.as_str()).copied())
            .collect();
        let key = match grouping {
            Grouping::Chain => format!("chain {}", t.chain.0),
            // A structured request sharing the main conversation's opening
            // is a check beside it, a conversation of its own.
            Grouping::Opening => match calls.first().map(|r| (r, opening(&r.request))) {
                Some((r, Some(text))) if asks_structured(&r.request) => {
                    format!("structured {text}")
                }
                Some((_, Some(text))) => format!("opening {text}"),
                _ => format!("call {i}"),
            },
        };
        let c = convos.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            Conversation::default()
        });
        c.traces.push(i);
        c.calls += t.call_ids.len();
        c.offers_tools |= calls.iter().any(|r| offers_tools(&r.request));
        // A chain's first segment opens its conversation: what it asks for
        // (structured output: a title, a check) and its task.
        let opens = grouping == Grouping::Opening || t.segment == 0;
        c.structured |= opens && calls.first().is_some_and(|r| asks_structured(&r.request));
        if opens && let (Some(want), Some(first)) = (&instruction, calls.first()) {
            c.carries_task |= names_task(&first.request, want);
        }
    }
    let session_offers_tools = convos.values().any(|c| c.offers_tools);
    let side = |c: &Conversation| c.structured || (session_offers_tools && !c.offers_tools);
    let main = order
        .iter()
        .enumerate()
        .filter(|(_, k)| !side(&convos[*k]))
        .max_by_key(|(pos, k)| {
            let c = &convos[*k];
            (c.carries_task, c.calls, std::cmp::Reverse(*pos))
        })
        .map(|(_, k)| k.clone());
    for (key, c) in &convos {
        let role = if side(c) {
            ChainRole::Side
        } else if main.as_ref() == Some(key) {
            ChainRole::Main
        } else {
            ChainRole::SubAgent
        };
        for &i in &c.traces {
            let t = &mut traces[i];
            t.role = role;
            match role {
                ChainRole::Main => {}
                ChainRole::SubAgent => t.add_label(Label::SubAgent),
                ChainRole::Side => t.add_label(Label::Side),
            }
        }
    }
}
