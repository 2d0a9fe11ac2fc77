//! `cargo xtask harnesses`: installs the six harness CLIs the end-to-end
//! tests run, from the npm registry, at the versions pinned in
//! `harnesses/package.json` (with `harnesses/package-lock.json` for their
//! dependencies): the one place their versions are set.
//!
//! They go to `.polar-cache/harnesses/` (git-ignored; `POLAR_HARNESS_DIR`
//! overrides it), reused between runs: a stamp holding the manifest and lock
//! file it was installed from makes a second run a no-op, and any change to
//! either reinstalls. `npm install` (not `npm ci`, which refuses lock files
//! whose optional platform packages were left out) follows the lock file.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};

/// The binaries the six CLIs install.
pub const BINARIES: [&str; 6] = ["codex", "claude", "gemini", "qwen", "opencode", "pi"];
const STAMP: &str = ".polar-installed";
/// The oldest Node the pinned CLIs run on.
const NODE_MAJOR: u32 = 20;

/// Where the CLIs are installed.
pub fn install_dir() -> Result<PathBuf> {
    Ok(match std::env::var_os("POLAR_HARNESS_DIR") {
        Some(d) => PathBuf::from(d),
        None => workspace_root()?.join(".polar-cache/harnesses"),
    })
}

fn report(item: &str, state: &str) {
    eprintln!("harnesses: {item:<18} {state}");
}

fn node_major() -> Option<u32> {
    let v = Cmd::new("node").ok()?.arg("--version").probe()?;
    v.trim()
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Installs the CLIs if they are missing or out of date; returns where.
pub fn run() -> Result<PathBuf> {
    let src = workspace_root()?.join("harnesses");
    let manifest = std::fs::read_to_string(src.join("package.json"))
        .context("reading harnesses/package.json")?;
    let lock = std::fs::read_to_string(src.join("package-lock.json"))
        .context("reading harnesses/package-lock.json")?;
    let dir = install_dir()?;
    let stamp = format!("{manifest}\n{lock}");
    let bins = dir.join("node_modules/.bin");
    let installed = std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp)
        && BINARIES.iter().all(|b| bins.join(b).exists());
    if installed {
        report("harness CLIs", "present");
        return Ok(dir);
    }
    match node_major() {
        Some(v) if v >= NODE_MAJOR => {}
        Some(v) => {
            bail!("the harness CLIs need Node {NODE_MAJOR} or later; `node --version` says {v}")
        }
        None => {
            bail!("the harness CLIs need Node {NODE_MAJOR} or later and npm; `node` was not found")
        }
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = std::fs::remove_file(dir.join(STAMP));
    std::fs::write(dir.join("package.json"), &manifest)?;
    std::fs::write(dir.join("package-lock.json"), &lock)?;
    Cmd::new("npm")?
        .arg("--prefix")
        .arg(&dir)
        .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
        .run()
        .context("npm install of the harness CLIs failed")?;
    for b in BINARIES {
        check(&bins, b)?;
    }
    std::fs::write(dir.join(STAMP), stamp)?;
    report("harness CLIs", "installed");
    Ok(dir)
}

fn check(bins: &Path, binary: &str) -> Result<()> {
    let path = bins.join(binary);
    let run = Cmd::new(&path)?
        .arg("--version")
        .capture(std::time::Duration::from_secs(60))?;
    if !run.status.success() {
        bail!(
            "{} --version failed after the install: {}",
            path.display(),
            run.stderr.trim()
        );
    }
    // pi prints its version on stderr.
    let text = if run.stdout.trim().is_empty() {
        run.stderr
    } else {
        run.stdout
    };
    report(binary, text.lines().next().unwrap_or_default().trim());
    Ok(())
}
