//! Builds the eBPF programs (`polar-ebpf`) with aya-build so the loader can
//! embed the object; `cargo xtask setup` installs what that needs (nightly
//! `rust-src`, `bpf-linker` built against LLVM 22).
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain, build_ebpf};

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    // polar-agent/crates/redirect -> the workspace root.
    let root = std::path::Path::new(&manifest_dir)
        .ancestors()
        .nth(3)
        .ok_or_else(|| anyhow!("{manifest_dir} is not three levels below the workspace root"))?
        .join("polar-ebpf");
    let root = root
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", root.display()))?;
    build_ebpf(
        [Package {
            name: "polar-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context("building the eBPF programs failed; run `cargo xtask setup` to install the toolchain")
}
