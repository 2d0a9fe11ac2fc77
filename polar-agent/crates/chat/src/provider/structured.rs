//! Structured output as each API asks for it, read into one
//! [`ResponseFormat`] (which the backend enforces with constrained
//! decoding): OpenAI Chat `response_format`, Responses `text.format`,
//! Anthropic `output_format` / `output_config.format`, Gemini
//! `generationConfig.responseMimeType` with `responseJsonSchema` or
//! `responseSchema`. Plain text is no constraint (`None`); a constraint
//! Polar cannot pass on is the harness's request error, never dropped.

use serde_json::Value;

use super::ProviderError;
use super::read::{bool_field, string_field};
use crate::ResponseFormat;
use polar_json::Json;

/// Takes `key` out of `extra`'s object `parent` (read already), dropping
/// `parent` when nothing else is left in it.
pub fn take_nested(extra: &mut serde_json::Map<String, Value>, parent: &str, key: &str) {
    if let Some(Value::Object(o)) = extra.get_mut(parent) {
        o.remove(key);
        if o.is_empty() {
            extra.remove(parent);
        }
    }
}

/// The name given to a schema the harness did not name.
pub const DEFAULT_SCHEMA_NAME: &str = "response";

/// A JSON Schema given at `at`: an object (or `true`, any JSON).
fn schema(v: Json<'_>, at: &str) -> Result<Value, ProviderError> {
    match v.to_value() {
        s @ Value::Object(_) => Ok(s),
        Value::Bool(true) => Ok(Value::Object(serde_json::Map::new())),
        _ => Err(ProviderError::invalid(format!(
            "{at}: must be a JSON Schema object"
        ))),
    }
}

/// A schema constraint named `name` (or the default).
fn json_schema(name: Option<String>, schema: Value, strict: Option<bool>) -> ResponseFormat {
    ResponseFormat::JsonSchema {
        name: name
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| DEFAULT_SCHEMA_NAME.to_owned()),
        schema,
        strict,
    }
}

fn unsupported(at: &str, kind: &str, supported: &str) -> ProviderError {
    ProviderError::invalid(format!(
        "{at}: {kind:?} is not supported (supported: {supported})"
    ))
}

/// OpenAI Chat `response_format`: `{"type": "text" | "json_object" |
/// "json_schema", "json_schema": {"name", "schema", "strict"}}`.
pub fn openai_chat(v: Option<Json<'_>>) -> Result<Option<ResponseFormat>, ProviderError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = string_field(v, "type")
        .ok_or_else(|| ProviderError::invalid("response_format.type: field required"))?;
    match kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(ResponseFormat::JsonObject)),
        "json_schema" => {
            let js = v
                .get("json_schema")
                .filter(Json::is_object)
                .ok_or_else(|| {
                    ProviderError::invalid("response_format.json_schema: field required")
                })?;
            Ok(Some(match js.get("schema").filter(|s| !s.is_null()) {
                Some(s) => json_schema(
                    string_field(js, "name"),
                    schema(s, "response_format.json_schema.schema")?,
                    bool_field(js, "strict"),
                ),
                None => ResponseFormat::JsonObject,
            }))
        }
        other => Err(unsupported(
            "response_format.type",
            other,
            "text, json_object, json_schema",
        )),
    }
}

/// OpenAI Responses `text.format`: `{"type": "text" | "json_object" |
/// "json_schema", "name", "schema", "strict"}`.
pub fn openai_responses(text: Option<Json<'_>>) -> Result<Option<ResponseFormat>, ProviderError> {
    let Some(f) = text.and_then(|t| t.get("format")).filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let kind = string_field(f, "type")
        .ok_or_else(|| ProviderError::invalid("text.format.type: field required"))?;
    match kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(ResponseFormat::JsonObject)),
        "json_schema" => {
            let s = f
                .get("schema")
                .ok_or_else(|| ProviderError::invalid("text.format.schema: field required"))?;
            Ok(Some(json_schema(
                string_field(f, "name"),
                schema(s, "text.format.schema")?,
                bool_field(f, "strict"),
            )))
        }
        other => Err(unsupported(
            "text.format.type",
            other,
            "text, json_object, json_schema",
        )),
    }
}

/// Anthropic structured outputs: `output_format` (beta) or
/// `output_config.format`, each `{"type": "json_schema", "schema"}`.
pub fn anthropic(obj: Json<'_>) -> Result<Option<ResponseFormat>, ProviderError> {
    let (f, at) = match (
        obj.get("output_format").filter(|f| !f.is_null()),
        obj.get("output_config")
            .and_then(|c| c.get("format"))
            .filter(|f| !f.is_null()),
    ) {
        (Some(f), _) => (f, "output_format"),
        (None, Some(f)) => (f, "output_config.format"),
        (None, None) => return Ok(None),
    };
    match string_field(f, "type").as_deref() {
        Some("json_schema") => {
            let s = f
                .get("schema")
                .ok_or_else(|| ProviderError::invalid(format!("{at}.schema: field required")))?;
            Ok(Some(json_schema(
                string_field(f, "name"),
                schema(s, &format!("{at}.schema"))?,
                None,
            )))
        }
        Some(other) => Err(unsupported(&format!("{at}.type"), other, "json_schema")),
        None => Err(ProviderError::invalid(format!("{at}.type: field required"))),
    }
}

/// The Gemini `generationConfig` keys read here, camelCase and snake_case.
pub const GEMINI_KEYS: &[&str] = &[
    "responseMimeType",
    "response_mime_type",
    "responseJsonSchema",
    "response_json_schema",
    "_responseJsonSchema",
    "responseSchema",
    "response_schema",
];

/// Gemini `generationConfig`: `responseMimeType` `application/json` (JSON
/// mode), with `responseJsonSchema` (JSON Schema) or `responseSchema` (the
/// OpenAPI subset), whose upper-case types (`OBJECT`, `STRING`, ...: the
/// `Type` enum of Google's SDKs, which Gemini CLI's router call also puts
/// in its `responseJsonSchema`) `lower` turns into JSON Schema's.
pub fn gemini(
    gc: Option<Json<'_>>,
    lower: fn(Json<'_>) -> Value,
) -> Result<Option<ResponseFormat>, ProviderError> {
    let Some(gc) = gc else { return Ok(None) };
    let get = |keys: &[&str]| keys.iter().find_map(|k| gc.get(k)).filter(|v| !v.is_null());
    let mime = get(&["responseMimeType", "response_mime_type"])
        .and_then(|m| m.as_str().map(|s| s.into_owned()));
    let json_schema_v = get(&[
        "responseJsonSchema",
        "response_json_schema",
        "_responseJsonSchema",
    ]);
    let openapi = get(&["responseSchema", "response_schema"]);
    let schema_v = match (json_schema_v, openapi) {
        (Some(s), _) => Some(match lower(s) {
            v @ Value::Object(_) => v,
            _ => schema(s, "generationConfig.responseJsonSchema")?,
        }),
        (None, Some(s)) => Some(match lower(s) {
            v @ Value::Object(_) => v,
            _ => {
                return Err(ProviderError::invalid(
                    "generationConfig.responseSchema: must be a schema object",
                ));
            }
        }),
        (None, None) => None,
    };
    match (mime.as_deref(), schema_v) {
        (None | Some("text/plain"), None) => Ok(None),
        (Some("application/json"), None) => Ok(Some(ResponseFormat::JsonObject)),
        (Some("application/json"), Some(s)) => Ok(Some(json_schema(None, s, None))),
        (None | Some("text/plain"), Some(_)) => Err(ProviderError::invalid(
            "generationConfig.responseSchema needs responseMimeType \"application/json\"",
        )),
        (Some(other), _) => Err(unsupported(
            "generationConfig.responseMimeType",
            other,
            "text/plain, application/json",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn with<T>(v: Value, f: impl FnOnce(Json<'_>) -> T) -> T {
        let bytes = v.to_string().into_bytes();
        let doc = polar_json::Doc::parse(&bytes).unwrap();
        f(doc.root())
    }

    fn schema_of(name: &str) -> ResponseFormat {
        ResponseFormat::JsonSchema {
            name: name.into(),
            schema: json!({"type": "object", "properties": {"title": {"type": "string"}}}),
            strict: None,
        }
    }

    #[test]
    fn openai_chat_formats() {
        let s = json!({"type": "object", "properties": {"title": {"type": "string"}}});
        let read = |v: Value| with(v, |j| openai_chat(Some(j)));
        assert_eq!(read(json!({"type": "text"})), Ok(None));
        assert_eq!(
            read(json!({"type": "json_object"})),
            Ok(Some(ResponseFormat::JsonObject))
        );
        assert_eq!(
            read(
                json!({"type": "json_schema", "json_schema": {"name": "title", "schema": s, "strict": true}})
            ),
            Ok(Some(ResponseFormat::JsonSchema {
                name: "title".into(),
                schema: s.clone(),
                strict: Some(true)
            }))
        );
        assert_eq!(
            read(json!({"type": "json_schema", "json_schema": {"schema": s}})),
            Ok(Some(schema_of(DEFAULT_SCHEMA_NAME)))
        );
        for bad in [
            json!({"type": "grammar"}),
            json!({}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
        ] {
            assert!(read(bad.clone()).is_err(), "{bad}");
        }
        assert_eq!(openai_chat(None), Ok(None));
    }

    #[test]
    fn responses_text_format() {
        let s = json!({"type": "object", "properties": {"title": {"type": "string"}}});
        let read = |v: Value| with(v, |j| openai_responses(Some(j)));
        assert_eq!(read(json!({"verbosity": "low"})), Ok(None));
        assert_eq!(read(json!({"format": {"type": "text"}})), Ok(None));
        assert_eq!(
            read(json!({"format": {"type": "json_object"}})),
            Ok(Some(ResponseFormat::JsonObject))
        );
        assert_eq!(
            read(json!({"format": {"type": "json_schema", "name": "title", "schema": s}})),
            Ok(Some(schema_of("title")))
        );
        assert!(read(json!({"format": {"type": "json_schema"}})).is_err());
        assert!(read(json!({"format": {"type": "xml"}})).is_err());
    }

    #[test]
    fn anthropic_output_formats() {
        let s = json!({"type": "object", "properties": {"title": {"type": "string"}}});
        let read = |v: Value| with(v, anthropic);
        assert_eq!(read(json!({"max_tokens": 5})), Ok(None));
        assert_eq!(
            read(json!({"output_format": {"type": "json_schema", "schema": s}})),
            Ok(Some(schema_of(DEFAULT_SCHEMA_NAME)))
        );
        assert_eq!(
            read(
                json!({"output_config": {"effort": "low", "format": {"type": "json_schema", "schema": s}}})
            ),
            Ok(Some(schema_of(DEFAULT_SCHEMA_NAME)))
        );
        assert_eq!(read(json!({"output_config": {"effort": "low"}})), Ok(None));
        assert!(read(json!({"output_format": {"type": "regex"}})).is_err());
        assert!(read(json!({"output_format": {"type": "json_schema"}})).is_err());
    }

    fn lower(v: Json<'_>) -> Value {
        let mut v = v.to_value();
        fn walk(v: &mut Value) {
            match v {
                Value::Object(m) => {
                    for (k, x) in m.iter_mut() {
                        match x {
                            Value::String(s) if k == "type" => *s = s.to_ascii_lowercase(),
                            _ => walk(x),
                        }
                    }
                }
                Value::Array(a) => a.iter_mut().for_each(walk),
                _ => {}
            }
        }
        walk(&mut v);
        v
    }

    #[test]
    fn gemini_generation_config() {
        let s = json!({"type": "object", "properties": {"title": {"type": "string"}}});
        let read = |v: Value| with(v, |j| gemini(Some(j), lower));
        assert_eq!(read(json!({"temperature": 0})), Ok(None));
        assert_eq!(read(json!({"responseMimeType": "text/plain"})), Ok(None));
        assert_eq!(
            read(json!({"responseMimeType": "application/json"})),
            Ok(Some(ResponseFormat::JsonObject))
        );
        assert_eq!(
            read(json!({"responseMimeType": "application/json", "responseJsonSchema": s})),
            Ok(Some(schema_of(DEFAULT_SCHEMA_NAME)))
        );
        assert_eq!(
            read(json!({"response_mime_type": "application/json",
                        "responseSchema": {"type": "OBJECT", "properties": {"title": {"type": "STRING"}}}})),
            Ok(Some(schema_of(DEFAULT_SCHEMA_NAME)))
        );
        // Gemini CLI's router: SDK types in a JSON Schema.
        assert_eq!(
            read(json!({"responseMimeType": "application/json",
                        "responseJsonSchema": {"type": "OBJECT", "properties": {"title": {"type": "STRING"}}}})),
            Ok(Some(schema_of(DEFAULT_SCHEMA_NAME)))
        );
        assert!(read(json!({"responseMimeType": "text/x.enum", "responseSchema": {"type": "STRING", "enum": ["a"]}})).is_err());
        assert!(read(json!({"responseJsonSchema": s})).is_err());
        assert_eq!(gemini(None, lower), Ok(None));
    }
}
