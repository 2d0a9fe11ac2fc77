//! `cargo xtask test`: everything CI checks, in order, stopping at the first
//! failure with the name of the step.
//!
//! After the Debian packages, what only downloads (the Python
//! environments, the harness CLIs, the Docker test image, the browser
//! clients) installs in a second process ([`Background`]) while this one
//! builds the cargo tools and runs the checks, builds and fuzz targets; the
//! step before the tests waits for it.
//!
//! The layer check (`cargo xtask layers`) runs in-process right after
//! clippy, before the long steps.
//!
//! The end-to-end tests run the `polar` binary from `target/debug`, so it is
//! built before the tests (`cargo nextest run`, the tests of every test
//! binary side by side, `.config/nextest.toml`; then `cargo test --doc`).
//! The privileged tests (real cgroups, eBPF and network namespaces) need
//! root; `--unprivileged` leaves them out. With them, a private Docker
//! engine ([`docker::Engine`]) and a Slurm test cluster
//! ([`slurm::Cluster`]) run for the length of the test step, for the docker
//! runtime's tests (`POLAR_TEST_DOCKER_HOST`, `POLAR_TEST_DOCKER_IMAGE`) and
//! the Slurm rollout tests (`POLAR_TEST_SLURM_CONF`). Before the tests,
//! every fuzz target runs for a few seconds from its committed corpus
//! ([`fuzz`]). The last steps check and test the Python client (`python/`)
//! in its environments ([`python`]); then, with root, the dashboard in
//! headless Chromium and Firefox ([`dashboard`]).
//!
//! Each step's time and the disk space left are printed when it ends, and
//! the whole run's time, so CI's log shows where the time and the space go.
//!
//! Every build here runs without incremental state (`CARGO_INCREMENTAL=0`):
//! on a fresh clone, which is what CI runs, nothing would reuse it, and it
//! is 3 of the 8 GB the builds would leave (`BENCHMARKS.md`, "Disk: what a
//! whole test run leaves").

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::background::Background;
use crate::cmd::{Cmd, is_root, workspace_root};
use crate::{chat_models, dashboard, docker, fuzz, harnesses, layers, python, setup, slurm};

/// The feature of the `polar-tests` crate that turns on the root-only tests.
const PRIVILEGED_FEATURE: &str = "polar-tests/privileged";

/// One step: an external command, or a check xtask makes itself.
enum Step {
    Run(Box<Cmd>),
    Layers,
    /// The test run, with a private Docker engine and a Slurm test cluster
    /// for the docker runtime's and the Slurm tests (privileged runs),
    /// stopped when it ends however it ends.
    Tests {
        cmd: Box<Cmd>,
        services: bool,
    },
    /// Every fuzz target for a few seconds ([`fuzz::run_all`]).
    Fuzz,
    /// Waiting for what installs in the background ([`Background`]).
    Background(Background),
    /// The Python client's type check and tests ([`python_tests`]).
    Python {
        privileged: bool,
    },
    /// The dashboard in a browser ([`dashboard::run`]), with root only.
    Dashboard {
        privileged: bool,
    },
}

impl Step {
    fn run(cmd: Cmd) -> Self {
        Self::Run(Box::new(cmd))
    }
}

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// Leave out the privileged tests (for runs without root).
    #[arg(long)]
    unprivileged: bool,
    /// Extra arguments for `cargo nextest run`, e.g. a test name filter or
    /// `--no-capture`.
    #[arg(last = true)]
    cargo_test_args: Vec<String>,
}

pub fn run(args: TestArgs) -> Result<()> {
    let started = Instant::now();
    // Checked before anything is installed or built.
    if !args.unprivileged && !is_root()? {
        bail!(
            "the privileged tests need root (they create cgroups, load eBPF programs \
             and make network namespaces); run as root, or pass --unprivileged to skip them"
        );
    }
    setup::packages(setup::Scope::All)?;
    // Downloads, while the tools build and the checks run.
    let downloads = Background::start(!args.unprivileged)?;
    setup::tools(setup::Scope::All)?;
    // The tests of every test binary side by side, each in a process of its
    // own (`.config/nextest.toml`: their groups and priorities).
    // polar-template's differential test: the real tokenizers and chat
    // templates, and transformers to compare with (`chat_models`).
    let mut cargo_test = cargo()?
        .args(["nextest", "run"])
        .env("POLAR_CHAT_MODELS_DIR", chat_models::install_dir()?)
        .env("POLAR_TEMPLATE_PYTHON", chat_models::python()?);
    // cargo-nextest runs no doc tests: `cargo test --doc` does.
    let mut doc_tests = cargo()?.args(["test", "--doc"]);
    if !args.unprivileged {
        // The end-to-end tests run the real harness CLIs.
        cargo_test = cargo_test
            .env("POLAR_HARNESS_DIR", harnesses::install_dir()?)
            .args(["--features", PRIVILEGED_FEATURE]);
        // The same features, so nothing builds again.
        doc_tests = doc_tests.args(["--features", PRIVILEGED_FEATURE]);
    }
    let steps = [
        (
            "format",
            Step::run(cargo()?.args(["fmt", "--all", "--", "--check"])),
        ),
        (
            // With the privileged tests compiled in: without the feature they
            // build with dead code and unused imports allowed.
            "clippy",
            Step::run(cargo()?.args([
                "clippy",
                "--all-targets",
                "--features",
                "polar-tests/privileged",
                "--",
                "-D",
                "warnings",
            ])),
        ),
        // The fuzz targets are a workspace of their own (nightly to run,
        // but they check on stable), which the two steps above miss.
        (
            "format of fuzz/",
            Step::run(cargo()?.args([
                "fmt",
                "--manifest-path",
                "fuzz/Cargo.toml",
                "--",
                "--check",
            ])),
        ),
        (
            "clippy of fuzz/",
            Step::run(cargo()?.args([
                "clippy",
                "--manifest-path",
                "fuzz/Cargo.toml",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])),
        ),
        ("crate layering", Step::Layers),
        (
            // Advisories are never checked: they need GitHub, which CI cannot reach.
            "dependency policy",
            Step::run(cargo()?.args(["deny", "check", "bans", "licenses", "sources"])),
        ),
        (
            "debug build of polar",
            Step::run(cargo()?.args(["build", "--bin", "polar"])),
        ),
        ("fuzz targets", Step::Fuzz),
        ("set-up in the background", Step::Background(downloads)),
        (
            "tests",
            Step::Tests {
                cmd: Box::new(cargo_test.args(&args.cargo_test_args)),
                services: !args.unprivileged,
            },
        ),
        ("doc tests", Step::run(doc_tests)),
        (
            "python client",
            Step::Python {
                privileged: !args.unprivileged,
            },
        ),
        (
            "dashboard in chromium and firefox",
            Step::Dashboard {
                privileged: !args.unprivileged,
            },
        ),
    ];

    eprintln!(
        "==> set-up (Debian packages, cargo tools) took {}; {}",
        minutes(started.elapsed()),
        disk_left()
    );
    let total = steps.len();
    for (index, (name, step)) in steps.into_iter().enumerate() {
        let number = index + 1;
        let step_started = Instant::now();
        let failed = || {
            format!(
                "test step {number}/{total} ({name}) failed; {}",
                disk_left()
            )
        };
        match step {
            Step::Run(cmd) => {
                eprintln!("==> test step {number}/{total} ({name}): {}", cmd.shown());
                cmd.run().with_context(failed)?;
            }
            Step::Layers => {
                eprintln!("==> test step {number}/{total} ({name}): cargo xtask layers");
                layers::run(false).with_context(failed)?;
            }
            Step::Tests { cmd, services } => {
                let engine = services
                    .then(docker::Engine::start)
                    .transpose()
                    .with_context(failed)?;
                let cluster = services
                    .then(slurm::Cluster::start)
                    .transpose()
                    .with_context(failed)?;
                let mut cmd = *cmd;
                if engine.is_some() {
                    cmd = cmd
                        .env("POLAR_TEST_DOCKER_HOST", docker::host())
                        .env("POLAR_TEST_DOCKER_IMAGE", docker::IMAGE);
                }
                if let Some(c) = &cluster {
                    cmd = cmd.env("POLAR_TEST_SLURM_CONF", c.conf());
                }
                eprintln!("==> test step {number}/{total} ({name}): {}", cmd.shown());
                let result = cmd.run().with_context(failed);
                drop(cluster);
                drop(engine);
                result?;
            }
            Step::Fuzz => {
                eprintln!(
                    "==> test step {number}/{total} ({name}): cargo xtask fuzz --secs {}",
                    fuzz::TEST_SECS
                );
                fuzz::run_all(fuzz::TEST_SECS).with_context(failed)?;
                drop_fuzz_build_if_short().with_context(failed)?;
            }
            Step::Background(downloads) => {
                eprintln!("==> test step {number}/{total} ({name}): waiting for it");
                downloads.wait().with_context(failed)?;
            }
            Step::Python { privileged } => {
                eprintln!("==> test step {number}/{total} ({name}): mypy and pytest in python/");
                python_tests(privileged).with_context(failed)?;
            }
            Step::Dashboard { privileged } => {
                if privileged {
                    eprintln!(
                        "==> test step {number}/{total} ({name}): node tests/dashboard/dashboard.test.mjs"
                    );
                    dashboard::run().with_context(failed)?;
                } else {
                    eprintln!(
                        "==> test step {number}/{total} ({name}): left out (--unprivileged: it starts a gateway)"
                    );
                }
            }
        }
        eprintln!(
            "==> test step {number}/{total} ({name}) took {}; {}",
            minutes(step_started.elapsed()),
            disk_left()
        );
    }
    eprintln!(
        "==> all {total} test steps passed in {}, installs included",
        minutes(started.elapsed())
    );
    Ok(())
}

/// `cargo`, for the suite's builds: without incremental state (the
/// module's documentation says why).
fn cargo() -> Result<Cmd> {
    Ok(Cmd::cargo()?.env("CARGO_INCREMENTAL", "0"))
}

/// The bytes free on the working tree's file system (`df`), if told.
fn free_bytes() -> Option<u64> {
    let out = Cmd::new("df").ok()?.args(["-P", "-B1", "."]).probe()?;
    out.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()
}

/// Below this much free space, what a step leaves that only a later run
/// would reuse is removed once the step is done (the fuzz targets' build,
/// 2.5 GB); a whole fresh run's peak is about 24 GB (`BENCHMARKS.md`,
/// "Disk: what a whole test run leaves").
const KEEP_CACHES_ABOVE: u64 = 30_000_000_000;

/// Below this much free space, a failed step's error also lists what
/// takes the space.
const SHOW_USE_BELOW: u64 = 5_000_000_000;

/// The space left on the working tree's file system, for the steps' log
/// lines: a run that fills the disk says so, and then what holds it.
fn disk_left() -> String {
    let Some(free) = free_bytes() else {
        return "disk space unknown (df failed)".into();
    };
    let mut said = format!("{:.1} GB left on the disk", free as f64 / 1e9);
    if free < SHOW_USE_BELOW {
        said.push_str(&format!(" (held: {})", space_held()));
    }
    said
}

/// The sizes of the directories a test run fills, largest first (`du`).
fn space_held() -> String {
    let Ok(root) = workspace_root() else {
        return "unknown".into();
    };
    let mut dirs = vec![root.join("target"), root.join("fuzz/target")];
    if let Ok(entries) = std::fs::read_dir(root.join(".polar-cache")) {
        dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    let Some(out) = Cmd::new("du")
        .ok()
        .and_then(|c| c.arg("-sB1").args(&dirs).probe())
    else {
        return "unknown (du failed)".into();
    };
    let mut sizes: Vec<(u64, String)> = out
        .lines()
        .filter_map(|l| {
            let (size, path) = l.split_once('\t')?;
            let path = std::path::Path::new(path).strip_prefix(&root).ok()?;
            Some((size.parse().ok()?, path.display().to_string()))
        })
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes
        .iter()
        .map(|(size, path)| format!("{path} {:.1} GB", *size as f64 / 1e9))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Removes the fuzz targets' build when the disk is short (see
/// [`KEEP_CACHES_ABOVE`]); the next run builds them again.
fn drop_fuzz_build_if_short() -> Result<()> {
    match free_bytes() {
        Some(free) if free < KEEP_CACHES_ABOVE => {
            let dir = workspace_root()?.join("fuzz/target");
            eprintln!(
                "==> {:.1} GB left: removing the fuzz targets' build ({}), which only a later run would reuse",
                free as f64 / 1e9,
                dir.display()
            );
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("could not remove {}", dir.display()))
                }
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// A duration as minutes and seconds, for the steps' timings (CI's log
/// shows where the suite's time goes).
fn minutes(d: Duration) -> String {
    let secs = d.as_secs();
    format!("{}m{:02}s", secs / 60, secs % 60)
}

/// Longest a single Python test may run (pytest-timeout).
const PYTEST_TIMEOUT_SECS: u32 = 300;

/// `polar-client`: mypy (strict) on the package; then, with root (the
/// gateway needs it), its tests against the real stack started from
/// `target/debug/polar`, and each bridge's in its trainer's environment.
fn python_tests(privileged: bool) -> Result<()> {
    python::CLIENT.install_client()?;
    Cmd::new(python::CLIENT.python()?)?
        .args(["-m", "mypy", "--config-file", "python/pyproject.toml"])
        .arg("python/src/polar_client")
        .run()?;
    if !privileged {
        eprintln!(
            "(--unprivileged: the Python client's tests, which start a gateway, are left out)"
        );
        return Ok(());
    }
    let polar = workspace_root()?.join("target/debug/polar");
    for (venv, tests) in [
        (python::CLIENT, "python/tests/client"),
        (python::VERL, "python/tests/bridges/test_verl.py"),
        (python::SKYRL, "python/tests/bridges/test_skyrl.py"),
        (python::NEMO_GYM, "python/tests/bridges/test_nemo_gym.py"),
    ] {
        venv.install_client()?;
        Cmd::new(venv.python()?)?
            .args([
                "-m",
                "pytest",
                "-c",
                "python/pyproject.toml",
                "-p",
                "no:cacheprovider",
            ])
            .arg(format!("--timeout={PYTEST_TIMEOUT_SECS}"))
            .arg(tests)
            .env("POLAR_BIN", &polar)
            .run()?;
    }
    Ok(())
}
