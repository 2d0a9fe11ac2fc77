//! The install manifest: every file, link and directory `polar install`
//! made, as paths on the target system (below the install root), with what
//! `polar uninstall` does with each. Written atomically as JSON to
//! `<root>/var/lib/polar/install-manifest.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::InstallError;

/// Where the manifest lives (below the root).
pub const MANIFEST: &str = "/var/lib/polar/install-manifest.json";

/// What an entry is, which decides whether uninstall removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A program or unit file: removed by uninstall.
    File,
    /// A symbolic link (the unit's enablement): removed by uninstall.
    Link,
    /// A directory made for the above: removed when empty.
    Dir,
    /// Configuration: removed only with `--purge`.
    Config,
    /// State (the CA, sessions): removed, with all it holds, only with
    /// `--purge`.
    State,
}

/// One thing installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The path on the target system (absolute).
    pub path: PathBuf,
    /// What it is.
    pub kind: Kind,
}

/// Everything installed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The Polar version that installed it.
    pub version: String,
    /// The entries, in the order they were made.
    pub entries: Vec<Entry>,
}

/// `path` (absolute on the target) below `root`.
pub fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

impl Manifest {
    /// Adds an entry once.
    pub fn add(&mut self, path: impl Into<PathBuf>, kind: Kind) {
        let path = path.into();
        if !self.entries.iter().any(|e| e.path == path) {
            self.entries.push(Entry { path, kind });
        }
    }

    /// The manifest below `root`; `None` when nothing was installed there.
    pub fn load(root: &Path) -> Result<Option<Self>, InstallError> {
        let path = under(root, Path::new(MANIFEST));
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| InstallError::Manifest(path.display().to_string(), e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(InstallError::io("reading", &path, e)),
        }
    }

    /// Writes the manifest below `root` (temporary file, then rename; not
    /// fsynced, like the installed files).
    pub fn save(&self, root: &Path) -> Result<(), InstallError> {
        let path = under(root, Path::new(MANIFEST));
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| InstallError::Manifest(path.display().to_string(), e.to_string()))?;
        let opts = polar_io::fs::WriteOptions::new().no_sync();
        polar_io::fs::write_atomic(&path, &text, &opts)
            .map_err(|e| InstallError::io("writing", &path, e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_added_once_and_round_trip() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(under(t.path(), Path::new("/var/lib/polar"))).unwrap();
        assert_eq!(Manifest::load(t.path()).unwrap(), None);
        let mut m = Manifest {
            version: "1".into(),
            ..Manifest::default()
        };
        m.add("/usr/local/bin/polar", Kind::File);
        m.add("/usr/local/bin/polar", Kind::File);
        m.add("/etc/polar/agent.toml", Kind::Config);
        assert_eq!(m.entries.len(), 2);
        m.save(t.path()).unwrap();
        assert_eq!(Manifest::load(t.path()).unwrap(), Some(m));
        assert_eq!(
            under(Path::new("/r"), Path::new("/etc/x")),
            PathBuf::from("/r/etc/x")
        );
    }
}
