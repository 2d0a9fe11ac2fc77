//! Rebuild the programs when the BPF linker changes.
use which::which;

fn main() {
    // The linker is found on PATH by the eBPF build; a missing one is reported
    // there with the command that installs it (`cargo xtask setup`).
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
