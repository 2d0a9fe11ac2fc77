//! Every real chat template of llama.cpp's collection (`models/templates/`
//! of the pinned llama-cpp-python source archive: Qwen, Llama, DeepSeek,
//! Mistral, Gemma, GLM, Kimi, Granite, Phi, Command R, gpt-oss and others,
//! about 70), each over a small byte-level tokenizer that has the
//! template's control tokens, rendered on seeded conversations by this
//! crate and by `transformers`, compared byte for byte and id for id: how
//! far minijinja in Hugging Face's environment goes as Jinja2 in
//! transformers' does.
//!
//! Two differences are known and allowed, each recognised precisely (any
//! other difference fails): iterating `none` renders nothing where Jinja2
//! raises `TypeError` (minijinja iterates it as empty, with no hook to
//! change that; Hermes' and Command R's tool-use templates loop over
//! `tools` unguarded), and `"text" | safe + value`, where Jinja2's `Markup`
//! HTML-escapes `value` and minijinja concatenates it as it is
//! (functionary's template).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failed step fails the test"
)]

mod support;

use polar_template::{Model, ModelFiles, PromptError, RenderError, RenderInput, control_tokens};
use serde_json::Value;

use support::cases::{self, Case};

const CASES: usize = 40;

#[test]
fn every_template_of_the_collection_agrees_with_transformers() {
    let collection = support::template_collection();
    let mut names: Vec<String> = std::fs::read_dir(&collection)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jinja"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 60,
        "only {} templates in {}",
        names.len(),
        collection.display()
    );
    let mut dirs = Vec::new();
    let mut all_cases = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let template = std::fs::read_to_string(collection.join(name)).unwrap();
        dirs.push(support::byte_model(&template, &control_tokens(&template)));
        all_cases.push(cases::cases("generic", 100 + i as u64, CASES));
    }
    let json: Vec<Vec<Value>> = all_cases
        .iter()
        .map(|c| c.iter().map(Case::to_json).collect())
        .collect();
    let jobs: Vec<(&std::path::Path, &[Value])> = dirs
        .iter()
        .zip(&json)
        .map(|(d, j)| (d.path(), j.as_slice()))
        .collect();
    let reference = support::reference_all(&jobs);
    let (mut equal, mut refused, mut known) = (0, 0, Vec::new());
    let mut failures = Vec::new();
    for ((name, dir), (cases, theirs)) in names
        .iter()
        .zip(&dirs)
        .zip(all_cases.iter().zip(&reference))
    {
        let model = match Model::load(&ModelFiles::from_dir(dir.path())) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{name}: does not load: {e}"));
                continue;
            }
        };
        for (i, (case, theirs)) in cases.iter().zip(theirs).enumerate() {
            let ours = model.render_ids(&RenderInput {
                messages: &case.messages,
                tools: case.tools.as_deref(),
                documents: None,
                add_generation_prompt: case.add_generation_prompt,
                kwargs: &case.kwargs,
            });
            match (ours, theirs.get("error").and_then(Value::as_str)) {
                (Ok(ours), None) => {
                    let text = theirs["text"].as_str().unwrap();
                    let ids: Vec<u32> = theirs["ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap() as u32)
                        .collect();
                    if ours.text != text && unescape_markup(text) == ours.text {
                        known.push(format!("{name} case {i}: `| safe +` escapes in Jinja2"));
                    } else if ours.text != text {
                        failures.push(format!(
                            "{name} case {i}: {}",
                            support::text_diff(&ours.text, text)
                        ));
                    } else if ours.ids != ids {
                        failures.push(format!(
                            "{name} case {i}: {}",
                            support::ids_diff(&ours.ids, &ids)
                        ));
                    } else {
                        equal += 1;
                    }
                }
                (Err(e), Some(theirs)) => {
                    let ours_raised = match &e {
                        PromptError::Render(RenderError::Raised { message }) => {
                            Some(message.as_str())
                        }
                        _ => None,
                    };
                    if ours_raised == theirs.strip_prefix("TemplateError: ") {
                        refused += 1;
                    } else {
                        failures.push(format!("{name} case {i}: both failed, differently: ours {e}; transformers {theirs}"));
                    }
                }
                (Err(e), None) => failures.push(format!("{name} case {i}: only we failed: {e}")),
                (Ok(_), Some("TypeError: 'NoneType' object is not iterable")) => {
                    known.push(format!("{name} case {i}: Jinja2 refuses to iterate none"));
                }
                (Ok(_), Some(e)) => {
                    failures.push(format!("{name} case {i}: only transformers failed: {e}"))
                }
            }
        }
    }
    eprintln!(
        "{} templates x {CASES} cases: {equal} equal, {refused} refused by both, {} known differences, {} other differences",
        names.len(),
        known.len(),
        failures.len()
    );
    for k in &known {
        eprintln!("  known: {k}");
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Text with Jinja2's `Markup` escapes undone.
fn unescape_markup(text: &str) -> String {
    text.replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}
