//! Python for the tests: imports the modules a test needs and installs the
//! missing ones from PyPI (`python3 -m pip install`), once per process. A
//! failed install fails the test with pip's output: never a silent skip.

use std::process::{Command, Output};
use std::sync::Mutex;

use anyhow::{Context as _, Result, bail};

/// One install at a time within a test process (`cargo test`); across the
/// processes cargo-nextest runs, the `system-python` test group of
/// `.config/nextest.toml`.
static INSTALL: Mutex<()> = Mutex::new(());

fn python(args: &[&str]) -> Result<Output> {
    Command::new("python3")
        .args(args)
        .output()
        .context("python3 is not runnable (cargo xtask setup installs it)")
}

/// Makes `modules` importable, installing `packages` with pip if not.
pub fn ensure(modules: &[&str], packages: &[&str]) -> Result<()> {
    let _guard = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let check = format!("import {}", modules.join(", "));
    if python(&["-c", &check])?.status.success() {
        return Ok(());
    }
    let mut args = vec![
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ];
    args.extend_from_slice(packages);
    let mut out = python(&args)?;
    if !out.status.success()
        && String::from_utf8_lossy(&out.stderr).contains("externally-managed-environment")
    {
        args.push("--break-system-packages");
        out = python(&args)?;
    }
    if !out.status.success() {
        bail!(
            "this test needs the Python packages {packages:?} and `python3 -m pip install` \
             failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let after = python(&["-c", &check])?;
    if !after.status.success() {
        bail!(
            "installed {packages:?} but `{check}` still fails:\n{}",
            String::from_utf8_lossy(&after.stderr)
        );
    }
    Ok(())
}
