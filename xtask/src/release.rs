//! `cargo xtask build`: the release build of the `polar` binary, and where
//! cargo puts it.
//!
//! `polar-agent`'s build script compiles the eBPF object with aya-build,
//! which needs the nightly toolchain, rust-src and bpf-linker, so the set-up
//! runs first.

use std::{env, path::PathBuf};

use anyhow::{Context as _, Result};

use crate::{cmd::Cmd, cmd::workspace_root, setup};

/// Sets up, then builds `target/release/polar`.
pub fn run() -> Result<()> {
    setup::run(setup::Scope::All)?;
    build()
}

/// `cargo build --release --bin polar`, without the set-up.
pub fn build() -> Result<()> {
    Cmd::cargo()?
        .args(["build", "--release", "--bin", "polar"])
        .run()
        .context("the release build of polar failed")
}

/// The release `polar` binary: in `CARGO_TARGET_DIR` if that is set (relative
/// to the workspace root, where cargo runs), else in `target/`.
pub fn polar_binary() -> Result<PathBuf> {
    let root = workspace_root()?;
    let target = env::var_os("CARGO_TARGET_DIR")
        .map(|dir| root.join(dir))
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("release").join("polar"))
}
