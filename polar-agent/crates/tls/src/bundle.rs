//! Trust inside sandboxes only: the files a sandbox is given so that its
//! programs trust Polar's CA, and the variables pointing at them. The host's
//! trust store is never changed: the combined bundle is bind-mounted over the
//! distribution bundle paths inside the sandbox's own mount namespace.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::ca::Ca;

/// Where distributions keep their CA bundle (Debian/Ubuntu, Fedora/RHEL,
/// Alpine/Arch/macOS-style).
pub const DISTRO_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// Variables that point a program at the combined bundle.
const BUNDLE_VARS: [&str; 7] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "CODEX_CA_CERTIFICATE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
];

/// Errors writing the trust files.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The trust files of the sandboxes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustFiles {
    /// The host's roots followed by Polar's CA (and the previous CA while a
    /// rotation drains).
    pub bundle: PathBuf,
    /// Polar's CA alone (for `NODE_EXTRA_CA_CERTS`, which adds to Node's
    /// own roots).
    pub ca: PathBuf,
}

impl TrustFiles {
    /// Environment variables for a sandboxed process.
    pub fn env(&self) -> Vec<(String, String)> {
        let bundle = self.bundle.display().to_string();
        let mut env: Vec<(String, String)> = BUNDLE_VARS
            .iter()
            .map(|v| ((*v).to_owned(), bundle.clone()))
            .collect();
        env.push(("NODE_EXTRA_CA_CERTS".into(), self.ca.display().to_string()));
        env
    }

    /// `(source, target)` bind mounts over the distribution bundles present
    /// on this host.
    pub fn bind_mounts(&self) -> Vec<(PathBuf, PathBuf)> {
        DISTRO_BUNDLES
            .iter()
            .map(Path::new)
            .filter(|p| p.is_file())
            .map(|p| (self.bundle.clone(), p.to_owned()))
            .collect()
    }
}

/// The host's system roots, from the first distribution bundle that exists.
pub fn system_roots() -> String {
    DISTRO_BUNDLES
        .iter()
        .find_map(|p| fs::read_to_string(p).ok())
        .unwrap_or_default()
}

/// Writes `trust/bundle.pem` and `trust/polar-ca.pem` under `state_dir`
/// (world-readable: they hold only certificates), atomically.
pub fn write_trust_files(state_dir: &Path, ca: &Ca) -> Result<TrustFiles, BundleError> {
    let dir = state_dir.join("trust");
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| BundleError::Write { path, source }
    };
    fs::create_dir_all(&dir).map_err(err(&dir))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(err(&dir))?;
    let ca_pem = ca.bundle_pem();
    let mut bundle = system_roots();
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(&ca_pem);
    let files = TrustFiles {
        bundle: dir.join("bundle.pem"),
        ca: dir.join("polar-ca.pem"),
    };
    write_public(&files.bundle, bundle.as_bytes()).map_err(err(&files.bundle))?;
    write_public(&files.ca, ca_pem.as_bytes()).map_err(err(&files.ca))?;
    Ok(files)
}

fn write_public(path: &Path, data: &[u8]) -> std::io::Result<()> {
    // Each writer has a temporary of its own: agents sharing a state
    // directory may write the trust files at the same time.
    let opts = polar_io::fs::WriteOptions::new().mode(0o644);
    polar_io::fs::write_atomic(path, data, &opts).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NameConstraintsSpec;

    #[test]
    fn bundle_holds_system_roots_and_the_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let spec = NameConstraintsSpec {
            dns: vec!["api.anthropic.com".into()],
            ip_ranges: vec![],
        };
        let ca = Ca::init(&tmp.path().join("state"), &spec).unwrap();
        let files = write_trust_files(&tmp.path().join("state"), &ca).unwrap();
        let bundle = fs::read_to_string(&files.bundle).unwrap();
        assert!(bundle.ends_with(ca.cert_pem()) || bundle.contains(ca.cert_pem()));
        assert!(bundle.starts_with(&system_roots()));
        assert_eq!(fs::read_to_string(&files.ca).unwrap(), ca.bundle_pem());
        let env = files.env();
        assert!(
            env.iter()
                .any(|(k, v)| k == "NODE_EXTRA_CA_CERTS" && v.ends_with("polar-ca.pem"))
        );
        assert!(env.iter().any(|(k, _)| k == "CODEX_CA_CERTIFICATE"));
        for (src, dst) in files.bind_mounts() {
            assert_eq!(src, files.bundle);
            assert!(dst.is_file());
        }
    }
}
