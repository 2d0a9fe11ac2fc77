//! The mock backend's deterministic tokenizer: reversible, with fixed ids and
//! no vocabulary file.
//!
//! Ids:
//! - `0..16`: special tokens ([`SPECIALS`]), recognised anywhere in the text;
//! - `16..272`: one token per byte (`16 + byte`), for everything that is not
//!   an ASCII letter (spaces, digits, punctuation, UTF-8 bytes);
//! - `272..`: one token per chunk of one to three ASCII letters (runs of
//!   letters are cut into chunks of three from the left), encoded as a number
//!   in bijective base 53, so about 149k ids in all, like a real vocabulary.
//!
//! `decode(encode(t)) == t` for every text. Encoding is prefix-stable:
//! `encode(a + b) == encode(a) + encode(b)` whenever the split is neither
//! inside a special token nor inside a run of letters at an offset that is
//! not a multiple of three. The template only splits next to special tokens
//! and newlines, which always qualifies.

use std::ops::Range;

use super::MockError;

/// End of text.
pub const ENDOFTEXT: u32 = 0;
/// Start of a message.
pub const IM_START: u32 = 1;
/// End of a message (the end-of-turn token generation stops at).
pub const IM_END: u32 = 2;
/// Reasoning begins.
pub const THINK: u32 = 3;
/// Reasoning ends.
pub const THINK_END: u32 = 4;
/// A tool call begins.
pub const TOOL_CALL: u32 = 5;
/// A tool call ends.
pub const TOOL_CALL_END: u32 = 6;

/// The special tokens and their ids.
pub const SPECIALS: [(&str, u32); 7] = [
    ("<|endoftext|>", ENDOFTEXT),
    ("<|im_start|>", IM_START),
    ("<|im_end|>", IM_END),
    ("<think>", THINK),
    ("</think>", THINK_END),
    ("<tool_call>", TOOL_CALL),
    ("</tool_call>", TOOL_CALL_END),
];

const BYTE_BASE: u32 = 16;
const WORD_BASE: u32 = BYTE_BASE + 256;
const RADIX: u32 = 53;
const CHUNK: usize = 3;

/// Number of ids (the largest id is `VOCAB_SIZE - 1`).
pub const VOCAB_SIZE: u32 = WORD_BASE + RADIX * RADIX * RADIX;

/// Encodes text into token ids.
pub fn encode(text: &str) -> Vec<u32> {
    encode_with_spans(text)
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// Encodes text into token ids, each with the byte range of `text` it covers.
pub fn encode_with_spans(text: &str) -> Vec<(u32, Range<usize>)> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() / 2 + 1);
    let mut pos = 0;
    while pos < bytes.len() {
        if bytes[pos] == b'<'
            && let Some((s, id)) = SPECIALS.iter().find(|(s, _)| text[pos..].starts_with(s))
        {
            out.push((*id, pos..pos + s.len()));
            pos += s.len();
            continue;
        }
        if bytes[pos].is_ascii_alphabetic() {
            let run = bytes[pos..]
                .iter()
                .take(CHUNK)
                .take_while(|b| b.is_ascii_alphabetic())
                .count();
            let id = bytes[pos..pos + run]
                .iter()
                .fold(0u32, |acc, &b| acc * RADIX + letter_digit(b));
            out.push((WORD_BASE + id, pos..pos + run));
            pos += run;
            continue;
        }
        out.push((BYTE_BASE + u32::from(bytes[pos]), pos..pos + 1));
        pos += 1;
    }
    out
}

/// The bytes one token stands for.
pub fn token_bytes(id: u32) -> Result<Vec<u8>, MockError> {
    if let Some((s, _)) = SPECIALS.iter().find(|(_, sid)| *sid == id) {
        return Ok(s.as_bytes().to_vec());
    }
    match id {
        _ if !(BYTE_BASE..VOCAB_SIZE).contains(&id) => Err(MockError::UnknownToken(id)),
        _ if id < WORD_BASE => Ok(vec![(id - BYTE_BASE) as u8]),
        _ => {
            let mut n = id - WORD_BASE;
            let mut letters = Vec::with_capacity(CHUNK);
            while n > 0 {
                let digit = n % RADIX;
                if digit == 0 {
                    return Err(MockError::UnknownToken(id));
                }
                letters.push(digit_letter(digit));
                n /= RADIX;
            }
            if letters.is_empty() {
                return Err(MockError::UnknownToken(id));
            }
            letters.reverse();
            Ok(letters)
        }
    }
}

/// One token as text (invalid UTF-8, such as part of a character, is shown
/// with replacement characters), as logprob entries show it.
pub fn token_text(id: u32) -> Result<String, MockError> {
    Ok(String::from_utf8_lossy(&token_bytes(id)?).into_owned())
}

/// Decodes ids into bytes.
pub fn decode_bytes(ids: &[u32]) -> Result<Vec<u8>, MockError> {
    let mut out = Vec::with_capacity(ids.len() * 2);
    for &id in ids {
        out.extend(token_bytes(id)?);
    }
    Ok(out)
}

/// Decodes ids into text (invalid UTF-8 replaced).
pub fn decode(ids: &[u32]) -> Result<String, MockError> {
    Ok(String::from_utf8_lossy(&decode_bytes(ids)?).into_owned())
}

/// Whether an id is a special token.
pub fn is_special(id: u32) -> bool {
    id < BYTE_BASE
}

fn letter_digit(b: u8) -> u32 {
    if b.is_ascii_uppercase() {
        u32::from(b - b'A') + 1
    } else {
        u32::from(b - b'a') + 27
    }
}

fn digit_letter(d: u32) -> u8 {
    if d <= 26 {
        b'A' + (d - 1) as u8
    } else {
        b'a' + (d - 27) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn specials_have_fixed_ids() {
        assert_eq!(
            encode("<|im_start|>user\nhi<|im_end|>"),
            vec![
                IM_START,
                encode("use")[0],
                encode("r")[0],
                16 + 10,
                encode("hi")[0],
                IM_END
            ]
        );
        assert_eq!(
            encode("<think></think><tool_call></tool_call>"),
            vec![3, 4, 5, 6]
        );
        assert_eq!(
            encode("<thin"),
            encode("<")
                .into_iter()
                .chain(encode("thin"))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn letters_chunk_by_three() {
        let ids = encode("polar");
        assert_eq!(ids.len(), 2);
        assert_eq!(decode(&ids).unwrap(), "polar");
        assert!(ids.iter().all(|id| (WORD_BASE..VOCAB_SIZE).contains(id)));
        assert_eq!(token_text(ids[0]).unwrap(), "pol");
    }

    #[test]
    fn unknown_ids_are_rejected() {
        assert!(decode(&[VOCAB_SIZE]).is_err());
        assert!(decode(&[7]).is_err());
        assert!(decode(&[WORD_BASE]).is_err());
    }

    proptest! {
        #[test]
        fn reversible(text in any::<String>()) {
            prop_assert_eq!(decode(&encode(&text)).unwrap(), text);
        }

        #[test]
        fn prefix_stable_at_non_letter_splits(a in any::<String>(), b in any::<String>()) {
            let splittable = !a.ends_with(|c: char| c.is_ascii_alphabetic() || c == '<' || c == '|')
                && !b.starts_with(|c: char| c.is_ascii_alphabetic());
            prop_assume!(splittable && !SPECIALS.iter().any(|(s, _)| (1..s.len()).any(|k| a.ends_with(&s[..k]) && b.starts_with(&s[k..]))));
            let mut joined = encode(&a);
            joined.extend(encode(&b));
            prop_assert_eq!(encode(&format!("{a}{b}")), joined);
        }

        #[test]
        fn spans_cover_the_text(text in "[a-zA-Z <>|/_\n{}\"é]{0,40}") {
            let spans = encode_with_spans(&text);
            let mut pos = 0;
            for (id, span) in spans {
                prop_assert_eq!(span.start, pos);
                prop_assert_eq!(token_bytes(id).unwrap(), text.as_bytes()[span.clone()].to_vec());
                pos = span.end;
            }
            prop_assert_eq!(pos, text.len());
        }
    }
}
