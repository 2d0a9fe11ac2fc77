//! The backend's request body serialized straight from the normalized
//! request, without building a JSON tree of the conversation first: the
//! exact bytes of `request::chat_body(..).to_string()`, at a fraction of the
//! cost for long conversations (the conversation is most of the body).

use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

use super::request::body_with;
use super::{BackendConfig, SamplingMode};
use crate::chat::{ChatRequest, Message, Part, Role, ToolCall};

/// The body of `POST /v1/chat/completions` for `req`, as bytes.
pub fn chat_body_bytes(cfg: &BackendConfig, req: &ChatRequest, mode: SamplingMode) -> Vec<u8> {
    let shell = body_with(cfg, req, mode, Value::Array(Vec::new()));
    let body = Body {
        shell: &shell,
        messages: &req.messages,
    };
    // Serializing these types cannot fail (string keys, no non-finite
    // floats are produced by `body_with`'s numbers); an empty body would be
    // refused by the backend with a clear error if it ever did.
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The shell's entries in order, with `messages` serialized directly.
struct Body<'a> {
    shell: &'a Value,
    messages: &'a [Message],
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Value::Object(map) = self.shell else {
            return self.shell.serialize(s);
        };
        let mut out = s.serialize_map(Some(map.len()))?;
        for (k, v) in map {
            if k == "messages" {
                out.serialize_entry(k, &Messages(self.messages))?;
            } else {
                out.serialize_entry(k, v)?;
            }
        }
        out.end()
    }
}

struct Messages<'a>(&'a [Message]);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for m in self.0 {
            seq.serialize_element(&WireMessage(m))?;
        }
        seq.end()
    }
}

/// One message as `request::message` renders it.
struct WireMessage<'a>(&'a Message);

fn text_only(parts: &[Part]) -> bool {
    parts.iter().all(|p| matches!(p, Part::Text { .. }))
}

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let m = self.0;
        let role = match m.role {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        let mut out = s.serialize_map(None)?;
        out.serialize_entry("role", role)?;
        let text_only = text_only(&m.content);
        let empty = text_only
            && m.content
                .iter()
                .all(|p| matches!(p, Part::Text { text } if text.is_empty()));
        if m.role == Role::Assistant && empty && !m.tool_calls.is_empty() {
            out.serialize_entry("content", &Value::Null)?;
        } else if text_only {
            match m.content.as_slice() {
                [Part::Text { text }] => out.serialize_entry("content", text)?,
                parts => {
                    let joined: String = parts
                        .iter()
                        .filter_map(|p| match p {
                            Part::Text { text } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect();
                    out.serialize_entry("content", &joined)?;
                }
            }
        } else {
            out.serialize_entry("content", &Parts(&m.content))?;
        }
        if let Some(r) = &m.reasoning {
            out.serialize_entry("reasoning_content", &r.text)?;
        }
        if !m.tool_calls.is_empty() {
            out.serialize_entry("tool_calls", &Calls(&m.tool_calls))?;
        }
        if let Some(id) = &m.tool_call_id {
            out.serialize_entry("tool_call_id", id)?;
        }
        if m.role == Role::Tool
            && let Some(name) = &m.name
        {
            out.serialize_entry("name", name)?;
        }
        out.end()
    }
}

struct Parts<'a>(&'a [Part]);

impl Serialize for Parts<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for p in self.0 {
            match p {
                Part::Text { text } => seq.serialize_element(&TextPart(text))?,
                Part::Image {
                    media_type,
                    data,
                    url,
                } => {
                    let url = match (url, data) {
                        (Some(u), _) => u.clone(),
                        (None, Some(d)) => format!(
                            "data:{};base64,{d}",
                            media_type.as_deref().unwrap_or("image/png")
                        ),
                        (None, None) => String::new(),
                    };
                    seq.serialize_element(&ImagePart(&url))?;
                }
                Part::Other { value } => seq.serialize_element(value)?,
            }
        }
        seq.end()
    }
}

struct TextPart<'a>(&'a str);

impl Serialize for TextPart<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("type", "text")?;
        m.serialize_entry("text", self.0)?;
        m.end()
    }
}

struct ImagePart<'a>(&'a str);

impl Serialize for ImagePart<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Url<'a>(&'a str);
        impl Serialize for Url<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("url", self.0)?;
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("type", "image_url")?;
        m.serialize_entry("image_url", &Url(self.0))?;
        m.end()
    }
}

struct Calls<'a>(&'a [ToolCall]);

impl Serialize for Calls<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Function<'a>(&'a ToolCall);
        impl Serialize for Function<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("name", &self.0.name)?;
                m.serialize_entry("arguments", &self.0.arguments)?;
                m.end()
            }
        }
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for c in self.0 {
            struct Call<'a>(&'a ToolCall);
            impl Serialize for Call<'_> {
                fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    let mut m = s.serialize_map(Some(3))?;
                    m.serialize_entry("id", &self.0.id)?;
                    m.serialize_entry("type", "function")?;
                    m.serialize_entry("function", &Function(self.0))?;
                    m.end()
                }
            }
            seq.serialize_element(&Call(c))?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::record::Api;
    use crate::chat::Reasoning;
    use crate::inference::Dialect;
    use crate::inference::request::chat_body;
    use crate::provider::{self, Framing, ModelCall};

    fn fixture_requests() -> Vec<ChatRequest> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/providers/requests");
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
        for dialect in [Dialect::Vllm, Dialect::Sglang] {
            let cfg = BackendConfig::new("b", dialect, vec![], "served");
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
