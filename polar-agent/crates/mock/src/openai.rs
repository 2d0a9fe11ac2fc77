//! Reading an OpenAI-shaped chat request as the mock receives it: messages,
//! tools, and the fields that steer the mock (ids wanted, token limit,
//! per-request template switches).
//!
//! Per-request template switches of the mock's own template (a real
//! model's template takes `chat_template_kwargs` only), in increasing
//! precedence over the server flags:
//! - `chat_template_kwargs: {"enable_thinking": false}` in the body sets the
//!   generation glue to `<think>\n\n</think>\n\n` (as Qwen3 does);
//! - the header `x-polar-mock-template` with a JSON object;
//! - the body field `polar_mock` with a JSON object.
//!
//! The object is `{"strip_reasoning": "off" | "before-last-user" | "all",
//! "generation_glue": "<text>"}`; both keys are optional.

use http::HeaderMap;
use serde_json::{Map, Value};

use super::constrain::{Constraint, ToolChoice};
use super::template::{NO_THINK_GLUE, PromptFacts, StripReasoning, TemplateOptions};
use super::{Dialect, HistoryReasoning, MockError};
use polar_chat::{Message, Part, Reasoning, Role, Tool, ToolCall};

/// The header carrying per-request template switches.
pub const TEMPLATE_HEADER: &str = "x-polar-mock-template";
/// The header naming the session.
pub const SESSION_HEADER: &str = "x-polar-session";

/// A chat request as the mock reads it.
#[derive(Clone, Debug)]
pub struct ChatIn {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Tools offered.
    pub tools: Vec<Tool>,
    /// Whether to stream.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `max_completion_tokens` or `max_tokens`.
    pub max_tokens: Option<usize>,
    /// The `user` field.
    pub user: Option<String>,
    /// `logprobs`.
    pub logprobs: bool,
    /// `top_logprobs`.
    pub top_logprobs: usize,
    /// `response_format`, `tool_choice`, `parallel_tool_calls`.
    pub constraint: Constraint,
    /// The whole body, for dialect-specific flags.
    pub body: Map<String, Value>,
}

impl ChatIn {
    /// Parses a request body, reading assistant messages' earlier reasoning
    /// from the field(s) `reasoning` names.
    pub fn parse(body: &[u8], reasoning: HistoryReasoning) -> Result<Self, MockError> {
        let body: Map<String, Value> = serde_json::from_slice(body)
            .map_err(|e| MockError::BadRequest(format!("invalid JSON body: {e}")))?;
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| MockError::BadRequest("`messages` must be an array".into()))?
            .iter()
            .map(|m| message(m, reasoning))
            .collect::<Result<Vec<_>, _>>()?;
        let tools: Vec<Tool> = body
            .get("tools")
            .and_then(Value::as_array)
            .map(|ts| ts.iter().filter_map(tool).collect())
            .unwrap_or_default();
        let constraint = Constraint::parse(&body, &tools)?;
        Ok(Self {
            messages,
            tools,
            constraint,
            stream: flag(&body, "stream"),
            include_usage: body
                .get("stream_options")
                .is_some_and(|o| flag_in(o, "include_usage")),
            max_tokens: ["max_completion_tokens", "max_tokens"]
                .iter()
                .find_map(|k| body.get(*k).and_then(Value::as_u64))
                .map(|n| n as usize),
            user: body.get("user").and_then(Value::as_str).map(str::to_owned),
            logprobs: flag(&body, "logprobs"),
            top_logprobs: body
                .get("top_logprobs")
                .and_then(Value::as_u64)
                .unwrap_or(0) as usize,
            body,
        })
    }

    /// Whether the body sets `key` to `true`.
    pub fn flag(&self, key: &str) -> bool {
        flag(&self.body, key)
    }

    /// The tools the chat template renders: every offered tool, except on
    /// SGLang, whose `OpenAIServingChat._process_messages`
    /// (`python/sglang/srt/entrypoints/openai/serving_chat.py`) renders none
    /// for `tool_choice: "none"` and only the named one for a named choice.
    /// vLLM renders every tool either way.
    pub fn template_tools(&self, dialect: Dialect) -> Vec<Tool> {
        match (dialect, &self.constraint.tool_choice) {
            (Dialect::Sglang, ToolChoice::None) => Vec::new(),
            (Dialect::Sglang, ToolChoice::Named(name)) => self
                .tools
                .iter()
                .filter(|t| &t.name == name)
                .cloned()
                .collect(),
            _ => self.tools.clone(),
        }
    }

    /// The prompt text of this conversation, rendered as a generation of
    /// the server would render it (also what `/tokenize` counts).
    pub fn prompt(
        &self,
        cfg: &super::MockConfig,
        headers: &HeaderMap,
        add_generation_prompt: bool,
    ) -> Result<String, MockError> {
        let opts = template_options(&cfg.template, headers, &self.body)?;
        Ok(super::template::render_prompt(
            &self.messages,
            &self.template_tools(cfg.dialect),
            &opts,
            add_generation_prompt,
        ))
    }
}

impl ChatIn {
    /// The prompt ids of this conversation as the server renders them for
    /// a generation (also what `/tokenize` counts).
    pub fn prompt_ids(
        &self,
        cfg: &super::MockConfig,
        headers: &HeaderMap,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, MockError> {
        Ok(self.rendered(cfg, headers, add_generation_prompt)?.1)
    }

    /// The prompt of this conversation, text and ids: the real model's
    /// template and tokenizer when one is served (the tools SGLang filters
    /// by the tool choice left out), else the mock's.
    pub fn rendered(
        &self,
        cfg: &super::MockConfig,
        headers: &HeaderMap,
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<u32>), MockError> {
        let Some(model) = &cfg.model else {
            let text = self.prompt(cfg, headers, add_generation_prompt)?;
            let ids = super::tokenizer::encode(&text);
            return Ok((text, ids));
        };
        let filter = match (cfg.dialect, &self.constraint.tool_choice) {
            (Dialect::Sglang, ToolChoice::None | ToolChoice::Named(_)) => Some(
                self.template_tools(cfg.dialect)
                    .into_iter()
                    .map(|t| t.name)
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        };
        model.chat_prompt(&self.body, filter.as_deref(), add_generation_prompt)
    }

    /// What the script needs of this conversation: from its messages with
    /// the mock's template; from the rendered prompt with a real model's,
    /// as a token-in request of the same prompt gets them (the same
    /// session, the same turn).
    pub fn facts(&self, cfg: &super::MockConfig, prompt: &str) -> PromptFacts {
        match &cfg.model {
            Some(model) => model.facts(prompt),
            None => PromptFacts::of_messages(&self.messages, &self.template_tools(cfg.dialect)),
        }
    }
}

/// Whether `body[key]` is `true`.
pub fn flag(body: &Map<String, Value>, key: &str) -> bool {
    body.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn flag_in(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// The template options for one request: the server's, overridden as the
/// module docs say.
pub fn template_options(
    base: &TemplateOptions,
    headers: &HeaderMap,
    body: &Map<String, Value>,
) -> Result<TemplateOptions, MockError> {
    let mut opts = base.clone();
    if body
        .get("chat_template_kwargs")
        .and_then(|k| k.get("enable_thinking"))
        .and_then(Value::as_bool)
        == Some(false)
    {
        opts.generation_glue = NO_THINK_GLUE.to_owned();
    }
    if let Some(h) = headers.get(TEMPLATE_HEADER) {
        let v: Value = serde_json::from_slice(h.as_bytes())
            .map_err(|e| MockError::BadRequest(format!("{TEMPLATE_HEADER}: {e}")))?;
        apply(&mut opts, &v)?;
    }
    if let Some(v) = body.get("polar_mock") {
        apply(&mut opts, v)?;
    }
    Ok(opts)
}

fn apply(opts: &mut TemplateOptions, v: &Value) -> Result<(), MockError> {
    let obj = v
        .as_object()
        .ok_or_else(|| MockError::BadRequest("template switches must be a JSON object".into()))?;
    for (k, v) in obj {
        match k.as_str() {
            "strip_reasoning" => {
                opts.strip_reasoning = serde_json::from_value::<StripReasoning>(v.clone())
                    .map_err(|e| MockError::BadRequest(format!("strip_reasoning: {e}")))?;
            }
            "generation_glue" => {
                opts.generation_glue = v
                    .as_str()
                    .ok_or_else(|| {
                        MockError::BadRequest("generation_glue must be a string".into())
                    })?
                    .to_owned();
            }
            other => {
                return Err(MockError::BadRequest(format!(
                    "unknown template switch {other:?}"
                )));
            }
        }
    }
    Ok(())
}

fn message(v: &Value, reasoning: HistoryReasoning) -> Result<Message, MockError> {
    let role = match v.get("role").and_then(Value::as_str) {
        Some("system") => Role::System,
        Some("developer") => Role::Developer,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool" | "function") => Role::Tool,
        other => {
            return Err(MockError::BadRequest(format!(
                "unknown message role {other:?}"
            )));
        }
    };
    let mut m = Message::text(role, "");
    m.content = match v.get("content") {
        Some(Value::String(s)) => vec![Part::Text {
            text: s.as_str().into(),
        }],
        Some(Value::Array(parts)) => parts.iter().map(part).collect(),
        _ => Vec::new(),
    };
    m.reasoning = reasoning
        .keys()
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .map(|text| Reasoning {
            text: text.to_owned(),
            ..Reasoning::default()
        });
    m.tool_calls = v
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| calls.iter().filter_map(tool_call).collect())
        .unwrap_or_default();
    m.tool_call_id = v
        .get("tool_call_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    m.name = v.get("name").and_then(Value::as_str).map(str::to_owned);
    Ok(m)
}

fn part(v: &Value) -> Part {
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Part::Text {
            text: v
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .into(),
        },
        Some("image_url") => Part::Image {
            media_type: None,
            data: None,
            url: v
                .pointer("/image_url/url")
                .and_then(Value::as_str)
                .map(str::to_owned),
        },
        _ => Part::Other { value: v.clone() },
    }
}

fn tool_call(v: &Value) -> Option<ToolCall> {
    let f = v.get("function")?;
    Some(ToolCall {
        id: v
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        name: f.get("name")?.as_str()?.to_owned(),
        arguments: match f.get("arguments") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => "{}".to_owned(),
        },
    })
}

fn tool(v: &Value) -> Option<Tool> {
    let f = v.get("function")?;
    Some(Tool {
        name: f.get("name")?.as_str()?.to_owned(),
        description: f
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned),
        parameters: polar_json::RawJson::from_value(f.get("parameters").unwrap_or(&Value::Null)),
    })
}

/// A chat request parsed, rendered through the template, tokenized and
/// admitted for generation, with the ids its tool calls will carry; or the
/// response to send instead (paused, overloaded, too long).
pub async fn admit_chat(
    state: &std::sync::Arc<super::server::State>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<
    Result<(ChatIn, super::server::Admitted, Vec<String>), http::Response<super::body::RespBody>>,
    super::MockError,
> {
    let req = ChatIn::parse(body, state.cfg.history_reasoning())?;
    let (prompt, prompt_ids) = req.rendered(&state.cfg, headers, true)?;
    let gen_req = super::server::GenRequest {
        headers,
        user: req.user.as_deref(),
        facts: req.facts(&state.cfg, &prompt),
        prompt_ids,
        max_tokens: req.max_tokens,
        constraint: req.constraint.clone(),
    };
    let adm = match state.admit(gen_req).await {
        Ok(a) => a,
        Err(resp) => return Ok(Err(resp)),
    };
    // A streamed reply may start a call its whole reply has not (an abort
    // inside it).
    let call_ids = adm
        .generation
        .streamed()
        .tool_calls
        .iter()
        .map(|_| adm.call_id())
        .collect();
    Ok(Ok((req, adm, call_ids)))
}
