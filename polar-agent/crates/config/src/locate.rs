//! Maps between byte spans of the TOML text and [`KeyPath`]s, so that
//! deserializer errors (which only carry a span) name their key, and
//! validation errors (which only carry a key) get a line and column.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::error::{ConfigError, KeyPath, Location, Segment};

/// The TOML document parsed with spans, to look keys up in.
pub(crate) struct SpanIndex<'a> {
    source: &'a str,
    doc: Spanned<DeTable<'a>>,
}

impl<'a> SpanIndex<'a> {
    /// Parses `source`; a syntax error comes back as [`ConfigError::Syntax`].
    pub(crate) fn parse(source: &'a str) -> Result<Self, ConfigError> {
        match DeTable::parse(source) {
            Ok(doc) => Ok(Self { source, doc }),
            Err(error) => Err(ConfigError::Syntax {
                at: Location::of_offset(source, error.span().map_or(0, |s| s.start)),
                message: error.message().to_owned(),
            }),
        }
    }

    /// The location of byte `offset`.
    pub(crate) fn location(&self, offset: usize) -> Location {
        Location::of_offset(self.source, offset)
    }

    /// The deepest key whose key or value span encloses `span`.
    pub(crate) fn path_at(&self, span: &Range<usize>) -> KeyPath {
        let mut best = Best::default();
        let mut path = Vec::new();
        visit_table(self.doc.get_ref(), &mut path, span, &mut best);
        KeyPath::from_segments(best.path)
    }

    /// Where `path` is written: its value if present, else the nearest
    /// enclosing table or array that is (so a missing key points at its table).
    pub(crate) fn locate(&self, path: &KeyPath) -> Option<Location> {
        let mut current: Option<&Spanned<DeValue<'a>>> = None;
        for segment in path.segments() {
            let next = match (segment, current.map(Spanned::get_ref)) {
                (Segment::Key(key), None) => find_key(self.doc.get_ref(), key),
                (Segment::Key(key), Some(DeValue::Table(table))) => find_key(table, key),
                (Segment::Index(index), Some(DeValue::Array(array))) => array.get(*index),
                _ => None,
            };
            match next {
                Some(next) => current = Some(next),
                None => break,
            }
        }
        current.map(|value| self.location(value.span().start))
    }
}

fn find_key<'t, 'a>(table: &'t DeTable<'a>, key: &str) -> Option<&'t Spanned<DeValue<'a>>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == key)
        .map(|(_, v)| v)
}

/// The best candidate found so far by [`SpanIndex::path_at`].
#[derive(Default)]
struct Best {
    path: Vec<Segment>,
    len: Option<usize>,
}

impl Best {
    /// Keeps `path` if `node` encloses `target` at least as tightly as the
    /// best so far (deeper candidates are visited later, so they win ties).
    fn offer(&mut self, node: &Range<usize>, target: &Range<usize>, path: &[Segment]) {
        let encloses = node.start <= target.start && target.end <= node.end;
        let len = node.end - node.start;
        if encloses && self.len.is_none_or(|best| len <= best) {
            self.len = Some(len);
            self.path = path.to_vec();
        }
    }
}

fn visit_table(
    table: &DeTable<'_>,
    path: &mut Vec<Segment>,
    target: &Range<usize>,
    best: &mut Best,
) {
    for (key, value) in table.iter() {
        path.push(Segment::Key(key.get_ref().to_string()));
        best.offer(&key.span(), target, path);
        visit_value(value, path, target, best);
        path.pop();
    }
}

fn visit_value(
    value: &Spanned<DeValue<'_>>,
    path: &mut Vec<Segment>,
    target: &Range<usize>,
    best: &mut Best,
) {
    best.offer(&value.span(), target, path);
    match value.get_ref() {
        DeValue::Table(table) => visit_table(table, path, target, best),
        DeValue::Array(array) => {
            for (index, item) in array.iter().enumerate() {
                path.push(Segment::Index(index));
                visit_value(item, path, target, best);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Turns the deserializer's error into a [`ConfigError`] that names its key.
pub(crate) fn from_toml_error(source: &str, error: &toml::de::Error) -> ConfigError {
    let index = match SpanIndex::parse(source) {
        Ok(index) => index,
        Err(syntax) => return syntax,
    };
    let span = error.span();
    let path = span
        .as_ref()
        .map_or_else(KeyPath::root, |span| index.path_at(span));
    let at = span.map(|span| index.location(span.start));
    let message = error.message();
    if let Some((field, expected)) = parse_unknown_field(message) {
        // The span is the unknown key itself: report the table that holds it.
        let table = match path.segments().last() {
            Some(Segment::Key(key)) if key == field => path.parent().unwrap_or_default(),
            _ => path,
        };
        return ConfigError::UnknownField {
            field: field.to_owned(),
            table,
            expected: expected.to_owned(),
            at,
        };
    }
    ConfigError::Schema {
        key: path,
        message: message.to_owned(),
        at,
    }
}

/// Splits serde's "unknown field `x`, expected ..." into the field and the list.
fn parse_unknown_field(message: &str) -> Option<(&str, &str)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (field, rest) = rest.split_once('`')?;
    let expected = rest
        .strip_prefix(", expected ")
        .or_else(|| rest.strip_prefix(", there are no fields"))
        .unwrap_or("");
    Some((field, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "default_action = \"deny\"\n\
                       [proxy]\n\
                       max_body_bytes = 5\n\
                       [[route]]\n\
                       host = \"a\"\n\
                       [[route]]\n\
                       host = \"b\"\n\
                       ports = [1, 2]\n";

    fn path(s: &str) -> KeyPath {
        let mut path = KeyPath::root();
        for part in s.split('.') {
            match part.split_once('[') {
                Some((key, index)) => {
                    path = path.key(key);
                    let index = index.trim_end_matches(']').parse().unwrap_or(usize::MAX);
                    path = path.index(index);
                }
                None => path = path.key(part),
            }
        }
        path
    }

    fn span_of(needle: &str) -> Range<usize> {
        let start = DOC.find(needle).unwrap_or(usize::MAX);
        start..start + needle.len()
    }

    #[test]
    fn path_at_finds_keys_values_and_tables() {
        let index = SpanIndex::parse(DOC);
        let Ok(index) = index else {
            panic!("DOC parses");
        };
        assert_eq!(index.path_at(&span_of("5")), path("proxy.max_body_bytes"));
        assert_eq!(index.path_at(&span_of("\"b\"")), path("route[1].host"));
        let two = span_of("2]").start;
        assert_eq!(
            index.path_at(&(two..two + 1)).to_string(),
            "route[1].ports[1]"
        );
        assert_eq!(index.path_at(&span_of("ports")), path("route[1].ports"));
        // A `[[route]]` header stands for its table.
        let second = DOC.rfind("[[route]]").unwrap_or(0);
        assert_eq!(index.path_at(&(second..second + 9)), path("route[1]"));
        assert_eq!(index.path_at(&(0..0)), path("default_action"));
    }

    #[test]
    fn locate_falls_back_to_the_enclosing_table() {
        let Ok(index) = SpanIndex::parse(DOC) else {
            panic!("DOC parses");
        };
        assert_eq!(
            index.locate(&path("route[1].host")),
            Some(Location { line: 7, column: 8 })
        );
        // Missing key: the `[[route]]` header of its table.
        assert_eq!(
            index.locate(&path("route[0].upstream")),
            Some(Location { line: 4, column: 1 })
        );
        assert_eq!(index.locate(&path("ca.validity_days")), None);
    }

    #[test]
    fn unknown_field_messages_split() {
        assert_eq!(
            parse_unknown_field("unknown field `hots`, expected one of `host`, `ports`"),
            Some(("hots", "one of `host`, `ports`"))
        );
        assert_eq!(parse_unknown_field("missing field `host`"), None);
    }

    #[test]
    fn syntax_errors_have_a_location() {
        let Err(error) = SpanIndex::parse("a = 1\n[proxy\n") else {
            panic!("must fail");
        };
        assert!(
            matches!(error, ConfigError::Syntax { at, .. } if at.line == 2),
            "{error}"
        );
    }
}
