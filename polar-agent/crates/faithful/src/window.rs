//! The messages a bridge renders ([`window`]): not the whole conversation,
//! whose rendering grows with it, but its head (through the first user
//! message: the system prompt, the tools, the task, which templates render
//! specially), the latest user message before the window's turns (which
//! templates such as Qwen3's find the last query by), and the turns from
//! the model's turn before the reply on (which tool results and the reply
//! are rendered after). What a template writes after the reply's turn is
//! the same in the window's rendering as in the whole conversation's for
//! every template whose turns are rendered from their own messages and
//! their neighbours; a template that keeps state across the whole
//! conversation (DeepSeek-V3's marks its first tool call for good) may
//! not be, so a chain trusts its windows only once the first window that
//! leaves messages out has given the ids the whole rendering gives
//! ([`Window`], kept by each chain).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Whether a chain's bridges render a window of the conversation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    /// Not yet known: the next bridge whose window leaves messages out is
    /// built both ways and compared.
    #[default]
    Unchecked,
    /// A window gave the ids the whole rendering gave: bridges render
    /// windows.
    Trusted,
    /// A window gave other ids (or failed where the whole rendering did
    /// not): bridges render the whole conversation.
    Refuted,
}

/// The indices of `messages` a bridge renders when `reply` is the index of
/// the reply it follows, ascending, or `None` when that is every message
/// (no user message before the reply, or no earlier turn of the model's
/// past the head).
pub fn window(messages: &[Value], reply: usize) -> Option<Vec<usize>> {
    let head = messages[..reply]
        .iter()
        .position(|m| role(m) == Some("user"))?
        + 1;
    let from = messages[head..reply]
        .iter()
        .rposition(|m| role(m) == Some("assistant"))
        .map(|k| head + k)
        .filter(|&k| k > head)?;
    let query = messages[head..from]
        .iter()
        .rposition(|m| role(m) == Some("user"))
        .map(|k| head + k);
    let mut at: Vec<usize> = (0..head).collect();
    at.extend(query);
    at.extend(from..messages.len());
    Some(at)
}

fn role(m: &Value) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn conv(roles: &str) -> Vec<Value> {
        roles
            .chars()
            .map(|c| {
                let role = match c {
                    's' => "system",
                    'u' => "user",
                    'a' => "assistant",
                    _ => "tool",
                };
                json!({"role": role, "content": ""})
            })
            .collect()
    }

    #[test]
    fn the_head_the_last_query_and_the_latest_turns() {
        let m = conv("suatatuatat");
        assert_eq!(window(&m, 9), Some(vec![0, 1, 6, 7, 8, 9, 10]));
        let m = conv("suatatatat");
        assert_eq!(window(&m, 8), Some(vec![0, 1, 6, 7, 8, 9]));
        let m = conv("suatuatat");
        assert_eq!(window(&m, 7), Some(vec![0, 1, 4, 5, 6, 7, 8]));
        let m = conv("uatatat");
        assert_eq!(window(&m, 5), Some(vec![0, 3, 4, 5, 6]));
    }

    #[test]
    fn no_window_when_it_would_be_everything_or_has_no_head() {
        assert_eq!(window(&conv("suatat"), 4), None);
        assert_eq!(window(&conv("uatat"), 3), None);
        assert_eq!(window(&conv("satatat"), 5), None);
    }
}
