//! `cargo xtask fuzz --coverage`: which of Polar's lines each fuzz target
//! runs. The target runs once over its committed corpus and seeds with
//! coverage instrumentation (`cargo fuzz coverage`), then the nightly
//! toolchain's `llvm-cov` summarizes the lines per source file, leaving
//! out the dependencies', the standard library's and the fuzz targets' own
//! ([`NOT_POLAR`]). Edge counts say how much of a binary a target reaches;
//! this says which of Polar's parsers' lines, which is how the capture-log
//! targets' corpora were found to hold no valid record (docs/SECURITY.md,
//! "Fuzzing", session 20).

use std::path::Path;

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::daemon::tail;
use crate::fuzz::{STOP_GRACE, nightly_cargo, seeds};
use crate::group::Group;
use crate::setup;

/// Where a target's report goes, from the workspace root.
const COVERAGE_REPORTS: &str = "target/fuzz-coverage";
/// The sources a report leaves out: the dependencies', the standard
/// library's, the fuzz targets' own and generated code.
const NOT_POLAR: &str = r"(/\.cargo/registry/|/\.rustup/|^/rustc/|/fuzz/|/target/)";

/// [`report`] for each of `targets`, the nightly toolchain's `llvm-cov`
/// and host looked up once.
pub fn run(targets: &[String]) -> Result<()> {
    setup::llvm_tools()?;
    let rustc = |arg: &str| -> Result<String> {
        Cmd::new("rustc")?
            .args(["+nightly", arg])
            .probe()
            .context("`rustc +nightly` failed")
    };
    let sysroot = rustc("--print=sysroot")?;
    let host = rustc("-vV")?
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("`rustc -vV` names no host")?;
    let llvm_cov = Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(&host)
        .join("bin/llvm-cov");
    for t in targets {
        report(t, &llvm_cov, &host)?;
    }
    Ok(())
}

/// Runs `target` over its committed corpus and seeds with coverage
/// instrumentation (built for `host`), writes `llvm-cov`'s report on
/// Polar's sources to [`COVERAGE_REPORTS`] and prints its rows for the
/// files the target ran any line of, with their total.
fn report(target: &str, llvm_cov: &Path, host: &str) -> Result<()> {
    let root = workspace_root()?;
    let dir = root.join(COVERAGE_REPORTS);
    std::fs::create_dir_all(&dir).with_context(|| format!("could not create {}", dir.display()))?;
    let log = dir.join(format!("{target}.log"));
    eprintln!(
        "==> fuzz: coverage of {target} over its corpus (log {COVERAGE_REPORTS}/{target}.log)"
    );
    let mut cmd = nightly_cargo()?
        .args(["fuzz", "coverage", target])
        .arg(root.join("fuzz/corpus").join(target));
    if let Some(seeds) = seeds(&root, target) {
        cmd = cmd.arg(seeds);
    }
    let status = Group::spawn(cmd, &log, STOP_GRACE)?.wait()?;
    if !status.success() {
        bail!(
            "`cargo fuzz coverage {target}` failed ({status}):\n{}",
            tail(&log, 30)
        );
    }
    let binary = root
        .join("target")
        .join(host)
        .join("coverage")
        .join(host)
        .join("release")
        .join(target);
    let profile = root
        .join("fuzz/coverage")
        .join(target)
        .join("coverage.profdata");
    let summary = Cmd::new(llvm_cov)?
        .args(["export", "-summary-only"])
        .arg(&binary)
        .arg(format!("-instr-profile={}", profile.display()))
        .arg(format!("-ignore-filename-regex={NOT_POLAR}"))
        .probe()
        .with_context(|| format!("`llvm-cov export` on {} failed", binary.display()))?;
    let path = dir.join(format!("{target}.json"));
    std::fs::write(&path, &summary)
        .with_context(|| format!("could not write {}", path.display()))?;
    let summary: serde_json::Value =
        serde_json::from_str(&summary).context("reading llvm-cov's summary")?;
    let files = summary["data"][0]["files"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut reached: Vec<(String, u64, u64)> = files
        .iter()
        .filter_map(|f| {
            let lines = &f["summary"]["lines"];
            let (count, covered) = (lines["count"].as_u64()?, lines["covered"].as_u64()?);
            let name = f["filename"].as_str()?;
            let name = Path::new(name)
                .strip_prefix(&root)
                .map_or(name.into(), |p| p.display().to_string());
            (covered > 0).then_some((name, covered, count))
        })
        .collect();
    reached.sort();
    eprintln!("    {target}: lines run / lines, per source file of Polar's it reaches:");
    for (name, covered, count) in &reached {
        eprintln!("      {covered:>5} / {count:<5} {name}");
    }
    let covered: u64 = reached.iter().map(|r| r.1).sum();
    let count: u64 = reached.iter().map(|r| r.2).sum();
    eprintln!(
        "    {target}: {covered} of {count} lines in those files ({:.1}%); llvm-cov's summary: {COVERAGE_REPORTS}/{target}.json",
        if count == 0 {
            0.0
        } else {
            100.0 * covered as f64 / count as f64
        }
    );
    Ok(())
}
