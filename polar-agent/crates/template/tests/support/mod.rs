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

/// transformers' result for each case: `{"text", "ids"}` or `{"error"}`.
pub fn reference(model: &Path, cases: &[Value]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cases.json");
    let output = dir.path().join("out.json");
    std::fs::write(&input, serde_json::to_vec(cases).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference.py");
    let run = Command::new(python())
        .arg(&script)
        .arg(model)
        .arg(&input)
        .arg(&output)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "the reference renderer failed ({}): {}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let out: Vec<Value> = serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap();
    assert_eq!(out.len(), cases.len());
    out
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
