//! `cargo xtask setup`: installs what building, demonstrating and testing
//! Polar needs, and only what is missing.
//!
//! Each item is checked first (a few milliseconds each), so a second run
//! changes nothing and takes seconds. One line per item says whether it was
//! already present or has just been installed. `cargo xtask demo` installs
//! only what building and running the demo takes ([`Scope::Demo`]); every
//! other command everything ([`Scope::All`]), cargo-deny, cargo-fuzz,
//! cargo-nextest, the tools only the tests call and the Python client's
//! environments ([`python`]) included.

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, is_root};
use crate::python;

/// What a command needs installed; `All` includes `Demo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Building `polar` (LLVM 22, nightly + rust-src, bpf-linker) and
    /// running the demo (bubblewrap, python3, kill).
    Demo,
    /// Everything, for the tests too: cargo-deny, cargo-fuzz,
    /// cargo-nextest, the tools they call and the Python environments of
    /// `python/`.
    All,
}

/// Debian packages, each with the first scope that needs it.
const APT_PACKAGES: &[(&str, Scope)] = &[
    // LLVM 22 for bpf-linker.
    ("llvm-22-dev", Scope::Demo),
    ("libclang-22-dev", Scope::Demo),
    // The sandboxes.
    ("bubblewrap", Scope::Demo),
    // The demo's small agent (and the tests' scripts).
    ("python3", Scope::Demo),
    // `kill`, with which the demo stops its daemons.
    ("procps", Scope::Demo),
    // The tools the tests call (eBPF, network, HTTP, util-linux's setpriv).
    ("bpftool", Scope::All),
    ("iproute2", Scope::All),
    ("curl", Scope::All),
    ("util-linux", Scope::All),
    // The export tests install pyarrow, datasets and moto from PyPI; the
    // Python client's tests run in virtual environments (`crate::python`).
    ("python3-pip", Scope::All),
    ("python3-venv", Scope::All),
    // The Kubernetes manifest test parses YAML with python3.
    ("python3-yaml", Scope::All),
    // The evaluators' tests run hidden pytest suites with the system's
    // Python, the one sandboxes see.
    ("python3-pytest", Scope::All),
    // The test_output evaluator applies test patches with git or patch.
    ("git", Scope::All),
    ("patch", Scope::All),
    // The docker runtime's tests: an engine (dockerd, containerd, runc,
    // tini) and debootstrap, which makes their image (`crate::docker`).
    ("docker.io", Scope::All),
    ("debootstrap", Scope::All),
    // The Slurm tests' cluster on this machine (`crate::slurm`).
    ("slurm-wlm", Scope::All),
    ("munge", Scope::All),
    // The dashboard's browser tests (`crate::dashboard`): Debian's Chromium,
    // driven by playwright-core, and Firefox ESR, by puppeteer-core.
    ("chromium", Scope::All),
    ("firefox-esr", Scope::All),
];

/// bpf-linker must be this minor version, built against LLVM 22, the LLVM of
/// the nightly that compiles `polar-ebpf`.
const BPF_LINKER_VERSION: &str = "0.13";
/// Where Debian's LLVM 22 lives if `llvm-config-22` cannot tell.
const LLVM_22_PREFIX: &str = "/usr/lib/llvm-22";
/// cargo-deny 0.20 builds with rustc 1.88 and later.
const CARGO_DENY_VERSION: &str = "0.20";
/// cargo-fuzz, run with the nightly toolchain.
const CARGO_FUZZ_VERSION: &str = "0.13";
/// cargo-nextest 0.9 (test groups and priorities, `.config/nextest.toml`).
const CARGO_NEXTEST_VERSION: &str = "0.9";

/// Checks every item `scope` needs and installs the missing ones.
pub fn run(scope: Scope) -> Result<()> {
    packages(scope)?;
    tools(scope)?;
    if scope >= Scope::All {
        python_envs()?;
    }
    Ok(())
}

/// The Debian packages `scope` needs.
pub fn packages(scope: Scope) -> Result<()> {
    let packages: Vec<&str> = APT_PACKAGES
        .iter()
        .filter(|(_, needed_from)| *needed_from <= scope)
        .map(|(pkg, _)| *pkg)
        .collect();
    apt_packages(&packages)
}

/// The Rust toolchains and cargo-installed tools `scope` needs (after
/// [`packages`]: bpf-linker builds against Debian's LLVM).
pub fn tools(scope: Scope) -> Result<()> {
    nightly_toolchain()?;
    nightly_component("rust-src")?;
    bpf_linker()?;
    if scope >= Scope::All {
        cargo_deny()?;
        cargo_fuzz()?;
        cargo_nextest()?;
    }
    Ok(())
}

/// polar-client's environments: its tests', and its bridges' with their
/// trainers (after [`packages`]: python3-venv).
pub fn python_envs() -> Result<()> {
    for venv in python::ALL {
        venv.ensure()?;
    }
    Ok(())
}

fn report(item: &str, state: &str) {
    eprintln!("setup: {item:<18} {state}");
}

/// Installs the Debian packages of `packages` that are missing (as root).
pub fn apt_packages(packages: &[&str]) -> Result<()> {
    let (present, missing): (Vec<&str>, Vec<&str>) =
        packages.iter().partition(|pkg| dpkg_installed(pkg));
    for pkg in present {
        report(pkg, "present");
    }
    if missing.is_empty() {
        return Ok(());
    }
    let install = Cmd::new("apt-get")?
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y"])
        .args(&missing);
    if !is_root()? {
        bail!(
            "missing Debian packages: {}; run this as root, or install them with `{}`",
            missing.join(" "),
            install.shown()
        );
    }
    Cmd::new("apt-get")?
        .arg("update")
        .run()
        .context("could not update the apt package lists")?;
    install
        .run()
        .context("could not install the missing Debian packages")?;
    for pkg in missing {
        if !dpkg_installed(pkg) {
            bail!("apt-get reported success but {pkg} is still not installed");
        }
        report(pkg, "installed");
    }
    Ok(())
}

fn dpkg_installed(pkg: &str) -> bool {
    Cmd::new("dpkg-query")
        .map(|cmd| cmd.args(["-W", "-f=${Status}", pkg]).probe())
        .ok()
        .flatten()
        .is_some_and(|status| status.trim() == "install ok installed")
}

fn nightly_toolchain() -> Result<()> {
    let listed = Cmd::new("rustup")?
        .args(["toolchain", "list"])
        .probe()
        .unwrap_or_default();
    // Lines look like `nightly-x86_64-unknown-linux-gnu (default)`; a dated
    // `nightly-2025-01-01-...` is not the `nightly` that aya-build asks for.
    let has_nightly = listed.lines().any(|line| {
        let name = line.split_whitespace().next().unwrap_or_default();
        name == "nightly"
            || name
                .strip_prefix("nightly-")
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
    });
    if has_nightly {
        report("rust nightly", "present");
        return Ok(());
    }
    Cmd::new("rustup")?
        .args(["toolchain", "install", "nightly", "--profile", "minimal"])
        .run()
        .context("could not install the nightly toolchain")?;
    report("rust nightly", "installed");
    Ok(())
}

/// The nightly toolchain's llvm-cov and llvm-profdata, for `cargo xtask
/// fuzz --coverage`.
pub fn llvm_tools() -> Result<()> {
    nightly_toolchain()?;
    nightly_component("llvm-tools")
}

/// Adds the component `name` to the nightly toolchain if it is missing.
fn nightly_component(name: &str) -> Result<()> {
    let installed = Cmd::new("rustup")?
        .args(["component", "list", "--toolchain", "nightly", "--installed"])
        .probe()
        .unwrap_or_default();
    if installed.lines().any(|line| line.trim().starts_with(name)) {
        report(&format!("nightly {name}"), "present");
        return Ok(());
    }
    Cmd::new("rustup")?
        .args(["component", "add", name, "--toolchain", "nightly"])
        .run()
        .with_context(|| format!("could not add {name} to the nightly toolchain"))?;
    report(&format!("nightly {name}"), "installed");
    Ok(())
}

/// The version bpf-linker reports, e.g. `0.13.0`, if it runs at all.
fn bpf_linker_version() -> Option<String> {
    let out = Cmd::new("bpf-linker").ok()?.arg("--version").probe()?;
    // `bpf-linker 0.13.0` (possibly followed by more lines).
    out.split_whitespace().nth(1).map(str::to_owned)
}

fn bpf_linker() -> Result<()> {
    let wanted = format!("{BPF_LINKER_VERSION}.");
    if bpf_linker_version().is_some_and(|v| v.starts_with(&wanted)) {
        report("bpf-linker", "present");
        return Ok(());
    }
    // bpf-linker's build script finds LLVM's libraries next to the first
    // `llvm-config` on PATH, which on Debian may be another LLVM version
    // (`/usr/bin/llvm-config` belongs to the default LLVM). Point it, and the
    // llvm-sys crate it uses (major version 221 for LLVM 22.1), at LLVM 22.
    let prefix = Cmd::new("llvm-config-22")?
        .arg("--prefix")
        .probe()
        .map(|out| out.trim().to_owned())
        .filter(|prefix| !prefix.is_empty())
        .unwrap_or_else(|| LLVM_22_PREFIX.to_owned());
    Cmd::cargo()?
        .env("LLVM_PREFIX", &prefix)
        .env("LLVM_SYS_221_PREFIX", &prefix)
        .args(["install", "bpf-linker", "--version"])
        .arg(format!("~{BPF_LINKER_VERSION}"))
        .args(["--locked", "--no-default-features", "--features", "llvm-22"])
        .run()
        .context("could not build bpf-linker (it takes a few minutes and needs llvm-22-dev)")?;
    match bpf_linker_version() {
        Some(v) if v.starts_with(&wanted) => report("bpf-linker", "installed"),
        other => bail!(
            "bpf-linker was installed but `bpf-linker --version` reports {other:?}, \
             not {BPF_LINKER_VERSION}.x; is another bpf-linker earlier on PATH?"
        ),
    }
    Ok(())
}

/// What `cargo xtask fuzz` needs: nightly (the sanitizer flags) and
/// cargo-fuzz.
pub fn fuzz_tools() -> Result<()> {
    nightly_toolchain()?;
    cargo_fuzz()
}

/// cargo-fuzz, for the fuzz targets (`cargo xtask fuzz`, and the tests'
/// short runs).
fn cargo_fuzz() -> Result<()> {
    cargo_tool("fuzz", CARGO_FUZZ_VERSION)
}

/// cargo-deny, for the dependency policy step of the tests.
fn cargo_deny() -> Result<()> {
    cargo_tool("deny", CARGO_DENY_VERSION)
}

/// cargo-nextest, which runs the tests (`.config/nextest.toml`).
fn cargo_nextest() -> Result<()> {
    cargo_tool("nextest", CARGO_NEXTEST_VERSION)
}

/// The cargo subcommand `cargo <sub>` (crate `cargo-<sub>`) at `version`
/// (a major.minor prefix), built with `cargo install --locked` if it is
/// missing or another version.
fn cargo_tool(sub: &str, version: &str) -> Result<()> {
    let krate = format!("cargo-{sub}");
    let wanted = format!("{version}.");
    let present = Cmd::cargo()?
        .args([sub, "--version"])
        .probe()
        // `cargo-fuzz 0.13.2`, `cargo-nextest 0.9.143 (<commit> <date>)`
        .is_some_and(|out| {
            out.split_whitespace()
                .nth(1)
                .is_some_and(|v| v.starts_with(&wanted))
        });
    if present {
        report(&krate, "present");
        return Ok(());
    }
    Cmd::cargo()?
        .args(["install", &krate, "--version"])
        .arg(format!("~{version}"))
        .arg("--locked")
        .run()
        .with_context(|| format!("could not install {krate}"))?;
    report(&krate, "installed");
    Ok(())
}
