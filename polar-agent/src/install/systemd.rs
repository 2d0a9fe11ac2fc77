//! Talking to systemd, only when the install root is `/` and systemd runs
//! (`/run/systemd/system` exists); otherwise install writes the enablement
//! link itself and uninstall has nothing to stop.

use std::path::Path;
use std::process::Command;

use super::InstallError;

/// Whether systemd manages `root`.
pub fn manages(root: &Path) -> bool {
    root == Path::new("/") && Path::new("/run/systemd/system").is_dir()
}

/// Runs `systemctl ARGS`.
pub fn systemctl(args: &[&str]) -> Result<(), InstallError> {
    let failed = |detail: String| InstallError::Systemctl {
        args: args.join(" "),
        detail,
    };
    let out = Command::new("systemctl")
        .args(args)
        .output()
        .map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Stops `unit` when it runs (its drain runs within the unit's stop
/// timeout) and disables it.
pub fn stop_and_disable(unit: &str) -> Result<(), InstallError> {
    let active = Command::new("systemctl")
        .args(["is-active", "--quiet", unit])
        .status()
        .is_ok_and(|s| s.success());
    if active {
        tracing::info!(unit, "stopping the service");
        systemctl(&["stop", unit])?;
    }
    // Disabling a unit that is not enabled succeeds.
    systemctl(&["disable", unit])
}
