//! The differential test: for each real model (tokenizer and chat template
//! as the model ships them), hundreds of seeded conversations rendered and
//! tokenized by this crate and by `transformers.apply_chat_template`
//! (`tests/reference.py`), compared byte for byte and id for id (and the
//! ids decoded back, with and without special tokens); a case the
//! real template refuses must be refused by both. Then one long agentic
//! session, compared the same way, with the time this crate takes for it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failed step fails the test"
)]

mod support;

use std::time::Instant;

use polar_template::{Model, ModelFiles, RenderError, RenderInput};
use serde_json::Value;

use support::cases::{self, Case};

/// Cases per model.
const CASES: usize = 220;

fn input(case: &Case) -> RenderInput<'_> {
    RenderInput {
        messages: &case.messages,
        tools: case.tools.as_deref(),
        documents: None,
        add_generation_prompt: case.add_generation_prompt,
        kwargs: &case.kwargs,
    }
}

/// Where decoding `ids` (with and without special tokens) differs from
/// transformers' `decode`.
fn decode_diff(model: &Model, ids: &[u32], theirs: &Value) -> Option<String> {
    for (skip, key) in [(false, "decoded"), (true, "decoded_skip")] {
        let want = theirs[key].as_str().unwrap_or_default();
        match model.decode(ids, skip) {
            Ok(got) if got == want => {}
            Ok(got) => {
                return Some(format!(
                    "decoding (skip_special {skip}): {}",
                    support::text_diff(&got, want)
                ));
            }
            Err(e) => return Some(format!("decoding (skip_special {skip}) failed: {e}")),
        }
    }
    None
}

/// Renders every case both ways; fails listing the first differences.
fn differential(name: &str, seed: u64) {
    let dir = support::model_dir(name);
    let model =
        Model::load(&ModelFiles::from_dir(&dir)).unwrap_or_else(|e| panic!("loading {name}: {e}"));
    let cases = cases::cases(name, seed, CASES);
    let json: Vec<Value> = cases.iter().map(Case::to_json).collect();
    let reference = support::reference(&dir, &json);
    let (mut equal, mut raised) = (0, 0);
    let mut failures = Vec::new();
    let mut reasons = std::collections::BTreeMap::new();
    for (i, (case, theirs)) in cases.iter().zip(&reference).enumerate() {
        let ours = model.render_ids(&input(case));
        match (ours, theirs.get("error")) {
            (Err(e), Some(theirs)) => {
                // A template's own refusal must be the same refusal.
                let theirs = theirs.as_str().unwrap_or_default();
                let raised_theirs = theirs.strip_prefix("TemplateError: ");
                let raised_ours = match &e {
                    polar_template::PromptError::Render(RenderError::Raised { message }) => {
                        Some(message.as_str())
                    }
                    _ => None,
                };
                if raised_ours == raised_theirs {
                    raised += 1;
                    let reason: String = theirs.chars().take(90).collect();
                    *reasons.entry(reason).or_insert(0usize) += 1;
                } else {
                    failures.push(format!(
                        "case {i}: both failed, differently: ours {e}; transformers {theirs}"
                    ));
                }
            }
            (Ok(ours), None) => {
                let text = theirs["text"].as_str().unwrap_or_default();
                let ids: Vec<u32> = theirs["ids"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_u64())
                            .map(|v| v as u32)
                            .collect()
                    })
                    .unwrap_or_default();
                if ours.text != text {
                    failures.push(format!(
                        "case {i}: {}",
                        support::text_diff(&ours.text, text)
                    ));
                } else if ours.ids != ids {
                    failures.push(format!("case {i}: {}", support::ids_diff(&ours.ids, &ids)));
                } else if let Some(diff) = decode_diff(&model, &ours.ids, theirs) {
                    failures.push(format!("case {i}: {diff}"));
                } else {
                    equal += 1;
                }
            }
            (Err(e), None) => failures.push(format!("case {i}: only we failed: {e}")),
            (Ok(_), Some(e)) => failures.push(format!("case {i}: only transformers failed: {e}")),
        }
    }
    eprintln!(
        "{name}: {CASES} cases, {equal} equal (text, ids, decoded), {raised} refused by both, {} differ",
        failures.len()
    );
    for (reason, n) in &reasons {
        eprintln!("  refused by both {n}x: {reason}");
    }
    if !failures.is_empty() {
        let first = &failures[..failures.len().min(5)];
        let i: usize = first[0]
            .trim_start_matches("case ")
            .split(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        panic!(
            "{name}: {} of {CASES} cases differ from transformers:\n{}\nfirst differing case: {}",
            failures.len(),
            first.join("\n"),
            json[i]
        );
    }
    assert!(
        equal >= CASES / 2,
        "{name}: only {equal} of {CASES} cases rendered; the generator must mostly make conversations the template accepts"
    );
}

#[test]
fn qwen3_agrees_with_transformers() {
    differential("qwen3", 1);
}

#[test]
fn qwen3_coder_agrees_with_transformers() {
    differential("qwen3_coder", 2);
}

#[test]
fn deepseek_v3_agrees_with_transformers() {
    differential("deepseek_v3", 3);
}

#[test]
fn deepseek_v3_1_agrees_with_transformers() {
    differential("deepseek_v3_1", 4);
}

#[test]
fn llama3_1_agrees_with_transformers() {
    differential("llama3_1", 5);
}

#[test]
fn gptoss_agrees_with_transformers() {
    differential("gptoss", 6);
}

/// A long agentic session (about 100k tokens) renders as transformers
/// renders it; the time this crate takes is printed for the record.
#[test]
fn long_session_agrees_and_is_timed() {
    let dir = support::model_dir("qwen3");
    let model = Model::load(&ModelFiles::from_dir(&dir)).unwrap();
    let case = cases::long_session(64);
    let started = Instant::now();
    let text = model.render(&input(&case)).unwrap();
    let rendered = started.elapsed();
    let ids = model.encode(&text).unwrap();
    let total = started.elapsed();
    eprintln!(
        "long session: {} messages, {} bytes, {} tokens: render {:?}, render + tokenize {:?}",
        case.messages.len(),
        text.len(),
        ids.len(),
        rendered,
        total
    );
    assert!(
        ids.len() > 90_000,
        "the long session has only {} tokens",
        ids.len()
    );
    let theirs = &support::reference(&dir, &[case.to_json()])[0];
    assert_eq!(theirs.get("error"), None);
    let their_text = theirs["text"].as_str().unwrap();
    assert!(
        text == their_text,
        "{}",
        support::text_diff(&text, their_text)
    );
    let their_ids: Vec<u32> = theirs["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert!(ids == their_ids, "{}", support::ids_diff(&ids, &their_ids));
}

/// Images cannot be rendered without the model's processor: refused with
/// an error that says so, by every model.
#[test]
fn image_parts_are_refused() {
    let dir = support::model_dir("qwen3");
    let model = Model::load(&ModelFiles::from_dir(&dir)).unwrap();
    let messages = vec![serde_json::json!({"role": "user", "content": [
        {"type": "text", "text": "what is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    ]})];
    let err = model
        .render(&RenderInput::messages(&messages, true))
        .unwrap_err();
    assert!(
        matches!(&err, RenderError::UnsupportedContent { message: 0, part: 1, part_type } if part_type == "image_url"),
        "{err:?}"
    );
    assert!(err.to_string().contains("image"), "{err}");
}

/// The ids generation stops at and the token lookups, on the real models:
/// `generation_config.json`'s `eos_token_id`s where the model directory
/// has one (`cargo xtask chat-models` writes the models' own lists: gpt-oss
/// also stops at `<|call|>` and `<|endoftext|>`, Qwen3 at
/// `<|endoftext|>`), then the tokenizer's `eos_token` (what transformers
/// reports as `eos_token_id`).
#[test]
fn stop_ids_and_tokens_of_real_models() {
    for (name, eos, start) in [
        ("qwen3", &[151_645, 151_643][..], ("<|im_start|>", 151_644)),
        ("deepseek_v3", &[1], ("<｜User｜>", 128_803)),
        (
            "gptoss",
            &[200_002, 199_999, 200_012],
            ("<|start|>", 200_006),
        ),
        ("llama3_1", &[128_009], ("<|start_header_id|>", 128_006)),
    ] {
        let model = Model::load(&ModelFiles::from_dir(&support::model_dir(name))).unwrap();
        assert_eq!(model.stop_ids(), eos, "{name}");
        assert_eq!(model.token_id(start.0), Some(start.1), "{name}");
        assert_eq!(model.id_token(start.1).as_deref(), Some(start.0), "{name}");
        assert_eq!(model.context_len(), None, "{name}: no config.json");
        assert_eq!(model.token_id("<|no such token|>"), None, "{name}");
    }
}
