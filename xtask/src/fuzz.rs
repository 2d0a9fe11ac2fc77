//! `cargo xtask fuzz`: the coverage-guided fuzz targets of `fuzz/` (cargo
//! fuzz, libFuzzer, nightly), one per core at a time (`--jobs`), each for
//! `--secs` seconds with its output in `target/fuzz-logs/<target>.log`.
//!
//! Each target starts from three corpora ([`corpora`]): its seed corpus in
//! the repository, `fuzz/corpus/<target>/` (a set-cover minimization: the
//! fewest inputs that reach every edge the grown corpus reached, a few
//! hundred files at most), the grown corpus this machine has kept,
//! `.polar-cache/fuzz-corpus/<target>/` (where libFuzzer writes what it
//! finds; a fresh machine starts it empty and grows it again), and its
//! hand-kept seeds in `fuzz/seeds/`, never minimized. `--cmin` folds the
//! grown corpus into the seed corpus again ([`minimize`]). A target with a
//! dictionary `fuzz/dicts/<target>.dict` (the tokens and field names its
//! parser matches) runs with it; the targets whose inputs are JSON also
//! mutate them as JSON values with its words (`fuzz/src/mutate.rs`).
//! `cargo xtask test` runs every target briefly ([`TEST_SECS`]).
//!
//! A target that finds a crash fails the command, naming the input libFuzzer
//! wrote to `fuzz/artifacts/<target>/`; the fix comes with a regression test
//! in the crate that owns the parser (docs/SECURITY.md, "Fuzzing").

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::daemon::tail;
use crate::group::Group;
use crate::setup;

/// Seconds each target runs in `cargo xtask test` (19 targets, two at a
/// time on two cores: about three and a half minutes with the corpora's
/// loading, against five one after the other).
pub const TEST_SECS: u64 = 8;

/// Memory one target may use (libFuzzer's `-rss_limit_mb`): a parser that
/// lets a small input take more is a finding.
const RSS_LIMIT_MB: u32 = 2048;
/// Longest one input may take, seconds (libFuzzer's `-timeout`).
const INPUT_TIMEOUT_SECS: u32 = 10;
/// Each target's output, from the workspace root.
const LOGS: &str = "target/fuzz-logs";
/// The seed corpora in the repository, from the workspace root.
const SEED_CORPORA: &str = "fuzz/corpus";
/// The grown corpora, outside the tree, from the workspace root.
const GROWN_CORPORA: &str = ".polar-cache/fuzz-corpus";
/// The targets whose inputs are capture logs: they share the seeds of
/// `fuzz/seeds/capture_log/` (see [`seeds`]) and may grow inputs to
/// [`CAPTURE_LOG_MAX_LEN`].
const CAPTURE_LOG_TARGETS: [&str; 2] = ["capture_log", "capture_log_roundtrip"];
/// libFuzzer's `-max_len` for [`CAPTURE_LOG_TARGETS`]: its default, 4096
/// bytes, cuts a log before its second call, and cut the session's log
/// (26 KiB) before its first completion.
const CAPTURE_LOG_MAX_LEN: usize = 32 << 10;
/// How often the runs are looked at.
const POLL: Duration = Duration::from_millis(100);
/// How long a stopped run has to end after SIGTERM.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub struct FuzzArgs {
    /// Seconds to run each target.
    #[arg(long, default_value_t = 60)]
    secs: u64,
    /// Targets to run at a time (default: one per core).
    #[arg(long)]
    jobs: Option<usize>,
    /// After the runs, rebuild each seed corpus in fuzz/corpus/ from itself
    /// and the grown corpus: the fewest inputs that reach every edge they
    /// reach (libFuzzer's set-cover merge).
    #[arg(long)]
    cmin: bool,
    /// Instead of fuzzing, run each target once over its corpus (and
    /// seeds) with coverage instrumentation and report, per source file of
    /// Polar's that it reaches, the lines it ran (`cargo fuzz coverage`,
    /// `llvm-cov`); the whole report goes to target/fuzz-coverage/.
    #[arg(long, conflicts_with = "cmin")]
    coverage: bool,
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
    if args.coverage {
        return crate::fuzz_coverage::run(&chosen);
    }
    fuzz(&chosen, args.secs, args.jobs.unwrap_or_else(cores))?;
    if args.cmin {
        for t in &chosen {
            minimize(t)?;
        }
    }
    Ok(())
}

/// Every target for `secs` seconds, as many at a time as there are
/// cores (the tests' step; the tools are set up).
pub fn run_all(secs: u64) -> Result<()> {
    fuzz(&targets()?, secs, cores())
}

/// The cores this process may use (1 if that cannot be told).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `cargo +nightly`, with the environment a shell gives it
/// ([`Cmd::cargo`]).
pub fn nightly_cargo() -> Result<Cmd> {
    Ok(Cmd::cargo()?.arg("+nightly"))
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

/// One target's run: `cargo fuzz run` in a process group of its own (it
/// starts the target's binary), its output in `log`; stopped with its
/// group if dropped while it runs (another target failed, or xtask did).
struct Run {
    target: String,
    group: Group,
    log: PathBuf,
}

impl Run {
    fn start(target: &str, secs: u64) -> Result<Self> {
        let root = workspace_root()?;
        let log = root.join(LOGS).join(format!("{target}.log"));
        // libFuzzer writes new inputs into the first directory: the grown one.
        let mut run = nightly_cargo()?
            .args(["fuzz", "run", "--debug-assertions", target])
            .args(corpora(&root, target)?)
            .arg("--");
        if let Some(max_len) = max_len(target) {
            run = run.arg(max_len);
        }
        let dict = root.join("fuzz/dicts").join(format!("{target}.dict"));
        if dict.is_file() {
            run = run.arg(format!("-dict={}", dict.display()));
        }
        let run = run
            .arg(format!("-max_total_time={secs}"))
            .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
            .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
            .arg("-print_final_stats=1");
        let group = Group::spawn(run, &log, STOP_GRACE)?;
        eprintln!("==> fuzz: {target} for {secs} s (log {LOGS}/{target}.log)");
        Ok(Self {
            target: target.to_owned(),
            group,
            log,
        })
    }

    /// Whether it has ended, and if so how: `Some(Ok)` if it passed.
    fn ended(&mut self) -> Result<Option<Result<()>>> {
        let Some(status) = self.group.try_wait()? else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let t = &self.target;
        if status.success() {
            // libFuzzer's status when the corpus was loaded and when it
            // stopped (`#<runs>\tINITED cov: ...`, `#<runs>\tDONE cov: ...`).
            let status = |event: &str| {
                text.lines()
                    .find(|l| l.starts_with('#') && l.contains(&format!("\t{event} ")))
            };
            for line in [status("INITED"), status("DONE")].into_iter().flatten() {
                eprintln!("    {t}: {line}");
            }
            return Ok(Some(Ok(())));
        }
        Ok(Some(Err(anyhow!(
            "fuzz target {t} failed ({status}); the end of {LOGS}/{t}.log:\n{}\n\
             its input is in fuzz/artifacts/{t}/; reproduce with `cargo +nightly fuzz run \
             {t} fuzz/artifacts/{t}/<file>`, fix it and add the input as a regression test \
             to the crate that owns the parser",
            tail(&self.log, 40)
        ))))
    }
}

/// Builds the targets, then runs each for `secs` seconds, `jobs` at a
/// time (a fuzzer keeps one core busy); after a failure no new one starts
/// and those running are stopped.
fn fuzz(targets: &[String], secs: u64, jobs: usize) -> Result<()> {
    let jobs = jobs.clamp(1, targets.len().max(1));
    eprintln!(
        "==> fuzz: building the targets ({} to run, {jobs} at a time)",
        targets.len()
    );
    build()?;
    let logs = workspace_root()?.join(LOGS);
    std::fs::create_dir_all(&logs)
        .with_context(|| format!("could not create {}", logs.display()))?;
    let mut queue = targets.iter();
    let mut running: Vec<Run> = Vec::new();
    loop {
        while running.len() < jobs {
            let Some(t) = queue.next() else { break };
            running.push(Run::start(t, secs)?);
        }
        if running.is_empty() {
            return Ok(());
        }
        std::thread::sleep(POLL);
        let mut i = 0;
        while i < running.len() {
            match running[i].ended()? {
                None => i += 1,
                Some(Ok(())) => {
                    running.remove(i);
                }
                // `running` is dropped on the way out: the others stop.
                Some(Err(e)) => return Err(e),
            }
        }
    }
}

/// The directories `target` runs over: its grown corpus (created if
/// missing; first, so that libFuzzer writes new inputs there), its seed
/// corpus and its hand-kept seeds ([`seeds`]).
pub fn corpora(root: &Path, target: &str) -> Result<Vec<PathBuf>> {
    let grown = root.join(GROWN_CORPORA).join(target);
    std::fs::create_dir_all(&grown)
        .with_context(|| format!("could not create {}", grown.display()))?;
    let mut dirs = vec![grown, root.join(SEED_CORPORA).join(target)];
    dirs.extend(seeds(root, target));
    Ok(dirs)
}

/// The hand-kept seeds `target` also starts from, if it has any:
/// `fuzz/seeds/<target>/` (`capture_log/` for [`CAPTURE_LOG_TARGETS`]).
/// They are inputs the minimized corpora did not reach (valid capture logs,
/// one call per file, whole or as its two parts, and one session's log;
/// the provider requests' structured outputs, ...), kept apart because
/// `cmin` never touches them, so a change of a format cannot drop them
/// unnoticed: the owning crates' `fuzz_seeds` tests keep them valid.
pub fn seeds(root: &Path, target: &str) -> Option<PathBuf> {
    let name = if CAPTURE_LOG_TARGETS.contains(&target) {
        "capture_log"
    } else {
        target
    };
    Some(root.join("fuzz/seeds").join(name)).filter(|dir| dir.is_dir())
}

/// Builds every target as `cargo xtask fuzz` runs it (libFuzzer,
/// AddressSanitizer, debug assertions).
pub fn build() -> Result<()> {
    nightly_cargo()?
        .args(["fuzz", "build", "--debug-assertions"])
        .run()
}

/// The `-max_len` `target` runs with, if not libFuzzer's default.
pub fn max_len(target: &str) -> Option<String> {
    CAPTURE_LOG_TARGETS
        .contains(&target)
        .then(|| format!("-max_len={CAPTURE_LOG_MAX_LEN}"))
}

/// Rebuilds the seed corpus of `target` from itself and its grown corpus:
/// libFuzzer's set-cover merge over edge coverage (`-use_counters=0`: hit
/// counts would keep an input per loop count) into a new directory, which
/// then replaces `fuzz/corpus/<target>/`. The hand-kept seeds are left as
/// they are.
fn minimize(target: &str) -> Result<()> {
    let root = workspace_root()?;
    let corpus = root.join(SEED_CORPORA).join(target);
    let grown = root.join(GROWN_CORPORA).join(target);
    let merged = root.join("target/fuzz-cmin").join(target);
    if merged.exists() {
        std::fs::remove_dir_all(&merged)
            .with_context(|| format!("could not remove {}", merged.display()))?;
    }
    std::fs::create_dir_all(&merged)
        .with_context(|| format!("could not create {}", merged.display()))?;
    let mut cmd = nightly_cargo()?
        .args(["fuzz", "run", "--debug-assertions", target])
        .arg(&merged)
        .arg(&corpus);
    if grown.is_dir() {
        cmd = cmd.arg(&grown);
    }
    cmd = cmd.args(["--", "-set_cover_merge=1", "-use_counters=0"]);
    if let Some(max_len) = max_len(target) {
        cmd = cmd.arg(max_len);
    }
    cmd.arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .run()?;
    let kept = std::fs::read_dir(&merged)
        .with_context(|| format!("could not read {}", merged.display()))?
        .count();
    if kept == 0 {
        bail!(
            "the set-cover merge of {target} kept no input; {} is left as it was",
            corpus.display()
        );
    }
    if corpus.exists() {
        std::fs::remove_dir_all(&corpus)
            .with_context(|| format!("could not remove {}", corpus.display()))?;
    }
    std::fs::rename(&merged, &corpus).with_context(|| {
        format!(
            "could not move {} to {}",
            merged.display(),
            corpus.display()
        )
    })?;
    eprintln!("==> fuzz: {target}: the seed corpus now holds {kept} inputs");
    Ok(())
}
