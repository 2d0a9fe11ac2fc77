//! The model's raw output parsed into reasoning, text and tool calls
//! (`polar_chat::output::OutputParser`, the `qwen3` format the token-in
//! endpoints and a reply's resumption after a backend fault go through),
//! on any text: the model under training writes it, so it is hostile. The
//! text is fed in the pieces the first byte chooses (1 to 16 bytes, to the
//! next character boundary). Never a panic; the parse only grows (text
//! fields by suffixes, tool calls by new ones and argument suffixes, what
//! is done stays done and unchanged); the pieces give exactly what the
//! whole text gives, the same parse or the same error; and `Resync`,
//! stepped after every piece with each event it yields noted as sent,
//! never finds the parse diverging from what it sent and ends having sent
//! all of it. Nor does it when the tool calls' arguments sent halfway were
//! re-serialized by the server (without the whitespace outside strings, as
//! vLLM's `hermes` parser may send them): it goes on from the output's own
//! text, and the harness ends with the same arguments but for that
//! whitespace.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polar_chat::StreamEvent;
use polar_chat::output::resync::Resync;
use polar_chat::output::{OutputError, OutputFormat, OutputParser, ParsedOutput};

fuzz_target!(|data: &[u8]| {
    let Some((&sizes, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let whole = parse_whole(&text);

    let mut parser = OutputParser::new(OutputFormat::Qwen3);
    let mut resync = Resync::new();
    let mut was = ParsedOutput::default();
    let mut halfway = None;
    let (mut at, mut n) = (0, 0u32);
    let pieces = loop {
        if at == text.len() {
            break parser.finish();
        }
        let len = usize::from(sizes.rotate_left(n % 8)) % 16 + 1;
        n += 1;
        let mut end = (at + len).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        if let Err(e) = parser.push(&text[at..end]) {
            break Err(e);
        }
        at = end;
        grows(&was, parser.parsed());
        was = parser.parsed().clone();
        step(&mut resync, parser.parsed(), parser.is_finished());
        if halfway.is_none() && 2 * at >= text.len() {
            halfway = Some(was.clone());
        }
    };
    let pieces = pieces.map(|()| parser.parsed().clone());
    assert_eq!(pieces, whole, "in pieces, then whole");
    if let Ok(done) = pieces {
        grows(&was, &done);
        step(&mut resync, &done, true);
        let sent = resync.sent();
        assert_eq!(sent.reasoning, done.reasoning);
        assert_eq!(sent.content, done.content);
        let calls = |p: &ParsedOutput| -> Vec<(String, String)> {
            p.calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect()
        };
        assert_eq!(calls(sent), calls(&done));
        if let Some(halfway) = halfway {
            resumes_after_reserialized(&halfway, &done);
        }
    }
});

/// A server sent the replies' events up to `halfway` (not finished), its
/// tool call arguments re-serialized; the output then parsed to `done`.
fn resumes_after_reserialized(halfway: &ParsedOutput, done: &ParsedOutput) {
    let mut resync = Resync::new();
    let events = resync
        .step(halfway, false)
        .unwrap_or_else(|e| panic!("a first step diverged: {e}"));
    for e in events {
        resync.observe(&match e {
            StreamEvent::ToolCallDelta { index, arguments } => StreamEvent::ToolCallDelta {
                index,
                arguments: compact(&arguments),
            },
            other => other,
        });
    }
    step(&mut resync, done, true);
    let sent = &resync.sent().calls;
    assert_eq!(sent.len(), done.calls.len());
    for (s, d) in sent.iter().zip(&done.calls) {
        assert_eq!(
            compact(&s.arguments),
            compact(&d.arguments),
            "{s:?} for {d:?}"
        );
    }
}

/// JSON text, possibly cut short, without the whitespace outside its
/// strings (written here apart from `Resync`'s own, to check it).
fn compact(json: &str) -> String {
    let (mut in_string, mut escaped) = (false, false);
    json.chars()
        .filter(|&c| {
            if in_string {
                if escaped {
                    escaped = false;
                } else {
                    escaped = c == '\\';
                    in_string = c != '"';
                }
                true
            } else {
                in_string = c == '"';
                !matches!(c, ' ' | '\t' | '\n' | '\r')
            }
        })
        .collect()
}

fn parse_whole(text: &str) -> Result<ParsedOutput, OutputError> {
    let mut parser = OutputParser::new(OutputFormat::Qwen3);
    parser.push(text)?;
    parser.finish()?;
    Ok(parser.parsed().clone())
}

/// `now` is `was` grown: every text longer by a suffix at most, tool
/// calls added or their arguments grown, and what was done unchanged.
fn grows(was: &ParsedOutput, now: &ParsedOutput) {
    assert!(
        now.reasoning.starts_with(&was.reasoning),
        "{was:?} -> {now:?}"
    );
    if was.reasoning_done {
        assert!(now.reasoning_done && now.reasoning == was.reasoning);
    }
    assert!(now.content.starts_with(&was.content), "{was:?} -> {now:?}");
    assert!(now.calls.len() >= was.calls.len(), "{was:?} -> {now:?}");
    for (w, c) in was.calls.iter().zip(&now.calls) {
        assert_eq!(w.name, c.name);
        assert!(c.arguments.starts_with(&w.arguments), "{was:?} -> {now:?}");
        if w.done {
            assert!(c.done && c.arguments == w.arguments, "{was:?} -> {now:?}");
        }
    }
}

/// The events that take what was sent to `parsed`, each noted as sent.
fn step(resync: &mut Resync, parsed: &ParsedOutput, finished: bool) {
    let events = resync
        .step(parsed, finished)
        .unwrap_or_else(|e| panic!("a parse that only grew diverged: {e}"));
    for e in &events {
        resync.observe(e);
    }
}
