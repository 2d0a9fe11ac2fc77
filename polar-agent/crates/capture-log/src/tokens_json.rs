//! The reply's token data (`response_token_ids`, `response_logprobs`)
//! serialized while the reply streams ([`ReplyTokensJson`]): the task that
//! handles each event of the backend's stream adds the tokens that came
//! with it ([`ReplyTokensJson::catch_up`]), so the line written at the end
//! of the call copies their JSON instead of formatting a few hundred ids
//! and floats on the way to the reply's last byte.
//!
//! Each element is written by `serde_json` itself (`itoa` for an id, its
//! float formatter for a logprob, `null` for a logprob that is not finite),
//! so `[` + the text + `]` is, byte for byte, what `serde_json` writes for
//! the same list.

use serde::Serialize;

/// A list's elements as JSON, comma-separated, without the brackets; the
/// list it was made from only ever grew.
#[derive(Debug, Default)]
struct Growing {
    text: Vec<u8>,
    len: usize,
    /// The list was seen shorter than before (it was not one growing
    /// list): the text is never used.
    broken: bool,
}

impl Growing {
    /// Writes the elements of `all` past those written before.
    fn catch_up<T: Serialize>(&mut self, all: &[T]) {
        let Some(new) = all.get(self.len..) else {
            self.broken = true;
            return;
        };
        for x in new {
            if self.len > 0 {
                self.text.push(b',');
            }
            // Writing a number to a `Vec` cannot fail.
            if serde_json::to_writer(&mut self.text, x).is_err() {
                self.broken = true;
            }
            self.len += 1;
        }
    }

    /// The text, if it was made from `list`: the list it was made from
    /// only grew, so the same length means the same elements.
    fn text_of<T: Serialize>(&self, list: &[T]) -> Option<&[u8]> {
        if self.broken || self.len != list.len() {
            return None;
        }
        debug_assert_eq!(
            serde_json::to_vec(list).ok().as_deref(),
            Some(&[b"[", &self.text[..], b"]"].concat()[..]),
            "the serialized tokens are not the record's"
        );
        Some(&self.text)
    }
}

/// A reply's response token ids and logprobs serialized as they arrived.
#[derive(Debug, Default)]
pub struct ReplyTokensJson {
    ids: Growing,
    logprobs: Growing,
}

impl ReplyTokensJson {
    /// Serializes the ids and logprobs not serialized yet. `ids` and
    /// `logprobs` are the reply's lists so far (as
    /// `polar_inference::ChatStream::response_tokens` gives them): each call's lists start with the previous call's.
    pub fn catch_up(&mut self, ids: &[u32], logprobs: &[f32]) {
        self.ids.catch_up(ids);
        self.logprobs.catch_up(logprobs);
    }

    /// The JSON of `ids` (without brackets) when it was serialized here.
    pub(crate) fn ids(&self, ids: &[u32]) -> Option<&[u8]> {
        self.ids.text_of(ids)
    }

    /// The JSON of `logprobs` (without brackets) when it was serialized
    /// here.
    pub(crate) fn logprobs(&self, logprobs: &[f32]) -> Option<&[u8]> {
        self.logprobs.text_of(logprobs)
    }
}

/// Writes the record's `,"response_token_ids":[...]` and
/// `,"response_logprobs":[...]` (each absent when the record has none), as
/// `serde_json` writes them, copying the text of `ahead` when it was made
/// from the record's lists.
pub(super) fn write_fields(
    out: &mut Vec<u8>,
    ids: Option<&[u32]>,
    logprobs: Option<&[f32]>,
    ahead: &ReplyTokensJson,
) -> Result<(), serde_json::Error> {
    if let Some(ids) = ids {
        out.extend_from_slice(b",\"response_token_ids\":");
        write_list(out, ids, ahead.ids(ids))?;
    }
    if let Some(lps) = logprobs {
        out.extend_from_slice(b",\"response_logprobs\":");
        write_list(out, lps, ahead.logprobs(lps))?;
    }
    Ok(())
}

fn write_list<T: Serialize>(
    out: &mut Vec<u8>,
    list: &[T],
    text: Option<&[u8]>,
) -> Result<(), serde_json::Error> {
    match text {
        Some(t) => {
            out.reserve(t.len() + 2);
            out.push(b'[');
            out.extend_from_slice(t);
            out.push(b']');
            Ok(())
        }
        None => serde_json::to_writer(out, list),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The list serialized in pieces of the given sizes, then written.
    fn in_pieces<T: Serialize>(list: &[T], cuts: &[usize]) -> Growing {
        let mut g = Growing::default();
        let mut n = 0;
        for c in cuts {
            n = (n + c).min(list.len());
            g.catch_up(&list[..n]);
            // Asked again with nothing new: nothing written twice.
            g.catch_up(&list[..n]);
        }
        g.catch_up(list);
        g
    }

    fn bracketed(text: &[u8]) -> String {
        format!("[{}]", std::str::from_utf8(text).unwrap())
    }

    fn any_f32() -> impl Strategy<Value = f32> {
        prop_oneof![
            // Any bit pattern: subnormals, huge and tiny exponents, -0.0,
            // NaNs and infinities (`null`).
            any::<u32>().prop_map(f32::from_bits),
            // Logprobs as backends report them.
            (-30.0f64..=0.0).prop_map(|x| x as f32),
            Just(0.0f32),
            Just(-0.0f32),
            Just(f32::MIN_POSITIVE),
            Just(f32::MAX),
            Just(f32::NEG_INFINITY),
        ]
    }

    proptest! {
        #[test]
        fn ids_are_serde_jsons_bytes(
            ids in proptest::collection::vec(any::<u32>(), 0..300),
            cuts in proptest::collection::vec(0usize..40, 0..20),
        ) {
            let g = in_pieces(&ids, &cuts);
            prop_assert_eq!(bracketed(g.text_of(&ids).unwrap()), serde_json::to_string(&ids).unwrap());
        }

        #[test]
        fn logprobs_are_serde_jsons_bytes(
            lps in proptest::collection::vec(any_f32(), 0..300),
            cuts in proptest::collection::vec(0usize..40, 0..20),
        ) {
            let g = in_pieces(&lps, &cuts);
            prop_assert_eq!(bracketed(g.text_of(&lps).unwrap()), serde_json::to_string(&lps).unwrap());
        }

        #[test]
        fn the_fields_are_serde_jsons_bytes(
            ids in proptest::option::of(proptest::collection::vec(any::<u32>(), 0..50)),
            lps in proptest::option::of(proptest::collection::vec(any_f32(), 0..50)),
            streamed in any::<bool>(),
        ) {
            #[derive(Serialize)]
            struct Fields<'a> {
                a: u8,
                #[serde(skip_serializing_if = "Option::is_none")]
                response_token_ids: Option<&'a Vec<u32>>,
                #[serde(skip_serializing_if = "Option::is_none")]
                response_logprobs: Option<&'a Vec<f32>>,
            }
            let mut ahead = ReplyTokensJson::default();
            if streamed {
                ahead.catch_up(ids.as_deref().unwrap_or_default(), lps.as_deref().unwrap_or_default());
            }
            let mut out = br#"{"a":0"#.to_vec();
            write_fields(&mut out, ids.as_deref(), lps.as_deref(), &ahead).unwrap();
            out.push(b'}');
            let want = serde_json::to_vec(&Fields {
                a: 0,
                response_token_ids: ids.as_ref(),
                response_logprobs: lps.as_ref(),
            })
            .unwrap();
            prop_assert_eq!(String::from_utf8(out).unwrap(), String::from_utf8(want).unwrap());
        }
    }

    #[test]
    fn text_of_another_list_is_not_used() {
        let mut ahead = ReplyTokensJson::default();
        ahead.catch_up(&[1, 2, 3], &[-0.5, -1.25]);
        assert_eq!(ahead.ids(&[1, 2, 3]), Some(&b"1,2,3"[..]));
        assert_eq!(ahead.logprobs(&[-0.5, -1.25]), Some(&b"-0.5,-1.25"[..]));
        // Another length: serialized from the list instead.
        assert_eq!(ahead.ids(&[1, 2]), None);
        assert_eq!(ahead.logprobs(&[-0.5, -1.25, 0.0]), None);
        // A list seen shorter than before was not one growing list.
        ahead.catch_up(&[1, 2], &[-0.5, -1.25]);
        assert_eq!(ahead.ids(&[1, 2, 3]), None);
        assert_eq!(ahead.ids(&[1, 2]), None);
        assert!(ahead.logprobs(&[-0.5, -1.25]).is_some());
        // Nothing serialized: the empty lists only.
        let none = ReplyTokensJson::default();
        assert_eq!(none.ids(&[]), Some(&b""[..]));
        assert_eq!(none.ids(&[1]), None);
    }
}
