//! What vLLM's and SGLang's constrained decoding does to a reply, imitated
//! deterministically: `response_format` (`json_object`, `json_schema`)
//! makes the reply a JSON text valid against the schema, and `tool_choice`
//! (`none`, `auto`, `required`, a named function) with
//! `parallel_tool_calls` decides which tool calls the reply may carry.
//!
//! A request without `response_format` keeps the policy's plan (the
//! script or the built-in policy), filtered by the tool choice. A request
//! with it is answered with JSON generated from the schema and never
//! consults the policy, so side calls asking for JSON do not move a
//! script's cursor. As in SGLang's `to_sampling_params`
//! (`python/sglang/srt/entrypoints/openai/protocol.py`), a
//! `response_format` wins over tool calls.
//!
//! The generated value ([`value_for`]): `const`, else the first `enum`
//! value, else by `type` (the first non-null one of a list; inferred from
//! `properties` / `items` when absent): objects carry every declared
//! property (required ones first when `maxProperties` cuts), arrays
//! `max(minItems, 1)` items (at most `maxItems`; `prefixItems` first),
//! strings the property's name (a fixed value for the common `format`s),
//! padded or cut to `minLength` / `maxLength`, numbers the smallest value
//! the bounds and `multipleOf` allow (else 0), booleans `false`. `$ref`s
//! into the same schema (`#/$defs/...`, `#/definitions/...`), `allOf`
//! (objects merged), `anyOf` and `oneOf` (the first branch) are followed.
//! A `pattern` on a string, a `not`, or a `$ref` that leaves the schema
//! cannot be honoured by this imitation: the request gets 400, as a
//! backend answers a constraint it cannot compile.

use serde_json::{Map, Value, json};

use super::Dialect;
use super::MockError;
use super::forced::Forced;
use super::script::Plan;
use polar_chat::Tool;

/// How deep a schema may nest (`$ref` cycles end here).
const MAX_DEPTH: usize = 32;
/// The longest string and array generated (`minLength`, `minItems`).
const MAX_GENERATED: usize = 100_000;

/// The structured output a request asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponseFormat {
    /// `{"type": "json_object"}`: any JSON object.
    JsonObject,
    /// `{"type": "json_schema", "json_schema": {"schema": ...}}`.
    JsonSchema(Value),
    /// One of these strings (vLLM's `structured_outputs.choice`, token-in
    /// only: [`crate::guided`]).
    Choice(Vec<String>),
}

/// The request's `tool_choice`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// `auto` (the default when tools are offered).
    #[default]
    Auto,
    /// `none`: no tool call.
    None,
    /// `required` (OpenAI) or `any`: at least one tool call.
    Required,
    /// `{"type": "function", "function": {"name": N}}`: a call of `N`.
    Named(String),
}

/// What constrains one reply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Constraint {
    /// `response_format` (`text` and absent are `None`).
    pub response_format: Option<ResponseFormat>,
    /// `tool_choice`.
    pub tool_choice: ToolChoice,
    /// `parallel_tool_calls: false` keeps at most one call.
    pub single_call: bool,
}

impl Constraint {
    /// Reads `response_format`, `tool_choice` and `parallel_tool_calls`
    /// of a chat request body, and checks the tool choice against the
    /// offered tools as both servers do (SGLang's `_validate_request` in
    /// `serving_chat.py`; vLLM's `ChatCompletionRequest` validators).
    pub fn parse(body: &Map<String, Value>, tools: &[Tool]) -> Result<Self, MockError> {
        let bad = MockError::BadRequest;
        let response_format = match body.get("response_format") {
            None | Some(Value::Null) => None,
            Some(rf) => match rf.get("type").and_then(Value::as_str) {
                Some("text") => None,
                Some("json_object") => Some(ResponseFormat::JsonObject),
                Some("json_schema") => {
                    let schema = rf
                        .pointer("/json_schema/schema")
                        .filter(|s| s.is_object() || s.is_boolean())
                        .ok_or_else(|| {
                            bad(
                                "schema_ is required for json_schema response format request."
                                    .into(),
                            )
                        })?;
                    Some(ResponseFormat::JsonSchema(schema.clone()))
                }
                other => {
                    return Err(bad(format!(
                        "response_format type {other:?} is not supported"
                    )));
                }
            },
        };
        let tool_choice = match body.get("tool_choice") {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => return Err(bad(format!("tool_choice {other:?} is not supported"))),
            },
            Some(v) => {
                let name = v
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("tool_choice must name a function".into()))?;
                ToolChoice::Named(name.to_owned())
            }
        };
        match &tool_choice {
            ToolChoice::Required if tools.is_empty() => {
                return Err(bad(
                    "Tools cannot be empty if tool choice is set to required.".into(),
                ));
            }
            ToolChoice::Named(_) if tools.is_empty() => {
                return Err(bad(
                    "Tools cannot be empty if tool choice is set to a specific tool.".into(),
                ));
            }
            ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => {
                return Err(bad(format!("Tool '{name}' not found in tools list.")));
            }
            _ => {}
        }
        Ok(Self {
            response_format,
            tool_choice,
            single_call: body.get("parallel_tool_calls").and_then(Value::as_bool) == Some(false),
        })
    }

    /// The plan of a structured reply: the JSON text the schema allows, no
    /// tool calls. `None` without `response_format`.
    pub fn structured_plan(&self) -> Result<Option<Plan>, MockError> {
        let value = match &self.response_format {
            None => return Ok(None),
            Some(ResponseFormat::JsonObject) => json!({}),
            Some(ResponseFormat::JsonSchema(schema)) => {
                value_for(schema, schema, "", 0, 0).map_err(MockError::BadRequest)?
            }
            Some(ResponseFormat::Choice(choices)) => {
                return Ok(Some(Plan {
                    text: choices.first().cloned().unwrap_or_default(),
                    ..Plan::default()
                }));
            }
        };
        Ok(Some(Plan {
            text: value.to_string(),
            ..Plan::default()
        }))
    }

    /// Filters a policy's plan by the tool choice: `none` drops every call
    /// (answering `done` when nothing else is left), `required` and a named
    /// tool add a call when the plan has none (arguments generated from the
    /// tool's parameter schema) and mark the plan forced (its calls are
    /// generated as bare JSON, its text dropped), a named tool keeps only
    /// its first call, and `parallel_tool_calls: false` keeps the first.
    pub fn apply_tools(
        &self,
        plan: &mut Plan,
        tools: &[Tool],
        dialect: Dialect,
    ) -> Result<(), MockError> {
        match &self.tool_choice {
            ToolChoice::Auto => {}
            ToolChoice::None => {
                plan.tool_calls.clear();
                if plan.text.is_empty() {
                    "done".clone_into(&mut plan.text);
                }
            }
            ToolChoice::Required => {
                if plan.tool_calls.is_empty()
                    && let Some(tool) = tools.first()
                {
                    plan.tool_calls.push(forced_call(tool)?);
                }
                plan.forced = Some(Forced::Array);
            }
            ToolChoice::Named(name) => {
                plan.tool_calls.retain(|(n, _)| n == name);
                if plan.tool_calls.is_empty()
                    && let Some(tool) = tools.iter().find(|t| &t.name == name)
                {
                    plan.tool_calls.push(forced_call(tool)?);
                }
                plan.tool_calls.truncate(1);
                plan.forced = Some(match dialect {
                    Dialect::Vllm => Forced::Arguments,
                    Dialect::Sglang => Forced::Array,
                });
            }
        }
        if self.single_call {
            plan.tool_calls.truncate(1);
        }
        Ok(())
    }
}

/// A call of `tool` with arguments generated from its parameter schema.
fn forced_call(tool: &Tool) -> Result<(String, String), MockError> {
    let schema = tool.parameters.to_value();
    let schema = if schema.is_null() {
        json!({"type": "object"})
    } else {
        schema
    };
    let args = value_for(&schema, &schema, "", 0, 0)
        .map_err(|e| MockError::BadRequest(format!("tool {}: {e}", tool.name)))?;
    Ok((tool.name.clone(), args.to_string()))
}

/// A value valid against `schema` (part of `root`), for a property named
/// `name` (empty at the top), the `index`-th item of its array.
pub fn value_for(
    schema: &Value,
    root: &Value,
    name: &str,
    index: usize,
    depth: usize,
) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("the schema nests deeper than {MAX_DEPTH} levels"));
    }
    let s = match schema {
        Value::Bool(true) => return Ok(json!({})),
        Value::Bool(false) => return Err("the schema `false` allows no value".into()),
        Value::Object(s) => s,
        _ => return Err(format!("a schema must be an object, not {schema}")),
    };
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let target = r
            .strip_prefix('#')
            .and_then(|p| root.pointer(p))
            .ok_or_else(|| format!("$ref {r:?} does not point into the schema"))?;
        return value_for(target, root, name, index, depth + 1);
    }
    if s.contains_key("not") {
        return Err("`not` cannot be honoured by the mock's constrained decoding".into());
    }
    if let Some(c) = s.get("const") {
        return Ok(c.clone());
    }
    if let Some(first) = s
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return Ok(first.clone());
    }
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        return value_for(&merge_all_of(s, all, root)?, root, name, index, depth + 1);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(first) = s.get(key).and_then(Value::as_array).and_then(|b| b.first()) {
            return value_for(first, root, name, index, depth + 1);
        }
    }
    match type_of(s).as_str() {
        "object" => object(s, root, depth),
        "array" => array(s, root, name, depth),
        "string" => string(s, name, index),
        "integer" => Ok(number(s, index, true)),
        "number" => Ok(number(s, index, false)),
        "boolean" => Ok(json!(false)),
        "null" => Ok(Value::Null),
        other => Err(format!("unknown schema type {other:?}")),
    }
}

/// The schema's type: `type` (the first non-null of a list), else
/// inferred from its keywords, else `object`.
fn type_of(s: &Map<String, Value>) -> String {
    let declared = match s.get("type") {
        Some(Value::String(t)) => Some(t.clone()),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .or_else(|| ts.first().and_then(Value::as_str))
            .map(str::to_owned),
        _ => None,
    };
    declared.unwrap_or_else(|| {
        let has = |k: &str| s.contains_key(k);
        if has("items") || has("prefixItems") {
            "array"
        } else if has("minLength") || has("maxLength") || has("format") {
            "string"
        } else if has("minimum") || has("maximum") {
            "number"
        } else {
            "object"
        }
        .to_owned()
    })
}

/// `allOf` branches (and the schema's own keywords) merged into one object
/// schema: properties and required names joined.
fn merge_all_of(s: &Map<String, Value>, all: &[Value], root: &Value) -> Result<Value, String> {
    let mut merged = s.clone();
    merged.remove("allOf");
    let mut props = merged
        .remove("properties")
        .and_then(|p| p.as_object().cloned())
        .unwrap_or_default();
    let mut required: Vec<Value> = merged
        .remove("required")
        .and_then(|r| r.as_array().cloned())
        .unwrap_or_default();
    for branch in all {
        let branch = match branch.get("$ref").and_then(Value::as_str) {
            Some(r) => r
                .strip_prefix('#')
                .and_then(|p| root.pointer(p))
                .ok_or_else(|| format!("$ref {r:?} does not point into the schema"))?,
            None => branch,
        };
        let Some(b) = branch.as_object() else {
            continue;
        };
        for (k, v) in b {
            match k.as_str() {
                "properties" => props.extend(v.as_object().cloned().unwrap_or_default()),
                "required" => required.extend(v.as_array().cloned().unwrap_or_default()),
                _ => {
                    merged.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
    }
    merged.insert("properties".into(), Value::Object(props));
    merged.insert("required".into(), Value::Array(required));
    Ok(Value::Object(merged))
}

fn object(s: &Map<String, Value>, root: &Value, depth: usize) -> Result<Value, String> {
    let empty = Map::new();
    let props = s
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required: Vec<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let max = s
        .get("maxProperties")
        .and_then(Value::as_u64)
        .map_or(usize::MAX, |m| m as usize);
    let mut names: Vec<&str> = required.clone();
    names.extend(
        props
            .keys()
            .map(String::as_str)
            .filter(|k| !required.contains(k)),
    );
    let mut out = Map::new();
    for (i, key) in names.into_iter().enumerate() {
        if i >= max && !required.contains(&key) {
            break;
        }
        let value = match props.get(key) {
            Some(p) => value_for(p, root, key, 0, depth + 1)?,
            None => json!(key),
        };
        out.insert(key.to_owned(), value);
    }
    Ok(Value::Object(out))
}

fn array(s: &Map<String, Value>, root: &Value, name: &str, depth: usize) -> Result<Value, String> {
    let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
    let max = s
        .get("maxItems")
        .and_then(Value::as_u64)
        .map_or(usize::MAX, |m| m as usize);
    if min > MAX_GENERATED {
        return Err(format!(
            "{name:?}: minItems {min} is beyond what the mock generates"
        ));
    }
    let n = min.max(1).min(max);
    let prefix = s
        .get("prefixItems")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let items = s.get("items").filter(|i| i.is_object() || i.is_boolean());
    let mut out = Vec::new();
    for i in 0..n.max(prefix.len().min(max)) {
        let item = match (prefix.get(i), items) {
            (Some(p), _) => value_for(p, root, name, i, depth + 1)?,
            (None, Some(schema)) => value_for(schema, root, name, i, depth + 1)?,
            (None, None) => json!(format!("{} {i}", base_text(name))),
        };
        out.push(item);
    }
    Ok(Value::Array(out))
}

fn base_text(name: &str) -> String {
    if name.is_empty() {
        "polar".to_owned()
    } else {
        format!("polar {name}")
    }
}

fn string(s: &Map<String, Value>, name: &str, index: usize) -> Result<Value, String> {
    if s.contains_key("pattern") {
        return Err(format!(
            "string `pattern` of {:?} cannot be honoured by the mock's constrained decoding",
            if name.is_empty() { "the value" } else { name }
        ));
    }
    let fixed = match s.get("format").and_then(Value::as_str) {
        Some("date-time") => Some("2026-01-01T00:00:00Z"),
        Some("date") => Some("2026-01-01"),
        Some("time") => Some("00:00:00Z"),
        Some("email") => Some("polar@example.com"),
        Some("uri" | "url" | "iri") => Some("https://example.com/polar"),
        Some("uuid") => Some("00000000-0000-4000-8000-000000000000"),
        Some("ipv4") => Some("127.0.0.1"),
        Some("ipv6") => Some("::1"),
        Some("hostname") => Some("localhost"),
        _ => None,
    };
    let mut text = match fixed {
        Some(f) => f.to_owned(),
        None if index > 0 => format!("{} {index}", base_text(name)),
        None => base_text(name),
    };
    let min = s.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
    let max = s
        .get("maxLength")
        .and_then(Value::as_u64)
        .map(|m| m as usize);
    if min > MAX_GENERATED {
        return Err(format!(
            "{name:?}: minLength {min} is beyond what the mock generates"
        ));
    }
    let n = text.chars().count();
    if n < min {
        text.push_str(&".".repeat(min - n));
    }
    if let Some(max) = max
        && text.chars().count() > max
    {
        if max < min {
            return Err(format!(
                "{name:?}: maxLength {max} is below minLength {min}"
            ));
        }
        text = text.chars().take(max).collect();
    }
    Ok(json!(text))
}

fn number(s: &Map<String, Value>, index: usize, integer: bool) -> Value {
    let f = |k: &str| s.get(k).and_then(Value::as_f64);
    let mut low = f("minimum").unwrap_or(0.0_f64.min(f("maximum").unwrap_or(0.0)));
    if let Some(e) = f("exclusiveMinimum") {
        low = low.max(if integer { e.floor() + 1.0 } else { e + 1.0 });
    }
    if let (Some(e), None) = (f("exclusiveMaximum"), f("minimum")) {
        low = low.min(e - 1.0);
    }
    let mut v = low + index as f64;
    if let Some(m) = f("multipleOf").filter(|m| *m > 0.0) {
        v = (v / m).ceil() * m;
    }
    if integer || v.fract() == 0.0 {
        json!(v.ceil() as i64)
    } else {
        json!(v)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn generated(schema: Value) -> Value {
        value_for(&schema, &schema, "", 0, 0).unwrap()
    }

    #[test]
    fn objects_carry_their_properties_with_valid_values() {
        // Claude Code's title call and Gemini CLI's next-speaker check.
        assert_eq!(
            generated(
                json!({"type": "object", "properties": {"title": {"type": "string"}},
                       "required": ["title"], "additionalProperties": false})
            ),
            json!({"title": "polar title"})
        );
        assert_eq!(
            generated(json!({"type": "object", "properties": {
                "reasoning": {"type": "string"},
                "next_speaker": {"type": "string", "enum": ["user", "model"]}},
                "required": ["reasoning", "next_speaker"]})),
            json!({"reasoning": "polar reasoning", "next_speaker": "user"})
        );
    }

    #[test]
    fn nested_arrays_numbers_refs_and_bounds() {
        let schema = json!({
            "type": "object",
            "$defs": {"step": {"type": "object", "properties": {
                "n": {"type": "integer", "minimum": 3, "multipleOf": 2},
                "score": {"type": "number", "exclusiveMinimum": 0.5},
                "done": {"type": "boolean"},
                "note": {"type": ["null", "string"], "minLength": 14, "maxLength": 20}}}},
            "properties": {
                "steps": {"type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 2},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 0},
                "when": {"type": "string", "format": "date-time"},
                "kind": {"const": "fixed"},
                "either": {"anyOf": [{"type": "integer", "maximum": -2}, {"type": "string"}]},
                "merged": {"allOf": [{"properties": {"a": {"type": "string"}}},
                                     {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
            },
            "required": ["steps"]
        });
        let v = generated(schema);
        assert_eq!(v["steps"].as_array().unwrap().len(), 2);
        assert_eq!(v["steps"][0]["n"], 4);
        assert_eq!(v["steps"][1]["n"], 4, "3 rounds up to a multiple of 2");
        assert!(v["steps"][0]["score"].as_f64().unwrap() > 0.5);
        assert_eq!(v["steps"][0]["done"], false);
        let note = v["steps"][0]["note"].as_str().unwrap();
        assert!((14..=20).contains(&note.chars().count()), "{note}");
        assert_eq!(v["tags"], json!([]));
        assert_eq!(v["when"], "2026-01-01T00:00:00Z");
        assert_eq!(v["kind"], "fixed");
        assert!(v["either"].as_i64().unwrap() <= -2);
        assert_eq!(v["merged"]["b"], 0);
        assert_eq!(v["merged"]["a"], "polar a");
    }

    #[test]
    fn what_cannot_be_honoured_is_an_error() {
        for schema in [
            json!({"type": "string", "pattern": "^[a-z]+$"}),
            json!({"not": {"type": "string"}}),
            json!({"$ref": "https://example.com/schema"}),
            json!({"$ref": "#/$defs/loop", "$defs": {"loop": {"$ref": "#/$defs/loop"}}}),
            json!(false),
        ] {
            assert!(value_for(&schema, &schema, "", 0, 0).is_err(), "{schema}");
        }
    }

    fn tool(name: &str, params: Value) -> Tool {
        Tool {
            name: name.into(),
            description: None,
            parameters: polar_json::RawJson::from_value(&params),
        }
    }

    #[test]
    fn tool_choice_is_parsed_checked_and_applied() {
        let tools = vec![
            tool(
                "bash",
                json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
            ),
            tool(
                "read",
                json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            ),
        ];
        let parse = |body: Value| Constraint::parse(body.as_object().unwrap(), &tools);
        let calls = vec![
            ("bash".to_owned(), "{\"command\":\"ls\"}".to_owned()),
            ("read".to_owned(), "{\"path\":\"a\"}".to_owned()),
        ];
        let plan = |c: &Constraint| {
            let mut p = Plan {
                tool_calls: calls.clone(),
                ..Plan::default()
            };
            c.apply_tools(&mut p, &tools, Dialect::Vllm).unwrap();
            p
        };
        let none = parse(json!({"tool_choice": "none"})).unwrap();
        let p = plan(&none);
        assert!(p.tool_calls.is_empty());
        assert_eq!(p.text, "done");
        let named =
            parse(json!({"tool_choice": {"type": "function", "function": {"name": "read"}}}))
                .unwrap();
        assert_eq!(plan(&named).tool_calls, vec![calls[1].clone()]);
        let single = parse(json!({"parallel_tool_calls": false})).unwrap();
        assert_eq!(plan(&single).tool_calls, vec![calls[0].clone()]);
        let required = parse(json!({"tool_choice": "required"})).unwrap();
        let mut empty = Plan::default();
        required
            .apply_tools(&mut empty, &tools, Dialect::Vllm)
            .unwrap();
        assert_eq!(
            empty.tool_calls,
            vec![(
                "bash".to_owned(),
                "{\"command\":\"polar command\"}".to_owned()
            )]
        );
        let mut empty = Plan::default();
        named
            .apply_tools(&mut empty, &tools, Dialect::Vllm)
            .unwrap();
        assert_eq!(
            empty.tool_calls,
            vec![("read".to_owned(), "{\"path\":\"polar path\"}".to_owned())]
        );
        let err = |body: Value, t: &[Tool]| {
            Constraint::parse(body.as_object().unwrap(), t)
                .unwrap_err()
                .to_string()
        };
        assert!(err(json!({"tool_choice": "required"}), &[]).contains("Tools cannot be empty"));
        assert!(
            err(
                json!({"tool_choice": {"type": "function", "function": {"name": "x"}}}),
                &tools
            )
            .contains("Tool 'x' not found")
        );
        assert!(
            err(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                &tools
            )
            .contains("schema_ is required")
        );
        assert!(
            err(json!({"response_format": {"type": "grammar"}}), &tools).contains("not supported")
        );
    }

    #[test]
    fn a_structured_reply_is_json_and_wins_over_tools() {
        let c = Constraint::parse(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "t",
                "schema": {"type": "object", "properties": {"title": {"type": "string", "maxLength": 5}}}}}})
            .as_object()
            .unwrap(),
            &[],
        )
        .unwrap();
        let plan = c.structured_plan().unwrap().unwrap();
        assert_eq!(plan.text, "{\"title\":\"polar\"}");
        assert!(plan.tool_calls.is_empty());
        let object = Constraint::parse(
            json!({"response_format": {"type": "json_object"}})
                .as_object()
                .unwrap(),
            &[],
        )
        .unwrap();
        assert_eq!(object.structured_plan().unwrap().unwrap().text, "{}");
        let text = Constraint::parse(
            json!({"response_format": {"type": "text"}})
                .as_object()
                .unwrap(),
            &[],
        )
        .unwrap();
        assert!(text.structured_plan().unwrap().is_none());
    }
}
