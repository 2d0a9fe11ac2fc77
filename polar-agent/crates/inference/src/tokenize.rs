//! Token counts from the backend's own tokenizer and served chat template,
//! for the harness's `count_tokens` (Anthropic) and `countTokens` (Gemini):
//! the conversation as the chat endpoint would render it (messages, tools,
//! the generation prompt), tokenized by the server, so the count equals the
//! `prompt_token_ids` length of a real call with the same request.
//!
//! | dialect | endpoint | body | answer |
//! | --- | --- | --- | --- |
//! | vLLM | `POST /tokenize` | `TokenizeChatRequest` (`vllm/entrypoints/openai/protocol.py`): `model`, `messages`, `tools`, `add_generation_prompt: true`, `chat_template_kwargs` | `{count, max_model_len, tokens, token_strs}` |
//! | SGLang | `POST /v1/tokenize` | `TokenizeRequest` (`python/sglang/srt/entrypoints/openai/protocol.py`): `model`, `messages`, `tools`, `tool_choice`, `chat_template_kwargs` (rendered by the chat path, generation prompt included; no `add_generation_prompt` field) | `TokenizeResponse` `{tokens, count, max_model_len}` |
//!
//! Older SGLang releases only tokenize a `prompt` string and refuse
//! `messages` (HTTP 400 or 422): the caller then falls back to its estimate and
//! says so (see `x-polar-token-count` in the agent).

use serde_json::{Map, Value, json};

use super::request::{Conversation, body_with};
use super::{BackendConfig, Dialect, SamplingMode};
use polar_chat::ChatRequest;

/// The path of the tokenize endpoint of `dialect`.
pub fn tokenize_path(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Vllm => "/tokenize",
        Dialect::Sglang => "/v1/tokenize",
    }
}

/// The JSON body asking the backend to count `req`'s prompt: the same
/// messages, tools and template switches the chat body carries (see
/// [`super::request::chat_body`]), with the dialect's tokenize fields.
pub fn tokenize_body(cfg: &BackendConfig, req: &ChatRequest) -> Value {
    let chat = body_with(cfg, req, SamplingMode::Train, Conversation::Tree);
    let mut out = Map::new();
    for key in [
        "model",
        "messages",
        "tools",
        "chat_template_kwargs",
        "polar_mock",
    ] {
        if let Some(v) = chat.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    match cfg.dialect {
        Dialect::Vllm => {
            out.insert("add_generation_prompt".into(), json!(true));
        }
        Dialect::Sglang => {
            // SGLang renders only the named tool (none for `none`), so its
            // count needs the choice (`TokenizeRequest.tool_choice`).
            if let Some(choice) = chat.get("tool_choice") {
                out.insert("tool_choice".into(), choice.clone());
            }
        }
    }
    Value::Object(out)
}

/// The count of a tokenize answer: `count`, checked against the length of
/// `tokens` when both are there.
pub fn parse_count(body: &[u8]) -> Result<u64, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("tokenize answer is not JSON: {e}"))?;
    let tokens = v.get("tokens").and_then(Value::as_array).map(Vec::len);
    match (v.get("count").and_then(Value::as_u64), tokens) {
        (Some(c), Some(t)) if c != t as u64 => Err(format!(
            "tokenize answer says count {c} but carries {t} tokens"
        )),
        (Some(c), _) => Ok(c),
        (None, Some(t)) => Ok(t as u64),
        (None, None) => Err("tokenize answer has neither `count` nor `tokens`".into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use polar_chat::{Message, Role, Tool, ToolChoice};

    fn request() -> ChatRequest {
        let mut extra = Map::new();
        extra.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": false}),
        );
        extra.insert("metadata".into(), json!({"user_id": "u"}));
        ChatRequest {
            model: "claude-x".into(),
            messages: vec![
                Message::text(Role::System, "rules"),
                Message::text(Role::User, "hi"),
            ],
            tools: vec![Tool {
                name: "bash".into(),
                description: Some("run".into()),
                parameters: polar_json::RawJson::from_value(&json!({"type": "object"})),
            }],
            tool_choice: Some(ToolChoice::None),
            response_format: None,
            sampling: polar_chat::Sampling {
                max_tokens: Some(100),
                temperature: Some(0.5),
                ..polar_chat::Sampling::default()
            },
            stream: true,
            extra,
        }
    }

    /// vLLM's `TokenizeChatRequest`: messages and tools as the chat body
    /// has them, `add_generation_prompt: true`; nothing of sampling.
    #[test]
    fn vllm_tokenize_chat_request_fields() {
        let cfg = BackendConfig::new(
            "b",
            Dialect::Vllm,
            vec!["http://127.0.0.1:1".into()],
            "served",
        );
        let body = tokenize_body(&cfg, &request());
        let chat = super::super::request::chat_body(&cfg, &request(), SamplingMode::Train);
        assert_eq!(tokenize_path(Dialect::Vllm), "/tokenize");
        assert_eq!(body["model"], "served");
        assert_eq!(body["messages"], chat["messages"]);
        assert_eq!(body["tools"], chat["tools"]);
        assert_eq!(body["add_generation_prompt"], true);
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        for absent in [
            "tool_choice",
            "max_tokens",
            "temperature",
            "stream",
            "metadata",
            "return_token_ids",
        ] {
            assert!(body.get(absent).is_none(), "{absent}");
        }
    }

    /// SGLang's `TokenizeRequest`: no `add_generation_prompt` field (the
    /// chat path adds it), but the tool choice, which changes the tools
    /// its template renders.
    #[test]
    fn sglang_tokenize_request_fields() {
        let cfg = BackendConfig::new(
            "b",
            Dialect::Sglang,
            vec!["http://127.0.0.1:1".into()],
            "served",
        );
        let body = tokenize_body(&cfg, &request());
        assert_eq!(tokenize_path(Dialect::Sglang), "/v1/tokenize");
        assert_eq!(body["tool_choice"], "none");
        assert!(body.get("add_generation_prompt").is_none());
        assert_eq!(
            body["messages"][1],
            json!({"role": "user", "content": "hi"})
        );
    }

    #[test]
    fn counts_are_read_and_checked() {
        assert_eq!(
            parse_count(br#"{"count": 3, "tokens": [1, 2, 3], "max_model_len": 9}"#),
            Ok(3)
        );
        assert_eq!(parse_count(br#"{"tokens": [1, 2]}"#), Ok(2));
        assert_eq!(parse_count(br#"{"count": 7}"#), Ok(7));
        assert!(parse_count(br#"{"count": 2, "tokens": [1]}"#).is_err());
        assert!(parse_count(br#"{"object": "error"}"#).is_err());
        assert!(parse_count(b"nope").is_err());
    }
}
