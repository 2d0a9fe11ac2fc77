use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

/// The document's value rebuilt from the handle's accessors alone (not
/// `to_value`, which defers to serde_json for containers).
fn rebuild(j: Json<'_>) -> Value {
    match j.kind() {
        Kind::Null => Value::Null,
        Kind::Bool => Value::Bool(j.as_bool().unwrap()),
        Kind::Number => serde_json::from_str(j.raw()).unwrap(),
        Kind::String => Value::String(j.as_str().unwrap().into_owned()),
        Kind::Array => Value::Array(j.as_array().unwrap().map(rebuild).collect()),
        Kind::Object => {
            let mut m = serde_json::Map::new();
            for (k, v) in j.as_object().unwrap() {
                m.insert(k.into_owned(), rebuild(v));
            }
            Value::Object(m)
        }
    }
}

fn parse(text: &str) -> Result<Value, JsonError> {
    Doc::parse(text.as_bytes()).map(|d| rebuild(d.root()))
}

#[test]
fn reads_what_serde_json_reads() {
    for text in [
        r#"{"a": [1, -2.5e3, true, false, null, "x"], "b": {"c": {}}, "d": []}"#,
        r#"  "tab\there \"q\" \\ \/ \b\f\n\r \u00e9 \ud83d\ude00 é"  "#,
        "0",
        "-0.0E+1",
        r#"[[[[]]], {"": ""}]"#,
        r#"{"k": 1, "k": 2}"#,
        r#"{ "a" : [ 1 , 2 ] , "s": "x y\t" , "n": -12 }"#,
        r#"{"f": 1.50, "e": 1e3, "big": 123456789012345678901, "u": "\u00e9\/"}"#,
        r#"[-0, 0, -5, 1.0, 1e2, -0.0, 9007199254740993, -9223372036854775808]"#,
        r#"[123456789012345678901, 1.2345678901234567890123e5, 0.1000000000000000055511151231257827, 9.999999999999999e22]"#,
        r#"["\u001f\u0001 \u0008\b \u000A \u00e9 \/ \"", "\u001F", "\ud83d\ude00"]"#,
    ] {
        let want: Value = serde_json::from_str(text).unwrap();
        assert_eq!(parse(text).unwrap(), want, "{text}");
        let doc = Doc::parse(text.as_bytes()).unwrap();
        assert_eq!(doc.root().to_value(), want);
        assert_eq!(doc.root().to_compact_string(), want.to_string());
    }
}

#[test]
fn refuses_what_serde_json_refuses() {
    for text in [
        "",
        " ",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{1: 2}",
        "01",
        "1.",
        "1e",
        "-",
        ".5",
        "tru",
        "nul",
        "\"abc",
        "\"a\nb\"",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\ud800\"",
        "\"\\ud800\\u0041\"",
        "\"\\udc00\"",
        "[1] [2]",
        "{} x",
        "-9E8307",
        "1e400",
    ] {
        assert!(
            serde_json::from_str::<Value>(text).is_err(),
            "serde_json reads {text:?}"
        );
        assert!(Doc::parse(text.as_bytes()).is_err(), "{text:?}");
    }
    assert!(Doc::parse(b"\"\xff\"").is_err());
    let deep = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
    assert!(Doc::parse(deep.as_bytes()).is_ok());
    let deeper = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
    let err = Doc::parse(deeper.as_bytes()).unwrap_err();
    assert_eq!(err.what, "nesting too deep");
}

#[test]
fn accessors_follow_serde_json_value() {
    let doc = Doc::parse(
        br#"{"n": 7, "neg": -3, "f": 1.5, "big": 18446744073709551616, "long": 0.30000000000000004441, "s": "a\nb", "p": "plain", "k": 1, "k": 2}"#,
    )
    .unwrap();
    let r = doc.root();
    let v: Value = serde_json::from_str(r.raw()).unwrap();
    for key in ["n", "neg", "f", "big", "long", "s", "p", "k", "missing"] {
        let j = r.get(key);
        let want = v.get(key);
        assert_eq!(
            j.and_then(|j| j.as_u64()),
            want.and_then(Value::as_u64),
            "{key}"
        );
        assert_eq!(
            j.and_then(|j| j.as_f64()),
            want.and_then(Value::as_f64),
            "{key}"
        );
        assert_eq!(
            j.and_then(|j| j.as_str()).as_deref(),
            want.and_then(Value::as_str),
            "{key}"
        );
        assert_eq!(
            r.get_str(key).as_deref(),
            want.and_then(Value::as_str),
            "{key}"
        );
    }
    assert!(matches!(
        r.get("p").unwrap().as_str(),
        Some(Cow::Borrowed("plain"))
    ));
    assert!(r.get("s").unwrap().is_str("a\nb"));
    assert_eq!(r.get("s").unwrap().raw(), r#""a\nb""#);
    assert_eq!(r.as_object().unwrap().count(), 9);
    assert!(r.get("n").unwrap().get("x").is_none());
    assert!(r.as_array().is_none());
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
        "[\"\\\\\n\t\u{0}-\u{1f}é😀]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(("[a-z\"\\\\\n]{0,4}", inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn round_trips_any_value(v in arb_json(), pretty in any::<bool>()) {
        let text = if pretty { serde_json::to_string_pretty(&v) } else { serde_json::to_string(&v) }.unwrap();
        // serde_json's reading of the text, not `v`: its float parsing does
        // not always round-trip, and numbers are read the same way here.
        let want: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(parse(&text).unwrap(), want.clone());
        let doc = Doc::parse(text.as_bytes()).unwrap();
        prop_assert_eq!(doc.root().to_value(), want.clone());
        prop_assert_eq!(doc.root().raw(), text.as_str());
        prop_assert_eq!(doc.root().to_compact_string(), want.to_string());
    }

    #[test]
    fn never_panics_and_agrees_on_validity(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let ours = Doc::parse(&bytes).is_ok();
        let theirs = serde_json::from_slice::<Value>(&bytes).is_ok();
        prop_assert_eq!(ours, theirs);
    }

    #[test]
    fn agrees_on_validity_of_mutated_json(v in arb_json(), at in any::<prop::sample::Index>(), b in any::<u8>()) {
        let mut bytes = serde_json::to_vec(&v).unwrap();
        let i = at.index(bytes.len());
        bytes[i] = b;
        prop_assert_eq!(Doc::parse(&bytes).is_ok(), serde_json::from_slice::<Value>(&bytes).is_ok());
    }
}

proptest! {
    #[test]
    fn strings_are_written_as_serde_json_writes_them(
        s in "(?s:.{0,40})",
        plain in "[a-z ]{0,20}",
        controls in prop::collection::vec(0u8..0x20, 0..4),
    ) {
        let mut text = plain.clone();
        for c in &controls {
            text.push(char::from(*c));
            text.push_str(&s);
            text.push_str(&plain);
        }
        for t in [s.as_str(), plain.as_str(), text.as_str()] {
            let mut out = Vec::new();
            write_str(&mut out, t);
            prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(t).unwrap());
        }
    }
}

#[test]
fn every_byte_is_escaped_as_serde_json_escapes_it() {
    let all: String = (0u8..0x80)
        .map(char::from)
        .chain(['é', '😀', '\u{7f}'])
        .collect();
    for len in [all.len(), 7, 8, 9, 16, 17] {
        for start in 0..all.len() {
            let Some(piece) = all.get(start..(start + len).min(all.len())) else {
                continue;
            };
            let mut out = Vec::new();
            write_str(&mut out, piece);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(piece).unwrap()
            );
        }
    }
}

#[test]
fn serde_jsons_raw_value_key_is_refused_however_escaped() {
    // Found by the `request_gemini` fuzz target: serde_json reads an object
    // whose first key is this as the JSON text its value holds (or fails),
    // so a record holding the body could not be read back.
    for text in [
        r#"{"$serde_json::private::RawValue": {"a": 1}}"#,
        r#"{"a": [{"b": 1, "$serde_json::private::RawValue": "{}"}]}"#,
        r#"{"\u0024serde_json::private::RawValue": 1}"#,
        r#"{"$serde_json::private::Raw\u0056alue": 1}"#,
    ] {
        let err = Doc::parse(text.as_bytes()).unwrap_err();
        assert!(err.what.contains("reserved by serde_json"), "{text}: {err}");
    }
    // Near misses are ordinary keys.
    for text in [
        r#"{"$serde_json::private::RawValue2": 1}"#,
        r#"{"serde_json::private::RawValue": 1}"#,
        r#"{"x": "$serde_json::private::RawValue"}"#,
    ] {
        assert!(Doc::parse(text.as_bytes()).is_ok(), "{text}");
    }
}
