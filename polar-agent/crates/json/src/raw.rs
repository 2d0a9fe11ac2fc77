//! [`RawJson`]: JSON text kept exactly as it was received, for records
//! that must hold what a harness sent without the cost of a tree.

use std::fmt;

use bytes::Bytes;
use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use super::Json;

/// One JSON value as text. Serialized as the value itself (not as a string),
/// byte for byte; cloning shares the bytes. Two are equal when they hold
/// the same value, however it is written.
#[derive(Clone)]
pub struct RawJson(Bytes);

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0 || self.to_value() == other.to_value()
    }
}

impl RawJson {
    /// `bytes` that [`super::Doc::parse`] accepted. (Text that is not JSON is
    /// refused again when the value is serialized.)
    pub fn from_checked(bytes: Bytes) -> Self {
        Self(bytes)
    }

    /// The JSON text of `value`.
    pub fn from_value(value: &Value) -> Self {
        Self(Bytes::from(value.to_string()))
    }

    /// `null`.
    pub fn null() -> Self {
        Self(Bytes::from_static(b"null"))
    }

    /// The value of `json`, as its document has it (a slice of the
    /// document's buffer when it was parsed shared).
    pub fn of(json: Json<'_>) -> Self {
        Self(json.raw_bytes())
    }

    /// The text, as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("null")
    }

    /// The value as a tree (`null` if the text is not JSON).
    pub fn to_value(&self) -> Value {
        serde_json::from_slice(&self.0).unwrap_or(Value::Null)
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = std::str::from_utf8(&self.0).map_err(S::Error::custom)?;
        let raw: &RawValue = serde_json::from_str(text).map_err(S::Error::custom)?;
        raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d).map_err(D::Error::custom)?;
        let text: Box<str> = raw.into();
        Ok(Self(Bytes::from(text.into_string())))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::Doc;

    #[test]
    fn serializes_as_the_value_itself_byte_for_byte() {
        let text = Bytes::from_static(b"{\"b\": 1,  \"a\": [true]}");
        assert!(Doc::parse(&text).is_ok());
        let raw = RawJson::from_checked(text);
        let line = serde_json::to_string(&json!({"x": 1})).unwrap();
        assert_eq!(line, r#"{"x":1}"#);
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Rec {
            body: RawJson,
        }
        let text = serde_json::to_string(&Rec { body: raw.clone() }).unwrap();
        assert_eq!(text, r#"{"body":{"b": 1,  "a": [true]}}"#);
        let back: Rec = serde_json::from_str(&text).unwrap();
        assert_eq!(back.body, raw);
        assert_eq!(raw.to_value(), json!({"b": 1, "a": [true]}));
        assert_eq!(RawJson::from_value(&json!("s")).as_str(), "\"s\"");
        assert_eq!(RawJson::null().to_value(), Value::Null);
    }

    #[test]
    fn text_that_is_not_json_is_refused() {
        let bad = RawJson::from_checked(Bytes::from_static(b"{oops"));
        assert!(serde_json::to_string(&bad).is_err());
    }
}
