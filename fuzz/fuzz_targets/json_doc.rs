//! The JSON document reader (`polar_json::Doc`) against `serde_json`, on
//! any bytes: the same documents accepted and refused, and for accepted
//! ones the same value, whether rebuilt from the handle's accessors alone
//! or by `to_value`, the same compact text, and the root's raw text the
//! document's without its surrounding whitespace. The one intended
//! difference: `polar_json::RAW_VALUE_KEY` is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polar_json::{Doc, Json, Kind};
use serde_json::Value;

/// The value from the accessors alone.
fn rebuild(j: Json<'_>) -> Value {
    match j.kind() {
        Kind::Null => Value::Null,
        Kind::Bool => Value::Bool(j.as_bool().expect("a bool")),
        Kind::Number => serde_json::from_str(j.raw()).expect("a number serde_json reads"),
        Kind::String => Value::String(j.as_str().expect("a string").into_owned()),
        Kind::Array => Value::Array(j.as_array().expect("an array").map(rebuild).collect()),
        Kind::Object => {
            let mut m = serde_json::Map::new();
            for (k, v) in j.as_object().expect("an object") {
                m.insert(k.into_owned(), rebuild(v));
            }
            Value::Object(m)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let theirs = serde_json::from_slice::<Value>(data);
    let ours = Doc::parse(data);
    match (&ours, &theirs) {
        (Ok(doc), Ok(want)) => {
            let root = doc.root();
            assert_eq!(&rebuild(root), want);
            assert_eq!(&root.to_value(), want);
            assert_eq!(root.to_compact_string(), want.to_string());
            let text = std::str::from_utf8(data).expect("UTF-8");
            assert_eq!(root.raw(), text.trim_matches([' ', '\t', '\n', '\r']));
            if let Kind::Number = root.kind() {
                assert_eq!(root.as_u64(), want.as_u64());
                assert_eq!(root.as_f64(), want.as_f64());
            }
        }
        (Err(_), Err(_)) => {}
        // The key serde_json reserves for raw values is refused on purpose.
        (Err(e), Ok(_)) if e.what.contains("reserved by serde_json") => {}
        (Ok(_), Err(e)) => panic!("accepted what serde_json refuses ({e})"),
        (Err(e), Ok(_)) => panic!("refused what serde_json reads ({e})"),
    }
});
