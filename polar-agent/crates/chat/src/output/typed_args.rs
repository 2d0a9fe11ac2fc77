//! The arguments of the XML tool-call formats (`qwen3_coder`, `glm45`),
//! where the model writes one bare value per parameter: each value is
//! typed by the request's tool schema the way vLLM's parser for the
//! format types it, and the arguments are written as the JSON object that
//! parser sends (Python's `json.dumps`: `", "` and `": "` between items),
//! one parameter at a time so the text only grows.
//!
//! Python's `ast.literal_eval`, the last resort of both vLLM parsers, is
//! approximated by JSON plus Python's `True`, `False` and `None`; other
//! Python literals (single-quoted strings, tuples) stay strings.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Number, Value};

use crate::Tool;

/// The parameter schemas of a request's tools, by tool name (the first
/// tool of a name wins, as in vLLM).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolSchemas(Arc<HashMap<String, Value>>);

impl ToolSchemas {
    /// The schemas of `tools`.
    pub fn of(tools: &[Tool]) -> Self {
        let mut map = HashMap::new();
        for tool in tools {
            map.entry(tool.name.clone())
                .or_insert_with(|| tool.parameters.to_value());
        }
        Self(Arc::new(map))
    }

    /// The schema's `properties` (vLLM's `qwen3_coder` takes the schema
    /// itself when it has none).
    fn properties(&self, tool: &str) -> Option<&Map<String, Value>> {
        let params = self.0.get(tool)?.as_object()?;
        match params.get("properties") {
            Some(Value::Object(p)) => Some(p),
            Some(_) => None,
            None => Some(params),
        }
    }

    /// A `qwen3_coder` parameter value (vLLM's `_convert_param_value`).
    pub(super) fn qwen3_coder_value(&self, tool: &str, param: &str, raw: &str) -> Value {
        if raw.eq_ignore_ascii_case("null") {
            return Value::Null;
        }
        let Some(schema) = self.properties(tool).and_then(|p| p.get(param)) else {
            return Value::String(raw.to_owned());
        };
        let kind = match schema.get("type") {
            Some(Value::String(t)) => t.trim().to_lowercase(),
            Some(other) if schema.is_object() => other.to_string().to_lowercase(),
            _ => "string".to_owned(),
        };
        let string = || Value::String(raw.to_owned());
        match kind.as_str() {
            "string" | "str" | "text" | "varchar" | "char" | "enum" => string(),
            k if ["int", "uint", "long", "short", "unsigned"]
                .iter()
                .any(|p| k.starts_with(p)) =>
            {
                raw.trim()
                    .parse::<i64>()
                    .map_or_else(|_| string(), Value::from)
            }
            k if k.starts_with("num") || k.starts_with("float") => {
                float(raw).unwrap_or_else(string)
            }
            "boolean" | "bool" | "binary" => Value::Bool(raw.eq_ignore_ascii_case("true")),
            k => {
                let structured = ["object", "array", "arr"].contains(&k)
                    || k.starts_with("dict")
                    || k.starts_with("list");
                structured
                    .then(|| serde_json::from_str(raw).ok())
                    .flatten()
                    .or_else(|| py_literal(raw))
                    .unwrap_or_else(string)
            }
        }
    }

    /// A `glm45` argument value (vLLM's `glm4_moe` parser): as written
    /// when the schema says `string`, else JSON, else JSON written as the
    /// inside of a JSON string, else a Python literal, else the text.
    pub(super) fn glm45_value(&self, tool: &str, key: &str, raw: &str) -> Value {
        let is_string = self
            .0
            .get(tool)
            .and_then(|p| p.get("properties"))
            .and_then(|p| p.get(key))
            .and_then(|p| p.get("type"))
            .is_some_and(|t| t == "string");
        if is_string {
            return Value::String(raw.to_owned());
        }
        serde_json::from_str(raw)
            .ok()
            .or_else(|| {
                let inner: String = serde_json::from_str(&format!("\"{raw}\"")).ok()?;
                serde_json::from_str(&inner).ok()
            })
            .or_else(|| py_literal(raw))
            .unwrap_or_else(|| Value::String(raw.to_owned()))
    }
}

/// Python's `float(raw)`, an integral value written as an integer.
fn float(raw: &str) -> Option<Value> {
    let f: f64 = raw.trim().parse().ok()?;
    if !f.is_finite() {
        return None;
    }
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        return Some(Value::from(f as i64));
    }
    Number::from_f64(f).map(Value::Number)
}

/// `ast.literal_eval` as far as JSON and Python's constants go.
fn py_literal(raw: &str) -> Option<Value> {
    let t = raw.trim_start_matches([' ', '\t']);
    match t.trim_end() {
        "True" => Some(Value::Bool(true)),
        "False" => Some(Value::Bool(false)),
        "None" => Some(Value::Null),
        _ => serde_json::from_str(t).ok(),
    }
}

/// `value` as Python's `json.dumps` writes it (`ensure_ascii`: non-ASCII
/// characters as `\u` escapes, its default).
#[cfg(test)]
fn py_dumps(value: &Value, ensure_ascii: bool) -> String {
    let mut out = String::new();
    write_py(value, ensure_ascii, &mut out);
    out
}

fn write_py(value: &Value, ensure_ascii: bool, out: &mut String) {
    match value {
        Value::String(s) => write_str(s, ensure_ascii, out),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py(v, ensure_ascii, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(k, ensure_ascii, out);
                out.push_str(": ");
                write_py(v, ensure_ascii, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn write_str(s: &str, ensure_ascii: bool, out: &mut String) {
    let json = Value::String(s.to_owned()).to_string();
    if !ensure_ascii {
        out.push_str(&json);
        return;
    }
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
}

/// Arguments written one parameter at a time.
#[derive(Clone, Debug, Default)]
pub(super) struct ArgsWriter {
    count: usize,
}

impl ArgsWriter {
    /// The text that adds `key: value`.
    pub(super) fn param(&mut self, key: &str, value: &Value, ensure_ascii: bool) -> String {
        let mut out = String::new();
        if self.count > 0 {
            out.push_str(", ");
        }
        self.count += 1;
        write_str(key, ensure_ascii, &mut out);
        out.push_str(": ");
        write_py(value, ensure_ascii, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_json::RawJson;
    use serde_json::json;

    fn schemas() -> ToolSchemas {
        let tool = |name: &str, params: Value| Tool {
            name: name.into(),
            description: None,
            parameters: RawJson::from_value(&params),
        };
        ToolSchemas::of(&[
            tool(
                "f",
                json!({"type": "object", "properties": {
                    "s": {"type": "string"}, "i": {"type": "integer"},
                    "n": {"type": "number"}, "b": {"type": "boolean"},
                    "o": {"type": "object"}, "a": {"type": "array"},
                    "u": {"description": "no type"}, "x": {"type": ["string", "null"]}
                }}),
            ),
            tool(
                "bare",
                json!({"s": {"type": "string"}, "i": {"type": "int"}}),
            ),
        ])
    }

    #[test]
    fn qwen3_coder_values_are_typed_by_the_schema() {
        let s = schemas();
        let v = |p: &str, raw: &str| s.qwen3_coder_value("f", p, raw);
        assert_eq!(v("s", "12"), json!("12"));
        assert_eq!(v("s", "NULL"), Value::Null);
        assert_eq!(v("i", " 12 "), json!(12));
        assert_eq!(v("i", "twelve"), json!("twelve"));
        assert_eq!(v("n", "2.5"), json!(2.5));
        assert_eq!(v("n", "3.0"), json!(3));
        assert_eq!(v("n", "inf"), json!("inf"));
        assert_eq!(v("b", "True"), json!(true));
        assert_eq!(v("b", "yes"), json!(false));
        assert_eq!(v("o", r#"{"k": [1, 2]}"#), json!({"k": [1, 2]}));
        assert_eq!(v("o", "not json"), json!("not json"));
        assert_eq!(v("a", "[1, True]"), json!("[1, True]"));
        assert_eq!(v("u", "5"), json!("5"), "no type: a string");
        assert_eq!(v("x", "5"), json!(5), "a type list: a literal");
        assert_eq!(v("x", "None"), Value::Null);
        assert_eq!(v("missing", "5"), json!("5"));
        assert_eq!(s.qwen3_coder_value("nope", "i", "5"), json!("5"));
        assert_eq!(s.qwen3_coder_value("bare", "i", "5"), json!(5));
    }

    #[test]
    fn glm45_values_are_json_unless_the_schema_says_string() {
        let s = schemas();
        let v = |p: &str, raw: &str| s.glm45_value("f", p, raw);
        assert_eq!(v("s", "12"), json!("12"));
        assert_eq!(v("i", "12"), json!(12));
        assert_eq!(v("u", "hello"), json!("hello"));
        assert_eq!(v("o", r#"{\"k\": 1}"#), json!({"k": 1}), "escaped JSON");
        assert_eq!(v("b", "True"), json!(true));
        assert_eq!(s.glm45_value("nope", "k", "[1]"), json!([1]));
    }

    #[test]
    fn arguments_are_written_as_json_dumps_writes_them() {
        let mut w = ArgsWriter::default();
        let a = w.param("path", &json!("é/x"), false);
        let b = w.param("opts", &json!({"a": [1, null], "b": "ü😀"}), true);
        assert_eq!(a, r#""path": "é/x""#);
        assert_eq!(
            b,
            r#", "opts": {"a": [1, null], "b": "\u00fc\ud83d\ude00"}"#
        );
        assert_eq!(py_dumps(&json!({"k": "\n"}), true), r#"{"k": "\n"}"#);
    }
}
