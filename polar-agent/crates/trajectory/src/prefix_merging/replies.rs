//! What the harness did with each call's reply: whether a later call's
//! conversation holds it. A reply is known by its tool calls' ids (unique
//! per generation: a later request answers them with tool results, or
//! repeats them in an assistant turn), else by its text (an assistant turn
//! of a later request repeating it, whitespace at the ends aside). Message
//! level, so a template that re-renders the turn, or a summary request that
//! re-serializes the history, still counts.
//!
//! Used by `assemble`: a sibling whose reply the harness went on with is
//! never a superseded retry, and a compaction's summary call is told from
//! the turn it summarized. Keys are kept as 64-bit hashes: a session's
//! histories repeat every earlier turn, and copying their text per call
//! would cost the square of the session's length in memory.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use polar_chat::{Message, Role};

use crate::calls::Call;

use super::tree::CallIx;

/// How one reply is recognized in a later request: the hash of a tool
/// call id, or of the text of an assistant turn without tool calls.
type Key = u64;

fn id_key(id: &str) -> Key {
    let mut h = DefaultHasher::new();
    (0u8, id).hash(&mut h);
    h.finish()
}

fn text_key(m: &Message) -> Option<Key> {
    let text = m.joined_text();
    let text = text.trim();
    (!text.is_empty()).then(|| {
        let mut h = DefaultHasher::new();
        (1u8, text).hash(&mut h);
        h.finish()
    })
}

/// The keys of a reply (an assistant message).
fn reply_keys(m: &Message) -> Vec<Key> {
    if m.tool_calls.is_empty() {
        text_key(m).into_iter().collect()
    } else {
        m.tool_calls.iter().map(|t| id_key(&t.id)).collect()
    }
}

/// The keys a request's history holds.
fn history_keys(messages: &[Message]) -> impl Iterator<Item = Key> + '_ {
    messages.iter().flat_map(|m| {
        let mut keys: Vec<Key> = Vec::new();
        match m.role {
            Role::Assistant => {
                keys.extend(m.tool_calls.iter().map(|t| id_key(&t.id)));
                if m.tool_calls.is_empty() {
                    keys.extend(text_key(m));
                }
            }
            Role::Tool => keys.extend(m.tool_call_id.as_deref().map(id_key)),
            _ => {}
        }
        keys
    })
}

/// For each call, the calls whose request holds its reply (ascending).
#[derive(Debug)]
pub(super) struct ReplyUse {
    held_by: Vec<Vec<CallIx>>,
    keys: Vec<Vec<Key>>,
}

impl ReplyUse {
    /// Indexes the histories of `calls`.
    pub fn new(calls: &[Call<'_>]) -> Self {
        let mut holders: HashMap<Key, Vec<CallIx>> = HashMap::new();
        for (i, c) in calls.iter().enumerate() {
            for k in history_keys(&c.record.request.messages) {
                let list = holders.entry(k).or_default();
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
        }
        let keys: Vec<Vec<Key>> = calls
            .iter()
            .map(|c| {
                c.record
                    .response
                    .as_ref()
                    .map(|r| reply_keys(&r.message))
                    .unwrap_or_default()
            })
            .collect();
        let held_by = keys
            .iter()
            .enumerate()
            .map(|(i, ks)| {
                let mut by: Vec<CallIx> = ks
                    .iter()
                    .filter_map(|k| holders.get(k))
                    .flatten()
                    .copied()
                    .filter(|&d| d > i)
                    .collect();
                by.sort_unstable();
                by.dedup();
                by
            })
            .collect();
        Self { held_by, keys }
    }

    /// Whether a later call holds `c`'s reply, and no other call of `group`
    /// (its siblings) gave the same reply (identical replies of retries are
    /// interchangeable: that evidence names none of them).
    pub fn used_among(&self, c: CallIx, group: &[CallIx]) -> bool {
        !self.held_by[c].is_empty()
            && group
                .iter()
                .all(|&g| g == c || self.keys[g].is_empty() || self.keys[g] != self.keys[c])
    }

    /// Whether call `d`'s request holds `c`'s reply.
    pub fn holds(&self, d: CallIx, c: CallIx) -> bool {
        self.held_by[c].binary_search(&d).is_ok()
    }
}
