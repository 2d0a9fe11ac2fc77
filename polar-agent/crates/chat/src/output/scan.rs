//! The pieces every output format is read with: finding markup in text
//! that is still arriving (holding back what may become a marker), moving
//! text up to a marker into the reasoning or the answer, the leading
//! reasoning block, and a cursor over JSON-like heads.

use super::{Feed, ParsedOutput};

/// The length of the longest end of `text` that is a proper start of
/// `marker` (text that may become the marker with what comes next).
pub(super) fn held(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| marker.is_char_boundary(n) && text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

/// [`held`] for the longest of several markers.
pub(super) fn held_any(text: &str, markers: &[&str]) -> usize {
    markers.iter().map(|m| held(text, m)).max().unwrap_or(0)
}

/// Where the earliest of `markers` begins in `text`, and which one it is.
pub(super) fn find_first(text: &str, markers: &[&str]) -> Option<(usize, usize)> {
    markers
        .iter()
        .enumerate()
        .filter_map(|(which, m)| text.find(m).map(|at| (at, which)))
        .min()
}

/// [`find_first`] in `text` of which the first `scanned` bytes were
/// searched already (no marker began there that ended before its end):
/// only the rest is searched, so a long block read piece by piece is
/// searched once, not once per piece.
pub(super) fn find_first_after(
    text: &str,
    markers: &[&str],
    scanned: usize,
) -> Option<(usize, usize)> {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let mut from = scanned.saturating_sub(longest).min(text.len());
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    find_first(&text[from..], markers).map(|(at, which)| (from + at, which))
}

/// Whether `rest` may still become `whole` (it is a proper start of it).
pub(super) fn may_become(rest: &str, whole: &str) -> bool {
    rest.len() < whole.len() && whole.starts_with(rest)
}

/// Where text read by [`text_until`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sink {
    Reasoning,
    Content,
}

impl Sink {
    pub(super) fn of(self, out: &mut ParsedOutput) -> &mut String {
        match self {
            Self::Reasoning => &mut out.reasoning,
            Self::Content => &mut out.content,
        }
    }
}

/// A marker [`text_until`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Found {
    /// Which of the markers.
    pub which: usize,
    /// Where the markup begins in the text (the stripped text before the
    /// marker included): what to give back if it turns out not to be
    /// markup.
    pub start: usize,
}

/// Moves the text before the first of `markers` into `sink` and consumes
/// it and the marker (`Some`). With no marker in the text, moves what
/// cannot begin one (all of it once the output is over) and gives `None`.
/// `strip` (possibly empty) right before the marker is markup too: it is
/// not moved, and held while it may precede one.
pub(super) fn text_until(
    f: &mut Feed<'_>,
    markers: &[&str],
    strip: &str,
    sink: Sink,
) -> Option<Found> {
    let rest = f.rest();
    if let Some((i, which)) = find_first(rest, markers) {
        let text = &rest[..i];
        let text = text.strip_suffix(strip).unwrap_or(text);
        let start = *f.pos + text.len();
        sink.of(f.out).push_str(text);
        *f.pos += i + markers[which].len();
        return Some(Found { which, start });
    }
    let keep = if f.fin {
        rest.len()
    } else {
        let cut = rest.len() - held_any(rest, markers);
        let mut keep = cut;
        if !strip.is_empty() {
            // A trailing start of `strip` may be followed by a marker.
            let tail = (1..=strip.len().min(cut))
                .rev()
                .find(|&n| strip.is_char_boundary(n) && rest[..cut].ends_with(&strip[..n]));
            if let Some(n) = tail {
                keep = cut - n;
            }
        }
        keep
    };
    sink.of(f.out).push_str(&rest[..keep]);
    *f.pos += keep;
    None
}

/// The whitespace-free markup of a leading reasoning block.
#[derive(Clone, Copy, Debug)]
pub(super) struct ThinkMarkup {
    /// Text allowed before the open tag (read as markup with it).
    pub lead: &'static str,
    /// Stripped right after the open tag.
    pub after_open: &'static str,
    /// Stripped right before the close tag.
    pub before_close: &'static str,
    /// Stripped (as far as present) right after the close tag.
    pub after_close: &'static str,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ThinkState {
    Start,
    AfterOpen,
    Reasoning,
    AfterClose,
    Done,
}

/// A leading `<think>` block (or, when the prompt opened it, reasoning
/// from the first byte) read into the reasoning.
#[derive(Clone, Debug)]
pub(super) struct Think {
    state: ThinkState,
    markup: ThinkMarkup,
}

impl Think {
    pub(super) fn new(markup: ThinkMarkup, open: bool) -> Self {
        let state = if open {
            ThinkState::Reasoning
        } else {
            ThinkState::Start
        };
        Self { state, markup }
    }

    /// Reads the block: `true` once it is over (or there is none) and the
    /// answer begins at the feed's position; `false` when more text is
    /// needed.
    pub(super) fn step(&mut self, f: &mut Feed<'_>) -> bool {
        loop {
            let rest = f.rest();
            match self.state {
                ThinkState::Start => {
                    let lead = self.markup.lead;
                    let open = rest
                        .strip_prefix(lead)
                        .filter(|r| r.starts_with(THINK_OPEN))
                        .map(|_| lead.len())
                        .or_else(|| rest.starts_with(THINK_OPEN).then_some(0));
                    if let Some(skip) = open {
                        *f.pos += skip + THINK_OPEN.len();
                        self.state = ThinkState::AfterOpen;
                    } else if !f.fin
                        && (may_become(rest, THINK_OPEN)
                            || may_become(rest, &[lead, THINK_OPEN].concat()))
                    {
                        return false;
                    } else {
                        // No reasoning block: none will come.
                        f.out.reasoning_done = true;
                        self.state = ThinkState::Done;
                    }
                }
                ThinkState::AfterOpen => {
                    let strip = self.markup.after_open;
                    if !strip.is_empty() && rest.starts_with(strip) {
                        *f.pos += strip.len();
                    } else if !f.fin && may_become(rest, strip) {
                        return false;
                    }
                    self.state = ThinkState::Reasoning;
                }
                ThinkState::Reasoning => {
                    let strip = self.markup.before_close;
                    if text_until(f, &[THINK_CLOSE], strip, Sink::Reasoning).is_none() {
                        return f.fin;
                    }
                    f.out.reasoning_done = true;
                    self.state = ThinkState::AfterClose;
                }
                ThinkState::AfterClose => {
                    let strip = self.markup.after_close;
                    let n = (0..=strip.len().min(rest.len()))
                        .rev()
                        .find(|&n| strip.is_char_boundary(n) && rest.starts_with(&strip[..n]))
                        .unwrap_or(0);
                    if n < strip.len() && n == rest.len() && !f.fin {
                        return false;
                    }
                    *f.pos += n;
                    self.state = ThinkState::Done;
                }
                ThinkState::Done => return true,
            }
        }
    }
}

/// A cursor over JSON-like text that may end anywhere.
pub(super) struct Cursor<'a> {
    pub text: &'a str,
    pub at: usize,
}

impl Cursor<'_> {
    pub(super) fn ws(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    /// `Ok(true)` when `token` is next (and is read), `Ok(false)` when the
    /// text ends inside it.
    pub(super) fn expect(&mut self, token: &str, why: &'static str) -> Result<bool, &'static str> {
        let rest = &self.text[self.at..];
        if rest.starts_with(token) {
            self.at += token.len();
            Ok(true)
        } else if token.starts_with(rest) {
            Ok(false)
        } else {
            Err(why)
        }
    }

    /// A JSON string, decoded; `None` when the text ends inside it.
    pub(super) fn string(&mut self) -> Result<Option<String>, &'static str> {
        let rest = &self.text[self.at..];
        if rest.is_empty() {
            return Ok(None);
        }
        if !rest.starts_with('"') {
            return Err("the name is not a JSON string");
        }
        let mut escaped = false;
        for (i, b) in rest.bytes().enumerate().skip(1) {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => {
                    let name: String = serde_json::from_str(&rest[..=i])
                        .map_err(|_| "the name is not a valid JSON string")?;
                    self.at += i + 1;
                    return Ok(Some(name));
                }
                _ => {}
            }
        }
        Ok(None)
    }
}
