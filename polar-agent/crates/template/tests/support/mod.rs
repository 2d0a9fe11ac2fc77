//! What the template tests share: where the real tokenizers and the
//! reference Python environment are (`cargo xtask chat-models` installs
//! them; `cargo xtask test` names them in `POLAR_CHAT_MODELS_DIR` and
//! `POLAR_TEMPLATE_PYTHON`), and running the reference on a list of cases.

#![allow(
    dead_code,
    clippy::unwrap_used,
    reason = "shared by two test binaries, each using a part; a failed step fails the test"
)]

pub mod cases;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const INSTALL: &str = "install them with `cargo xtask chat-models` (or run `cargo xtask test`)";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// The directory of one installed model (`qwen3`, `gptoss`, ...).
pub fn model_dir(name: &str) -> PathBuf {
    let root = std::env::var_os("POLAR_CHAT_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".polar-cache/chat-models"));
    let dir = root.join(name);
    assert!(
        dir.join("tokenizer.json").is_file() && dir.join("tokenizer_config.json").is_file(),
        "the model files of {name} are missing from {}: {INSTALL}",
        dir.display()
    );
    dir
}

/// The reference environment's interpreter (transformers, jinja2).
pub fn python() -> PathBuf {
    let python = std::env::var_os("POLAR_TEMPLATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".polar-cache/venvs/chat-template/bin/python"));
    assert!(
        python.is_file(),
        "the reference Python environment ({}) is missing: {INSTALL}",
        python.display()
    );
    python
}

/// A model directory in a temporary directory: Qwen3's real tokenizer
/// files, with `edit` applied to the config and `template` (if any) as
/// `chat_template.jinja`.
pub fn custom_model(
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
    template: Option<&str>,
) -> tempfile::TempDir {
    let real = model_dir("qwen3");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        real.join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let mut config: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(real.join("tokenizer_config.json")).unwrap())
            .unwrap();
    edit(&mut config);
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    if let Some(t) = template {
        std::fs::write(dir.path().join("chat_template.jinja"), t).unwrap();
    }
    dir
}

/// transformers' result for each case: `{"text", "ids", "decoded",
/// "decoded_skip"}` or `{"error"}`.
pub fn reference(model: &Path, cases: &[Value]) -> Vec<Value> {
    reference_all(&[(model, cases)]).pop().unwrap()
}

/// [`reference`] for several models, in one Python process.
pub fn reference_all(jobs: &[(&Path, &[Value])]) -> Vec<Vec<Value>> {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference.py");
    let mut cmd = Command::new(python());
    cmd.arg(&script);
    let mut outputs = Vec::new();
    for (i, (model, cases)) in jobs.iter().enumerate() {
        let input = dir.path().join(format!("cases-{i}.json"));
        let output = dir.path().join(format!("out-{i}.json"));
        std::fs::write(&input, serde_json::to_vec(cases).unwrap()).unwrap();
        cmd.arg(model).arg(&input).arg(&output);
        outputs.push(output);
    }
    let run = cmd.output().unwrap();
    assert!(
        run.status.success(),
        "the reference renderer failed ({}): {}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    outputs
        .iter()
        .zip(jobs)
        .map(|(output, (_, cases))| {
            let out: Vec<Value> = serde_json::from_slice(&std::fs::read(output).unwrap()).unwrap();
            assert_eq!(out.len(), cases.len());
            out
        })
        .collect()
}

/// Where two texts first differ, with a little of each around it.
pub fn text_diff(ours: &str, theirs: &str) -> String {
    let at = ours
        .char_indices()
        .zip(theirs.chars())
        .find(|((_, a), b)| a != b)
        .map_or(ours.len().min(theirs.len()), |((i, _), _)| i);
    let around = |s: &str| {
        let start = s.floor_char_boundary(at.saturating_sub(60));
        let end = s.ceil_char_boundary((at + 60).min(s.len()));
        format!("{:?}", &s[start..end])
    };
    format!(
        "texts differ at byte {at} (ours {} bytes, transformers {}):\n  ours:         {}\n  transformers: {}",
        ours.len(),
        theirs.len(),
        around(ours),
        around(theirs)
    )
}

/// Where two id lists first differ.
pub fn ids_diff(ours: &[u32], theirs: &[u32]) -> String {
    let at = ours
        .iter()
        .zip(theirs)
        .position(|(a, b)| a != b)
        .unwrap_or(ours.len().min(theirs.len()));
    let window = |v: &[u32]| v[at.saturating_sub(3)..(at + 4).min(v.len())].to_vec();
    format!(
        "ids differ at position {at} (ours {} ids, transformers {}): ours {:?}, transformers {:?}",
        ours.len(),
        theirs.len(),
        window(ours),
        window(theirs)
    )
}

/// A model directory with a small byte-level tokenizer (one token per
/// byte, no merges) that has `tokens` as special tokens (`<|bos|>` and
/// `<|eos|>` always), and `template` as `chat_template.jinja`: for
/// comparing how templates render, whatever model they belong to.
pub fn byte_model(template: &str, tokens: &[&str]) -> tempfile::TempDir {
    let mut printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~'))
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let mut chars = vec![0u32; 256];
    for &b in &printable {
        chars[b as usize] = b;
    }
    let mut next = 256;
    for (b, c) in chars.iter_mut().enumerate() {
        if !printable.contains(&(b as u32)) {
            *c = next;
            next += 1;
        }
    }
    printable.clear();
    let vocab: serde_json::Map<String, Value> = chars
        .iter()
        .enumerate()
        .map(|(id, c)| (char::from_u32(*c).unwrap().to_string(), Value::from(id)))
        .collect();
    let mut specials: Vec<&str> = vec!["<|bos|>", "<|eos|>"];
    for t in tokens {
        if !specials.contains(t) {
            specials.push(t);
        }
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []}
    });
    let config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
        "clean_up_tokenization_spaces": false, "model_max_length": 131072
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), template).unwrap();
    dir
}

/// The directory of llama.cpp's collection of real chat templates.
pub fn template_collection() -> PathBuf {
    let dir = model_dir("qwen3").join("../llama.cpp-templates");
    assert!(
        dir.join("Qwen-Qwen3-0.6B.jinja").is_file(),
        "llama.cpp's template collection is missing from {}: {INSTALL}",
        dir.display()
    );
    dir
}
