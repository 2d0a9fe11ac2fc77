//! Token text for the trajectory viewer: the operator's Hugging Face
//! `tokenizer.json` (`[rollout.dashboard] tokenizer`), loaded once at
//! start-up with the `tokenizers` crate, and each token id of a trace
//! decoded on its own into what it stands for.
//!
//! One token's text, without guessing:
//! - an added token (`<|im_end|>`, `<think>`) is its content, flagged
//!   `special` when the tokenizer says so;
//! - under a byte-level decoder (GPT-2, Qwen, Llama-3: `Ġ` is a space) the
//!   token's characters map back to its bytes through the byte alphabet,
//!   and a byte-fallback piece (`<0xE2>`, SentencePiece) is its byte;
//!   bytes that are not UTF-8 on their own (part of a multi-byte
//!   character) are given as bytes, never as a replacement character;
//! - any other token is decoded by the tokenizer's own decoder after an
//!   anchor token (the one `a` encodes to), and the anchor's text is cut
//!   off: decoders that drop the first token's leading space (SentencePiece
//!   `▁`, WordPiece joins) then keep this token's, as it reads in the
//!   middle of a text. Replacement characters the decoder made from bytes
//!   it could not name are flagged `lossy`;
//! - an id the vocabulary does not hold (the ids come from exports, which a
//!   sandbox influences) is `unknown`: nothing is looked up beyond the
//!   vocabulary, and the work is one decode per distinct id of a trace.
//!
//! Decoding blocks: the caller runs it on the blocking pool.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use serde::Serialize;
use tokenizers::{DecoderWrapper, Tokenizer};

/// Why the tokenizer was not loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// Missing, unreadable, or too large.
    #[error("{path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Not a `tokenizer.json` the `tokenizers` library loads.
    #[error("{path}: not a Hugging Face tokenizer.json: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The largest `tokenizer.json` read (real ones are 2 to 35 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// One token as the viewer shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Piece {
    /// Its text (an added token's content when `special` or not).
    Text {
        /// The text.
        text: String,
        /// A special token.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        special: bool,
    },
    /// Bytes that are not UTF-8 on their own: valid runs as text, the rest
    /// as bytes.
    Parts {
        /// In order.
        parts: Vec<Part>,
    },
    /// The decoder's text, which holds replacement characters for bytes it
    /// could not name.
    Lossy {
        /// The text.
        text: String,
        /// Always true.
        lossy: bool,
    },
    /// Not in the vocabulary, or the decoder refused it.
    Unknown {
        /// Always true.
        unknown: bool,
    },
}

/// A run of a [`Piece::Parts`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Part {
    /// Valid UTF-8.
    Text {
        /// The text.
        text: String,
    },
    /// Bytes that are not (part of a character).
    Bytes {
        /// The bytes.
        bytes: Vec<u8>,
    },
}

/// The loaded tokenizer and what decoding one token needs.
pub struct TokenText {
    path: PathBuf,
    tokenizer: Tokenizer,
    /// Added tokens: content and whether special.
    added: HashMap<u32, (String, bool)>,
    /// The decoder is byte-level (characters stand for bytes).
    byte_level: bool,
    /// The decoder turns `<0xNN>` pieces into bytes.
    byte_fallback: bool,
    /// A plain token and its text, decoded before a token.
    anchor: Option<(u32, String)>,
}

impl std::fmt::Debug for TokenText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenText")
            .field("path", &self.path)
            .field("byte_level", &self.byte_level)
            .field("byte_fallback", &self.byte_fallback)
            .finish_non_exhaustive()
    }
}

impl PartialEq for TokenText {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl Eq for TokenText {}

impl TokenText {
    /// Loads `path` (blocks: reads and parses the file).
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let read = |reason: String| TokenizerError::Read {
            path: path.to_owned(),
            reason,
        };
        let meta = std::fs::metadata(path).map_err(|e| read(e.to_string()))?;
        if !meta.is_file() {
            return Err(read("not a regular file".into()));
        }
        if meta.len() > MAX_TOKENIZER_BYTES {
            return Err(read(format!(
                "{} bytes, over {MAX_TOKENIZER_BYTES}",
                meta.len()
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| read(e.to_string()))?;
        Self::from_bytes(path, &bytes)
    }

    /// Parses a `tokenizer.json` read from `path`.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, TokenizerError> {
        let tokenizer = Tokenizer::from_bytes(bytes).map_err(|e| TokenizerError::Parse {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let added = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (id, (t.content, t.special)))
            .collect::<HashMap<_, _>>();
        let decoder = tokenizer.get_decoder();
        let byte_level = matches!(decoder, Some(DecoderWrapper::ByteLevel(_)));
        let byte_fallback = decoder
            .and_then(|d| serde_json::to_value(d).ok())
            .is_some_and(|v| has_type(&v, "ByteFallback"));
        let mut out = Self {
            path: path.to_owned(),
            tokenizer,
            added,
            byte_level,
            byte_fallback,
            anchor: None,
        };
        out.anchor = out.find_anchor();
        Ok(out)
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pieces of every distinct id of `ids`. Blocks.
    pub fn pieces(&self, ids: impl IntoIterator<Item = u32>) -> BTreeMap<u32, Piece> {
        let mut out = BTreeMap::new();
        for id in ids {
            out.entry(id).or_insert_with(|| self.piece(id));
        }
        out
    }

    /// One token's piece (see the module doc).
    pub fn piece(&self, id: u32) -> Piece {
        if let Some((content, special)) = self.added.get(&id) {
            return Piece::Text {
                text: content.clone(),
                special: *special,
            };
        }
        let Some(token) = self.tokenizer.id_to_token(id) else {
            return Piece::Unknown { unknown: true };
        };
        if let Some(bytes) = self.raw_bytes(&token) {
            return piece_of_bytes(bytes);
        }
        let Some(text) = self.in_context(id) else {
            return Piece::Unknown { unknown: true };
        };
        if text.contains(char::REPLACEMENT_CHARACTER)
            && !token.contains(char::REPLACEMENT_CHARACTER)
        {
            Piece::Lossy { text, lossy: true }
        } else {
            Piece::Text {
                text,
                special: false,
            }
        }
    }

    /// The bytes a token stands for, when the decoder says so plainly.
    fn raw_bytes(&self, token: &str) -> Option<Vec<u8>> {
        if self.byte_level {
            return token.chars().map(|c| CHAR_BYTE.get(&c).copied()).collect();
        }
        if self.byte_fallback
            && let Some(hex) = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>'))
            && hex.len() == 2
        {
            return u8::from_str_radix(hex, 16).ok().map(|b| vec![b]);
        }
        None
    }

    /// The token decoded after the anchor, the anchor's text cut off (or
    /// alone without an anchor).
    fn in_context(&self, id: u32) -> Option<String> {
        if let Some((anchor, prefix)) = &self.anchor
            && let Ok(s) = self.tokenizer.decode(&[*anchor, id], false)
            && let Some(rest) = s.strip_prefix(prefix.as_str())
        {
            return Some(rest.to_owned());
        }
        self.tokenizer.decode(&[id], false).ok()
    }

    /// The token `a` encodes to, if it is one plain token whose text
    /// starts its decoding before another token.
    fn find_anchor(&self) -> Option<(u32, String)> {
        let enc = self.tokenizer.encode("a", false).ok()?;
        let [id] = enc.get_ids() else {
            return None;
        };
        if self.added.contains_key(id) {
            return None;
        }
        let text = self.tokenizer.decode(&[*id], false).ok()?;
        let twice = self.tokenizer.decode(&[*id, *id], false).ok()?;
        (!text.is_empty() && twice.starts_with(&text) && twice.len() > text.len())
            .then_some((*id, text))
    }
}

/// Whether a serialized decoder holds a part of type `ty`.
fn has_type(v: &serde_json::Value, ty: &str) -> bool {
    match v {
        serde_json::Value::Object(o) => {
            o.get("type").and_then(|t| t.as_str()) == Some(ty)
                || o.values().any(|v| has_type(v, ty))
        }
        serde_json::Value::Array(a) => a.iter().any(|v| has_type(v, ty)),
        _ => false,
    }
}

/// A token's bytes as a piece: text when UTF-8, else its runs.
fn piece_of_bytes(bytes: Vec<u8>) -> Piece {
    match String::from_utf8(bytes) {
        Ok(text) => Piece::Text {
            text,
            special: false,
        },
        Err(e) => {
            let bytes = e.into_bytes();
            let mut parts = Vec::new();
            for chunk in bytes.utf8_chunks() {
                if !chunk.valid().is_empty() {
                    parts.push(Part::Text {
                        text: chunk.valid().to_owned(),
                    });
                }
                if !chunk.invalid().is_empty() {
                    parts.push(Part::Bytes {
                        bytes: chunk.invalid().to_vec(),
                    });
                }
            }
            Piece::Parts { parts }
        }
    }
}

/// The byte-level alphabet (GPT-2's): printable Latin-1 bytes stand for
/// themselves, the others for the characters from U+0100 on, in byte
/// order. Maps a character back to its byte.
static CHAR_BYTE: LazyLock<HashMap<char, u8>> = LazyLock::new(|| {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    let mut map = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
});

#[cfg(test)]
mod tests {
    use super::*;

    fn load(json: &str) -> TokenText {
        TokenText::from_bytes(Path::new("t.json"), json.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn text(s: &str) -> Piece {
        Piece::Text {
            text: s.into(),
            special: false,
        }
    }

    /// GPT-2 / Qwen / Llama-3 style: byte-level BPE.
    #[test]
    fn byte_level_tokens_are_their_bytes() {
        let t = load(
            r#"{"version":"1.0","truncation":null,"padding":null,
            "added_tokens":[{"id":5,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
                            {"id":6,"content":"<think>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}],
            "normalizer":null,
            "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
            "post_processor":null,
            "decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
            "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,
              "vocab":{"a":0,"ĠHello":1,"Ċ":2,"Ã":3,"Ã©":4,"<|im_end|>":5,"<think>":6,"âĤ":7,"é":8},"merges":[]}}"#,
        );
        assert_eq!(t.piece(1), text(" Hello"));
        assert_eq!(t.piece(2), text("\n"));
        assert_eq!(t.piece(4), text("é"));
        assert_eq!(
            t.piece(3),
            Piece::Parts {
                parts: vec![Part::Bytes { bytes: vec![0xC3] }]
            }
        );
        // "âĤ" is the first two bytes of "€" (E2 82 AC).
        assert_eq!(
            t.piece(7),
            Piece::Parts {
                parts: vec![Part::Bytes {
                    bytes: vec![0xE2, 0x82]
                }]
            }
        );
        // "é" is byte 0xE9 in the alphabet: not UTF-8 alone.
        assert_eq!(
            serde_json::to_value(t.piece(8)).unwrap(),
            serde_json::json!({"parts": [{"bytes": [0xE9]}]})
        );
        assert_eq!(
            t.piece(5),
            Piece::Text {
                text: "<|im_end|>".into(),
                special: true
            }
        );
        assert_eq!(t.piece(6), text("<think>"));
        assert_eq!(t.piece(99), Piece::Unknown { unknown: true });
        assert_eq!(t.piece(u32::MAX), Piece::Unknown { unknown: true });
        assert_eq!(
            serde_json::to_value(t.pieces([1, 5, 1, 1, 4_000_000_000])).unwrap(),
            serde_json::json!({
                "1": {"text": " Hello"},
                "5": {"text": "<|im_end|>", "special": true},
                "4000000000": {"unknown": true},
            })
        );
    }

    /// Llama-2 / Mistral style: SentencePiece BPE with byte fallback, a
    /// decoder that strips the first token's leading space.
    #[test]
    fn sentencepiece_tokens_keep_their_space_and_bytes() {
        let t = load(
            r#"{"version":"1.0","truncation":null,"padding":null,
            "added_tokens":[{"id":1,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
            "normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},
            "pre_tokenizer":null,"post_processor":null,
            "decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
            "model":{"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":true,"ignore_merges":false,
              "vocab":{"<unk>":0,"<s>":1,"▁a":2,"▁Hello":3,"<0x0A>":4,"<0xE2>":5,"llo":6,"▁":7,"a":8},"merges":["▁ a"]}}"#,
        );
        assert_eq!(t.anchor.as_ref().map(|a| a.0), Some(2));
        assert_eq!(t.piece(3), text(" Hello"));
        assert_eq!(t.piece(6), text("llo"));
        assert_eq!(t.piece(4), text("\n"));
        assert_eq!(
            t.piece(5),
            Piece::Parts {
                parts: vec![Part::Bytes { bytes: vec![0xE2] }]
            }
        );
        assert_eq!(
            t.piece(1),
            Piece::Text {
                text: "<s>".into(),
                special: true
            }
        );
    }

    #[test]
    fn broken_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = TokenText::load(&dir.path().join("missing.json")).unwrap_err();
        assert!(matches!(e, TokenizerError::Read { .. }), "{e}");
        let e = TokenText::load(dir.path()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"model": 3}"#).unwrap();
        let e = TokenText::load(&bad).unwrap_err();
        assert!(
            e.to_string().contains("not a Hugging Face tokenizer.json"),
            "{e}"
        );
    }

    #[test]
    fn the_byte_alphabet_is_a_bijection() {
        assert_eq!(CHAR_BYTE.len(), 256);
        assert_eq!(CHAR_BYTE.get(&'Ġ'), Some(&b' '));
        assert_eq!(CHAR_BYTE.get(&'Ċ'), Some(&b'\n'));
        assert_eq!(CHAR_BYTE.get(&'a'), Some(&b'a'));
        assert_eq!(CHAR_BYTE.get(&'\u{100}'), Some(&0));
    }
}
