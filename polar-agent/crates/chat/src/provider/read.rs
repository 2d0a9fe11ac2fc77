//! Reading a harness's request body: the accessors every API's request
//! conversion shares, over a [`Json`] handle on the parsed body (see
//! [`polar_json`] for why requests are not read into a
//! `serde_json::Value`).

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use super::{ModelCall, ProviderError};
use crate::{Text, Tool};
use polar_json::{Json, RawJson};

/// The members of `obj` not in `known`, as a map (the fields a
/// translation keeps without understanding them).
pub(crate) fn rest(obj: Json<'_>, known: &[&str]) -> Map<String, Value> {
    let unknown = |(k, _): &(Cow<'_, str>, Json<'_>)| !known.contains(&k.as_ref());
    if !obj.as_object().into_iter().flatten().any(|m| unknown(&m)) {
        return Map::new();
    }
    obj.as_object()
        .into_iter()
        .flatten()
        .filter(unknown)
        .map(|(k, v)| (k.into_owned(), v.to_value()))
        .collect()
}

/// A string member of `obj`, owned.
pub(crate) fn string_field(obj: Json<'_>, key: &str) -> Option<String> {
    obj.get_str(key).map(Cow::into_owned)
}

/// A string as message text: escaped text is kept escaped ([`Text`]).
pub(crate) fn text(v: Json<'_>) -> Option<Text> {
    match v.str_literal()? {
        (plain, false) => Some(Text::new(plain.to_owned())),
        (_, true) => v
            .str_bytes()
            .map(|(escaped, _)| Text::from_escaped(escaped)),
    }
}

/// A string member of `obj` as message text.
pub(crate) fn text_field(obj: Json<'_>, key: &str) -> Option<Text> {
    text(obj.get(key)?)
}

/// Whether `obj`'s member `key` is the string `s`.
pub(crate) fn field_is(obj: Json<'_>, key: &str, s: &str) -> bool {
    obj.get(key).is_some_and(|v| v.is_str(s))
}

/// A boolean member of `obj`.
pub(crate) fn bool_field(obj: Json<'_>, key: &str) -> Option<bool> {
    obj.get(key)?.as_bool()
}

/// A number member of `obj`.
pub(crate) fn f64_field(obj: Json<'_>, key: &str) -> Option<f64> {
    obj.get(key)?.as_f64()
}

/// The array member `key` of `obj`, its elements (none when absent or not
/// an array).
pub(crate) fn array_field<'d>(obj: Json<'d>, key: &str) -> impl Iterator<Item = Json<'d>> {
    obj.get(key)
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
}

/// A function tool from `obj`: its `name`, `description` and the schema
/// `parameters` (as written; an empty object schema when absent). The
/// members not in `known` go to `tool_extra` with the tool's name.
pub(crate) fn function_tool(
    obj: Json<'_>,
    parameters: Option<Json<'_>>,
    known: &[&str],
    tool_extra: &mut Vec<Value>,
) -> Tool {
    let name = string_field(obj, "name").unwrap_or_default();
    let unknown = rest(obj, known);
    if !unknown.is_empty() {
        let mut e = Map::new();
        e.insert("name".into(), Value::String(name.clone()));
        e.extend(unknown);
        tool_extra.push(Value::Object(e));
    }
    Tool {
        name,
        description: string_field(obj, "description"),
        parameters: parameters.map_or_else(
            || RawJson::from_value(&json!({"type": "object", "properties": {}})),
            RawJson::of,
        ),
    }
}

/// `body` as an object, or an invalid-request error.
pub(crate) fn body_object(body: Json<'_>) -> Result<Json<'_>, ProviderError> {
    if body.is_object() {
        Ok(body)
    } else {
        Err(ProviderError::invalid("request body must be a JSON object"))
    }
}

/// The request's model: the body's `model`, else the one in the path; an
/// invalid-request error without either.
pub(crate) fn request_model(obj: Json<'_>, call: &ModelCall) -> Result<String, ProviderError> {
    string_field(obj, "model")
        .or_else(|| call.path_model.clone())
        .ok_or_else(|| ProviderError::invalid("model: field required"))
}

/// A positive integer as `u32` (saturating).
pub(crate) fn u32_of(v: Option<Json<'_>>) -> Option<u32> {
    v?.as_u64().map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Stop sequences given as a string or an array of strings.
pub(crate) fn stop_list(v: Option<Json<'_>>) -> Vec<String> {
    let Some(v) = v else { return Vec::new() };
    if let Some(s) = v.as_str() {
        return vec![s.into_owned()];
    }
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str().map(Cow::into_owned))
        .collect()
}

/// A value as text: strings as they are, `null` as nothing, anything else
/// as compact JSON.
pub(crate) fn text_of(v: Json<'_>) -> String {
    if v.is_null() {
        return String::new();
    }
    match v.as_str() {
        Some(s) => s.into_owned(),
        None => v.to_compact_string(),
    }
}
