//! The `polar-chat` fuzz targets' hand-kept seeds are inputs today's
//! parsers accept, each with what it was written for: the request targets'
//! (`fuzz/seeds/request_<api>/`: the request shapes the minimized corpora
//! had not reached: structured outputs, image parts, Gemini's tool choices
//! and thoughts) and `output_parser`'s (model
//! outputs: reasoning, text and tool calls). A change that makes one a
//! refusal fails here, instead of leaving the fuzzers on the parser's error
//! path for it.

use std::path::{Path, PathBuf};

use polar_chat::output::{OutputFormat, OutputParser};
use polar_chat::provider::{Framing, ModelCall, parse_request};
use polar_chat::{Api, Part};

fn seeds_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../fuzz/seeds")
        .join(target)
}

#[test]
fn every_request_seed_parses_into_what_it_was_written_for() {
    let mut seeds = 0;
    for (dir, api) in [
        ("request_openai_chat", Api::OpenaiChat),
        ("request_openai_responses", Api::OpenaiResponses),
        ("request_anthropic", Api::AnthropicMessages),
        ("request_gemini", Api::Gemini),
    ] {
        let call = ModelCall {
            api,
            framing: Framing::Json,
            path_model: (api == Api::Gemini).then(|| "gemini-2.5-pro".to_owned()),
        };
        for entry in std::fs::read_dir(seeds_dir(dir)).expect("a seed directory") {
            let path = entry.expect("a directory entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let body = std::fs::read(&path).expect("a seed");
            let doc = polar_json::Doc::parse(&body).expect("a seed is JSON");
            let parsed =
                parse_request(&call, doc.root()).unwrap_or_else(|e| panic!("{dir}/{name}: {e:?}"));
            if name.starts_with("structured-") {
                assert!(
                    parsed.request.response_format.is_some(),
                    "{dir}/{name}: no structured output read"
                );
            }
            if name.starts_with("compaction-") {
                assert!(parsed.compaction, "{dir}/{name}: not read as a compaction");
            }
            let messages = &parsed.request.messages;
            if name.starts_with("image-") {
                let images = messages
                    .iter()
                    .flat_map(|m| &m.content)
                    .filter(|p| matches!(p, Part::Image { .. }))
                    .count();
                assert!(images >= 2, "{dir}/{name}: {images} images read");
            }
            if name.contains("tool-choice") {
                assert!(
                    parsed.request.tool_choice.is_some(),
                    "{dir}/{name}: no tool choice read"
                );
            }
            if name.contains("thoughts") {
                assert!(
                    messages.iter().any(|m| m.reasoning.is_some()),
                    "{dir}/{name}: no reasoning read"
                );
            }
            seeds += 1;
        }
    }
    assert!(seeds >= 19, "{seeds} seeds");
}

/// `output_parser`'s seeds (a byte choosing the pieces, then a model's
/// output) parse whole with no error, and between them have reasoning,
/// text and complete tool calls with arguments.
#[test]
fn every_output_seed_parses() {
    let (mut seeds, mut reasoning, mut text, mut calls) = (0, 0, 0, 0);
    for entry in std::fs::read_dir(seeds_dir("output_parser")).expect("a seed directory") {
        let path = entry.expect("a directory entry").path();
        let data = std::fs::read(&path).expect("a seed");
        let (_, output) = data.split_first().expect("a seed is not empty");
        let output = std::str::from_utf8(output).expect("a seed is UTF-8 after its first byte");
        let mut parser = OutputParser::new(OutputFormat::Qwen3);
        let parsed = parser
            .push(output)
            .and_then(|()| parser.finish())
            .map(|()| parser.parsed().clone())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        reasoning += usize::from(!parsed.reasoning.is_empty());
        text += usize::from(!parsed.content.is_empty());
        calls += parsed
            .calls
            .iter()
            .filter(|c| c.done && c.arguments.len() > 2)
            .count();
        seeds += 1;
    }
    assert!(
        seeds >= 6 && reasoning >= 3 && text >= 4 && calls >= 5,
        "{seeds} seeds: {reasoning} with reasoning, {text} with text, {calls} tool calls"
    );
}
