//! `cargo xtask dist`: a self-contained release of the agent, laid out as it
//! is installed, plus a `.tar.gz` of it:
//!
//! ```text
//! target/dist/polar-<version>-<arch>-linux/
//!   bin/polar                      the release binary (eBPF object embedded)
//!   etc/polar/agent.toml           config/polar.example.toml
//!   etc/polar/rollout.toml         config/rollout.example.toml
//!   lib/systemd/system/*.service   the units `polar install` writes
//!   share/doc/polar/               README, ARCHITECTURE, docs/*.md, LICENSE
//!   share/doc/polar/polar.1.txt    the long --help of every command
//!   deploy/k8s/*.yaml              the Kubernetes manifests
//!   deploy/slurm/*.sbatch          the Slurm batch script
//! ```
//!
//! The units and the manual come from the built binary itself (`polar
//! __unit`, `polar __manual`), so they are what that binary installs.

use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::{cmd::Cmd, cmd::workspace_root, release, setup};

/// Sets up, builds the release binary, lays out the release and packs it.
pub fn run() -> Result<()> {
    setup::run(setup::Scope::All)?;
    release::build()?;
    let root = workspace_root()?;
    let polar = release::polar_binary()?;
    let name = format!(
        "polar-{}-{}-linux",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    );
    let dist = root.join("target").join("dist");
    let dir = dist.join(&name);
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let copy = |from: &Path, to: &str| -> Result<()> {
        let dest = dir.join(to);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(from, &dest)
            .with_context(|| format!("copying {} to {}", from.display(), dest.display()))?;
        Ok(())
    };
    copy(&polar, "bin/polar")?;
    copy(
        &root.join("config/polar.example.toml"),
        "etc/polar/agent.toml",
    )?;
    copy(
        &root.join("config/rollout.example.toml"),
        "etc/polar/rollout.toml",
    )?;
    for doc in ["README.md", "ARCHITECTURE.md", "LICENSE"] {
        let from = root.join(doc);
        if from.exists() {
            copy(&from, &format!("share/doc/polar/{doc}"))?;
        }
    }
    for entry in fs::read_dir(root.join("docs"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "md")
            && let Some(file) = path.file_name()
        {
            copy(
                &path,
                &format!("share/doc/polar/{}", file.to_string_lossy()),
            )?;
        }
    }
    // The screenshots docs/DASHBOARD.md shows.
    for entry in fs::read_dir(root.join("docs/dashboard"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "png")
            && let Some(file) = path.file_name()
        {
            copy(
                &path,
                &format!("share/doc/polar/dashboard/{}", file.to_string_lossy()),
            )?;
        }
    }
    for deploy in ["deploy/k8s", "deploy/slurm"] {
        for entry in fs::read_dir(root.join(deploy))? {
            let path = entry?.path();
            if let Some(file) = path.file_name() {
                copy(&path, &format!("{deploy}/{}", file.to_string_lossy()))?;
            }
        }
    }
    let output = |args: &[&str]| -> Result<String> {
        let out = Cmd::new(&polar)?
            .args(args)
            .capture(Duration::from_secs(30))?;
        if !out.status.success() {
            bail!("`polar {}` failed: {}", args.join(" "), out.stderr);
        }
        Ok(out.stdout)
    };
    let write = |to: &str, text: String| -> Result<()> {
        let dest = dir.join(to);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&dest, text).with_context(|| format!("writing {}", dest.display()))
    };
    write("share/doc/polar/polar.1.txt", output(&["__manual"])?)?;
    for unit in ["polar-agent.service", "polar-rollout.service"] {
        write(
            &format!("lib/systemd/system/{unit}"),
            output(&["__unit", unit])?,
        )?;
    }
    let tarball = dist.join(format!("{name}.tar.gz"));
    Cmd::new("tar")?
        .arg("-C")
        .arg(&dist)
        .args(["--owner=0", "--group=0", "-czf"])
        .arg(&tarball)
        .arg(&name)
        .run()?;
    eprintln!(
        "xtask: release in {} and {}",
        dir.display(),
        tarball.display()
    );
    Ok(())
}
