//! Generated text read back by `polar_chat::output`'s parser of a family
//! (the one Polar's token-in path reads replies with, written after the
//! server's own parsers), with every byte of the text assigned to a
//! channel for the chat endpoint's streamed deltas: the parsed reasoning,
//! text, each call's name and arguments are found in the text in that
//! order, what lies between is markup.
//!
//! A piece the parser joined from several places (gpt-oss's text of two
//! messages, joined with a newline) is not found verbatim: it is in the
//! reply but not in the streamed deltas. The mock's own turns never have
//! such pieces.

use polar_chat::output::{OutputFormat, OutputOptions, OutputParser};

use crate::template::{Channel, ParsedCall, ParsedOutput};

/// `text` as `format`'s parser reads it (`reasoning_open`: the prompt
/// opened the reasoning block). A malformed call leaves the text content.
pub fn read_output(format: OutputFormat, reasoning_open: bool, text: &str) -> ParsedOutput {
    let options = OutputOptions {
        reasoning_open,
        ..OutputOptions::default()
    };
    let mut parser = OutputParser::with_options(format, &options);
    let read = parser.push(text).and_then(|()| parser.finish());
    let mut p = ParsedOutput::default();
    if read.is_err() {
        p.content = text.to_owned();
        p.spans.push((Channel::Content, 0..text.len()));
        return p;
    }
    let out = parser.parsed();
    let mut at = 0;
    let mut place = |p: &mut ParsedOutput, channel: Channel, piece: &str| {
        if piece.is_empty() {
            return;
        }
        if let Some(rel) = text[at..].find(piece) {
            let start = at + rel;
            p.spans.push((Channel::Markup, at..start));
            p.spans.push((channel, start..start + piece.len()));
            at = start + piece.len();
        }
    };
    place(&mut p, Channel::Reasoning, &out.reasoning);
    place(&mut p, Channel::Content, &out.content);
    for (n, call) in out.calls.iter().enumerate() {
        place(&mut p, Channel::ToolHead(n), &call.name);
        place(&mut p, Channel::ToolArgs(n), &call.arguments);
        p.tool_calls.push(ParsedCall {
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        });
    }
    p.spans.push((Channel::Markup, at..text.len()));
    p.spans.retain(|(_, r)| !r.is_empty());
    p.reasoning = (!out.reasoning.is_empty()).then(|| out.reasoning.clone());
    p.content = out.content.clone();
    p
}
