//! Constrained output through the token-in endpoints (token-faithful
//! serving): what the backend's chat endpoint would compile into a grammar
//! for a request ([`Guided::of`], from the chat body it would get), sent
//! in the token-in endpoint's own fields ([`Guided::apply`]), and the raw
//! output read back into the reply the chat endpoint would have made
//! ([`Reader`]). The rules, from the servers' source (docs/CONSUMERS.md,
//! "Constrained output, token-in"):
//!
//! - `response_format` `json_schema` compiles its schema, `json_object`
//!   any JSON object; the output is the reply's text, parsed as any other
//!   (vLLM `structured_outputs_from_response_format` in
//!   `vllm/entrypoints/generate/base/protocol.py`; SGLang
//!   `to_sampling_params` in `python/sglang/srt/entrypoints/openai/protocol.py`,
//!   `json_object` as the schema `{"type": "object"}`).
//! - vLLM, a named tool choice: the tool's `parameters` schema; the JSON
//!   generated is the call's arguments. `required`: a non-empty array
//!   of `{"name", "parameters"}` objects, `anyOf` one per tool, the
//!   tools' `$defs` moved to the top; each item becomes a call whose
//!   arguments are `json.dumps(parameters, ensure_ascii=False)`
//!   (`get_json_schema_from_tools` in `vllm/tool_parsers/utils.py`; the
//!   chat serving's `TypeAdapter(list[FunctionDefinition])`).
//! - SGLang, both: the array, of the named tool alone for a named choice,
//!   `maxItems` 1 when `parallel_tool_calls` is false, the `$defs`
//!   gathered at the top too (`get_json_schema_constraint` in
//!   `python/sglang/srt/function_call/utils.py`); each item a call, as
//!   vLLM's `required`.
//! - The token-in bodies: vLLM `/v1/completions` takes
//!   `structured_outputs` (`{"json": schema}` or `{"json_object": true}`,
//!   `CompletionRequest` in `vllm/entrypoints/openai/completion/protocol.py`);
//!   SGLang `/generate` takes `sampling_params.json_schema`, the schema as
//!   a JSON string (`python/sglang/srt/sampling/sampling_params.py`).
//!
//! Whether the grammar waits for the reasoning block to end is the
//! server's (its `--reasoning-parser`, which both servers apply to every
//! request, token-in ones included). A forced call's JSON follows the
//! reasoning; the whitespace the reasoning parser leaves before it is not
//! part of the arguments.
//!
//! What is left to the chat endpoint (labelled in the call's record): a
//! request with both structured output and a forced tool choice (the
//! servers disagree on which wins), one whose forced tool is not offered
//! or whose tools' `$defs` clash (the server's error is the harness's
//! answer), and a forced tool choice on a format whose own tool calls are
//! JSON or channels (`llama3_json`, `gpt_oss`), where the forced JSON
//! cannot be told from the format's markup.

use serde_json::{Map, Value, json};

use polar_chat::output::{OutputError, OutputFormat, OutputParser, ParsedCall, ParsedOutput};

use super::Dialect;

/// The schema a constraint compiles.
#[derive(Clone, Debug, PartialEq)]
enum Grammar {
    /// Any JSON object.
    JsonObject,
    /// JSON valid under this schema.
    Json(Value),
}

/// What the constrained output becomes in the reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// The reply's text (structured output).
    Content,
    /// One call of this tool, the output its arguments (vLLM, a named
    /// tool choice).
    Arguments(String),
    /// A JSON array of `{"name", "parameters"}`, one call each.
    Calls,
}

/// A token-in call's constraint.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Guided {
    grammar: Grammar,
    shape: Shape,
}

impl Guided {
    /// The constraint of a chat `body` (as [`crate::request::chat_body`]
    /// makes it) for a `dialect` backend whose output is `format`: `None`
    /// when its output is free; `Err` with why when it goes to the chat
    /// endpoint instead.
    pub(crate) fn of(
        dialect: Dialect,
        format: OutputFormat,
        body: &Value,
    ) -> Result<Option<Self>, String> {
        let choice = forced_choice(body.get("tool_choice"));
        let response_format = body
            .get("response_format")
            .filter(|f| f.get("type").and_then(Value::as_str) != Some("text"));
        match (response_format, choice) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err("constrained output: structured output and a forced tool \
                                       choice together (vLLM and SGLang differ on which wins)"
                .into()),
            (Some(rf), None) => {
                let grammar = match rf.get("type").and_then(Value::as_str) {
                    Some("json_object") => Grammar::JsonObject,
                    Some("json_schema") => match rf.pointer("/json_schema/schema") {
                        Some(s) if s.is_object() || s.is_boolean() => Grammar::Json(s.clone()),
                        _ => {
                            return Err("constrained output: a json_schema without a schema".into());
                        }
                    },
                    other => {
                        return Err(format!("constrained output: response_format {other:?}"));
                    }
                };
                Ok(Some(Self {
                    grammar,
                    shape: Shape::Content,
                }))
            }
            (None, Some(choice)) => {
                if matches!(format, OutputFormat::Llama3Json | OutputFormat::GptOss) {
                    return Err(format!(
                        "constrained output: a forced tool choice in the {} format, whose own \
                         tool calls the forced JSON cannot be told from",
                        format.as_str()
                    ));
                }
                let tools = tools(body);
                let single = body.get("parallel_tool_calls") == Some(&Value::Bool(false));
                forced_guided(dialect, &choice, &tools, single)
                    .map(Some)
                    .map_err(|why| format!("constrained output: {why}"))
            }
        }
    }

    /// Adds the constraint to a token-in `body` of `dialect`.
    pub(crate) fn apply(&self, dialect: Dialect, body: &mut Value) {
        match dialect {
            Dialect::Vllm => {
                let so = match &self.grammar {
                    Grammar::JsonObject => json!({"json_object": true}),
                    Grammar::Json(schema) => json!({"json": schema}),
                };
                body["structured_outputs"] = so;
            }
            Dialect::Sglang => {
                let schema = match &self.grammar {
                    Grammar::JsonObject => json!({"type": "object"}),
                    Grammar::Json(schema) => schema.clone(),
                };
                if let Some(sampling) = body
                    .get_mut("sampling_params")
                    .and_then(Value::as_object_mut)
                {
                    sampling.insert("json_schema".into(), json!(dumps(&schema)));
                }
            }
        }
    }

    /// What the output becomes.
    pub(crate) fn shape(&self) -> &Shape {
        &self.shape
    }
}

/// A required or named tool choice of a chat body.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Choice {
    Required,
    Named(String),
}

fn forced_choice(v: Option<&Value>) -> Option<Choice> {
    match v? {
        Value::String(s) if s == "required" => Some(Choice::Required),
        Value::Object(o) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(|n| Choice::Named(n.to_owned())),
        _ => None,
    }
}

/// The body's tools: name and parameters schema (`None`: none given).
fn tools(body: &Value) -> Vec<(String, Option<Value>)> {
    body.get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    let f = t.get("function")?;
                    let name = f.get("name")?.as_str()?.to_owned();
                    let params = f.get("parameters").filter(|p| !p.is_null()).cloned();
                    Some((name, params))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `{"name": {"enum": [name]}, "parameters": params}` required: one
/// call's schema (both servers' `_get_tool_schema`).
fn call_schema(name: &str, params: Option<&Value>) -> Value {
    let params = params
        .filter(|p| p.as_object().is_some_and(|o| !o.is_empty()))
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    json!({
        "properties": {
            "name": {"type": "string", "enum": [name]},
            "parameters": params,
        },
        "required": ["name", "parameters"],
    })
}

/// The tools' `$defs` gathered (`take`: removed from each tool's
/// parameters, as vLLM does; SGLang leaves them); a name defined twice
/// differently is an error, as both servers say.
fn gather_defs(
    tools: &mut [(String, Option<Value>)],
    take: bool,
) -> Result<Map<String, Value>, String> {
    let mut all = Map::new();
    for (_, params) in tools.iter_mut() {
        let Some(p) = params.as_mut().and_then(Value::as_object_mut) else {
            continue;
        };
        let defs = if take {
            p.remove("$defs")
        } else {
            p.get("$defs").cloned()
        };
        for (name, schema) in defs
            .and_then(|d| d.as_object().cloned())
            .unwrap_or_default()
        {
            if all.get(&name).is_some_and(|s| s != &schema) {
                return Err(format!(
                    "Tool definition '{name}' has multiple schemas, which is not supported."
                ));
            }
            all.insert(name, schema);
        }
    }
    Ok(all)
}

/// The constraint of a forced tool choice.
fn forced_guided(
    dialect: Dialect,
    choice: &Choice,
    tools: &[(String, Option<Value>)],
    single: bool,
) -> Result<Guided, String> {
    if let Choice::Named(name) = choice
        && !tools.iter().any(|(n, _)| n == name)
    {
        return Err(format!("the forced tool '{name}' is not among the tools"));
    }
    if tools.is_empty() {
        return Err("a required tool choice without tools".into());
    }
    let mut tools = tools.to_vec();
    let schema = match (dialect, choice) {
        (Dialect::Vllm, Choice::Named(name)) => {
            let params = tools
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, p)| p.clone())
                .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            return Ok(Guided {
                grammar: Grammar::Json(params),
                shape: Shape::Arguments(name.clone()),
            });
        }
        (Dialect::Sglang, Choice::Named(name)) => {
            let params = tools
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, p)| p.as_ref());
            let mut s = json!({"type": "array", "minItems": 1, "items": call_schema(name, params)});
            if single {
                s["maxItems"] = json!(1);
            }
            s
        }
        (dialect, Choice::Required) => {
            let defs = gather_defs(&mut tools, dialect == Dialect::Vllm)?;
            let any: Vec<Value> = tools
                .iter()
                .map(|(n, p)| call_schema(n, p.as_ref()))
                .collect();
            let mut s = json!({
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "anyOf": any},
            });
            if single && dialect == Dialect::Sglang {
                s["maxItems"] = json!(1);
            }
            if !defs.is_empty() {
                s["$defs"] = Value::Object(defs);
            }
            s
        }
    };
    Ok(Guided {
        grammar: Grammar::Json(schema),
        shape: Shape::Calls,
    })
}

/// `v` as Python's `json.dumps(v, ensure_ascii=False)` writes it: `", "`
/// between items, `": "` after keys, non-ASCII kept.
pub(crate) fn dumps(v: &Value) -> String {
    let compact = v.to_string();
    let mut out = String::with_capacity(compact.len() + compact.len() / 8);
    let (mut in_string, mut escaped) = (false, false);
    for c in compact.chars() {
        out.push(c);
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else if matches!(c, ',' | ':') {
            out.push(' ');
        }
    }
    out
}

/// The calls a forced tool choice's output (its text after the reasoning)
/// makes, as the chat endpoint makes them.
pub(crate) fn forced_calls(shape: &Shape, output: &str) -> Result<Vec<ParsedCall>, &'static str> {
    let output = output.trim();
    match shape {
        Shape::Content => Ok(Vec::new()),
        Shape::Arguments(name) => Ok(vec![ParsedCall {
            name: name.clone(),
            arguments: output.to_owned(),
            done: true,
        }]),
        Shape::Calls => {
            let items: Vec<Value> = serde_json::from_str(output)
                .map_err(|_| "a forced tool choice's output is not a JSON array")?;
            items
                .iter()
                .map(|item| {
                    let name = item
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or("a forced tool call without a name")?;
                    Ok(ParsedCall {
                        name: name.to_owned(),
                        arguments: dumps(item.get("parameters").unwrap_or(&Value::Null)),
                        done: true,
                    })
                })
                .collect()
        }
    }
}

/// A token-in call's raw output read into the reply: by the format's
/// parser, and for a forced tool choice, its text (the JSON) made into
/// tool calls once the output is over.
#[derive(Clone, Debug)]
pub(crate) struct Reader {
    parser: OutputParser,
    forced: Option<Shape>,
    view: ParsedOutput,
}

impl Reader {
    /// A reader of `parser`'s format; `shape` says what a constrained
    /// output becomes (`None`: the parse as it is).
    pub(crate) fn new(parser: OutputParser, shape: Option<&Shape>) -> Self {
        Self {
            parser,
            forced: shape.filter(|s| **s != Shape::Content).cloned(),
            view: ParsedOutput::default(),
        }
    }

    /// Adds generated text.
    pub(crate) fn push(&mut self, text: &str) -> Result<(), OutputError> {
        self.parser.push(text)?;
        self.update()
    }

    /// The output is over.
    pub(crate) fn finish(&mut self) -> Result<(), OutputError> {
        self.parser.finish()?;
        self.update()
    }

    /// Whether the output is over.
    pub(crate) fn is_finished(&self) -> bool {
        self.parser.is_finished()
    }

    /// What the output says so far.
    pub(crate) fn parsed(&self) -> &ParsedOutput {
        match self.forced {
            None => self.parser.parsed(),
            Some(_) => &self.view,
        }
    }

    fn update(&mut self) -> Result<(), OutputError> {
        let Some(shape) = &self.forced else {
            return Ok(());
        };
        let p = self.parser.parsed();
        let more = p
            .reasoning
            .get(self.view.reasoning.len()..)
            .unwrap_or_default();
        self.view.reasoning.push_str(more);
        self.view.reasoning_done = p.reasoning_done;
        if !p.calls.is_empty() {
            return Err(OutputError::MalformedCall {
                at: 0,
                why: "the format's own tool call markup in a forced tool choice's output",
            });
        }
        if self.parser.is_finished() && self.view.calls.is_empty() {
            self.view.calls = forced_calls(shape, &p.content)
                .map_err(|why| OutputError::MalformedCall { at: 0, why })?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "guided_tests.rs"]
mod tests;
