//! The normalized request as the backend's OpenAI-chat JSON: messages with
//! tool calls, tool results and earlier reasoning (in the field the server
//! reads, [`BackendConfig::reasoning_field`]), tools as
//! functions, sampling with the policy applied and `max_tokens` clamped, the
//! model name mapped, structured output as `response_format` (both
//! dialects' constrained decoding), and the dialect's token-id flags.

use serde_json::{Map, Value, json};

use super::{BackendConfig, Dialect, ReasoningField, SamplingMode};
use polar_chat::{ChatRequest, Message, Part, ResponseFormat, Role, ToolChoice};

/// Fields of `ChatRequest::extra` passed on to the backend as they are
/// (`parallel_tool_calls`: OpenAI's own field, or Anthropic's
/// `tool_choice.disable_parallel_tool_use` read into it; both dialects
/// take it).
pub const FORWARDED_EXTRA: [&str; 3] =
    ["chat_template_kwargs", "polar_mock", "parallel_tool_calls"];

/// Whether calls to this dialect stream upstream (vLLM streams with ids;
/// SGLang gives ids only without streaming).
pub fn streams_upstream(dialect: Dialect) -> bool {
    dialect == Dialect::Vllm
}

/// The JSON body of `POST /v1/chat/completions` for `req` (see
/// [`super::wire::chat_body_bytes`] for the same body serialized directly).
pub fn chat_body(cfg: &BackendConfig, req: &ChatRequest, mode: SamplingMode) -> Value {
    body_with(cfg, req, mode, Conversation::Tree)
}

/// How [`body_with`] renders the conversation (`messages` and `tools`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Conversation {
    /// As JSON trees.
    Tree,
    /// As `null` placeholders, keeping their places, for a writer that
    /// renders them itself.
    Placeholders,
}

/// The body, with the conversation rendered as `conversation` says.
pub(super) fn body_with(
    cfg: &BackendConfig,
    req: &ChatRequest,
    mode: SamplingMode,
    conversation: Conversation,
) -> Value {
    let tree = conversation == Conversation::Tree;
    let mut body = Map::new();
    body.insert("model".into(), json!(cfg.map_model(&req.model)));
    let reasoning = cfg.reasoning_field();
    let messages = if tree {
        Value::Array(req.messages.iter().map(|m| message(m, reasoning)).collect())
    } else {
        Value::Null
    };
    body.insert("messages".into(), messages);
    if !req.tools.is_empty() && !tree {
        body.insert("tools".into(), Value::Null);
    } else if !req.tools.is_empty() {
        let tools = req
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), json!(t.name));
                if let Some(d) = &t.description {
                    f.insert("description".into(), json!(d));
                }
                f.insert("parameters".into(), t.parameters.to_value());
                json!({"type": "function", "function": f})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = &req.tool_choice {
        let v = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Tool { name } => json!({"type": "function", "function": {"name": name}}),
        };
        body.insert("tool_choice".into(), v);
    }
    if let Some(format) = &req.response_format {
        body.insert("response_format".into(), response_format(format));
    }
    sampling(cfg, req, mode, &mut body);
    let stream = streams_upstream(cfg.dialect);
    body.insert("stream".into(), json!(stream));
    match cfg.dialect {
        Dialect::Vllm => {
            body.insert("stream_options".into(), json!({"include_usage": true}));
            body.insert("return_token_ids".into(), json!(true));
            body.insert("logprobs".into(), json!(true));
            body.insert("top_logprobs".into(), json!(0));
        }
        Dialect::Sglang => {
            body.insert("return_prompt_token_ids".into(), json!(true));
            body.insert("return_meta_info".into(), json!(true));
            body.insert("logprobs".into(), json!(true));
        }
    }
    for key in FORWARDED_EXTRA {
        if let Some(v) = req.extra.get(key) {
            body.insert(key.into(), v.clone());
        }
    }
    Value::Object(body)
}

/// The structured output as both dialects' constrained decoding reads it:
/// the OpenAI `response_format` field (vLLM's `ResponseFormat`, SGLang's
/// `ResponseFormat` in `sglang/srt/entrypoints/openai/protocol.py`).
fn response_format(format: &ResponseFormat) -> Value {
    match format {
        ResponseFormat::JsonObject => json!({"type": "json_object"}),
        ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
        } => {
            let mut js = Map::new();
            js.insert("name".into(), json!(name));
            js.insert("schema".into(), schema.clone());
            if let Some(s) = strict {
                js.insert("strict".into(), json!(s));
            }
            json!({"type": "json_schema", "json_schema": js})
        }
    }
}

fn sampling(
    cfg: &BackendConfig,
    req: &ChatRequest,
    mode: SamplingMode,
    body: &mut Map<String, Value>,
) {
    let s = &req.sampling;
    let o = cfg.sampling.overrides(mode);
    if let Some(t) = o.temperature.or(s.temperature) {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = o.top_p.or(s.top_p) {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(seed) = s.seed {
        body.insert("seed".into(), json!(seed));
    }
    if let Some(k) = o.top_k.or(s.top_k.map(i64::from)) {
        body.insert("top_k".into(), json!(k));
    }
    let max = match (s.max_tokens, cfg.max_tokens_clamp) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    };
    if let Some(m) = max {
        body.insert("max_tokens".into(), json!(m));
    }
    if !s.stop.is_empty() {
        body.insert("stop".into(), json!(s.stop));
    }
}

pub(crate) fn message(m: &Message, reasoning: ReasoningField) -> Value {
    let role = match m.role {
        Role::System | Role::Developer => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut out = Map::new();
    out.insert("role".into(), json!(role));
    let content = content(&m.content);
    let empty = matches!(&content, Value::String(s) if s.is_empty());
    if m.role == Role::Assistant && empty && !m.tool_calls.is_empty() {
        out.insert("content".into(), Value::Null);
    } else {
        out.insert("content".into(), content);
    }
    if let Some(text) = sent_reasoning(m) {
        for key in reasoning.keys() {
            out.insert((*key).into(), json!(text));
        }
    }
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), json!(id));
    }
    if m.role == Role::Tool
        && let Some(name) = &m.name
    {
        out.insert("name".into(), json!(name));
    }
    Value::Object(out)
}

/// Text-only content as a string, anything else as a list of parts.
fn content(parts: &[Part]) -> Value {
    if parts.iter().all(|p| matches!(p, Part::Text { .. })) {
        let text: String = parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        return json!(text);
    }
    Value::Array(
        parts
            .iter()
            .map(|p| match p {
                Part::Text { text } => json!({"type": "text", "text": text}),
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
                    json!({"type": "image_url", "image_url": {"url": url}})
                }
                Part::Other { value } => value.clone(),
            })
            .collect(),
    )
}

/// The reasoning of `m` the backend is sent (in the configured field):
/// none without text (Gemini CLI's `thoughtSignature` sentinel on a turn
/// that had no thought), since an empty `reasoning_content` makes a
/// template that tests for the key render an empty think block the model
/// never generated.
pub(crate) fn sent_reasoning(m: &Message) -> Option<&str> {
    m.reasoning
        .as_ref()
        .map(|r| r.text.as_str())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::SamplingOverrides;
    use polar_chat::{Reasoning, Tool, ToolCall};

    fn conversation() -> ChatRequest {
        let mut assistant = Message::text(Role::Assistant, "");
        assistant.reasoning = Some(Reasoning {
            text: "think".into(),
            ..Reasoning::default()
        });
        assistant.tool_calls = vec![ToolCall {
            id: "call_9".into(),
            name: "bash".into(),
            arguments: r#"{"command":"ls"}"#.into(),
        }];
        let mut result = Message::text(Role::Tool, "a.txt");
        result.tool_call_id = Some("call_9".into());
        result.name = Some("bash".into());
        let mut extra = Map::new();
        extra.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": false}),
        );
        extra.insert("metadata".into(), json!({"user_id": "secret"}));
        ChatRequest {
            model: "gpt-5".into(),
            messages: vec![
                Message::text(Role::Developer, "rules"),
                Message {
                    content: vec![
                        Part::Text {
                            text: "look".into(),
                        },
                        Part::Image {
                            media_type: Some("image/jpeg".into()),
                            data: Some("AAA".into()),
                            url: None,
                        },
                    ],
                    ..Message::text(Role::User, "")
                },
                assistant,
                result,
            ],
            tools: vec![Tool {
                name: "bash".into(),
                description: None,
                parameters: polar_json::RawJson::from_value(&json!({"type": "object"})),
            }],
            tool_choice: Some(ToolChoice::Tool {
                name: "bash".into(),
            }),
            response_format: None,
            sampling: polar_chat::Sampling {
                max_tokens: Some(50_000),
                temperature: Some(0.2),
                top_p: None,
                top_k: Some(20),
                stop: vec!["END".into()],
                seed: None,
            },
            stream: false,
            extra,
        }
    }

    #[test]
    fn vllm_body_asks_for_ids_and_applies_the_policy() {
        let mut cfg = BackendConfig::new(
            "b",
            Dialect::Vllm,
            vec!["http://127.0.0.1:1".into()],
            "Qwen/Qwen3-8B",
        );
        cfg.max_tokens_clamp = Some(8192);
        cfg.sampling.train = SamplingOverrides {
            temperature: Some(1.0),
            top_p: Some(1.0),
            top_k: Some(-1),
        };
        let body = chat_body(&cfg, &conversation(), SamplingMode::Train);
        assert_eq!(body["model"], "Qwen/Qwen3-8B");
        assert_eq!(
            (
                body["temperature"].clone(),
                body["top_p"].clone(),
                body["top_k"].clone()
            ),
            (json!(1.0), json!(1.0), json!(-1))
        );
        assert_eq!(body["max_tokens"], 8192);
        assert_eq!(body["stop"], json!(["END"]));
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert_eq!(
            (
                body["return_token_ids"].clone(),
                body["logprobs"].clone(),
                body["top_logprobs"].clone()
            ),
            (json!(true), json!(true), json!(0))
        );
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        assert!(
            body.get("metadata").is_none(),
            "unknown harness fields stay behind"
        );
        let m = &body["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "rules"}));
        assert_eq!(
            m[1]["content"][1],
            json!({"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAA"}})
        );
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(m[2]["reasoning"], "think", "vLLM reads `reasoning`");
        assert!(m[2].get("reasoning_content").is_none());
        assert_eq!(
            m[2]["tool_calls"][0],
            json!({"id": "call_9", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}})
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "content": "a.txt", "tool_call_id": "call_9", "name": "bash"})
        );
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}])
        );
        assert_eq!(
            body["tool_choice"],
            json!({"type": "function", "function": {"name": "bash"}})
        );
    }

    /// Gemini CLI sends `thoughtSignature` on a function call whose turn had
    /// no thought: reasoning without text, never sent as an empty
    /// `reasoning_content` (a template testing for the key would render a
    /// think block the model never generated, and the next prompt would
    /// not continue the last reply).
    #[test]
    fn reasoning_without_text_is_not_sent() {
        let cfg = BackendConfig::new(
            "b",
            Dialect::Vllm,
            vec!["http://127.0.0.1:1".into()],
            "served",
        );
        let mut req = conversation();
        for m in &mut req.messages {
            if let Some(r) = &mut m.reasoning {
                r.text.clear();
                r.signature = Some("skip_thought_signature_validator".into());
            }
        }
        let body = chat_body(&cfg, &req, SamplingMode::Train);
        let messages = body["messages"].as_array().unwrap();
        assert!(
            messages
                .iter()
                .all(|m| m.get("reasoning_content").is_none() && m.get("reasoning").is_none())
        );
        assert!(messages.iter().any(|m| m.get("tool_calls").is_some()));
    }

    /// Earlier reasoning goes in the field the backend's setting names (by
    /// default the one its dialect's server reads), in the tree and in the
    /// bytes alike; `none` sends none; other messages carry no field.
    #[test]
    fn reasoning_goes_in_the_configured_field() {
        for (dialect, setting, want) in [
            (Dialect::Vllm, None, &["reasoning"][..]),
            (Dialect::Sglang, None, &["reasoning_content"][..]),
            (
                Dialect::Vllm,
                Some(ReasoningField::ReasoningContent),
                &["reasoning_content"][..],
            ),
            (
                Dialect::Sglang,
                Some(ReasoningField::Reasoning),
                &["reasoning"][..],
            ),
            (
                Dialect::Vllm,
                Some(ReasoningField::Both),
                &["reasoning", "reasoning_content"][..],
            ),
            (Dialect::Sglang, Some(ReasoningField::None), &[][..]),
        ] {
            let mut cfg = BackendConfig::new("b", dialect, vec!["http://127.0.0.1:1".into()], "m");
            cfg.reasoning_field = setting;
            let req = conversation();
            let tree = chat_body(&cfg, &req, SamplingMode::Train);
            let bytes = crate::wire::chat_body_bytes(&cfg, &req, SamplingMode::Train);
            let parsed: Value = serde_json::from_slice(&bytes).unwrap();
            for body in [&tree, &parsed] {
                let m = body["messages"].as_array().unwrap();
                for key in ["reasoning", "reasoning_content"] {
                    let sent: Vec<usize> =
                        (0..m.len()).filter(|&i| m[i].get(key).is_some()).collect();
                    let expected: Vec<usize> = if want.contains(&key) { vec![2] } else { vec![] };
                    assert_eq!(sent, expected, "{dialect:?} {setting:?} {key}");
                }
                for key in want {
                    assert_eq!(m[2][*key], "think");
                }
            }
        }
    }

    #[test]
    fn sglang_body_and_eval_mode() {
        let mut cfg = BackendConfig::new(
            "b",
            Dialect::Sglang,
            vec!["http://127.0.0.1:1".into()],
            "served",
        );
        cfg.model_map.insert("gpt-5".into(), "other-served".into());
        cfg.sampling.eval = SamplingOverrides {
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: None,
        };
        let body = chat_body(&cfg, &conversation(), SamplingMode::Eval);
        assert_eq!(body["model"], "other-served");
        assert_eq!(
            (
                body["temperature"].clone(),
                body["top_p"].clone(),
                body["top_k"].clone()
            ),
            (json!(0.6), json!(0.95), json!(20))
        );
        assert_eq!(body["max_tokens"], 50_000);
        assert_eq!(body["stream"], false);
        assert!(body.get("stream_options").is_none());
        assert_eq!(
            (
                body["return_prompt_token_ids"].clone(),
                body["return_meta_info"].clone()
            ),
            (json!(true), json!(true))
        );
    }

    /// Structured output reaches both dialects as `response_format`, the
    /// field their constrained decoding reads; none without a constraint.
    #[test]
    fn structured_output_is_passed_to_both_dialects() {
        let schema = json!({"type": "object", "properties": {"title": {"type": "string"}}});
        for dialect in [Dialect::Vllm, Dialect::Sglang] {
            let cfg = BackendConfig::new("b", dialect, vec!["http://127.0.0.1:1".into()], "m");
            let mut req = conversation();
            assert!(
                chat_body(&cfg, &req, SamplingMode::Train)
                    .get("response_format")
                    .is_none()
            );
            req.response_format = Some(ResponseFormat::JsonSchema {
                name: "title".into(),
                schema: schema.clone(),
                strict: Some(true),
            });
            let body = chat_body(&cfg, &req, SamplingMode::Train);
            assert_eq!(
                body["response_format"],
                json!({"type": "json_schema", "json_schema": {"name": "title", "schema": schema, "strict": true}})
            );
            let bytes = crate::wire::chat_body_bytes(&cfg, &req, SamplingMode::Train);
            let parsed: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(parsed["response_format"], body["response_format"]);
            req.response_format = Some(ResponseFormat::JsonObject);
            req.extra.insert("parallel_tool_calls".into(), json!(false));
            let body = chat_body(&cfg, &req, SamplingMode::Train);
            assert_eq!(body["response_format"], json!({"type": "json_object"}));
            assert_eq!(body["parallel_tool_calls"], false);
        }
    }

    /// Every tool choice reaches both dialects in the OpenAI form their
    /// `ChatCompletionRequest.tool_choice` reads (`"auto"`, `"none"`,
    /// `"required"`, a named function), with `parallel_tool_calls`.
    #[test]
    fn tool_choices_reach_both_dialects() {
        for dialect in [Dialect::Vllm, Dialect::Sglang] {
            let cfg = BackendConfig::new("b", dialect, vec!["http://127.0.0.1:1".into()], "m");
            for (choice, want) in [
                (ToolChoice::Auto, json!("auto")),
                (ToolChoice::None, json!("none")),
                (ToolChoice::Required, json!("required")),
                (
                    ToolChoice::Tool {
                        name: "bash".into(),
                    },
                    json!({"type": "function", "function": {"name": "bash"}}),
                ),
            ] {
                let mut req = conversation();
                req.tool_choice = Some(choice);
                req.extra.insert("parallel_tool_calls".into(), json!(false));
                let body = chat_body(&cfg, &req, SamplingMode::Train);
                assert_eq!(body["tool_choice"], want, "{dialect:?}");
                assert_eq!(body["parallel_tool_calls"], false);
                let bytes = crate::wire::chat_body_bytes(&cfg, &req, SamplingMode::Train);
                let parsed: Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(parsed["tool_choice"], want, "{dialect:?} (wire)");
            }
        }
    }
}
