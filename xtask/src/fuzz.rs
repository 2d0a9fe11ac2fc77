//! `cargo xtask fuzz`: the coverage-guided fuzz targets of `fuzz/` (cargo
//! fuzz, libFuzzer, nightly), one after the other, each for `--secs`
//! seconds, starting from its committed corpus `fuzz/corpus/<target>/`
//! (seeds from the provider fixtures and the harnesses' request shapes,
//! minimized with `cargo fuzz cmin`). New inputs go to a scratch corpus
//! under `target/fuzz-corpus/` (`--cmin` folds them into the committed
//! corpora and minimizes those). A target with a dictionary
//! `fuzz/dicts/<target>.dict` (the tokens and field names its parser
//! matches) runs with it; the targets whose inputs are JSON also mutate
//! them as JSON values with its words (`fuzz/src/mutate.rs`). `cargo
//! xtask test` runs every target briefly ([`TEST_SECS`]).
//!
//! A target that finds a crash fails the command, naming the input libFuzzer
//! wrote to `fuzz/artifacts/<target>/`; the fix comes with a regression test
//! in the crate that owns the parser (docs/SECURITY.md, "Fuzzing").

use std::path::Path;

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::setup;

/// Seconds each target runs in `cargo xtask test` (15 targets: about three
/// minutes with the build, on two cores).
pub const TEST_SECS: u64 = 8;

/// Memory one target may use (libFuzzer's `-rss_limit_mb`): a parser that
/// lets a small input take more is a finding.
const RSS_LIMIT_MB: u32 = 2048;
/// Longest one input may take, seconds (libFuzzer's `-timeout`).
const INPUT_TIMEOUT_SECS: u32 = 10;

#[derive(Debug, clap::Args)]
pub struct FuzzArgs {
    /// Seconds to run each target.
    #[arg(long, default_value_t = 60)]
    secs: u64,
    /// After the runs, fold the new inputs into fuzz/corpus/ and minimize
    /// it (`cargo fuzz cmin`).
    #[arg(long)]
    cmin: bool,
    /// Targets to run (default: all of `cargo fuzz list`).
    targets: Vec<String>,
}

/// `cargo xtask fuzz`.
pub fn run(args: FuzzArgs) -> Result<()> {
    setup::fuzz_tools()?;
    let all = targets()?;
    let chosen = if args.targets.is_empty() {
        all
    } else {
        for t in &args.targets {
            if !all.contains(t) {
                bail!("no fuzz target {t:?} (there are: {})", all.join(", "));
            }
        }
        args.targets
    };
    fuzz(&chosen, args.secs)?;
    if args.cmin {
        for t in &chosen {
            minimize(t)?;
        }
    }
    Ok(())
}

/// Every target for `secs` seconds (the tests' step; the tools are set up).
pub fn run_all(secs: u64) -> Result<()> {
    fuzz(&targets()?, secs)
}

/// `cargo +nightly`, without the variables `cargo xtask` (a `cargo run`)
/// was given (`CARGO`, `CARGO_PKG_*`, `CARGO_MANIFEST_DIR`, ...; the
/// toolchain's): the fuzz build sees the environment a shell gives it, so
/// runs from a shell and from xtask do not rebuild each other's crates.
fn nightly_cargo() -> Result<Cmd> {
    let mut cmd = Cmd::new("cargo")?.arg("+nightly");
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let from_cargo = key.starts_with("CARGO") && key != "CARGO_HOME";
        if from_cargo
            || matches!(
                key,
                "RUSTUP_TOOLCHAIN" | "RUSTC" | "RUSTDOC" | "LD_LIBRARY_PATH"
            )
        {
            cmd = cmd.env_remove(key);
        }
    }
    Ok(cmd)
}

/// The targets `fuzz/Cargo.toml` declares.
fn targets() -> Result<Vec<String>> {
    let out = nightly_cargo()?
        .args(["fuzz", "list"])
        .probe()
        .context("`cargo +nightly fuzz list` failed")?;
    let list: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if list.is_empty() {
        bail!("`cargo fuzz list` names no target");
    }
    Ok(list)
}

fn fuzz(targets: &[String], secs: u64) -> Result<()> {
    let root = workspace_root()?;
    eprintln!("==> fuzz: building the targets ({} to run)", targets.len());
    nightly_cargo()?
        .args(["fuzz", "build", "--debug-assertions"])
        .run()?;
    for t in targets {
        let scratch = root.join("target/fuzz-corpus").join(t);
        std::fs::create_dir_all(&scratch)
            .with_context(|| format!("could not create {}", scratch.display()))?;
        let corpus = root.join("fuzz/corpus").join(t);
        eprintln!("==> fuzz: {t} for {secs} s");
        let mut run = nightly_cargo()?
            .args(["fuzz", "run", "--debug-assertions", t])
            .arg(&scratch)
            .arg(&corpus)
            .arg("--");
        let dict = root.join("fuzz/dicts").join(format!("{t}.dict"));
        if dict.is_file() {
            run = run.arg(format!("-dict={}", dict.display()));
        }
        run.arg(format!("-max_total_time={secs}"))
            .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
            .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
            .arg("-print_final_stats=1")
            .run()
            .with_context(|| {
                format!(
                    "fuzz target {t} failed: its input is in fuzz/artifacts/{t}/; reproduce \
                     with `cargo +nightly fuzz run {t} fuzz/artifacts/{t}/<file>`, fix it and \
                     add the input as a regression test to the crate that owns the parser"
                )
            })?;
    }
    Ok(())
}

/// Folds the scratch corpus of `target` into `fuzz/corpus/<target>` and
/// minimizes it.
fn minimize(target: &str) -> Result<()> {
    let root = workspace_root()?;
    let corpus = root.join("fuzz/corpus").join(target);
    copy_new(&root.join("target/fuzz-corpus").join(target), &corpus)?;
    nightly_cargo()?
        .args(["fuzz", "cmin", "--debug-assertions", target])
        .arg(&corpus)
        .run()
}

fn copy_new(from: &Path, to: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    std::fs::create_dir_all(to).with_context(|| format!("could not create {}", to.display()))?;
    for entry in entries {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if !dest.exists() {
            std::fs::copy(entry.path(), &dest)
                .with_context(|| format!("could not copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}
