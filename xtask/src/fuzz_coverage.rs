//! `cargo xtask fuzz --coverage`: which of Polar's lines each fuzz target
//! runs, and whose code the edges libFuzzer counts are in. The target runs
//! once over its corpora (seed, grown, hand-kept) with coverage instrumentation
//! (`cargo fuzz coverage`), then the nightly toolchain's `llvm-cov`
//! summarizes the lines per source file, leaving out the dependencies',
//! the standard library's and the fuzz targets' own ([`NOT_POLAR`]). Edge
//! counts say how much of a binary a target reaches; this says which of
//! Polar's parsers' lines (a corpus holding no valid record shows as
//! lines never run; docs/SECURITY.md, "Fuzzing"). The edges are then split
//! by source ([`edges`]): a run still finding edges may be finding them
//! all in a dependency's parser while Polar's code is at a plateau.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::daemon::tail;
use crate::fuzz::{STOP_GRACE, corpora, max_len, nightly_cargo};
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
    crate::fuzz::build()?;
    for t in targets {
        report(t, &llvm_cov, &host)?;
        edges(t, &host)?;
    }
    Ok(())
}

/// Runs `target` over its corpora ([`corpora`]) with coverage
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
    let cmd = nightly_cargo()?
        .args(["fuzz", "coverage", target])
        .args(corpora(&root, target)?);
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

/// Runs `target`'s fuzzing binary (the one `cargo xtask fuzz` runs, built
/// for `host`) once over its committed corpus and seeds with libFuzzer's
/// `-print_coverage=1` and prints the edges it counts (its `cov:`) by
/// where the functions holding them come from ([`source_of`]).
fn edges(target: &str, host: &str) -> Result<()> {
    let root = workspace_root()?;
    let binary = root
        .join("fuzz/target")
        .join(host)
        .join("release")
        .join(target);
    let log = root
        .join(COVERAGE_REPORTS)
        .join(format!("{target}-edges.log"));
    let mut cmd = Cmd::new(&binary)?.args(["-runs=0", "-print_coverage=1"]);
    if let Some(max_len) = max_len(target) {
        cmd = cmd.arg(max_len);
    }
    cmd = cmd.args(corpora(&root, target)?);
    let status = Group::spawn(cmd, &log, STOP_GRACE)?.wait()?;
    if !status.success() {
        bail!(
            "{} over its corpus failed ({status}):\n{}",
            binary.display(),
            tail(&log, 30)
        );
    }
    let report = std::fs::read_to_string(&log)
        .with_context(|| format!("could not read {}", log.display()))?;
    let by_source = edges_by_source(&report, &root.display().to_string());
    let total: u64 = by_source.values().sum();
    let of = |source: &str| by_source.get(source).copied().unwrap_or(0);
    let mut deps: Vec<(&String, &u64)> = by_source
        .iter()
        .filter(|(source, _)| !matches!(source.as_str(), POLAR | FUZZ_TARGET | STD))
        .collect();
    deps.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let named: Vec<String> = deps.iter().map(|(d, n)| format!("{d} {n}")).collect();
    let named = if named.is_empty() {
        String::new()
    } else {
        format!(" ({})", named.join(", "))
    };
    eprintln!(
        "    {target}: {total} edges as libFuzzer counts them: Polar's {}, the target's own \
         (its checks) {}, the standard library's {}, dependencies' {}{named}; per function: \
         {COVERAGE_REPORTS}/{target}-edges.log",
        of(POLAR),
        of(FUZZ_TARGET),
        of(STD),
        deps.iter().map(|d| d.1).sum::<u64>(),
    );
    Ok(())
}

/// [`source_of`] Polar's sources.
const POLAR: &str = "Polar";
/// [`source_of`] the fuzz targets' own sources.
const FUZZ_TARGET: &str = "fuzz target";
/// [`source_of`] the toolchain's sources (and the crates it vendors).
const STD: &str = "std";

/// The covered edges of libFuzzer's `-print_coverage=1` report, summed by
/// [`source_of`] the file of the function holding them (`COVERED_FUNC:
/// hits: H edges: C/T NAME FILE:LINE`, the name possibly with spaces).
fn edges_by_source(report: &str, root: &str) -> BTreeMap<String, u64> {
    let mut by_source = BTreeMap::new();
    for line in report.lines() {
        let Some(rest) = line.strip_prefix("COVERED_FUNC: ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let covered = words
            .by_ref()
            .skip_while(|w| *w != "edges:")
            .nth(1)
            .and_then(|e| e.split_once('/'))
            .and_then(|(covered, _)| covered.parse::<u64>().ok());
        let (Some(covered), Some(place)) = (covered, words.last()) else {
            continue;
        };
        let file = place.rsplit_once(':').map_or(place, |(file, _)| file);
        *by_source.entry(source_of(file, root)).or_default() += covered;
    }
    by_source
}

/// Where `file` comes from: Polar's sources under `root`; the fuzz
/// target's own (`fuzz/`, and `libfuzzer-sys`, where the target's body,
/// expanded from its `fuzz_target!`, is placed); the toolchain's; or
/// another registry crate (its name).
fn source_of(file: &str, root: &str) -> String {
    if let Some(inside) = file.strip_prefix(root) {
        return if inside.starts_with("/fuzz/") {
            FUZZ_TARGET
        } else {
            POLAR
        }
        .to_owned();
    }
    if let Some((_, in_registry)) = file.split_once("/registry/src/") {
        // `index.crates.io-<hash>/<name>-<version>/src/...`
        if let Some(dir) = in_registry.split('/').nth(1) {
            let name = dir
                .rsplit_once('-')
                .filter(|(_, version)| version.starts_with(|c: char| c.is_ascii_digit()))
                .map_or(dir, |(name, _)| name);
            return if name == "libfuzzer-sys" {
                FUZZ_TARGET
            } else {
                name
            }
            .to_owned();
        }
    }
    STD.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_are_summed_by_the_source_of_their_function() {
        let report = "\
INFO: some other line
COVERED_FUNC: hits: 3 edges: 5/38 rust_fuzzer_test_input /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libfuzzer-sys-0.4.13/src/lib.rs:261
COVERED_FUNC: hits: 9 edges: 7/9 <polar_chat::FinishReason as serde_core::de::Deserialize>::deserialize::<&mut serde_json::de::Deserializer<R>> /w/polar-agent/crates/chat/src/lib.rs:40
COVERED_FUNC: hits: 1 edges: 2/4 polar_capture::lines::parse_line /w/polar-agent/crates/capture/src/lines.rs:10
COVERED_FUNC: hits: 1 edges: 1/1 check /w/fuzz/src/lib.rs:5
COVERED_FUNC: hits: 1 edges: 4/9 <serde_json::de::Deserializer<R>>::parse_number /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/serde_json-1.0.145/src/de.rs:400
COVERED_FUNC: hits: 1 edges: 6/7 <alloc::vec::Vec<u8>>::push /root/.rustup/toolchains/nightly-x86_64-unknown-linux-gnu/lib/rustlib/src/rust/library/alloc/src/vec/mod.rs:2400
COVERED_FUNC: hits: 1 edges: 1/2 <hashbrown::raw::RawTable<T>>::find /rust/deps/hashbrown-0.17.1/src/raw.rs:948
UNCOVERED_FUNC: hits: 0 edges: 0/3 LLVMFuzzerInitialize /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libfuzzer-sys-0.4.13/src/lib.rs:252
";
        let by_source = edges_by_source(report, "/w");
        let want: BTreeMap<String, u64> = [
            ("Polar", 9),
            ("fuzz target", 6),
            ("serde_json", 4),
            ("std", 7),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(by_source, want);
    }
}
