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
//! conversation (DeepSeek-V3's marks its first tool call and its first
//! tool output for good) may not be. So a chain trusts a window only when
//! a window of the same [`Shape`] (the kinds of its messages, and the kinds
//! of the messages it leaves out) has given the ids the whole rendering
//! gives; a window of a new shape is built both ways and compared, and one
//! that differs makes the chain render the whole conversation for good
//! ([`Windows`], kept by each chain).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a chain knows of windows, in short ([`Windows::state`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    /// No window that leaves messages out has been checked yet.
    #[default]
    Unchecked,
    /// Windows of some shapes gave the ids the whole rendering gave:
    /// bridges over windows of those shapes render the window.
    Trusted,
    /// A window gave other ids (or failed where the whole rendering did
    /// not): bridges render the whole conversation.
    Refuted,
}

/// What a chain knows of windows: the shapes checked, or that a window
/// was refuted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Windows {
    refuted: bool,
    checked: Vec<Shape>,
}

impl Windows {
    /// Shapes a chain remembers; windows of further shapes are checked
    /// every time.
    const CAPACITY: usize = 64;

    /// Windows refuted: every bridge renders the whole conversation.
    pub fn whole() -> Self {
        Self {
            refuted: true,
            checked: Vec::new(),
        }
    }

    /// In short.
    pub fn state(&self) -> Window {
        match (self.refuted, self.checked.is_empty()) {
            (true, _) => Window::Refuted,
            (false, true) => Window::Unchecked,
            (false, false) => Window::Trusted,
        }
    }

    /// Whether bridges may render windows at all.
    pub(crate) fn refuted(&self) -> bool {
        self.refuted
    }

    /// Whether a window of `shape` was checked.
    pub(crate) fn trusts(&self, shape: &Shape) -> bool {
        !self.refuted && self.checked.contains(shape)
    }

    /// These, once a window of `shape` gave the whole rendering's ids
    /// (`same`) or not.
    pub(crate) fn checked(&self, shape: Shape, same: bool) -> Self {
        if !same {
            return Self::whole();
        }
        let mut next = self.clone();
        if next.checked.len() < Self::CAPACITY {
            next.checked.push(shape);
        }
        next
    }
}

/// A message's role, named without allocating for the usual ones.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    None,
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Other(String),
}

impl Role {
    fn of(m: &Value) -> Self {
        match role(m) {
            None => Self::None,
            Some("system") => Self::System,
            Some("developer") => Self::Developer,
            Some("user") => Self::User,
            Some("assistant") => Self::Assistant,
            Some("tool") => Self::Tool,
            Some(other) => Self::Other(other.to_owned()),
        }
    }
}

/// What a template can tell of a message without its text: its role,
/// whether it has tool calls, and its content's type.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Kind {
    role: Role,
    calls: bool,
    content: &'static str,
}

impl Kind {
    fn of(m: &Value) -> Self {
        let calls = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        let content = match m.get("content") {
            None | Some(Value::Null) => "none",
            Some(Value::String(s)) if s.is_empty() => "empty",
            Some(Value::String(_)) => "text",
            Some(_) => "parts",
        };
        Self {
            role: Role::of(m),
            calls,
            content,
        }
    }
}

/// A window's shape: the kinds of its messages in order, and the kinds of
/// the messages it leaves out (each once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    window: Vec<Kind>,
    left_out: Vec<Kind>,
}

/// The shape of the window `at` of `messages`.
pub fn shape(messages: &[Value], at: &[usize]) -> Shape {
    let window = at.iter().map(|&i| Kind::of(&messages[i])).collect();
    let mut left_out: Vec<Kind> = Vec::new();
    let mut next = at.iter().copied().peekable();
    for (i, m) in messages.iter().enumerate() {
        if next.peek() == Some(&i) {
            next.next();
            continue;
        }
        let kind = Kind::of(m);
        if !left_out.contains(&kind) {
            left_out.push(kind);
        }
    }
    left_out.sort();
    Shape { window, left_out }
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
    fn shapes_tell_the_kinds_of_the_messages_in_and_out() {
        let m = conv("suatatatat");
        let a = shape(&m, &[0, 1, 6, 7, 8, 9]);
        let mut longer = conv("suatatatatat");
        assert_eq!(a, shape(&longer, &[0, 1, 8, 9, 10, 11]));
        longer[3] = json!({"role": "user", "content": "a hint"});
        assert_ne!(a, shape(&longer, &[0, 1, 8, 9, 10, 11]));
        let mut text = conv("suatatatat");
        text[6]["content"] = json!("words");
        assert_ne!(a, shape(&text, &[0, 1, 6, 7, 8, 9]));
        let mut call = conv("suatatatat");
        call[6]["tool_calls"] = json!([{"id": "c"}]);
        assert_ne!(a, shape(&call, &[0, 1, 6, 7, 8, 9]));

        let w = Windows::default();
        assert_eq!(w.state(), Window::Unchecked);
        let w = w.checked(a.clone(), true);
        assert!(w.trusts(&a));
        assert_eq!(w.state(), Window::Trusted);
        let w = w.checked(shape(&call, &[0, 1, 6, 7, 8, 9]), false);
        assert!(!w.trusts(&a));
        assert_eq!(w.state(), Window::Refuted);
    }

    #[test]
    fn no_window_when_it_would_be_everything_or_has_no_head() {
        assert_eq!(window(&conv("suatat"), 4), None);
        assert_eq!(window(&conv("uatat"), 3), None);
        assert_eq!(window(&conv("satatat"), 5), None);
    }
}
