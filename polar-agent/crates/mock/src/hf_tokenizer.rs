//! The mock tokenizer's vocabulary as a Hugging Face `tokenizer.json`
//! (`polar mock-backend --write-tokenizer PATH`), so that what reads real
//! tokenizers (the rollout server's dashboard, `transformers`) shows the
//! mock's ids as their text.
//!
//! The file decodes every id of [`tokenizer`](super::tokenizer) to exactly
//! its bytes, in the SentencePiece byte-fallback style (Llama-2, Mistral):
//! - the specials are added tokens (`special: true`), also in the vocabulary;
//! - the byte tokens (`16 + byte`) are the pieces `<0x00>` .. `<0xFF>`, which
//!   the `ByteFallback` decoder turns into their byte (a run of them that is
//!   not UTF-8 decodes to replacement characters, as in any such tokenizer);
//! - a letter chunk is its letters;
//! - the model is `WordLevel` (a vocabulary, no merges), the decoder
//!   `ByteFallback` then `Fuse`. Ids the mock does not use are absent.
//!
//! It is a decoding vocabulary: encoding a text with it is not the mock's
//! encoding (the mock's own `/tokenize` is).

use std::path::Path;

use serde_json::{Map, Value, json};

use super::MockError;
use super::tokenizer::{SPECIALS, VOCAB_SIZE, is_special, token_bytes};

/// The `tokenizer.json` document.
pub fn tokenizer_json() -> Value {
    let mut vocab = Map::new();
    for id in 0..VOCAB_SIZE {
        let Ok(bytes) = token_bytes(id) else {
            continue;
        };
        let piece = if is_special(id) || id >= BYTE_END {
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            format!("<0x{:02X}>", bytes.first().copied().unwrap_or(0))
        };
        vocab.insert(piece, id.into());
    }
    let added: Vec<Value> = SPECIALS
        .iter()
        .map(|(content, id)| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            })
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {
            "type": "Sequence",
            "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}],
        },
        "model": {
            "type": "WordLevel",
            "vocab": vocab,
            "unk_token": "<|endoftext|>",
        },
    })
}

/// The first id past the byte tokens.
const BYTE_END: u32 = 16 + 256;

/// Writes the document to `path` (replacing it).
pub fn write(path: &Path) -> Result<(), MockError> {
    let text = serde_json::to_vec(&tokenizer_json())
        .map_err(|e| MockError::InvalidSetting(format!("tokenizer.json: {e}")))?;
    let opts = polar_io::fs::WriteOptions::new().mode(0o644);
    polar_io::fs::write_atomic(path, &text, &opts)
        .map_err(|e| MockError::InvalidSetting(format!("cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::super::tokenizer::{decode, decode_bytes, encode};
    use super::*;
    use proptest::prelude::*;
    use std::sync::LazyLock;
    use tokenizers::Tokenizer;

    static HF: LazyLock<Tokenizer> = LazyLock::new(|| {
        let text = serde_json::to_vec(&tokenizer_json()).unwrap();
        Tokenizer::from_bytes(text).unwrap_or_else(|e| panic!("{e}"))
    });

    /// One id's bytes as the `tokenizers` library gives them: a byte
    /// piece's byte, any other token's decoded text.
    fn hf_bytes(id: u32) -> Option<Vec<u8>> {
        let piece = HF.id_to_token(id)?;
        if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>')) {
            return u8::from_str_radix(hex, 16).ok().map(|b| vec![b]);
        }
        Some(HF.decode(&[id], false).unwrap().into_bytes())
    }

    #[test]
    fn every_id_decodes_to_its_bytes_and_no_other_id_exists() {
        let mut known = 0;
        for id in 0..VOCAB_SIZE + 16 {
            match token_bytes(id) {
                Ok(bytes) => {
                    known += 1;
                    assert_eq!(hf_bytes(id), Some(bytes), "id {id}");
                }
                Err(_) => assert_eq!(HF.id_to_token(id), None, "id {id}"),
            }
        }
        assert_eq!(HF.get_vocab_size(true), known);
        for (content, id) in SPECIALS {
            assert_eq!(HF.decode(&[id], false).unwrap(), content);
            assert_eq!(HF.decode(&[id], true).unwrap(), "");
        }
    }

    #[test]
    fn the_written_file_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        write(&path).unwrap();
        let t = Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        let ids = encode("<|im_start|>user\nPolar, ünïcode 🧊!<|im_end|>");
        assert_eq!(t.decode(&ids, false).unwrap(), decode(&ids).unwrap());
    }

    proptest! {
        #[test]
        fn texts_decode_as_the_mock_decodes(text in any::<String>()) {
            let ids = encode(&text);
            prop_assert_eq!(HF.decode(&ids, false).unwrap(), decode(&ids).unwrap());
            let mut joined = Vec::new();
            for &id in &ids {
                joined.extend(hf_bytes(id).unwrap());
            }
            prop_assert_eq!(joined, decode_bytes(&ids).unwrap());
        }
    }
}
