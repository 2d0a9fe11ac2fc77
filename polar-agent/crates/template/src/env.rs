//! The Jinja environment transformers renders chat templates in
//! (`_compile_jinja_template` in `transformers/utils/chat_template_utils.py`),
//! rebuilt on minijinja: `trim_blocks` and `lstrip_blocks`, loop controls,
//! the `{% generation %}` tag (rendered as its body),
//! no auto-escaping, a trailing newline of the template dropped; the globals
//! `raise_exception`, `strftime_now`, `namespace` and `dict`; Jinja2's `iterable`, `sequence` and `number`
//! tests; `map`, `select` and their kin giving generators; Hugging
//! Face's `tojson` (`json.dumps` with `ensure_ascii=False`, the key order
//! kept); Python's `str`/`dict`/`list` methods (minijinja-contrib's
//! `pycompat`); and values printed as Python prints them (`None`, `True`,
//! `['a']`), with `trim` and `string` taking any value as Jinja2's do.

use minijinja::syntax::SyntaxConfig;
use std::borrow::Cow;

use minijinja::value::{Kwargs, Rest, ValueKind, ValueOrKwargs};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, Value, filters};

use crate::python::{JsonFormat, json_dumps, py_str};

/// The message of a template's `raise_exception(...)`, kept as the source
/// of the render error so the caller can tell it from an engine error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Raised(pub String);

/// Hugging Face's environment, without templates.
pub fn environment() -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| {
        let text = match value.as_str() {
            Some(s) => s.to_owned(),
            None => py_str(value)?,
        };
        out.write_str(&text)
            .map_err(|e| Error::new(ErrorKind::WriteFailure, "writing the output").with_source(e))
    });
    env.add_filter("tojson", tojson);
    env.add_filter("trim", trim);
    env.add_filter("string", |value: Value| -> Result<String, Error> {
        py_str(&value)
    });
    // Jinja2's tests where minijinja's differ: `none` is not iterable;
    // strings and dicts are sequences; a bool is a number (Python's `True`
    // is an `int`).
    env.add_test("iterable", |v: Value| !v.is_none() && v.try_iter().is_ok());
    env.add_test("sequence", |v: Value| {
        v.is_undefined()
            || matches!(
                v.kind(),
                ValueKind::Seq | ValueKind::String | ValueKind::Map
            )
    });
    env.add_test("number", |v: Value| {
        matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
    });
    // Jinja2's `map`, `select`, `selectattr`, `reject` and `rejectattr`
    // give generators: always true, of no length, refused by `tojson`.
    env.add_filter(
        "map",
        |state: &mut State, value: Value, args: Rest<ValueOrKwargs>| {
            filters::map(state, value, args).map(generator)
        },
    );
    env.add_filter(
        "select",
        |state: &mut State, value: Value, test: Option<String>, args: Rest<ValueOrKwargs>| {
            filters::select(state, value, test.map(Cow::Owned), args).map(generator)
        },
    );
    env.add_filter(
        "reject",
        |state: &mut State, value: Value, test: Option<String>, args: Rest<ValueOrKwargs>| {
            filters::reject(state, value, test.map(Cow::Owned), args).map(generator)
        },
    );
    env.add_filter(
        "selectattr",
        |state: &mut State,
         value: Value,
         attr: String,
         test: Option<String>,
         args: Rest<ValueOrKwargs>| {
            filters::selectattr(state, value, Cow::Owned(attr), test.map(Cow::Owned), args)
                .map(generator)
        },
    );
    env.add_filter(
        "rejectattr",
        |state: &mut State,
         value: Value,
         attr: String,
         test: Option<String>,
         args: Rest<ValueOrKwargs>| {
            filters::rejectattr(state, value, Cow::Owned(attr), test.map(Cow::Owned), args)
                .map(generator)
        },
    );
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    Ok(env)
}

/// Compiles `source` into `env` as `name`.
pub fn add(env: &mut Environment<'static>, name: String, source: &str) -> Result<(), Error> {
    env.add_template_owned(name, without_generation_tags(source))
}

/// The template with transformers' `{% generation %}` ... `{%
/// endgeneration %}` (its `AssistantTracker` extension, which marks the
/// assistant's tokens and renders its body unchanged) as `{% if true %}`
/// ... `{% endif %}`: still block tags, so `trim_blocks`, `lstrip_blocks`
/// and `-` whitespace control act on them as on the originals.
pub fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(body) => (&inner[..1], body),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        let replaced = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replaced {
            Some(word) => {
                out.push_str("{%");
                out.push_str(open);
                out.push(' ');
                out.push_str(word);
                out.push(' ');
                out.push_str(close);
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A Python generator over `items`: iterable (more than once: minijinja
/// may), of unknown length, so always true.
fn generator(items: Vec<Value>) -> Value {
    Value::make_iterable(move || items.clone().into_iter().filter(|_| true))
}

/// `raise_exception(message)`: fails the render with the template's message.
fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = py_str(&message)?;
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// Hugging Face's `tojson(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, positionally or by name.
fn tojson(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let arg = |i: usize| -> Result<Option<Value>, Error> {
        let name = NAMES[i];
        match (args.get(i), kwargs.has(name)) {
            (Some(_), true) => Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson got multiple values for argument '{name}'"),
            )),
            (Some(v), false) => Ok(Some(v.clone())),
            (None, true) => kwargs.get::<Value>(name).map(Some),
            (None, false) => Ok(None),
        }
    };
    let ensure_ascii = arg(0)?.is_some_and(|v| v.is_true());
    let indent = match arg(1)? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_owned(),
            None => {
                let n = i64::try_from(v)?;
                " ".repeat(usize::try_from(n).unwrap_or(0))
            }
        }),
    };
    let separators = match arg(2)? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] => Some((py_str(item)?, py_str(key)?)),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson separators must be an (item, key) pair",
                    ));
                }
            }
        }
    };
    let sort_keys = arg(3)?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let format = JsonFormat {
        indent,
        separators,
        sort_keys,
        ensure_ascii,
    };
    json_dumps(&value, &format).map(Value::from)
}

/// Jinja2's `trim(value, chars=None)`: `str(value).strip(chars)`.
fn trim(value: Value, chars: Option<String>) -> Result<String, Error> {
    let text = py_str(&value)?;
    Ok(match chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)).to_owned(),
        None => text.trim().to_owned(),
    })
}

/// `strftime_now(format)`: the current time (UTC: the agent runs in UTC,
/// as the servers do) in C `strftime` notation.
fn strftime_now(format: String) -> Result<String, Error> {
    Ok(crate::strftime::format(
        time::OffsetDateTime::now_utc(),
        &format,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_plain_blocks() {
        assert_eq!(
            without_generation_tags(
                "a{%- generation -%}b{% endgeneration %}c{{ x }}{% if y %}{%+endgeneration-%}"
            ),
            "a{%- if true -%}b{% endif %}c{{ x }}{% if y %}{%+ endif -%}"
        );
        assert_eq!(
            without_generation_tags("{% raw %}x{% end"),
            "{% raw %}x{% end"
        );
    }
}
