//! Checks made before anything is created or loaded: capabilities and kernel
//! version, each failure reported with what is missing and how to fix it.

use caps::{CapSet, Capability};

/// Kernel release Polar needs: `SO_NETNS_COOKIE` (5.14), socket cookies in
/// `cgroup/sock_release` (5.10), `getpeername` hooks (5.8), BPF links for
/// cgroups (5.7); 5.15 is the first LTS release with all of them.
pub const MIN_KERNEL: (u32, u32) = (5, 15);

/// What is missing for the redirect to work.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// Missing capabilities, each with why it is needed.
    #[error(
        "missing capabilities: {}; run the agent as root, or grant them \
         (systemd: AmbientCapabilities={}){}",
        .0.iter().map(|(c, _)| c.to_string()).collect::<Vec<_>>().join(", "),
        .0.iter().map(|(c, _)| c.to_string()).collect::<Vec<_>>().join(" "),
        .0.iter().map(|(c, why)| format!("\n  {c} ({why}) is missing")).collect::<String>()
    )]
    Capabilities(Vec<(Capability, &'static str)>),
    /// The kernel is older than [`MIN_KERNEL`].
    #[error("kernel {0} is too old: Polar needs Linux {major}.{minor} or later", major = MIN_KERNEL.0, minor = MIN_KERNEL.1)]
    KernelTooOld(String),
    /// The capability sets could not be read.
    #[error("cannot read the process capabilities: {0}")]
    Caps(String),
}

/// The capabilities the agent needs, with the reason for each.
pub const REQUIRED: &[(Capability, &str)] = &[
    (Capability::CAP_BPF, "load eBPF programs and maps"),
    (
        Capability::CAP_NET_ADMIN,
        "attach cgroup socket programs and set up sandbox networks",
    ),
    (
        Capability::CAP_SYS_ADMIN,
        "create network namespaces and move sandboxes into them",
    ),
];

/// Checks capabilities and kernel version.
pub fn check() -> Result<(), PreflightError> {
    check_kernel(&release()?)?;
    let mut missing = Vec::new();
    for &(cap, why) in REQUIRED {
        let has = caps::has_cap(None, CapSet::Effective, cap)
            .map_err(|e| PreflightError::Caps(e.to_string()))?;
        if !has {
            missing.push((cap, why));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PreflightError::Capabilities(missing))
    }
}

fn release() -> Result<String, PreflightError> {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .map_err(|e| PreflightError::Caps(e.to_string()))
}

/// Checks a kernel release string such as `6.18.44-fc-v669`.
pub fn check_kernel(release: &str) -> Result<(), PreflightError> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    match (major, minor) {
        (Some(ma), Some(mi)) if (ma, mi) >= MIN_KERNEL => Ok(()),
        _ => Err(PreflightError::KernelTooOld(release.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions() {
        assert!(check_kernel("6.18.44-fc-v669").is_ok());
        assert!(check_kernel("5.15.0-1-amd64").is_ok());
        assert!(check_kernel("5.10.0").is_err());
        assert!(check_kernel("4.19.0").is_err());
        assert!(check_kernel("garbage").is_err());
    }

    #[test]
    fn missing_capabilities_are_named_with_the_fix() {
        let e = PreflightError::Capabilities(vec![(
            Capability::CAP_BPF,
            "load eBPF programs and maps",
        )]);
        let s = e.to_string();
        assert!(s.starts_with("missing capabilities: CAP_BPF;"), "{s}");
        assert!(s.contains("AmbientCapabilities=CAP_BPF)"), "{s}");
        assert!(
            s.ends_with("\n  CAP_BPF (load eBPF programs and maps) is missing"),
            "{s}"
        );
        let all = PreflightError::Capabilities(REQUIRED.to_vec()).to_string();
        assert_eq!(all.lines().count(), 1 + REQUIRED.len(), "{all}");
        for (cap, why) in REQUIRED {
            assert!(
                all.contains(&format!("\n  {cap} ({why}) is missing")),
                "{all}"
            );
        }
    }
}
