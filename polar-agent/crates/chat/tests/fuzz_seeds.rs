//! The request fuzz targets' hand-kept seeds (`fuzz/seeds/request_<api>/`:
//! the request shapes the minimized corpora had not reached, structured
//! outputs first) are requests today's parsers accept, each with what it
//! was written for. A change that makes one a refusal fails here, instead
//! of leaving the fuzzers on the parser's error path for it.

use std::path::Path;

use polar_chat::Api;
use polar_chat::provider::{Framing, ModelCall, parse_request};

#[test]
fn every_request_seed_parses_into_what_it_was_written_for() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../fuzz/seeds");
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
        for entry in std::fs::read_dir(root.join(dir)).expect("a seed directory") {
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
            seeds += 1;
        }
    }
    assert!(seeds >= 11, "{seeds} seeds");
}
