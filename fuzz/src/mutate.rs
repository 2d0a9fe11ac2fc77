//! Structure-aware mutation for the targets whose inputs are JSON: a
//! request body (the provider parsers) or JSON lines (the capture log).
//!
//! libFuzzer mutates bytes, and from bytes it reaches deep JSON shapes
//! slowly: most byte mutations of a request body break its JSON, and the
//! parser under test refuses it on the first byte that does. Here, two
//! mutations in three act on the parsed value instead: a subtree of the
//! input (or of another corpus input, in the cross-over) copied in place
//! of another or under a new key, a key or string from the target's
//! dictionary, an array element repeated, dropped or swapped, a scalar
//! from a list of edge values. The rest go to libFuzzer's own byte
//! mutations (with the dictionary), which keep the malformed and
//! oddly-spelled texts (duplicate keys, escapes, number spellings) in play.
//!
//! Every choice comes from the seed libFuzzer passes in, so a run is
//! reproducible. A target opts in with [`json_mutator!`](crate::json_mutator).

use rand::rngs::SmallRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Map, Number, Value};

/// The strings and scalars of a target's libFuzzer dictionary
/// (`fuzz/dicts/<target>.dict`) that are JSON texts on their own: the
/// field names and enum values its parser matches.
pub struct Words {
    strings: Vec<String>,
    scalars: Vec<Value>,
}

impl Words {
    /// Reads a libFuzzer dictionary: one `"..."` entry per line (escapes
    /// `\\`, `\"` and `\xNN`), `#` comments.
    pub fn from_dict(dict: &str) -> Self {
        let mut strings = Vec::new();
        let mut scalars = Vec::new();
        for line in dict.lines().map(str::trim) {
            let Some(entry) = line.strip_prefix('"').and_then(|l| l.strip_suffix('"')) else {
                continue;
            };
            let Some(text) = unescape_dict(entry) else {
                continue;
            };
            match serde_json::from_slice::<Value>(&text) {
                Ok(Value::String(s)) => strings.push(s),
                Ok(v @ (Value::Bool(_) | Value::Null | Value::Number(_))) => scalars.push(v),
                _ => {}
            }
        }
        Words { strings, scalars }
    }
}

/// libFuzzer's dictionary escapes.
fn unescape_dict(entry: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(entry.len());
    let mut bytes = entry.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next()? {
            b'x' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// libFuzzer's custom mutator: `data[..size]` mutated in place, at most
/// `max_size` bytes; returns the new size.
pub fn mutate(data: &mut [u8], size: usize, max_size: usize, seed: u32, words: &Words) -> usize {
    let mut rng = SmallRng::seed_from_u64(seed.into());
    if rng.random_ratio(1, 3) {
        return libfuzzer_sys::fuzzer_mutate(data, size, max_size);
    }
    let out = Input::parse(&data[..size]).and_then(|input| mutated(input, None, &mut rng, words));
    match out {
        Some(out) if out.len() <= max_size => {
            data[..out.len()].copy_from_slice(&out);
            out.len()
        }
        _ => libfuzzer_sys::fuzzer_mutate(data, size, max_size),
    }
}

/// libFuzzer's custom cross-over: a subtree of `data2` put into `data1`
/// (in place of a node, or in an array or under a key), written to `out`;
/// returns its size, 0 (no input) when either is not JSON or it does not fit.
pub fn crossover(data1: &[u8], data2: &[u8], out: &mut [u8], seed: u32, words: &Words) -> usize {
    let mut rng = SmallRng::seed_from_u64(seed.into());
    let (Some(into), Some(from)) = (Input::parse(data1), Input::parse(data2)) else {
        return 0;
    };
    match mutated(into, Some(&from), &mut rng, words) {
        Some(bytes) if bytes.len() <= out.len() => {
            out[..bytes.len()].copy_from_slice(&bytes);
            bytes.len()
        }
        _ => 0,
    }
}

/// `into` with one mutation, written out; the subtree it may copy in comes
/// from `from` (from `into` itself when `None`).
fn mutated(
    mut into: Input,
    from: Option<&Input>,
    rng: &mut SmallRng,
    words: &Words,
) -> Option<Vec<u8>> {
    let donor = from.unwrap_or(&into).random_subtree(rng)?;
    into.mutate(rng, words, donor);
    Some(into.to_bytes(rng))
}

/// An input read as JSON: one document, or lines of which at least one
/// is a document (the others kept as bytes).
enum Input {
    Doc(Value),
    Lines(Vec<Line>),
}

#[derive(Clone)]
enum Line {
    Json(Value),
    /// Not JSON (a torn or broken line), kept as it was, without its `\n`.
    Raw(Vec<u8>),
}

impl Line {
    fn json(&self) -> Option<&Value> {
        match self {
            Line::Json(v) => Some(v),
            Line::Raw(_) => None,
        }
    }

    fn json_mut(&mut self) -> Option<&mut Value> {
        match self {
            Line::Json(v) => Some(v),
            Line::Raw(_) => None,
        }
    }
}

impl Input {
    fn parse(data: &[u8]) -> Option<Self> {
        if let Ok(v) = serde_json::from_slice(data) {
            return Some(Input::Doc(v));
        }
        let lines: Vec<Line> = data
            .split(|&b| b == b'\n')
            .map(|l| match serde_json::from_slice(l) {
                Ok(v) => Line::Json(v),
                Err(_) => Line::Raw(l.to_vec()),
            })
            .collect();
        lines
            .iter()
            .any(|l| matches!(l, Line::Json(_)))
            .then_some(Input::Lines(lines))
    }

    fn docs(&self) -> Vec<&Value> {
        match self {
            Input::Doc(v) => vec![v],
            Input::Lines(lines) => lines.iter().filter_map(Line::json).collect(),
        }
    }

    fn random_subtree(&self, rng: &mut SmallRng) -> Option<Value> {
        let doc = *self.docs().choose(rng)?;
        let mut n = rng.random_range(0..count(doc));
        nth(doc, &mut n).cloned()
    }

    fn mutate(&mut self, rng: &mut SmallRng, words: &Words, donor: Value) {
        match self {
            Input::Doc(v) => mutate_value(v, rng, words, donor),
            Input::Lines(lines) => {
                let len = lines.len();
                match rng.random_range(0..8) {
                    0 => {
                        let copy = lines[rng.random_range(0..len)].clone();
                        lines.insert(rng.random_range(0..=len), copy);
                    }
                    1 if len > 1 => {
                        lines.remove(rng.random_range(0..len));
                    }
                    2 if len > 1 => lines.swap(rng.random_range(0..len), rng.random_range(0..len)),
                    _ => {
                        let mut docs: Vec<&mut Value> =
                            lines.iter_mut().filter_map(Line::json_mut).collect();
                        let i = rng.random_range(0..docs.len());
                        mutate_value(docs[i], rng, words, donor);
                    }
                }
            }
        }
    }

    /// Compact mostly; pretty now and then (request bodies come both ways).
    fn to_bytes(&self, rng: &mut SmallRng) -> Vec<u8> {
        let write = |v: &Value, pretty: bool| {
            if pretty {
                serde_json::to_vec_pretty(v)
            } else {
                serde_json::to_vec(v)
            }
            .expect("a Value serializes")
        };
        match self {
            Input::Doc(v) => write(v, rng.random_ratio(1, 8)),
            Input::Lines(lines) => {
                let mut out = Vec::new();
                for (i, line) in lines.iter().enumerate() {
                    if i > 0 {
                        out.push(b'\n');
                    }
                    match line {
                        Line::Json(v) => out.extend_from_slice(&write(v, false)),
                        Line::Raw(b) => out.extend_from_slice(b),
                    }
                }
                out
            }
        }
    }
}

/// Nodes in `v`, itself included.
fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

/// The `n`th node of `v` in pre-order (`n` counts down as nodes pass).
fn nth<'a>(v: &'a Value, n: &mut usize) -> Option<&'a Value> {
    if *n == 0 {
        return Some(v);
    }
    *n -= 1;
    match v {
        Value::Array(a) => a.iter().find_map(|c| nth(c, n)),
        Value::Object(o) => o.values().find_map(|c| nth(c, n)),
        _ => None,
    }
}

fn nth_mut<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
    if *n == 0 {
        return Some(v);
    }
    *n -= 1;
    match v {
        Value::Array(a) => a.iter_mut().find_map(|c| nth_mut(c, n)),
        Value::Object(o) => o.values_mut().find_map(|c| nth_mut(c, n)),
        _ => None,
    }
}

/// One mutation at a random node of `root`; `donor` is a subtree (of this
/// input or another) that may be copied in.
fn mutate_value(root: &mut Value, rng: &mut SmallRng, words: &Words, donor: Value) {
    let mut n = rng.random_range(0..count(root));
    let Some(node) = nth_mut(root, &mut n) else {
        return;
    };
    match node {
        Value::Object(o) => mutate_object(o, rng, words, donor),
        Value::Array(a) => mutate_array(a, rng, words, donor),
        _ => match rng.random_range(0..3) {
            0 => *node = donor,
            _ => *node = scalar(rng, words),
        },
    }
}

fn mutate_object(o: &mut Map<String, Value>, rng: &mut SmallRng, words: &Words, donor: Value) {
    let keys: Vec<String> = o.keys().cloned().collect();
    match rng.random_range(0..6) {
        // A field the parser knows, holding a copied subtree or a scalar.
        0 | 1 => {
            let Some(key) = words.strings.choose(rng) else {
                return;
            };
            o.insert(key.clone(), donor_or_scalar(donor, rng, words));
        }
        2 => {
            if let Some(key) = keys.choose(rng) {
                o.shift_remove(key);
            }
        }
        // A field renamed: its value under a name the parser knows.
        3 => {
            if let (Some(key), Some(to)) = (keys.choose(rng), words.strings.choose(rng))
                && let Some(value) = o.shift_remove(key)
            {
                o.insert(to.clone(), value);
            }
        }
        // A field's value replaced by the subtree or a scalar.
        _ => {
            if let Some(key) = keys.choose(rng) {
                o.insert(key.clone(), donor_or_scalar(donor, rng, words));
            }
        }
    }
}

fn mutate_array(a: &mut Vec<Value>, rng: &mut SmallRng, words: &Words, donor: Value) {
    let len = a.len();
    match rng.random_range(0..6) {
        0 if len > 0 => {
            let copy = a[rng.random_range(0..len)].clone();
            a.insert(rng.random_range(0..=len), copy);
        }
        1 if len > 0 => {
            a.remove(rng.random_range(0..len));
        }
        2 if len > 1 => a.swap(rng.random_range(0..len), rng.random_range(0..len)),
        3 if len > 0 => a[rng.random_range(0..len)] = scalar(rng, words),
        _ => a.insert(rng.random_range(0..=len), donor),
    }
}

/// The copied subtree or a scalar, one time in two each.
fn donor_or_scalar(donor: Value, rng: &mut SmallRng, words: &Words) -> Value {
    if rng.random_bool(0.5) {
        donor
    } else {
        scalar(rng, words)
    }
}

/// A scalar: a dictionary string or scalar, or an edge value.
fn scalar(rng: &mut SmallRng, words: &Words) -> Value {
    match rng.random_range(0..4) {
        0 | 1 => match words.strings.choose(rng) {
            Some(s) => Value::String(s.clone()),
            None => Value::Null,
        },
        2 => match words.scalars.choose(rng) {
            Some(v) => v.clone(),
            None => Value::Bool(true),
        },
        _ => {
            let edges = [
                Value::Null,
                Value::Bool(false),
                Value::Bool(true),
                Value::from(0),
                Value::from(1),
                Value::from(-1),
                Value::from(u64::from(u32::MAX) + 1),
                Value::from(u64::MAX),
                Value::from(i64::MIN),
                Number::from_f64(0.5).map_or(Value::Null, Value::Number),
                Number::from_f64(1e300).map_or(Value::Null, Value::Number),
                Value::String(String::new()),
                Value::String("\u{0}\u{fffd}\u{1f600}".to_owned()),
                Value::Array(Vec::new()),
                Value::Object(Map::new()),
            ];
            edges.choose(rng).cloned().unwrap_or(Value::Null)
        }
    }
}

/// Makes a target's mutations structure-aware ([`mutate`], [`crossover`]),
/// with the strings of its dictionary, given as text:
/// `polar_fuzz::json_mutator!(include_str!("../dicts/<target>.dict"));`.
#[macro_export]
macro_rules! json_mutator {
    ($dict:expr) => {
        static WORDS: ::std::sync::LazyLock<$crate::mutate::Words> =
            ::std::sync::LazyLock::new(|| $crate::mutate::Words::from_dict($dict));

        ::libfuzzer_sys::fuzz_mutator!(|data: &mut [u8],
                                        size: usize,
                                        max_size: usize,
                                        seed: u32| {
            $crate::mutate::mutate(data, size, max_size, seed, &WORDS)
        });

        ::libfuzzer_sys::fuzz_crossover!(|data1: &[u8],
                                          data2: &[u8],
                                          out: &mut [u8],
                                          seed: u32| {
            $crate::mutate::crossover(data1, data2, out, seed, &WORDS)
        });
    };
}
