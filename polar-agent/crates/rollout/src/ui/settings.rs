//! `[rollout.dashboard]`: what the dashboard may read besides the server's
//! own state. The exported trajectory files a sample names
//! (`result.trajectory_uri`, written by a gateway) are read only beneath
//! `export_roots`, which the operator sets; nothing a task spec, a gateway
//! or a sandbox says widens them.

use std::path::{Component, PathBuf};

use serde::Deserialize;

/// The largest exported file read by default (256 MiB).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 << 20;

/// `[rollout.dashboard]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDashboard {
    /// Directories the exported files may be read beneath (absolute).
    pub export_roots: Option<Vec<PathBuf>>,
    /// The largest exported file read.
    pub max_file_bytes: Option<u64>,
}

/// The dashboard's settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DashboardSettings {
    /// Directories the exported files may be read beneath (absolute, no
    /// `.` or `..`); empty: the dashboard shows no trajectory.
    pub export_roots: Vec<PathBuf>,
    /// The largest exported file read.
    pub max_file_bytes: u64,
}

impl Default for DashboardSettings {
    fn default() -> Self {
        Self {
            export_roots: Vec::new(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
        }
    }
}

impl DashboardSettings {
    /// Checks the raw settings; an error is `(key under dashboard, why)`.
    pub fn from_raw(raw: &RawDashboard) -> Result<Self, (String, String)> {
        let mut out = Self::default();
        for (i, root) in raw.export_roots.iter().flatten().enumerate() {
            let key = || format!("export_roots[{i}]");
            if !root.is_absolute() {
                return Err((key(), format!("{}: must be absolute", root.display())));
            }
            if root
                .components()
                .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
            {
                return Err((key(), format!("{}: no `.` or `..`", root.display())));
            }
            out.export_roots.push(root.clone());
        }
        if let Some(n) = raw.max_file_bytes {
            if n < 1024 {
                return Err(("max_file_bytes".into(), "must be at least 1024".into()));
            }
            out.max_file_bytes = n;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_are_absolute_and_plain() {
        let raw = |roots: &[&str]| RawDashboard {
            export_roots: Some(roots.iter().map(PathBuf::from).collect()),
            max_file_bytes: None,
        };
        let ok = DashboardSettings::from_raw(&raw(&["/srv/a", "/mnt/b/"])).unwrap();
        assert_eq!(ok.export_roots.len(), 2);
        assert_eq!(ok.max_file_bytes, DEFAULT_MAX_FILE_BYTES);
        let e = DashboardSettings::from_raw(&raw(&["/srv/a", "rel"])).unwrap_err();
        assert_eq!(e.0, "export_roots[1]");
        let e = DashboardSettings::from_raw(&raw(&["/srv/../etc"])).unwrap_err();
        assert!(e.1.contains("no `.` or `..`"), "{e:?}");
        let e = DashboardSettings::from_raw(&RawDashboard {
            export_roots: None,
            max_file_bytes: Some(10),
        })
        .unwrap_err();
        assert_eq!(e.0, "max_file_bytes");
    }
}
