//! Polar's certificate authority: an ECDSA P-256 CA, made with rcgen and
//! name-constrained (critical NameConstraints, permitted subtrees) to the
//! hosts the routing rules intercept and to chosen IP ranges, so a leaf for
//! any other name is rejected by clients even if the key leaks.
//!
//! This module owns the CA's files in the agent's state directory:
//! `ca.key` (PKCS#8 PEM, mode 0600, written atomically), `ca.crt` and, after
//! a rotation, `ca.prev.crt` (the replaced certificate, kept so sandbox
//! bundles can trust both while old sessions drain). It never overwrites a
//! CA except through [`Ca::rotate`], and refuses a key readable by group or
//! others.

use std::fmt;
use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use polar_io::fs::WriteOptions;
use rcgen::{Issuer, KeyPair, PublicKeyData};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

pub use super::constraints::{ConstraintsError, NameConstraintsSpec};

/// File name of the CA private key in the state directory.
pub const KEY_FILE: &str = "ca.key";
/// File name of the CA certificate in the state directory.
pub const CERT_FILE: &str = "ca.crt";
/// File name of the certificate replaced by the last rotation.
pub const PREV_CERT_FILE: &str = "ca.prev.crt";

/// Errors of the CA.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The state directory holds no CA.
    #[error("no CA in {}: run `polar ca init` first", dir.display())]
    NotInitialized { dir: PathBuf },
    /// `init` found an existing CA it must not overwrite.
    #[error("a CA already exists in {}: use `polar ca rotate` to replace it", dir.display())]
    AlreadyExists { dir: PathBuf },
    /// The key file grants permissions to group or others.
    #[error(
        "CA key {} has mode {mode:04o}, which grants group/other access: run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    InsecureKeyMode { path: PathBuf, mode: u32 },
    /// Reading or writing a CA file failed.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// The key file is not a usable private key.
    #[error("CA key {}: {source}", path.display())]
    InvalidKey { path: PathBuf, source: rcgen::Error },
    /// The certificate file is not a usable CA certificate.
    #[error("CA certificate {}: {reason}", path.display())]
    InvalidCert { path: PathBuf, reason: String },
    /// The key does not belong to the certificate (e.g. a rotation was interrupted).
    #[error("{KEY_FILE} and {CERT_FILE} in {} do not match: run `polar ca rotate`", dir.display())]
    KeyMismatch { dir: PathBuf },
    /// The name-constraints spec is invalid.
    #[error("CA name constraints: {0}")]
    Constraints(#[from] ConstraintsError),
    /// The validity period is zero or too large to represent.
    #[error("invalid CA validity {0:?}")]
    InvalidValidity(Duration),
    /// rcgen failed to build the certificate.
    #[error("generating the CA: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Options for a new CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaOptions {
    /// How long the CA certificate is valid (default one year).
    pub validity: Duration,
    /// The subject common name.
    pub common_name: String,
}

impl Default for CaOptions {
    fn default() -> Self {
        Self {
            validity: Duration::from_secs(365 * 24 * 60 * 60),
            common_name: "Polar sandbox CA".to_owned(),
        }
    }
}

/// A loaded CA: its signing key, certificate and parsed constraints.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    prev_cert_pem: Option<String>,
    constraints: NameConstraintsSpec,
    subject: String,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca")
            .field("subject", &self.subject)
            .field("not_after", &self.not_after)
            .field("constraints", &self.constraints)
            .finish_non_exhaustive()
    }
}

/// What `polar ca show` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaSummary {
    pub subject: String,
    /// SHA-256 of the certificate DER, upper-case hex bytes joined by colons.
    pub fingerprint_sha256: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    /// Permitted subtrees, as written in the certificate.
    pub constraints: NameConstraintsSpec,
}

impl Ca {
    /// Creates a CA with [`CaOptions::default`]. See [`Ca::init_with`].
    pub fn init(state_dir: &Path, spec: &NameConstraintsSpec) -> Result<Self, CaError> {
        Self::init_with(state_dir, spec, &CaOptions::default())
    }

    /// Creates `ca.key` and `ca.crt` in `state_dir` (created with mode 0700
    /// if missing). Refuses to overwrite an existing CA.
    pub fn init_with(
        state_dir: &Path,
        spec: &NameConstraintsSpec,
        options: &CaOptions,
    ) -> Result<Self, CaError> {
        let spec = spec.normalized()?;
        if state_dir.join(KEY_FILE).exists() || state_dir.join(CERT_FILE).exists() {
            return Err(CaError::AlreadyExists {
                dir: state_dir.to_path_buf(),
            });
        }
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(|source| io_err(state_dir, source))?;
        let (key_pem, cert_pem) = generate(&spec, options)?;
        write_atomic(state_dir, KEY_FILE, key_pem.as_bytes(), 0o600)?;
        write_atomic(state_dir, CERT_FILE, cert_pem.as_bytes(), 0o644)?;
        tracing::info!(dir = %state_dir.display(), "created CA");
        Self::load(state_dir)
    }

    /// Replaces the CA's key and certificate with new ones, keeping the old
    /// certificate as `ca.prev.crt`. An interrupted rotation is detected by
    /// [`Ca::load`] as [`CaError::KeyMismatch`] and fixed by rotating again.
    pub fn rotate(
        state_dir: &Path,
        spec: &NameConstraintsSpec,
        options: &CaOptions,
    ) -> Result<Self, CaError> {
        let spec = spec.normalized()?;
        let old_cert = read_required(state_dir, CERT_FILE)?;
        let (key_pem, cert_pem) = generate(&spec, options)?;
        write_atomic(state_dir, PREV_CERT_FILE, &old_cert, 0o644)?;
        write_atomic(state_dir, KEY_FILE, key_pem.as_bytes(), 0o600)?;
        write_atomic(state_dir, CERT_FILE, cert_pem.as_bytes(), 0o644)?;
        tracing::info!(dir = %state_dir.display(), "rotated CA");
        Self::load(state_dir)
    }

    /// Loads the CA from `state_dir`, refusing a key file with any group or
    /// other permission bit, a key that does not match the certificate, and
    /// a certificate without name constraints.
    pub fn load(state_dir: &Path) -> Result<Self, CaError> {
        let key_path = state_dir.join(KEY_FILE);
        let mode =
            match polar_io::tls::key_mode_too_open(&key_path, polar_io::tls::CA_KEY_FORBIDDEN) {
                Ok(mode) => mode,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(CaError::NotInitialized {
                        dir: state_dir.to_path_buf(),
                    });
                }
                Err(source) => return Err(io_err(&key_path, source)),
            };
        if let Some(mode) = mode {
            return Err(CaError::InsecureKeyMode {
                path: key_path,
                mode,
            });
        }
        let key_pem = read_required(state_dir, KEY_FILE)?;
        let cert_pem = read_required(state_dir, CERT_FILE)?;
        let prev_path = state_dir.join(PREV_CERT_FILE);
        let prev_cert_pem = match fs::read_to_string(&prev_path) {
            Ok(pem) => Some(pem),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(source) => return Err(io_err(&prev_path, source)),
        };
        let key_pem = String::from_utf8(key_pem).map_err(|_| CaError::InvalidKey {
            path: key_path.clone(),
            source: rcgen::Error::CouldNotParseKeyPair,
        })?;
        let key = KeyPair::from_pem(&key_pem).map_err(|source| CaError::InvalidKey {
            path: key_path.clone(),
            source,
        })?;
        let cert_path = state_dir.join(CERT_FILE);
        let invalid = |reason: String| CaError::InvalidCert {
            path: cert_path.clone(),
            reason,
        };
        let cert_der = CertificateDer::from_pem_slice(&cert_pem)
            .map_err(|e| invalid(format!("not a PEM certificate: {e}")))?;
        let parsed = super::constraints::parse_ca_cert(&cert_der).map_err(invalid)?;
        if key.subject_public_key_info() != parsed.spki {
            return Err(CaError::KeyMismatch {
                dir: state_dir.to_path_buf(),
            });
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(|e| invalid(format!("unusable as issuer: {e}")))?;
        let cert_pem = String::from_utf8(cert_pem).map_err(|_| invalid("not UTF-8".to_owned()))?;
        Ok(Self {
            issuer,
            cert_der,
            cert_pem,
            prev_cert_pem,
            constraints: parsed.constraints,
            subject: parsed.subject,
            not_before: parsed.not_before,
            not_after: parsed.not_after,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The certificate replaced by the last rotation, PEM, if any.
    pub fn previous_cert_pem(&self) -> Option<&str> {
        self.prev_cert_pem.as_deref()
    }

    /// The certificates a sandbox should trust: the current one and, after a
    /// rotation, the previous one.
    pub fn bundle_pem(&self) -> String {
        let mut bundle = self.cert_pem.clone();
        if let Some(prev) = &self.prev_cert_pem {
            if !bundle.ends_with('\n') {
                bundle.push('\n');
            }
            bundle.push_str(prev);
        }
        bundle
    }

    /// The permitted subtrees of the certificate's name constraints.
    pub fn constraints(&self) -> &NameConstraintsSpec {
        &self.constraints
    }

    /// When the CA certificate expires.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// Subject, fingerprint, validity and constraints, for `polar ca show`.
    pub fn summary(&self) -> CaSummary {
        let digest = ring::digest::digest(&ring::digest::SHA256, self.cert_der.as_ref());
        let fingerprint_sha256 = digest
            .as_ref()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":");
        CaSummary {
            subject: self.subject.clone(),
            fingerprint_sha256,
            not_before: self.not_before,
            not_after: self.not_after,
            constraints: self.constraints.clone(),
        }
    }

    /// The signer used by the leaf issuer.
    pub(crate) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }
}

impl fmt::Display for CaSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let time = |t: OffsetDateTime| t.format(&Rfc3339).map_err(|_| fmt::Error);
        writeln!(f, "subject:       {}", self.subject)?;
        writeln!(f, "sha256:        {}", self.fingerprint_sha256)?;
        writeln!(f, "not before:    {}", time(self.not_before)?)?;
        writeln!(f, "not after:     {}", time(self.not_after)?)?;
        writeln!(f, "permitted DNS: {}", self.constraints.dns.join(", "))?;
        let ips: Vec<String> = self
            .constraints
            .ip_ranges
            .iter()
            .map(|(addr, prefix)| format!("{addr}/{prefix}"))
            .collect();
        let ips = if ips.is_empty() {
            "none".to_owned()
        } else {
            ips.join(", ")
        };
        writeln!(f, "permitted IP:  {ips}")
    }
}

/// Generates a key and a self-signed, name-constrained CA certificate (PEM)
/// from the CA template the cluster CA shares.
fn generate(spec: &NameConstraintsSpec, options: &CaOptions) -> Result<(String, String), CaError> {
    let (not_before, not_after) = polar_io::tls::ca::validity_window(options.validity)
        .ok_or(CaError::InvalidValidity(options.validity))?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = polar_io::tls::ca::ca_params(&options.common_name, not_before, not_after);
    params.name_constraints = Some(spec.to_rcgen());
    let cert = params.self_signed(&key)?;
    Ok((key.serialize_pem(), cert.pem()))
}

fn io_err(path: &Path, source: io::Error) -> CaError {
    CaError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a file that must exist for the CA to be initialised.
fn read_required(dir: &Path, name: &str) -> Result<Vec<u8>, CaError> {
    let path = dir.join(name);
    fs::read(&path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => CaError::NotInitialized {
            dir: dir.to_path_buf(),
        },
        _ => io_err(&path, source),
    })
}

/// Writes `dir/name` atomically: a temporary file created with `mode`,
/// synced, then renamed over the target; the directory is synced after.
fn write_atomic(dir: &Path, name: &str, contents: &[u8], mode: u32) -> Result<(), CaError> {
    let target = dir.join(name);
    polar_io::fs::write_atomic(&target, contents, &WriteOptions::new().mode(mode))
        .map_err(|e| io_err(&target, e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn spec() -> NameConstraintsSpec {
        NameConstraintsSpec {
            dns: vec!["api.anthropic.com".into(), "*.openai.com".into()],
            ip_ranges: vec![("127.0.0.1".parse().unwrap(), 8)],
        }
    }

    fn key_mode(dir: &Path) -> u32 {
        fs::metadata(dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn init_writes_private_key_and_constrained_cert() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let ca = Ca::init(&dir, &spec()).unwrap();
        assert_eq!(key_mode(&dir), 0o600);
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let expected = NameConstraintsSpec {
            dns: vec!["api.anthropic.com".into(), "openai.com".into()],
            ip_ranges: vec![("127.0.0.0".parse().unwrap(), 8)],
        };
        assert_eq!(ca.constraints(), &expected);
        let (_, x509) = x509_parser::parse_x509_certificate(ca.cert_der()).unwrap();
        assert!(x509.name_constraints().unwrap().unwrap().critical);
        assert!(x509.is_ca());
        let lifetime = ca.not_after - ca.not_before;
        assert!(lifetime >= time::Duration::days(365));
        assert!(lifetime <= time::Duration::days(366));
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().collect();
        assert_eq!(leftovers.len(), 2, "no temporary files left behind");
    }

    #[test]
    fn init_refuses_to_overwrite() {
        let tmp = tempfile::tempdir().unwrap();
        Ca::init(tmp.path(), &spec()).unwrap();
        let err = Ca::init(tmp.path(), &spec()).unwrap_err();
        assert!(matches!(err, CaError::AlreadyExists { .. }));
        assert!(err.to_string().contains("polar ca rotate"));
    }

    #[test]
    fn load_round_trips_and_summarises() {
        let tmp = tempfile::tempdir().unwrap();
        let options = CaOptions {
            validity: Duration::from_secs(30 * 24 * 3600),
            common_name: "Test CA".into(),
        };
        let created = Ca::init_with(tmp.path(), &spec(), &options).unwrap();
        let loaded = Ca::load(tmp.path()).unwrap();
        assert_eq!(created.cert_der(), loaded.cert_der());
        let summary = loaded.summary();
        assert!(
            summary.subject.contains("CN=Test CA"),
            "{}",
            summary.subject
        );
        assert_eq!(summary.fingerprint_sha256.len(), 32 * 3 - 1);
        assert!(summary.not_after - summary.not_before <= time::Duration::days(31));
        let shown = summary.to_string();
        assert!(shown.contains("openai.com"), "{shown}");
        assert!(shown.contains("127.0.0.0/8"), "{shown}");
    }

    #[test]
    fn load_refuses_missing_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let err = Ca::load(tmp.path()).unwrap_err();
        assert!(matches!(err, CaError::NotInitialized { .. }));
        assert!(err.to_string().contains("polar ca init"));
    }

    #[test]
    fn load_refuses_group_readable_key() {
        let tmp = tempfile::tempdir().unwrap();
        Ca::init(tmp.path(), &spec()).unwrap();
        let key = tmp.path().join(KEY_FILE);
        fs::set_permissions(&key, fs::Permissions::from_mode(0o640)).unwrap();
        let err = Ca::load(tmp.path()).unwrap_err();
        assert!(matches!(err, CaError::InsecureKeyMode { mode: 0o640, .. }));
        let msg = err.to_string();
        assert!(msg.contains("0640"), "{msg}");
        assert!(
            msg.contains(&format!("chmod 600 {}", key.display())),
            "{msg}"
        );
    }

    #[test]
    fn rotate_keeps_previous_cert() {
        let tmp = tempfile::tempdir().unwrap();
        let first = Ca::init(tmp.path(), &spec()).unwrap();
        fs::set_permissions(tmp.path().join(KEY_FILE), fs::Permissions::from_mode(0o644)).unwrap();
        let second = Ca::rotate(tmp.path(), &spec(), &CaOptions::default()).unwrap();
        assert_ne!(first.cert_der(), second.cert_der());
        assert_eq!(key_mode(tmp.path()), 0o600);
        assert_eq!(second.previous_cert_pem(), Some(first.cert_pem()));
        let bundle = second.bundle_pem();
        assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2);
        let reloaded = Ca::load(tmp.path()).unwrap();
        assert_eq!(reloaded.cert_der(), second.cert_der());
    }

    #[test]
    fn rotate_requires_existing_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let err = Ca::rotate(tmp.path(), &spec(), &CaOptions::default()).unwrap_err();
        assert!(matches!(err, CaError::NotInitialized { .. }));
    }

    #[test]
    fn load_detects_key_mismatch() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        Ca::init(a.path(), &spec()).unwrap();
        Ca::init(b.path(), &spec()).unwrap();
        fs::copy(b.path().join(CERT_FILE), a.path().join(CERT_FILE)).unwrap();
        let err = Ca::load(a.path()).unwrap_err();
        assert!(matches!(err, CaError::KeyMismatch { .. }));
    }

    #[test]
    fn zero_validity_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let options = CaOptions {
            validity: Duration::ZERO,
            ..CaOptions::default()
        };
        let err = Ca::init_with(tmp.path(), &spec(), &options).unwrap_err();
        assert!(matches!(err, CaError::InvalidValidity(_)));
    }
}
