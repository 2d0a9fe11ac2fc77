//! What the prefix-merging builder needs to know about a chat template: the
//! ids of the tokens that end an assistant turn, of the reasoning
//! delimiters, and of the whitespace tokens (newline runs) a template's own
//! newline can merge with. The builder never tokenizes; the ids come from
//! the deployment's tokenizer, looked up once from the token strings (for
//! the Qwen / ChatML family, [`TemplateTokens::CHATML_QWEN`]).

use serde::{Deserialize, Serialize};

/// Token ids of a template's turn and reasoning delimiters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateInfo {
    /// Tokens that end an assistant turn (`<|im_end|>`, `<|endoftext|>`).
    pub end_of_turn: Vec<u32>,
    /// Reasoning delimiters (`<think>`, `</think>`).
    pub think: Vec<u32>,
    /// Tokens whose text is whitespace only (`"\n"`, `"\n\n"`, ...): where
    /// a template's newline and whitespace the harness echoed back merge
    /// into one token (see the `prefix_merging` builder's whitespace-merge
    /// splice). Empty: that shape is not recognised.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub whitespace: Vec<u32>,
}

/// A template's special tokens as strings, to be turned into ids with the
/// deployment's vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateTokens<'a> {
    /// Tokens that end an assistant turn.
    pub end_of_turn: &'a [&'a str],
    /// Reasoning delimiters.
    pub think: &'a [&'a str],
    /// Whitespace-only tokens, as the vocabulary spells them.
    pub whitespace: &'a [&'a str],
}

impl TemplateTokens<'static> {
    /// Qwen2.5 / Qwen3 and other ChatML templates with `<think>` reasoning;
    /// the whitespace tokens are the runs of one to eight newlines as a
    /// byte-level BPE vocabulary spells them (`Ċ` is the byte `\n`).
    pub const CHATML_QWEN: Self = Self {
        end_of_turn: &["<|im_end|>", "<|endoftext|>"],
        think: &["<think>", "</think>"],
        whitespace: &[
            "Ċ",
            "ĊĊ",
            "ĊĊĊ",
            "ĊĊĊĊ",
            "ĊĊĊĊĊ",
            "ĊĊĊĊĊĊ",
            "ĊĊĊĊĊĊĊ",
            "ĊĊĊĊĊĊĊĊ",
        ],
    };
}

/// Why a [`TemplateInfo`] could not be made or is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// The vocabulary has no id for a token string.
    #[error("the vocabulary has no token {0:?}")]
    UnknownToken(String),
    /// No end-of-turn token: splicing needs at least one.
    #[error("no end-of-turn token id given")]
    NoEndOfTurn,
    /// An id is listed both as end-of-turn and as reasoning delimiter.
    #[error("token id {0} is both an end-of-turn and a reasoning token")]
    Overlap(u32),
    /// A whitespace id is also an end-of-turn or reasoning token.
    #[error("token id {0} is listed as whitespace and as a special token")]
    WhitespaceOverlap(u32),
}

impl TemplateInfo {
    /// Looks the token strings up with `lookup` (a tokenizer's
    /// token-to-id map). Every string must be known.
    pub fn from_vocab(
        tokens: &TemplateTokens<'_>,
        lookup: impl Fn(&str) -> Option<u32>,
    ) -> Result<Self, TemplateError> {
        let ids = |names: &[&str]| -> Result<Vec<u32>, TemplateError> {
            names
                .iter()
                .map(|n| lookup(n).ok_or_else(|| TemplateError::UnknownToken((*n).to_owned())))
                .collect()
        };
        let info = Self {
            end_of_turn: ids(tokens.end_of_turn)?,
            think: ids(tokens.think)?,
            whitespace: ids(tokens.whitespace)?,
        };
        info.validate()?;
        Ok(info)
    }

    /// Checks that the ids are usable.
    pub fn validate(&self) -> Result<(), TemplateError> {
        if self.end_of_turn.is_empty() {
            return Err(TemplateError::NoEndOfTurn);
        }
        if let Some(&t) = self.think.iter().find(|t| self.end_of_turn.contains(t)) {
            return Err(TemplateError::Overlap(t));
        }
        match self
            .whitespace
            .iter()
            .find(|t| self.end_of_turn.contains(t) || self.think.contains(t))
        {
            Some(&t) => Err(TemplateError::WhitespaceOverlap(t)),
            None => Ok(()),
        }
    }

    /// Whether `token` ends an assistant turn.
    pub fn is_end_of_turn(&self, token: u32) -> bool {
        self.end_of_turn.contains(&token)
    }

    /// Whether `token` is a reasoning delimiter.
    pub fn is_think(&self, token: u32) -> bool {
        self.think.contains(&token)
    }

    /// Whether `token`'s text is whitespace only.
    pub fn is_whitespace(&self, token: u32) -> bool {
        self.whitespace.contains(&token)
    }

    /// Position of the first end-of-turn token in `tokens`.
    pub fn find_end_of_turn(&self, tokens: &[u32]) -> Option<usize> {
        tokens.iter().position(|&t| self.is_end_of_turn(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_vocabulary() {
        let vocab = |s: &str| match s {
            "<|im_end|>" => Some(2),
            "<|endoftext|>" => Some(0),
            "<think>" => Some(3),
            "</think>" => Some(4),
            s if !s.is_empty() && s.chars().all(|c| c == 'Ċ') => {
                u32::try_from(s.chars().count()).ok().map(|n| 10 + n)
            }
            _ => None,
        };
        let info = TemplateInfo::from_vocab(&TemplateTokens::CHATML_QWEN, vocab);
        assert_eq!(
            info,
            Ok(TemplateInfo {
                end_of_turn: vec![2, 0],
                think: vec![3, 4],
                whitespace: (11..=18).collect(),
            })
        );
        let missing = TemplateInfo::from_vocab(&TemplateTokens::CHATML_QWEN, |s| {
            (s != "</think>").then_some(7)
        });
        assert_eq!(missing, Err(TemplateError::UnknownToken("</think>".into())));
        let overlap = TemplateInfo {
            end_of_turn: vec![1],
            think: vec![1],
            whitespace: Vec::new(),
        };
        assert_eq!(overlap.validate(), Err(TemplateError::Overlap(1)));
        let ws = TemplateInfo {
            end_of_turn: vec![1],
            think: vec![2],
            whitespace: vec![5, 2],
        };
        assert_eq!(ws.validate(), Err(TemplateError::WhitespaceOverlap(2)));
        assert_eq!(
            TemplateInfo::default().validate(),
            Err(TemplateError::NoEndOfTurn)
        );
    }
}
