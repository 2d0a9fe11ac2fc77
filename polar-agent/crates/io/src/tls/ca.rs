//! The cluster CA of the control plane (`polar rollout ca init | issue`):
//! an ECDSA P-256 CA made with rcgen in a directory (`ca.key`, mode 0600,
//! and `ca.crt`), and the certificates it issues to the rollout server and
//! the nodes (`<name>.crt` with the CA after the leaf, `<name>.key`, mode
//! 0600), each valid for TLS servers and clients alike: a node's one
//! certificate serves its gateway and authenticates it to the server
//! (mutual TLS), which takes its first DNS name as the node id.
//!
//! [`ca_params`] is the CA certificate template this CA and the sandbox CA
//! (`polar-agent`'s `tls::ca`, name-constrained) share.

use std::fs::DirBuilder;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

use crate::fs::WriteOptions;

/// The CA's key file in its directory.
pub const KEY_FILE: &str = "ca.key";
/// The CA's certificate file in its directory.
pub const CERT_FILE: &str = "ca.crt";
/// How far `not_before` is set in the past, for clock skew.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// A cluster CA problem.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// `init` found a CA it must not overwrite.
    #[error("a CA already exists in {}", dir.display())]
    AlreadyExists {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory holds no CA.
    #[error("no CA in {}: run `polar rollout ca init --dir {}` first", dir.display(), dir.display())]
    NotInitialized {
        /// The directory.
        dir: PathBuf,
    },
    /// `issue` would overwrite a certificate.
    #[error("{} exists: remove it first to issue it again", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The key file grants group or other access.
    #[error(
        "{}: mode {mode:04o} grants group/other access: run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    KeyMode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A name is not usable in a certificate.
    #[error("{0}")]
    Name(String),
    /// A validity that is zero or too long.
    #[error("invalid validity {0:?}")]
    Validity(Duration),
    /// rcgen failed (or the files do not hold a usable CA).
    #[error("{what}: {source}")]
    Generate {
        /// What was being made or read.
        what: String,
        /// Why.
        #[source]
        source: rcgen::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CaError + '_ {
    move |source| CaError::Io {
        path: path.to_owned(),
        source,
    }
}

fn gen_err(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> CaError {
    let what = what.into();
    move |source| CaError::Generate { what, source }
}

/// `not_before` and `not_after` of a certificate valid for `validity`
/// from now (backdated for clock skew); `None` when it is zero or too long.
pub fn validity_window(validity: Duration) -> Option<(OffsetDateTime, OffsetDateTime)> {
    let v = time::Duration::try_from(validity).ok()?;
    if v.is_zero() {
        return None;
    }
    let now = OffsetDateTime::now_utc();
    Some((now - BACKDATE, now.checked_add(v)?))
}

/// The template of a self-signed CA certificate: `common_name` (of
/// organisation Polar), CA with a path length of 0 (it signs leaves
/// only), key usages for signing certificates and CRLs, valid from
/// `not_before` to `not_after`. Callers add their name constraints.
pub fn ca_params(
    common_name: &str,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "Polar");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = not_before;
    params.not_after = not_after;
    params
}

/// A loaded cluster CA.
pub struct ClusterCa {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// What to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssueRequest {
    /// The file stem and first DNS name: a node's id, or the server's name.
    pub name: String,
    /// More DNS names (the host names clients dial).
    pub dns: Vec<String>,
    /// IP addresses clients dial.
    pub ips: Vec<IpAddr>,
    /// How long the certificate is valid (capped at the CA's validity by
    /// verifiers).
    pub validity: Duration,
}

/// Where an issued certificate went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// `<dir>/<name>.crt`: the leaf, then the CA.
    pub cert: PathBuf,
    /// `<dir>/<name>.key`, mode 0600.
    pub key: PathBuf,
}

impl ClusterCa {
    /// Creates `ca.key` (0600) and `ca.crt` in `dir` (created 0700 when
    /// missing); refuses to overwrite a CA.
    pub fn init(dir: &Path, validity: Duration) -> Result<Self, CaError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_err(dir))?;
        let (key_path, cert_path) = (dir.join(KEY_FILE), dir.join(CERT_FILE));
        if key_path.exists() || cert_path.exists() {
            return Err(CaError::AlreadyExists {
                dir: dir.to_owned(),
            });
        }
        let (not_before, not_after) =
            validity_window(validity).ok_or(CaError::Validity(validity))?;
        let key =
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(gen_err("the CA key"))?;
        // A name of its own (from its key): a client trusting another
        // cluster CA then finds no issuer at all (an unknown issuer), not
        // a namesake whose signature fails.
        let id: String = key
            .public_key_raw()
            .iter()
            .skip(1)
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect();
        let cert = ca_params(&format!("Polar cluster CA {id}"), not_before, not_after)
            .self_signed(&key)
            .map_err(gen_err("the CA certificate"))?;
        write(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        write(&cert_path, cert.pem().as_bytes(), 0o644)?;
        Self::load(dir)
    }

    /// Loads the CA of `dir`, refusing a key file others may read.
    pub fn load(dir: &Path) -> Result<Self, CaError> {
        let (key_path, cert_path) = (dir.join(KEY_FILE), dir.join(CERT_FILE));
        let mode = match super::key_mode_too_open(&key_path, super::CA_KEY_FORBIDDEN) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CaError::NotInitialized {
                    dir: dir.to_owned(),
                });
            }
            Err(e) => return Err(io_err(&key_path)(e)),
        };
        if let Some(mode) = mode {
            return Err(CaError::KeyMode {
                path: key_path,
                mode,
            });
        }
        let key_pem = std::fs::read_to_string(&key_path).map_err(io_err(&key_path))?;
        let cert_pem = std::fs::read_to_string(&cert_path).map_err(io_err(&cert_path))?;
        let key = KeyPair::from_pem(&key_pem).map_err(gen_err(key_path.display().to_string()))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .map_err(gen_err(cert_path.display().to_string()))?;
        Ok(Self {
            dir: dir.to_owned(),
            issuer,
            cert_pem,
        })
    }

    /// The CA certificate file (the bundle clients verify against).
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join(CERT_FILE)
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a certificate for `req` into `out` (created 0700 when
    /// missing): DNS names `req.name` then `req.dns`, IP addresses
    /// `req.ips`, for TLS servers and clients. Refuses to overwrite.
    pub fn issue(&self, req: &IssueRequest, out: &Path) -> Result<Issued, CaError> {
        let name_ok = !req.name.is_empty()
            && req.name.len() <= 128
            && !req.name.starts_with('.')
            && req
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok {
            return Err(CaError::Name(format!(
                "--name {:?}: 1 to 128 characters from [A-Za-z0-9._-], not starting with '.' \
                 (a node's id, or the server's name)",
                req.name
            )));
        }
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(out)
            .map_err(io_err(out))?;
        let issued = Issued {
            cert: out.join(format!("{}.crt", req.name)),
            key: out.join(format!("{}.key", req.name)),
        };
        for path in [&issued.cert, &issued.key] {
            if path.exists() {
                return Err(CaError::Exists { path: path.clone() });
            }
        }
        let (not_before, not_after) =
            validity_window(req.validity).ok_or(CaError::Validity(req.validity))?;
        let mut params = CertificateParams::default();
        for dns in std::iter::once(&req.name).chain(&req.dns) {
            let san = dns
                .clone()
                .try_into()
                .map_err(|_| CaError::Name(format!("{dns:?} is not a DNS name")))?;
            params.subject_alt_names.push(SanType::DnsName(san));
        }
        params
            .subject_alt_names
            .extend(req.ips.iter().copied().map(SanType::IpAddress));
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, req.name.as_str());
        dn.push(DnType::OrganizationName, "Polar");
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before;
        params.not_after = not_after;
        let key =
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(gen_err("the key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(gen_err(format!("the certificate of {}", req.name)))?;
        write(&issued.key, key.serialize_pem().as_bytes(), 0o600)?;
        let mut chain = cert.pem();
        chain.push_str(&self.cert_pem);
        write(&issued.cert, chain.as_bytes(), 0o644)?;
        Ok(issued)
    }
}

fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CaError> {
    crate::fs::write_atomic(path, bytes, &WriteOptions::new().mode(mode))
        .map_err(|e| io_err(path)(e.into()))
}
