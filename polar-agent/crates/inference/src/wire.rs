//! The backend's request body written straight from the normalized
//! request as bytes, without building a JSON tree of the conversation: the
//! same JSON as `request::chat_body(..)`, at a fraction of the cost for long
//! conversations. Text still escaped as the harness sent it and tool
//! schemas are copied as they are (the exact bytes of
//! `chat_body(..).to_string()` when the harness wrote them as `serde_json`
//! does); other text is escaped by [`json_doc::write_str`], which skips
//! plain runs eight bytes at a time.

use serde::Serialize;
use serde_json::Value;

use super::request::{Conversation, body_with};
use super::{BackendConfig, ReasoningField, SamplingMode};
use polar_chat::{ChatRequest, Message, Part, Role, Text, Tool, ToolCall};
use polar_json::write_str;

/// The body of `POST /v1/chat/completions` for `req`, as bytes.
pub fn chat_body_bytes(cfg: &BackendConfig, req: &ChatRequest, mode: SamplingMode) -> Vec<u8> {
    let shell = body_with(cfg, req, mode, Conversation::Placeholders);
    let reasoning = cfg.reasoning_field();
    let text: usize = req
        .messages
        .iter()
        .flat_map(|m| &m.content)
        .map(|p| match p {
            Part::Text { text } => text.escaped().map_or_else(|| text.len(), <[u8]>::len),
            _ => 256,
        })
        .sum();
    let mut out = Vec::with_capacity(text + text / 16 + 256 * req.messages.len() + 4096);
    out.push(b'{');
    if let Value::Object(map) = &shell {
        for (i, (k, v)) in map.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_str(&mut out, k);
            out.push(b':');
            match k.as_str() {
                "messages" => array(&mut out, &req.messages, |out, m| message(out, m, reasoning)),
                "tools" => tools(&mut out, &req.tools),
                _ => value(&mut out, v),
            }
        }
    }
    out.push(b'}');
    out
}

/// `v` as serde_json writes it (writing to a vector cannot fail for the
/// values here: string keys, finite numbers).
fn value(out: &mut Vec<u8>, v: &(impl Serialize + ?Sized)) {
    if serde_json::to_writer(&mut *out, v).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// `"key":` after a comma unless it is the object's first member.
fn key(out: &mut Vec<u8>, first: bool, k: &str) {
    if !first {
        out.push(b',');
    }
    write_str(out, k);
    out.push(b':');
}

/// `[`, the items each written by `each`, separated by commas, `]`.
fn array<T>(out: &mut Vec<u8>, items: &[T], mut each: impl FnMut(&mut Vec<u8>, &T)) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        each(out, item);
    }
    out.push(b']');
}

fn tools(out: &mut Vec<u8>, tools: &[Tool]) {
    array(out, tools, |out, t| {
        out.extend_from_slice(br#"{"type":"function","function":{"name":"#);
        write_str(out, &t.name);
        if let Some(d) = &t.description {
            key(out, false, "description");
            write_str(out, d);
        }
        key(out, false, "parameters");
        out.extend_from_slice(t.parameters.as_bytes());
        out.extend_from_slice(b"}}");
    });
}

/// A text inside a JSON string: copied when it is still escaped as the
/// harness sent it (its escapes are valid JSON, if not always the ones
/// `serde_json` would pick), escaped otherwise.
fn text_contents(out: &mut Vec<u8>, text: &Text) {
    match text.escaped() {
        Some(e) => out.extend_from_slice(e),
        None => polar_json::write_str_contents(out, text),
    }
}

fn text_only(parts: &[Part]) -> bool {
    parts.iter().all(|p| matches!(p, Part::Text { .. }))
}

/// One message as `request::message` renders it.
fn message(out: &mut Vec<u8>, m: &Message, reasoning: ReasoningField) {
    let role = match m.role {
        Role::System | Role::Developer => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    out.push(b'{');
    key(out, true, "role");
    write_str(out, role);
    key(out, false, "content");
    let text_only = text_only(&m.content);
    let empty = text_only
        && m.content
            .iter()
            .all(|p| matches!(p, Part::Text { text } if text.is_empty()));
    if m.role == Role::Assistant && empty && !m.tool_calls.is_empty() {
        out.extend_from_slice(b"null");
    } else if text_only {
        // The parts' texts joined, as one string.
        out.push(b'"');
        for p in &m.content {
            if let Part::Text { text } = p {
                text_contents(out, text);
            }
        }
        out.push(b'"');
    } else {
        parts(out, &m.content);
    }
    if let Some(text) = crate::request::sent_reasoning(m) {
        for k in reasoning.keys() {
            key(out, false, k);
            write_str(out, text);
        }
    }
    if !m.tool_calls.is_empty() {
        key(out, false, "tool_calls");
        calls(out, &m.tool_calls);
    }
    if let Some(id) = &m.tool_call_id {
        key(out, false, "tool_call_id");
        write_str(out, id);
    }
    if m.role == Role::Tool
        && let Some(name) = &m.name
    {
        key(out, false, "name");
        write_str(out, name);
    }
    out.push(b'}');
}

fn parts(out: &mut Vec<u8>, parts: &[Part]) {
    array(out, parts, |out, p| match p {
        Part::Text { text } => {
            out.extend_from_slice(br#"{"type":"text","text":""#);
            text_contents(out, text);
            out.extend_from_slice(br#""}"#);
        }
        Part::Image {
            media_type,
            data,
            url,
        } => {
            out.extend_from_slice(br#"{"type":"image_url","image_url":{"url":"#);
            match (url, data) {
                (Some(u), _) => write_str(out, u),
                (None, Some(d)) => write_str(
                    out,
                    &format!(
                        "data:{};base64,{d}",
                        media_type.as_deref().unwrap_or("image/png")
                    ),
                ),
                (None, None) => write_str(out, ""),
            }
            out.extend_from_slice(b"}}");
        }
        Part::Other { value: v } => value(out, v),
    });
}

fn calls(out: &mut Vec<u8>, calls: &[ToolCall]) {
    array(out, calls, |out, c| {
        out.extend_from_slice(br#"{"id":"#);
        write_str(out, &c.id);
        out.extend_from_slice(br#","type":"function","function":{"name":"#);
        write_str(out, &c.name);
        key(out, false, "arguments");
        write_str(out, &c.arguments);
        out.extend_from_slice(b"}}");
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dialect;
    use crate::request::chat_body;
    use polar_chat::Api;
    use polar_chat::Reasoning;
    use polar_chat::provider::{self, Framing, ModelCall};

    fn fixture_requests() -> Vec<ChatRequest> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../chat/tests/fixtures/providers/requests");
        let mut out = Vec::new();
        for (file, api) in [
            ("claude_code_turn2.json", Api::AnthropicMessages),
            ("qwen_turn2.json", Api::OpenaiChat),
            ("codex_turn2.json", Api::OpenaiResponses),
            ("gemini_cli_turn2.json", Api::Gemini),
            ("pi_gemini_two_calls.json", Api::Gemini),
        ] {
            let body: Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
            let call = ModelCall {
                api,
                framing: Framing::Sse,
                path_model: Some("gemini-2.5-pro".into()),
            };
            out.push(provider::parse_request_value(&call, &body).unwrap().request);
        }
        out
    }

    #[test]
    fn bytes_equal_the_json_tree_serialized() {
        let mut reqs = fixture_requests();
        // Edge cases: empty assistant content with calls, several text parts,
        // images and unknown parts, a tool message with a name.
        let mut odd = reqs[0].clone();
        let mut a = Message::text(Role::Assistant, "");
        a.tool_calls = vec![ToolCall {
            id: "c".into(),
            name: "n".into(),
            arguments: "{}".into(),
        }];
        a.reasoning = Some(Reasoning {
            text: "r".into(),
            ..Reasoning::default()
        });
        let mut multi = Message::text(Role::User, "a");
        multi.content.push(Part::Text {
            text: "b\n\"".into(),
        });
        let mut mixed = Message::text(Role::User, "see");
        mixed.content.push(Part::Image {
            media_type: None,
            data: Some("AA".into()),
            url: None,
        });
        mixed.content.push(Part::Other {
            value: serde_json::json!({"type": "input_audio", "x": 1}),
        });
        let mut tool = Message::text(Role::Tool, "out");
        tool.tool_call_id = Some("c".into());
        tool.name = Some("n".into());
        let empty = Message {
            content: Vec::new(),
            ..Message::text(Role::User, "")
        };
        odd.messages.extend([a, multi, mixed, tool, empty]);
        reqs.push(odd);
        for (dialect, field) in [
            (Dialect::Vllm, None),
            (Dialect::Sglang, None),
            (Dialect::Vllm, Some(ReasoningField::Both)),
            (Dialect::Sglang, Some(ReasoningField::None)),
        ] {
            let mut cfg = BackendConfig::new("b", dialect, vec![], "served");
            cfg.reasoning_field = field;
            for (i, r) in reqs.iter().enumerate() {
                for mode in [SamplingMode::Train, SamplingMode::Eval] {
                    assert_eq!(
                        String::from_utf8(chat_body_bytes(&cfg, r, mode)).unwrap(),
                        chat_body(&cfg, r, mode).to_string(),
                        "request {i} {dialect:?}"
                    );
                }
            }
        }
    }
}
