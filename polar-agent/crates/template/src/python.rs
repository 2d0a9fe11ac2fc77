//! Python's text forms of template values, which chat templates rely on
//! because transformers renders them with Jinja2 in Python: `str()` (what
//! `{{ value }}` prints: `None`, `True`, `[1, 'a']`), `repr()` of strings
//! and floats, and `json.dumps` as Hugging Face's `tojson` filter calls it
//! (`ensure_ascii=False`, `indent`, `separators`, `sort_keys`).
//!
//! Pure functions over [`minijinja::Value`]; errors are minijinja errors,
//! so a template that feeds `tojson` something Python could not serialize
//! fails as it would under transformers.

use std::fmt::Write as _;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// `str(value)` as Python prints it; `Undefined` prints as nothing, as
/// Jinja2's default `Undefined` does.
pub fn py_str(value: &Value) -> Result<String, Error> {
    if let Some(s) = value.as_str() {
        return Ok(s.to_owned());
    }
    let mut out = String::new();
    write_repr(&mut out, value, false)?;
    Ok(out)
}

fn write_repr(out: &mut String, value: &Value, quote_strings: bool) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            if quote_strings {
                repr_str(out, s);
            } else {
                out.push_str(s);
            }
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let (open, close) = if value.is_tuple() {
                ("(", ")")
            } else {
                ("[", "]")
            };
            out.push_str(open);
            let items: Vec<Value> = value.try_iter()?.collect();
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, item, true)?;
            }
            if value.is_tuple() && items.len() == 1 {
                out.push(',');
            }
            out.push_str(close);
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key, true)?;
                out.push_str(": ");
                write_repr(out, &value.get_item(&key)?, true)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else {
        out.push_str(&float_repr(
            f64::try_from(value.clone()).unwrap_or(f64::NAN),
        ));
    }
}

/// `repr(s)` for a Python string: single quotes unless the text holds a
/// single quote and no double quote; backslash, the quote, `\n`, `\r`,
/// `\t` and other control characters escaped.
pub fn repr_str(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => {
                let n = c as u32;
                let _ = match n {
                    0..=0xff => write!(out, "\\x{n:02x}"),
                    0x100..=0xffff => write!(out, "\\u{n:04x}"),
                    _ => write!(out, "\\U{n:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character: false for controls
/// (Cc), format characters (Cf), separators other than the space (Zs, Zl,
/// Zp) and private use (Co). Unassigned code points (Cn), which Python
/// also escapes, are printed: telling them apart needs the Unicode
/// database.
fn printable(c: char) -> bool {
    let n = c as u32;
    if c == ' ' {
        return true;
    }
    !matches!(n,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2 | 0x1680 | 0x180e
        | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f | 0x3000
        | 0xe000..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..=0xffffd | 0x100000..=0x10fffd)
}

/// `repr(f)` for a Python float: the shortest digits that read back the
/// same, in positional form for decimal exponents from -4 to 15 (with
/// `.0` when integral), else `1e+16` style; `nan`, `inf`, `-inf`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip form: `d.ddde-5`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// How `json.dumps` lays out what it writes.
#[derive(Clone, Debug, Default)]
pub struct JsonFormat {
    /// `indent`: the text of one level (`indent=2` is two spaces).
    pub indent: Option<String>,
    /// `separators`: item and key separators; Python's defaults are
    /// `", "` and `": "`, or `","` and `": "` with an indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

/// `json.dumps(value, ...)` as Python writes it.
pub fn json_dumps(value: &Value, format: &JsonFormat) -> Result<String, Error> {
    let (item_sep, key_sep) = match (&format.separators, &format.indent) {
        (Some((i, k)), _) => (i.as_str(), k.as_str()),
        (None, Some(_)) => (",", ": "),
        (None, None) => (", ", ": "),
    };
    let mut w = JsonWriter {
        out: String::new(),
        format,
        item_sep,
        key_sep,
    };
    w.value(value, 0)?;
    Ok(w.out)
}

struct JsonWriter<'a> {
    out: String,
    format: &'a JsonFormat,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl JsonWriter<'_> {
    fn newline(&mut self, level: usize) {
        if let Some(indent) = &self.format.indent {
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(indent);
            }
        }
    }

    fn value(&mut self, value: &Value, level: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                let mut s = String::new();
                write_number(&mut s, value);
                match s.as_str() {
                    "nan" => self.out.push_str("NaN"),
                    "inf" => self.out.push_str("Infinity"),
                    "-inf" => self.out.push_str("-Infinity"),
                    _ => self.out.push_str(&s),
                }
            }
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            // Jinja2's `map`, `select`, `selectattr`, ... give generators,
            // which `json.dumps` refuses; minijinja's give lazy iterables.
            ValueKind::Iterable => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "Object of type generator is not JSON serializable",
                ));
            }
            ValueKind::Seq => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    self.out.push_str("[]");
                    return Ok(());
                }
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(self.item_sep);
                    }
                    self.newline(level + 1);
                    self.value(item, level + 1)?;
                }
                self.newline(level);
                self.out.push(']');
            }
            ValueKind::Map => self.map(value, level)?,
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {} is not JSON serializable", value.kind()),
                ));
            }
        }
        Ok(())
    }

    fn map(&mut self, value: &Value, level: usize) -> Result<(), Error> {
        let mut entries: Vec<(String, Value)> = Vec::new();
        for key in value.try_iter()? {
            let item = value.get_item(&key)?;
            entries.push((json_key(&key)?, item));
        }
        if entries.is_empty() {
            self.out.push_str("{}");
            return Ok(());
        }
        if self.format.sort_keys {
            entries.sort_by(|a, b| a.0.cmp(&b.0));
        }
        self.out.push('{');
        for (i, (key, item)) in entries.iter().enumerate() {
            if i > 0 {
                self.out.push_str(self.item_sep);
            }
            self.newline(level + 1);
            self.string(key);
            self.out.push_str(self.key_sep);
            self.value(item, level + 1)?;
        }
        self.newline(level);
        self.out.push('}');
        Ok(())
    }

    fn string(&mut self, s: &str) {
        let out = &mut self.out;
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.format.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A dict key as `json.dumps` turns it into a string.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            Ok(s)
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

/// A JSON value as a template value (objects keep their key order).
pub fn from_json(value: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match value {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(items) => Value::from(items.iter().map(from_json).collect::<Vec<_>>()),
        J::Object(map) => Value::from_pairs(map.iter().map(|(k, v)| (k.as_str(), from_json(v)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(json: &str) -> Value {
        let parsed: serde_json::Value = serde_json::from_str(json).unwrap();
        from_json(&parsed)
    }

    #[test]
    fn str_prints_python_forms() {
        assert_eq!(py_str(&Value::from(())).unwrap(), "None");
        assert_eq!(py_str(&Value::from(true)).unwrap(), "True");
        assert_eq!(py_str(&Value::UNDEFINED).unwrap(), "");
        assert_eq!(py_str(&Value::from("a'b")).unwrap(), "a'b");
        assert_eq!(
            py_str(&v(
                r#"[{"type": "text", "text": "it's"}, 1, 2.5, null, false]"#
            ))
            .unwrap(),
            r#"[{'type': 'text', 'text': "it's"}, 1, 2.5, None, False]"#
        );
        let repr = |s: &str| {
            let mut out = String::new();
            repr_str(&mut out, s);
            out
        };
        assert_eq!(repr("a\nb\\"), r"'a\nb\\'");
        assert_eq!(repr("'\""), r#"'\'"'"#);
        assert_eq!(repr("it's"), r#""it's""#);
        assert_eq!(
            repr("\u{200b}a\u{a0}\u{1b}\u{feff}é\u{e0001}"),
            r"'\u200ba\xa0\x1b\ufeffé\U000e0001'"
        );
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (2.5, "2.5"),
            (-3.0, "-3.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.25e-7, "1.25e-07"),
            (1e100, "1e+100"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn json_dumps_matches_python_defaults() {
        let value = v(
            r#"{"name": "ls", "n": 1, "x": 1.0, "ok": true, "s": "é\"\n\u0001", "l": [], "m": {}}"#,
        );
        assert_eq!(
            json_dumps(&value, &JsonFormat::default()).unwrap(),
            r#"{"name": "ls", "n": 1, "x": 1.0, "ok": true, "s": "é\"\n\u0001", "l": [], "m": {}}"#
        );
        let indented = JsonFormat {
            indent: Some("  ".into()),
            ..JsonFormat::default()
        };
        assert_eq!(
            json_dumps(&v(r#"{"a": [1, {"b": null}], "c": {}}"#), &indented).unwrap(),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {}\n}"
        );
        let compact = JsonFormat {
            separators: Some((",".into(), ":".into())),
            sort_keys: true,
            ensure_ascii: true,
            ..JsonFormat::default()
        };
        assert_eq!(
            json_dumps(&v(r#"{"b": "é😀", "a": 1}"#), &compact).unwrap(),
            r#"{"a":1,"b":"\u00e9\ud83d\ude00"}"#
        );
    }

    #[test]
    fn json_dumps_refuses_undefined() {
        let err = json_dumps(&Value::UNDEFINED, &JsonFormat::default()).unwrap_err();
        assert!(err.to_string().contains("not JSON serializable"), "{err}");
    }
}
