//! A JSON document read once into a flat tape of nodes that borrow the
//! text: the harness's request bodies are read this way on the path of
//! every model call.
//!
//! Building a `serde_json::Value` of a 100 KB agent request takes about
//! 90 µs on the nodes this runs on, most of it allocating maps, keys and
//! strings that translation then copies again. [`Doc::parse`] validates the
//! text as `serde_json` does (RFC 8259: UTF-8, grammar, escapes and paired
//! surrogates, numbers within `f64`, nesting at most [`MAX_DEPTH`]) and
//! records, for each value, its kind and byte span in one vector; strings
//! stay escaped until asked for ([`Json::as_str`] borrows when there is
//! nothing to unescape). [`Json`] is a cheap handle on one value with the
//! accessors translation needs; [`Json::to_value`] builds a
//! `serde_json::Value` of one part when a tree is wanted (unknown fields
//! kept as they were), [`Json::to_compact_string`] its compact text. Parsed
//! from a shared buffer ([`Doc::parse_shared`]), parts of the document can
//! be kept without copying ([`Json::str_bytes`], [`Json::raw_bytes`],
//! [`RawJson`]).
//!
//! Writing: [`write_str`] escapes a string exactly as `serde_json` does.
//! Both directions find the bytes that matter (quotes, backslashes,
//! control characters) sixteen bytes at a time with SSE2 on x86-64, eight
//! at a time elsewhere, so long texts cost little more than a copy.
//!
//! Semantics follow `serde_json::Value`'s: a repeated object key reads as
//! its last occurrence; `as_u64` accepts integers only and `as_f64`
//! any number. One difference: the key serde_json reserves for raw values
//! ([`RAW_VALUE_KEY`]) is refused.
//!
//! Pure: no Polar crate, no I/O crate. Tests: `tests.rs` (property tests
//! against serde_json on valid, random and mutated input).
#![deny(unsafe_op_in_unsafe_fn)]

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::Value;

mod raw;
pub use raw::RawJson;

/// Deepest nesting of arrays and objects accepted (`serde_json`'s limit).
pub const MAX_DEPTH: usize = 128;

/// The object key serde_json reserves for its raw values: read back into a
/// `serde_json::Value` (the capture log's reader, `polar export`), an
/// object whose first key it is turns into the JSON text its value holds,
/// or fails. [`Doc::parse`] refuses it anywhere (found by the
/// `request_gemini` fuzz target: a request body with it made its record
/// unreadable).
pub const RAW_VALUE_KEY: &str = "$serde_json::private::RawValue";

/// Why a text is not a JSON document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {at}")]
pub struct JsonError {
    /// What is wrong.
    pub what: &'static str,
    /// Byte offset where it was found.
    pub at: usize,
}

/// The kind of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    Null,
    True,
    False,
    Number,
    /// A string with no escape in it.
    Plain,
    /// A string with at least one escape.
    Escaped,
    Array,
    Object,
}

/// One value: its tag, its span in the text (a string's span is between
/// its quotes), and for arrays and objects the index of the first node
/// after its contents (its children follow it; an object's alternate key,
/// value).
#[derive(Clone, Copy, Debug)]
struct Node {
    tag: Tag,
    start: u32,
    end: u32,
    next: u32,
}

/// A parsed document.
#[derive(Debug)]
pub struct Doc<'a> {
    text: &'a str,
    nodes: Vec<Node>,
    /// The buffer `text` is, when shared ([`Doc::parse_shared`]).
    owner: Option<&'a Bytes>,
}

impl<'a> Doc<'a> {
    /// Parses a shared buffer: strings taken from the document
    /// ([`Json::str_bytes`]) are then slices of it, not copies.
    pub fn parse_shared(bytes: &'a Bytes) -> Result<Self, JsonError> {
        let mut doc = Self::parse(bytes)?;
        doc.owner = Some(bytes);
        Ok(doc)
    }

    /// Parses `bytes` as one JSON value, with optional whitespace around.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, JsonError> {
        let text = std::str::from_utf8(bytes).map_err(|e| JsonError {
            what: "invalid UTF-8",
            at: e.valid_up_to(),
        })?;
        if u32::try_from(text.len()).is_err() {
            return Err(JsonError {
                what: "document larger than 4 GiB",
                at: 0,
            });
        }
        let mut p = Parser {
            b: text.as_bytes(),
            i: 0,
            // About one node per 60 bytes of agent requests (long strings).
            nodes: Vec::with_capacity(text.len() / 64 + 16),
        };
        p.value(0)?;
        p.skip_ws();
        if p.i != p.b.len() {
            return Err(p.err("trailing characters"));
        }
        Ok(Self {
            text,
            nodes: p.nodes,
            owner: None,
        })
    }

    /// The document's value.
    pub fn root(&self) -> Json<'_> {
        Json {
            text: self.text,
            nodes: &self.nodes,
            owner: self.owner,
            i: 0,
        }
    }
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    nodes: Vec<Node>,
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The eight bytes of `b` at `i`, as a little-endian word.
#[inline]
fn word(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

/// High bits set in `w`'s bytes equal to `c`. Above the lowest byte
/// flagged, flags can be false (borrows); the lowest one is exact.
#[inline]
fn bytes_equal(w: u64, c: u8) -> u64 {
    let x = w ^ (ONES * u64::from(c));
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// High bits set in `w`'s bytes below 0x20, quotes and backslashes (the
/// lowest one exact, as for [`bytes_equal`]).
#[inline]
fn special_bytes(w: u64) -> u64 {
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
    below_space | bytes_equal(w, b'"') | bytes_equal(w, b'\\')
}

/// Offset of the lowest byte flagged in a non-zero mask.
#[inline]
fn lowest(mask: u64) -> usize {
    (mask.trailing_zeros() / 8) as usize
}

/// Position of the first byte at or after `i` that is below 0x20, a quote
/// or a backslash (`b.len()` if none): sixteen bytes at a time with SSE2
/// (part of every x86-64), then eight at a time.
#[inline]
pub(crate) fn skip_plain(b: &[u8], mut i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
            _mm_set1_epi8,
        };
        #[allow(
            clippy::cast_possible_wrap,
            clippy::cast_sign_loss,
            reason = "bytes as SSE lanes; the mask is 16 bits"
        )]
        // SAFETY: SSE2 is in the x86-64 baseline, so the intrinsics exist on
        // every target this compiles for; each load reads the 16 bytes at
        // `i..i + 16`, inside `b` by the loop's condition, unaligned as
        // `_mm_loadu_si128` allows.
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            let control = _mm_set1_epi8(0x1f);
            while i + 16 <= b.len() {
                let v = _mm_loadu_si128(b.as_ptr().add(i).cast());
                // v <= 0x1f (unsigned) exactly when min(v, 0x1f) == v.
                let below = _mm_cmpeq_epi8(_mm_min_epu8(v, control), v);
                let special = _mm_or_si128(
                    below,
                    _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                );
                let mask = _mm_movemask_epi8(special) as u32;
                if mask != 0 {
                    return i + mask.trailing_zeros() as usize;
                }
                i += 16;
            }
        }
    }
    while i + 8 <= b.len() {
        let m = special_bytes(word(b, i));
        if m != 0 {
            return i + lowest(m);
        }
        i += 8;
    }
    while i < b.len() && !matches!(b[i], 0..0x20 | b'"' | b'\\') {
        i += 1;
    }
    i
}

/// Position of the first backslash at or after `i` (`b.len()` if none),
/// eight bytes at a time.
fn find_backslash(b: &[u8], mut i: usize) -> usize {
    while i + 8 <= b.len() {
        let m = bytes_equal(word(b, i), b'\\');
        if m != 0 {
            return i + lowest(m);
        }
        i += 8;
    }
    b[i..]
        .iter()
        .position(|c| *c == b'\\')
        .map_or(b.len(), |p| i + p)
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "offsets fit in u32: Doc::parse refuses larger texts"
)]
fn off(i: usize) -> u32 {
    i as u32
}

impl Parser<'_> {
    fn err(&self, what: &'static str) -> JsonError {
        JsonError { what, at: self.i }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn push(&mut self, tag: Tag, start: usize, end: usize) -> usize {
        self.nodes.push(Node {
            tag,
            start: off(start),
            end: off(end),
            next: 0,
        });
        self.nodes.len() - 1
    }

    fn value(&mut self, depth: usize) -> Result<(), JsonError> {
        self.skip_ws();
        let start = self.i;
        match self.b.get(self.i) {
            None => Err(self.err("unexpected end of input")),
            Some(b'"') => self.string(),
            Some(b'{') => self.container(depth + 1, Tag::Object),
            Some(b'[') => self.container(depth + 1, Tag::Array),
            Some(b't') => self.literal(b"true", Tag::True),
            Some(b'f') => self.literal(b"false", Tag::False),
            Some(b'n') => self.literal(b"null", Tag::Null),
            Some(b'-' | b'0'..=b'9') => {
                self.number()?;
                self.push(Tag::Number, start, self.i);
                Ok(())
            }
            Some(_) => Err(self.err("expected a value")),
        }
    }

    fn literal(&mut self, word: &[u8], tag: Tag) -> Result<(), JsonError> {
        if self.b[self.i..].starts_with(word) {
            let start = self.i;
            self.i += word.len();
            self.push(tag, start, self.i);
            Ok(())
        } else {
            Err(self.err("expected a value"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.b.get(self.i) {
            self.i += 1;
        }
        self.i - start
    }

    /// A number at `self.i`: its grammar, and (as serde_json) a value
    /// that fits a finite `f64` when it is not a plain integer.
    fn number(&mut self) -> Result<(), JsonError> {
        let start = self.i;
        self.number_grammar()?;
        let text = &self.b[start..self.i];
        let plain_integer =
            text.len() < 19 && !text.iter().any(|c| matches!(c, b'.' | b'e' | b'E'));
        if !plain_integer {
            let finite = std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse::<f64>().ok())
                .is_some_and(f64::is_finite);
            if !finite {
                return Err(JsonError {
                    what: "number out of range",
                    at: start,
                });
            }
        }
        Ok(())
    }

    fn number_grammar(&mut self) -> Result<(), JsonError> {
        if self.b[self.i] == b'-' {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("invalid number")),
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(self.err("invalid number"));
            }
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("invalid number"));
            }
        }
        Ok(())
    }

    /// A string at `self.i` (its opening quote): pushed as a node.
    fn string(&mut self) -> Result<(), JsonError> {
        let b = self.b;
        let start = self.i + 1;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = skip_plain(b, i);
            match b.get(i) {
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    if let Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') =
                        b.get(i + 1)
                    {
                        i += 2;
                    } else {
                        self.i = i;
                        self.escape()?;
                        i = self.i;
                    }
                }
                None => {
                    self.i = i;
                    return Err(self.err("unterminated string"));
                }
                Some(_) => {
                    self.i = i;
                    return Err(self.err("control character in string"));
                }
            }
        }
        let tag = if escaped { Tag::Escaped } else { Tag::Plain };
        self.push(tag, start, i);
        self.i = i + 1;
        Ok(())
    }

    /// One escape at `self.i` (its backslash), checked; `\u` surrogates
    /// must pair.
    fn escape(&mut self) -> Result<(), JsonError> {
        match self.b.get(self.i + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.i += 2;
                Ok(())
            }
            Some(b'u') => {
                let unit = self.hex4(self.i + 2)?;
                self.i += 6;
                if (0xDC00..0xE000).contains(&unit) {
                    return Err(self.err("lone trailing surrogate in escape"));
                }
                if (0xD800..0xDC00).contains(&unit) {
                    let low = if self.b[self.i..].starts_with(b"\\u") {
                        self.hex4(self.i + 2)?
                    } else {
                        0
                    };
                    if !(0xDC00..0xE000).contains(&low) {
                        return Err(self.err("lone leading surrogate in escape"));
                    }
                    self.i += 6;
                }
                Ok(())
            }
            _ => Err(self.err("invalid escape")),
        }
    }

    fn hex4(&self, at: usize) -> Result<u32, JsonError> {
        let digits = self
            .b
            .get(at..at + 4)
            .ok_or_else(|| self.err("invalid \\u escape"))?;
        let mut n = 0;
        for d in digits {
            let v = char::from(*d)
                .to_digit(16)
                .ok_or_else(|| self.err("invalid \\u escape"))?;
            n = n * 16 + v;
        }
        Ok(n)
    }

    fn close(&mut self, node: usize, start: usize) {
        let next = off(self.nodes.len());
        let end = off(self.i);
        let n = &mut self.nodes[node];
        n.start = off(start);
        n.end = end;
        n.next = next;
    }

    /// An array or an object (`tag`) at `self.i`, its members parsed.
    fn container(&mut self, depth: usize, tag: Tag) -> Result<(), JsonError> {
        if depth > MAX_DEPTH {
            return Err(self.err("nesting too deep"));
        }
        let (close, expected) = if tag == Tag::Array {
            (b']', "expected `,` or `]`")
        } else {
            (b'}', "expected `,` or `}`")
        };
        let start = self.i;
        let node = self.push(tag, start, start);
        self.i += 1;
        self.skip_ws();
        if self.b.get(self.i) == Some(&close) {
            self.i += 1;
            self.close(node, start);
            return Ok(());
        }
        loop {
            if tag == Tag::Object {
                self.key()?;
            }
            self.value(depth)?;
            self.skip_ws();
            match self.b.get(self.i) {
                Some(b',') => self.i += 1,
                Some(c) if *c == close => {
                    self.i += 1;
                    self.close(node, start);
                    return Ok(());
                }
                _ => return Err(self.err(expected)),
            }
        }
    }

    /// An object's key and its colon. The key serde_json reserves for its
    /// raw values ([`RAW_VALUE_KEY`]) is refused, however it is escaped.
    fn key(&mut self) -> Result<(), JsonError> {
        self.skip_ws();
        if self.b.get(self.i) != Some(&b'"') {
            return Err(self.err("expected a key"));
        }
        let at = self.i;
        self.string()?;
        let inner = &self.b[at + 1..self.i - 1];
        if inner.len() >= RAW_VALUE_KEY.len()
            && (inner == RAW_VALUE_KEY.as_bytes()
                || (inner.contains(&b'\\')
                    && std::str::from_utf8(inner).is_ok_and(|k| unescape(k) == RAW_VALUE_KEY)))
        {
            return Err(JsonError {
                what: "the object key `$serde_json::private::RawValue` (reserved by serde_json)",
                at,
            });
        }
        self.skip_ws();
        if self.b.get(self.i) != Some(&b':') {
            return Err(self.err("expected `:`"));
        }
        self.i += 1;
        Ok(())
    }
}

/// A handle on one value of a [`Doc`].
#[derive(Clone, Copy)]
pub struct Json<'d> {
    text: &'d str,
    owner: Option<&'d Bytes>,
    nodes: &'d [Node],
    i: usize,
}

impl std::fmt::Debug for Json<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.raw())
    }
}

/// The document `null`, for [`Json::null`].
static NULL: [Node; 1] = [Node {
    tag: Tag::Null,
    start: 0,
    end: 4,
    next: 0,
}];

impl<'d> Json<'d> {
    /// A `null` value (for an absent one).
    pub fn null() -> Self {
        Self {
            text: "null",
            owner: None,
            nodes: &NULL,
            i: 0,
        }
    }

    fn node(&self) -> Node {
        self.nodes[self.i]
    }

    fn at(&self, i: usize) -> Self {
        Self { i, ..*self }
    }

    /// Index of the node after this value and its contents.
    fn after(&self) -> usize {
        match self.node().tag {
            Tag::Array | Tag::Object => self.node().next as usize,
            _ => self.i + 1,
        }
    }

    /// The value's kind.
    pub fn kind(&self) -> Kind {
        match self.node().tag {
            Tag::Null => Kind::Null,
            Tag::True | Tag::False => Kind::Bool,
            Tag::Number => Kind::Number,
            Tag::Plain | Tag::Escaped => Kind::String,
            Tag::Array => Kind::Array,
            Tag::Object => Kind::Object,
        }
    }

    /// The value's JSON text, exactly as it is in the document.
    pub fn raw(&self) -> &'d str {
        let n = self.node();
        match n.tag {
            // A string's span is between its quotes.
            Tag::Plain | Tag::Escaped => &self.text[n.start as usize - 1..n.end as usize + 1],
            _ => &self.text[n.start as usize..n.end as usize],
        }
    }

    /// Whether the value is `null`.
    pub fn is_null(&self) -> bool {
        self.node().tag == Tag::Null
    }

    /// Whether the value is an object.
    pub fn is_object(&self) -> bool {
        self.node().tag == Tag::Object
    }

    /// The boolean, if the value is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self.node().tag {
            Tag::True => Some(true),
            Tag::False => Some(false),
            _ => None,
        }
    }

    fn number(&self) -> Option<&'d str> {
        (self.node().tag == Tag::Number).then(|| self.raw())
    }

    /// The number as `u64`, if it is a non-negative integer that fits.
    pub fn as_u64(&self) -> Option<u64> {
        self.number()?.parse().ok()
    }

    /// The number as `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        serde_json::from_str(self.number()?).ok()
    }

    /// The string, unescaped (borrowed when it has no escapes).
    pub fn as_str(&self) -> Option<Cow<'d, str>> {
        let n = self.node();
        let inner = &self.text[n.start as usize..n.end as usize];
        match n.tag {
            Tag::Plain => Some(Cow::Borrowed(inner)),
            Tag::Escaped => Some(Cow::Owned(unescape(inner))),
            _ => None,
        }
    }

    /// A string's inside as written between its quotes, and whether it has
    /// escapes.
    pub fn str_literal(&self) -> Option<(&'d str, bool)> {
        let n = self.node();
        let inner = &self.text[n.start as usize..n.end as usize];
        match n.tag {
            Tag::Plain => Some((inner, false)),
            Tag::Escaped => Some((inner, true)),
            _ => None,
        }
    }

    /// The value's JSON text as bytes shared with the document's buffer
    /// when it was parsed shared (copied otherwise).
    pub fn raw_bytes(&self) -> Bytes {
        self.share(self.raw())
    }

    /// `text`, a part of the document, as shared bytes when possible.
    fn share(&self, text: &str) -> Bytes {
        match self.owner {
            Some(owner) => owner.slice_ref(text.as_bytes()),
            None => Bytes::copy_from_slice(text.as_bytes()),
        }
    }

    /// A string's inside as written between its quotes, as bytes shared
    /// with the document's buffer when it was parsed shared (copied
    /// otherwise), and whether it has escapes.
    pub fn str_bytes(&self) -> Option<(Bytes, bool)> {
        let (inner, escaped) = self.str_literal()?;
        Some((self.share(inner), escaped))
    }

    /// Whether the value is the string `s`.
    pub fn is_str(&self, s: &str) -> bool {
        let n = self.node();
        let inner = &self.text[n.start as usize..n.end as usize];
        match n.tag {
            Tag::Plain => inner == s,
            Tag::Escaped => unescape(inner) == s,
            _ => false,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<Elements<'d>> {
        (self.node().tag == Tag::Array).then(|| Elements {
            at: self.at(self.i + 1),
            end: self.node().next as usize,
        })
    }

    /// The members (key, value) in document order, if the value is an
    /// object. A repeated key is yielded each time.
    pub fn as_object(&self) -> Option<Members<'d>> {
        (self.node().tag == Tag::Object).then(|| Members {
            at: self.at(self.i + 1),
            end: self.node().next as usize,
        })
    }

    /// The value of `key` (its last occurrence), if this is an object that
    /// has it.
    pub fn get(&self, key: &str) -> Option<Self> {
        let mut found = None;
        for (k, v) in self.as_object()?.raw_keys() {
            if k.is_str(key) {
                found = Some(v);
            }
        }
        found
    }

    /// The string value of `key`, unescaped (borrowed when it has no
    /// escapes), if this is an object that has it and it is a string.
    pub fn get_str(&self, key: &str) -> Option<Cow<'d, str>> {
        self.get(key)?.as_str()
    }

    /// The value as a `serde_json::Value`.
    pub fn to_value(&self) -> Value {
        match self.node().tag {
            Tag::Null => Value::Null,
            Tag::True => Value::Bool(true),
            Tag::False => Value::Bool(false),
            // serde_json's own reading of the number (the text is valid).
            Tag::Number => number_value(self.raw()),
            Tag::Plain | Tag::Escaped => {
                Value::String(self.as_str().unwrap_or_default().into_owned())
            }
            Tag::Array => Value::Array(
                self.as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| e.to_value())
                    .collect(),
            ),
            Tag::Object => Value::Object(
                self.as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.into_owned(), v.to_value()))
                    .collect(),
            ),
        }
    }

    /// The value as compact JSON text: what `serde_json` writes for
    /// [`Json::to_value`]. Built from the document's tokens: strings whose
    /// escapes are already the ones `serde_json` writes and integers are
    /// copied, other strings and numbers rewritten; an object with a
    /// repeated key sends the whole value through a tree.
    pub fn to_compact_string(&self) -> String {
        let distinct = (self.i..self.after())
            .all(|i| self.nodes[i].tag != Tag::Object || self.at(i).keys_distinct());
        if !distinct {
            return self.to_value().to_string();
        }
        let mut out = Vec::with_capacity(self.raw().len());
        self.write_compact(&mut out);
        // Only whole tokens and ASCII punctuation were written.
        String::from_utf8(out).unwrap_or_default()
    }

    /// Whether an object's keys are all different (at most 64 of them are
    /// compared; more count as not).
    fn keys_distinct(&self) -> bool {
        let Some(members) = self.as_object() else {
            return true;
        };
        let mut seen: [&str; 64] = [""; 64];
        for (n, (k, _)) in members.raw_keys().enumerate() {
            let k = k.raw();
            if n == seen.len() || seen[..n].contains(&k) {
                return false;
            }
            seen[n] = k;
        }
        true
    }

    /// Appends the value as `serde_json` writes it, compact.
    fn write_compact(&self, out: &mut Vec<u8>) {
        let n = self.node();
        let span = &self.text[n.start as usize..n.end as usize];
        match n.tag {
            Tag::Array => {
                out.push(b'[');
                for (k, e) in self.as_array().into_iter().flatten().enumerate() {
                    if k > 0 {
                        out.push(b',');
                    }
                    e.write_compact(out);
                }
                out.push(b']');
            }
            Tag::Object => {
                out.push(b'{');
                let members = self.as_object().into_iter().flat_map(Members::raw_keys);
                for (k, (key, v)) in members.enumerate() {
                    if k > 0 {
                        out.push(b',');
                    }
                    key.write_compact(out);
                    out.push(b':');
                    v.write_compact(out);
                }
                out.push(b'}');
            }
            Tag::Plain => {
                out.push(b'"');
                out.extend_from_slice(span.as_bytes());
                out.push(b'"');
            }
            Tag::Escaped if canonical_escapes(span) => {
                out.push(b'"');
                out.extend_from_slice(span.as_bytes());
                out.push(b'"');
            }
            Tag::Escaped => write_str(out, &unescape(span)),
            // Integers are written as they are, except `-0`, which
            // serde_json reads as the float -0.0.
            Tag::Number
                if span.len() < 19
                    && span != "-0"
                    && span.bytes().all(|c| c.is_ascii_digit() || c == b'-') =>
            {
                out.extend_from_slice(span.as_bytes());
            }
            Tag::Number => out.extend_from_slice(number_value(span).to_string().as_bytes()),
            Tag::Null | Tag::True | Tag::False => out.extend_from_slice(span.as_bytes()),
        }
    }
}

/// A number's text read as `serde_json` reads numbers in documents (its
/// reading of long literals differs from `serde_json::Number`'s `FromStr`
/// in the last digit).
fn number_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// Whether a string's escapes are all the ones [`write_str`] writes
/// (`\" \\ \b \f \n \r \t`, and `\u00xx` in lower case for the other
/// control characters): then its text is already what `serde_json` writes.
fn canonical_escapes(inner: &str) -> bool {
    let b = inner.as_bytes();
    let mut i = find_backslash(b, 0);
    while i < b.len() {
        let len = match b.get(i + 1) {
            Some(b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't') => 2,
            Some(b'u') => {
                let hex = b.get(i + 2..i + 6).unwrap_or_default();
                let control = match hex {
                    [b'0', b'0', hi @ (b'0' | b'1'), lo] => {
                        let lo = match lo {
                            b'0'..=b'9' => lo - b'0',
                            b'a'..=b'f' => lo - b'a' + 10,
                            _ => return false,
                        };
                        Some(((hi - b'0') << 4) | lo)
                    }
                    _ => None,
                };
                match control {
                    Some(0x08 | 0x09 | 0x0a | 0x0c | 0x0d) | None => return false,
                    Some(_) => 6,
                }
            }
            _ => return false,
        };
        i = find_backslash(b, i + len);
    }
    true
}

/// An array's elements.
#[derive(Clone, Copy, Debug)]
pub struct Elements<'d> {
    at: Json<'d>,
    end: usize,
}

impl<'d> Iterator for Elements<'d> {
    type Item = Json<'d>;

    fn next(&mut self) -> Option<Json<'d>> {
        if self.at.i >= self.end {
            return None;
        }
        let v = self.at;
        self.at = v.at(v.after());
        Some(v)
    }
}

/// An object's members.
#[derive(Clone, Copy, Debug)]
pub struct Members<'d> {
    at: Json<'d>,
    end: usize,
}

impl<'d> Members<'d> {
    /// The members with their keys as handles (no unescaping).
    fn raw_keys(self) -> impl Iterator<Item = (Json<'d>, Json<'d>)> {
        let mut at = self.at;
        let end = self.end;
        std::iter::from_fn(move || {
            if at.i >= end {
                return None;
            }
            let key = at;
            let value = at.at(at.i + 1);
            at = value.at(value.after());
            Some((key, value))
        })
    }
}

impl<'d> Iterator for Members<'d> {
    type Item = (Cow<'d, str>, Json<'d>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.at.i >= self.end {
            return None;
        }
        let key = self.at;
        let value = key.at(key.i + 1);
        self.at = value.at(value.after());
        Some((key.as_str().unwrap_or_default(), value))
    }
}

/// Appends `s` as a JSON string: the bytes `serde_json` writes for it.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    write_str_contents(out, s);
    out.push(b'"');
}

/// Appends `s` escaped as inside a JSON string, as `serde_json` escapes it
/// (short escapes for `\b \f \n \r \t`, `\u00xx` for other control
/// characters); runs without anything to escape are copied whole.
pub fn write_str_contents(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let b = s.as_bytes();
    out.reserve(b.len() + b.len() / 16);
    let mut start = 0;
    loop {
        let i = skip_plain(b, start);
        out.extend_from_slice(&b[start..i]);
        let Some(&c) = b.get(i) else { break };
        let short = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x08 => b'b',
            0x0c => b'f',
            _ => 0,
        };
        if short == 0 {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(c >> 4)],
                HEX[usize::from(c & 0xf)],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', short]);
        }
        start = i + 1;
    }
}

/// The text of a string's escaped inside (valid: [`Doc::parse`] checked
/// it; anything else is read as best it can be, never a panic).
pub fn unescape(inner: &str) -> String {
    let b = inner.as_bytes();
    let mut out = String::with_capacity(inner.len());
    let mut i = 0;
    while i < b.len() {
        let plain_end = find_backslash(b, i);
        out.push_str(&inner[i..plain_end]);
        i = plain_end;
        let Some(&kind) = b.get(i + 1) else {
            break;
        };
        let hex = |at: usize| {
            inner
                .get(at..at + 4)
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .unwrap_or(0xFFFD)
        };
        let (c, len) = match kind {
            b'n' => ('\n', 2),
            b't' => ('\t', 2),
            b'r' => ('\r', 2),
            b'b' => ('\u{8}', 2),
            b'f' => ('\u{c}', 2),
            b'u' => {
                let unit = hex(i + 2);
                if (0xD800..0xDC00).contains(&unit) {
                    let low = hex(i + 8);
                    let c = (0xDC00..0xE000).contains(&low).then(|| {
                        char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
                    });
                    (c.flatten().unwrap_or('\u{FFFD}'), 12)
                } else {
                    (char::from_u32(unit).unwrap_or('\u{FFFD}'), 6)
                }
            }
            other => (char::from(other), 2),
        };
        out.push(c);
        i += len;
    }
    out
}

#[cfg(test)]
mod tests;
