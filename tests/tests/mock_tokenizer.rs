//! The mock backend's `tokenizer.json` (`polar mock-backend
//! --write-tokenizer`) in Hugging Face's own Python libraries: the
//! `tokenizers` package and `transformers` (`PreTrainedTokenizerFast`) of
//! the verl environment that `cargo xtask test`'s set-up makes load the
//! file, name every id's piece as the mock's vocabulary does, and decode
//! many texts' ids exactly as the mock decodes them.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, ensure};
use serde_json::{Value, json};

use polar_mock::tokenizer::{SPECIALS, VOCAB_SIZE, decode, encode, is_special, token_bytes};

fn verl_python() -> Result<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.polar-cache/venvs/verl/bin/python");
    ensure!(
        p.exists(),
        "{} is missing: `cargo xtask test` (its set-up) makes it",
        p.display()
    );
    Ok(p)
}

/// Texts of every kind the mock tokenizes: letters, digits, punctuation,
/// whitespace, multi-byte characters, special tokens and near misses.
fn texts() -> Vec<String> {
    const ALPHABET: [&str; 24] = [
        "a",
        "Z",
        "pol",
        "ar",
        " ",
        "  ",
        "\n",
        "\t",
        "0",
        "9",
        ".",
        "{\"",
        "<",
        "|",
        ">",
        "é",
        "中文",
        "🧊",
        "ü",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</tool_call>",
        "<thin",
    ];
    let mut out = vec![
        String::new(),
        "<|im_start|>user\nCreate the file polar-demo.txt.<|im_end|>\n".to_owned(),
        "<think>\nplan</think>\n\n<tool_call>\n{\"name\": \"write\"}\n</tool_call>".to_owned(),
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..300 {
        let mut s = String::new();
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        for _ in 0..(state >> 58) {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s.push_str(ALPHABET[(state >> 40) as usize % ALPHABET.len()]);
        }
        out.push(s);
    }
    out
}

const SCRIPT: &str = r#"
import json, sys
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast
req = json.load(sys.stdin)
t = Tokenizer.from_file(req["path"])
f = PreTrainedTokenizerFast(tokenizer_file=req["path"])
json.dump({
    "vocab_size": t.get_vocab_size(with_added_tokens=True),
    "pieces": [t.id_to_token(i) for i in range(req["ids"])],
    "tokenizers": [t.decode(ids, skip_special_tokens=False) for ids in req["texts"]],
    "transformers": [f.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for ids in req["texts"]],
    "transformers_pieces": f.convert_ids_to_tokens(list(range(req["ids"]))),
    "special_skipped": [t.decode([i], skip_special_tokens=True) for i in req["specials"]],
    "special_kept": [t.decode([i], skip_special_tokens=False) for i in req["specials"]],
}, sys.stdout)
"#;

#[test]
fn hugging_face_python_loads_the_mock_tokenizer_and_decodes_as_the_mock() -> Result<()> {
    let python = verl_python()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tokenizer.json");
    let status = Command::new(polar_tests::polar_bin()?)
        .args(["mock-backend", "--write-tokenizer"])
        .arg(&path)
        .status()?;
    ensure!(
        status.success(),
        "polar mock-backend --write-tokenizer: {status}"
    );
    let texts = texts();
    let ids: Vec<Vec<u32>> = texts.iter().map(|t| encode(t)).collect();
    let specials: Vec<u32> = SPECIALS.iter().map(|(_, id)| *id).collect();
    let req = json!({"path": path, "texts": ids, "ids": VOCAB_SIZE + 16, "specials": specials});
    let mut child = Command::new(&python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| python.display().to_string())?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(&serde_json::to_vec(&req)?)?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "python: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout)?;

    // Every id: the mock's vocabulary, and nothing else.
    let mut known = 0;
    for id in 0..VOCAB_SIZE + 16 {
        let want = match token_bytes(id) {
            Ok(bytes) => {
                known += 1;
                Value::String(if is_special(id) || id >= 16 + 256 {
                    String::from_utf8(bytes)?
                } else {
                    format!("<0x{:02X}>", bytes[0])
                })
            }
            Err(_) => Value::Null,
        };
        for key in ["pieces", "transformers_pieces"] {
            ensure!(
                got[key][id as usize] == want,
                "{key}: id {id}: {} != {want}",
                got[key][id as usize]
            );
        }
    }
    ensure!(
        got["vocab_size"] == known,
        "vocab size {} != {known}",
        got["vocab_size"]
    );
    // The specials are special tokens (skipped on request).
    let contents: Vec<&str> = SPECIALS.iter().map(|(s, _)| *s).collect();
    ensure!(
        got["special_kept"] == json!(contents),
        "specials: {}",
        got["special_kept"]
    );
    ensure!(
        got["special_skipped"] == json!(vec![""; SPECIALS.len()]),
        "specials skipped: {}",
        got["special_skipped"]
    );

    // Every text's ids decode as the mock decodes them.
    for (k, (text, ids)) in texts.iter().zip(&ids).enumerate() {
        let want = decode(ids)?;
        ensure!(&want == text, "the mock decodes its own encoding");
        for lib in ["tokenizers", "transformers"] {
            ensure!(
                got[lib][k] == want.as_str(),
                "{lib}: text {k} {text:?}: decoded {}",
                got[lib][k]
            );
        }
    }
    Ok(())
}
