//! The constraint fields of the token-in endpoints, read and checked as
//! the real servers check them, into the structured output the mock
//! imitates ([`ResponseFormat`], answered by
//! [`crate::constrain::Constraint::structured_plan`]: the JSON a schema
//! allows, written in the model's raw text form, without consulting the
//! script; a forced tool choice's schema is just a schema here, as it is
//! to the server's grammar).
//!
//! - vLLM `/v1/completions` ([`vllm`]): `response_format` (`text`,
//!   `json_object`, `json_schema` with its `json_schema` object, whose
//!   `name` is required) and `structured_outputs` (`json` as an object or
//!   a JSON string, `json_object`, `choice`, `regex`, `grammar`,
//!   `structural_tag`, and the backend options), at most one kind
//!   (`CompletionRequest` in `vllm/entrypoints/openai/completion/protocol.py`,
//!   `StructuredOutputsParams` in `vllm/sampling_params.py`); a
//!   `response_format` overrides `structured_outputs`' kind, as vLLM's
//!   `structured_outputs_from_response_format` does.
//! - SGLang `/generate` ([`sglang`]): `sampling_params.json_schema` (a
//!   JSON string), `regex`, `ebnf`, `structural_tag`, at most one of the
//!   first three (`SamplingParams.verify` in
//!   `python/sglang/srt/sampling/sampling_params.py`).
//!
//! Malformed or conflicting fields get 400 with the server's message. A
//! key of `structured_outputs` vLLM does not define gets 400 too (vLLM
//! drops it silently, and the output is then unconstrained: refusing it
//! shows a misspelling in tests). `regex`, `grammar`/`ebnf` and
//! `structural_tag` are valid but beyond this imitation: 400, as for a
//! schema `pattern` ([`crate::constrain`]).

use serde_json::{Map, Value};

use super::MockError;
use super::constrain::ResponseFormat;

/// `structured_outputs` keys vLLM's `StructuredOutputsParams` defines.
const VLLM_KEYS: [&str; 11] = [
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "structural_tag",
    "disable_fallback",
    "disable_any_whitespace",
    "disable_additional_properties",
    "whitespace_pattern",
    "_backend",
];

fn bad(message: impl Into<String>) -> MockError {
    MockError::BadRequest(message.into())
}

fn beyond(kind: &str) -> MockError {
    bad(format!(
        "the mock backend cannot honour a {kind} constraint (its imitation generates JSON from \
         schemas and picks choices)"
    ))
}

/// A schema given as a JSON object (or boolean), or as JSON text.
fn schema(v: &Value, field: &str) -> Result<Value, MockError> {
    let parsed = match v {
        Value::String(text) => serde_json::from_str(text)
            .map_err(|e| bad(format!("`{field}` is not valid JSON: {e}")))?,
        other => other.clone(),
    };
    if parsed.is_object() || parsed.is_boolean() {
        Ok(parsed)
    } else {
        Err(bad(format!("`{field}` must be a JSON schema")))
    }
}

/// The constraint of a vLLM `/v1/completions` body.
pub fn vllm(req: &Map<String, Value>) -> Result<Option<ResponseFormat>, MockError> {
    let mut kind = match req.get("structured_outputs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(so)) => structured_outputs(so)?,
        Some(_) => return Err(bad("`structured_outputs` must be an object")),
    };
    match req.get("response_format") {
        None | Some(Value::Null) => {}
        Some(rf) => {
            match rf.get("type").and_then(Value::as_str) {
                Some("text") => {}
                Some("json_object") => kind = Some(ResponseFormat::JsonObject),
                Some("json_schema") => {
                    let js = rf.get("json_schema").filter(|v| !v.is_null()).ok_or_else(|| {
                    bad("When response_format type is 'json_schema', the 'json_schema' field \
                         must be provided.")
                })?;
                    if js.get("name").and_then(Value::as_str).is_none() {
                        return Err(bad("response_format.json_schema.name: Field required"));
                    }
                    let s = js
                        .get("schema")
                        .ok_or_else(|| bad("response_format.json_schema.schema is required"))?;
                    kind = Some(ResponseFormat::JsonSchema(schema(
                        s,
                        "response_format.json_schema.schema",
                    )?));
                }
                Some("structural_tag") => return Err(beyond("structural_tag")),
                other => {
                    return Err(bad(format!(
                        "response_format.type: Input should be 'text', 'json_object', \
                     'json_schema' or 'structural_tag', got {other:?}"
                    )));
                }
            }
        }
    }
    Ok(kind)
}

/// `structured_outputs`' one kind of constraint.
fn structured_outputs(so: &Map<String, Value>) -> Result<Option<ResponseFormat>, MockError> {
    if let Some(k) = so.keys().find(|k| !VLLM_KEYS.contains(&k.as_str())) {
        return Err(bad(format!(
            "structured_outputs.{k}: not a field of StructuredOutputsParams"
        )));
    }
    let set = |k: &str| {
        so.get(k)
            .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
    };
    let kinds: Vec<&str> = [
        "json",
        "regex",
        "choice",
        "grammar",
        "json_object",
        "structural_tag",
    ]
    .into_iter()
    .filter(|k| set(k))
    .collect();
    if kinds.len() > 1 {
        return Err(bad(format!(
            "You can only use one kind of structured outputs constraint but multiple are \
             specified: {kinds:?}"
        )));
    }
    Ok(match kinds.first().copied() {
        None => None,
        Some("json") => Some(ResponseFormat::JsonSchema(schema(
            &so["json"],
            "structured_outputs.json",
        )?)),
        Some("json_object") => Some(ResponseFormat::JsonObject),
        Some("choice") => {
            let choices: Option<Vec<String>> = so["choice"]
                .as_array()
                .and_then(|a| a.iter().map(|c| c.as_str().map(str::to_owned)).collect());
            match choices {
                Some(c) if !c.is_empty() => Some(ResponseFormat::Choice(c)),
                _ => {
                    return Err(bad(
                        "structured_outputs.choice must be a non-empty list of strings",
                    ));
                }
            }
        }
        Some(other) => return Err(beyond(other)),
    })
}

/// The constraint of an SGLang `/generate` body's `sampling_params`.
pub fn sglang(sampling: Option<&Value>) -> Result<Option<ResponseFormat>, MockError> {
    let Some(sp) = sampling.and_then(Value::as_object) else {
        return Ok(None);
    };
    let set = |k: &str| sp.get(k).filter(|v| !v.is_null());
    let kinds: Vec<&str> = ["regex", "json_schema", "ebnf"]
        .into_iter()
        .filter(|k| set(k).is_some())
        .collect();
    if kinds.len() > 1 {
        return Err(bad("Only one of regex, json_schema, or ebnf can be set."));
    }
    for k in ["regex", "json_schema", "ebnf", "structural_tag"] {
        if set(k).is_some_and(|v| !v.is_string()) {
            return Err(bad(format!("sampling_params.{k} must be a string")));
        }
    }
    if let Some(s) = set("json_schema") {
        return Ok(Some(ResponseFormat::JsonSchema(schema(
            s,
            "sampling_params.json_schema",
        )?)));
    }
    for k in ["regex", "ebnf", "structural_tag"] {
        if set(k).is_some() {
            return Err(beyond(k));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn v(body: Value) -> Result<Option<ResponseFormat>, MockError> {
        vllm(body.as_object().unwrap())
    }

    #[test]
    fn vllm_reads_every_json_kind() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(v(json!({"prompt": [1]})).unwrap(), None);
        assert_eq!(
            v(json!({"structured_outputs": {"json": schema}})).unwrap(),
            Some(ResponseFormat::JsonSchema(schema.clone()))
        );
        assert_eq!(
            v(json!({"structured_outputs": {"json": schema.to_string()}})).unwrap(),
            Some(ResponseFormat::JsonSchema(schema.clone()))
        );
        assert_eq!(
            v(json!({"structured_outputs": {"json_object": true}})).unwrap(),
            Some(ResponseFormat::JsonObject)
        );
        assert_eq!(
            v(json!({"structured_outputs": {"choice": ["yes", "no"]}})).unwrap(),
            Some(ResponseFormat::Choice(vec!["yes".into(), "no".into()]))
        );
        assert_eq!(
            v(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}})).unwrap(),
            Some(ResponseFormat::JsonSchema(schema.clone()))
        );
        // response_format's kind wins over structured_outputs'.
        assert_eq!(
            v(json!({"response_format": {"type": "json_object"}, "structured_outputs": {"json": schema}})).unwrap(),
            Some(ResponseFormat::JsonObject)
        );
        assert_eq!(
            v(json!({"response_format": {"type": "text"}})).unwrap(),
            None
        );
    }

    #[test]
    fn vllm_refuses_what_it_refuses_and_what_the_mock_cannot_do() {
        for body in [
            json!({"structured_outputs": {"json": {}, "regex": "a+"}}),
            json!({"structured_outputs": {"guided_json": {}}}),
            json!({"structured_outputs": "json"}),
            json!({"structured_outputs": {"json": "{not json"}}),
            json!({"structured_outputs": {"json": [1]}}),
            json!({"structured_outputs": {"choice": []}}),
            json!({"structured_outputs": {"regex": "a+"}}),
            json!({"structured_outputs": {"grammar": "root ::= \"a\""}}),
            json!({"response_format": {"type": "json_schema"}}),
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
            json!({"response_format": {"type": "xml"}}),
            json!({"response_format": {"type": "structural_tag", "format": {}}}),
        ] {
            assert!(
                matches!(v(body.clone()), Err(MockError::BadRequest(_))),
                "{body}"
            );
        }
    }

    #[test]
    fn sglang_reads_a_json_schema_string() {
        let schema = json!({"type": "array", "minItems": 1});
        let sp = json!({"max_new_tokens": 5, "json_schema": schema.to_string()});
        assert_eq!(
            sglang(Some(&sp)).unwrap(),
            Some(ResponseFormat::JsonSchema(schema))
        );
        assert_eq!(sglang(Some(&json!({"temperature": 1.0}))).unwrap(), None);
        assert_eq!(sglang(None).unwrap(), None);
        for sp in [
            json!({"json_schema": "{}", "regex": "a"}),
            json!({"json_schema": {"type": "object"}}),
            json!({"json_schema": "{oops"}),
            json!({"regex": "a+"}),
            json!({"ebnf": "root ::= \"a\""}),
            json!({"structural_tag": "{}"}),
        ] {
            assert!(
                matches!(sglang(Some(&sp)), Err(MockError::BadRequest(_))),
                "{sp}"
            );
        }
    }
}
