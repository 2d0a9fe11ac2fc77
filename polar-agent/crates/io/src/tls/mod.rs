//! TLS for Polar's control plane (the rollout server, the gateways and
//! their clients), one copy for every side:
//!
//! - PEM files: certificate chains ([`read_certs`]) and private keys
//!   ([`read_key`], refused when the file grants group or other access);
//! - the rustls configurations: a server's ([`server_config`], HTTP/1.1,
//!   optionally asking for client certificates signed by a CA) and a
//!   client's ([`client_config`]: the CA bundle to verify against, the
//!   system's roots without one, and an optional client certificate);
//! - who a peer is: the DNS names of a verified certificate
//!   ([`dns_names`]: a node's certificate names its node id);
//! - whether a host is loopback ([`is_loopback_host`]: plain HTTP is
//!   allowed there only, unless a configuration opts in);
//! - [`ca`]: the cluster CA that issues the servers' and nodes'
//!   certificates (`polar rollout ca`), and the CA certificate template the
//!   sandbox CA shares.
//!
//! The crypto provider is rustls' ring provider everywhere.

pub mod ca;

use std::io;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// A TLS file or configuration problem, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file holds no usable PEM object of the kind wanted.
    #[error("{}: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A private key file grants others (or its group write) access.
    #[error(
        "{}: mode {mode:04o} grants others access to a private key: run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    KeyMode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// rustls refused the certificates or the key.
    #[error("{what}: {source}")]
    Rustls {
        /// What was being set up.
        what: &'static str,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// The client-certificate verifier could not be built.
    #[error("client certificate CA {}: {reason}", path.display())]
    ClientCa {
        /// The CA bundle.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The crypto provider of every control-plane configuration.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Permission bits a CA key may not have: none for group or others.
pub const CA_KEY_FORBIDDEN: u32 = 0o077;
/// Permission bits a server's or node's key may not have: none for
/// others, no group write (group read is how Kubernetes mounts a Secret
/// for a pod's `fsGroup`).
pub const KEY_FORBIDDEN: u32 = 0o037;

/// The permission bits of `path` when they include one of `forbidden`
/// (`None` when they do not).
pub fn key_mode_too_open(path: &Path, forbidden: u32) -> io::Result<Option<u32>> {
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    Ok((mode & forbidden != 0).then_some(mode))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The certificates of a PEM file (a chain, leaf first, or a CA bundle);
/// at least one.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            reason: "no PEM certificate in it".into(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, SEC1 or PKCS#1), refused when
/// the file grants others access or its group write access
/// ([`KEY_FORBIDDEN`]).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let mode = key_mode_too_open(path, KEY_FORBIDDEN).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    if let Some(mode) = mode {
        return Err(TlsError::KeyMode {
            path: path.to_owned(),
            mode,
        });
    }
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        reason: format!("no PEM private key in it: {e}"),
    })
}

/// A certificate chain and its key, read from their files.
#[derive(Debug)]
pub struct Identity {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            certs: self.certs.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// Reads `cert` (the chain, leaf first) and `key`.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            certs: read_certs(cert)?,
            key: read_key(key)?,
        })
    }
}

/// The roots of a CA bundle file.
pub fn roots_of(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

/// The system's trust roots, loaded once (empty, with a warning, when
/// there are none).
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    Arc::clone(ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        // None found: an https:// call fails with an unknown issuer,
        // which names the fix (a CA bundle).
        let _ = roots.add_parsable_certificates(found.certs);
        Arc::new(roots)
    }))
}

/// A server configuration presenting `identity`, speaking HTTP/1.1. With
/// `client_ca`, clients are asked for a certificate: one that is sent must
/// chain to that CA (else the handshake fails); one that is not sent is
/// allowed, and the server's routes decide who needs one.
pub fn server_config(
    identity: &Identity,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, TlsError> {
    let rustls = |what| move |source| TlsError::Rustls { what, source };
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(rustls("TLS versions"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots_of(path)?), provider())
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| TlsError::ClientCa {
                        path: path.to_owned(),
                        reason: e.to_string(),
                    })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(identity.certs.clone(), identity.key.clone_key())
        .map_err(rustls("the server certificate and key"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A client configuration trusting the system's roots, without a client
/// certificate (rustls' default versions, its crate-feature provider:
/// ring).
pub fn default_client_config() -> ClientConfig {
    ClientConfig::builder()
        .with_root_certificates(system_roots())
        .with_no_client_auth()
}

/// A client configuration verifying servers against the CA bundle `ca`
/// (the system's roots without one), presenting `identity` when a server
/// asks for a client certificate.
pub fn client_config(
    ca: Option<&Path>,
    identity: Option<&Identity>,
) -> Result<ClientConfig, TlsError> {
    let roots = match ca {
        Some(path) => Arc::new(roots_of(path)?),
        None => system_roots(),
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "TLS versions",
            source,
        })?
        .with_root_certificates(roots);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some(id) => builder
            .with_client_auth_cert(id.certs.clone(), id.key.clone_key())
            .map_err(|source| TlsError::Rustls {
                what: "the client certificate and key",
                source,
            }),
    }
}

/// The DNS names (subject alternative names) of a certificate; empty when
/// it does not parse.
pub fn dns_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, x509)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = x509.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect()
}

/// Whether `host` (a URL's host, brackets allowed around IPv6) is
/// `localhost` or a loopback address.
pub fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.eq_ignore_ascii_case("localhost") {
        return true;
    }
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests;
