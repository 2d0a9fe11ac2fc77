//! The rustls side of termination: a certificate resolver that picks the
//! leaf from the ClientHello's SNI (or, without SNI, for a fallback IP given
//! per connection), the base server config, and a factory that derives a
//! per-connection config from it cheaply.

use std::net::IpAddr;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::leaf::{LeafError, LeafIssuer, LeafSubject};

/// Picks the leaf from the ClientHello's SNI or, without SNI, for the
/// fallback IP given per connection (typically the original destination).
#[derive(Debug, Clone)]
pub struct LeafResolver {
    issuer: Arc<LeafIssuer>,
    fallback_ip: Option<IpAddr>,
}

impl LeafResolver {
    /// A resolver over the shared issuer; cheap to build per connection.
    pub fn new(issuer: Arc<LeafIssuer>, fallback_ip: Option<IpAddr>) -> Self {
        Self {
            issuer,
            fallback_ip,
        }
    }
}

impl ResolvesServerCert for LeafResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let subject = match (client_hello.server_name(), self.fallback_ip) {
            (Some(name), _) => LeafSubject::Dns(name.to_owned()),
            (None, Some(ip)) => LeafSubject::Ip(ip),
            (None, None) => {
                tracing::warn!("TLS client sent no SNI and no fallback IP was given");
                return None;
            }
        };
        match self.issuer.certified_key(&subject) {
            Ok(key) => Some(key),
            Err(error) => {
                tracing::warn!(leaf = %subject, %error, "no leaf certificate");
                None
            }
        }
    }
}

/// A server config over `issuer` offering `alpn`, resolving leaves by SNI
/// only (no fallback IP). Uses the ring provider and default TLS versions.
pub fn server_config(issuer: Arc<LeafIssuer>, alpn: &[&[u8]]) -> Result<ServerConfig, LeafError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(LeafResolver::new(issuer, None)));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Builds the server config for each connection from one shared base.
#[derive(Debug, Clone)]
pub struct ServerConfigFactory {
    base: Arc<ServerConfig>,
    issuer: Arc<LeafIssuer>,
}

impl ServerConfigFactory {
    /// A factory over [`server_config`]`(issuer, alpn)`.
    pub fn new(issuer: Arc<LeafIssuer>, alpn: &[&[u8]]) -> Result<Self, LeafError> {
        let base = Arc::new(server_config(Arc::clone(&issuer), alpn)?);
        Ok(Self { base, issuer })
    }

    /// The config for one connection: the shared base when there is no
    /// fallback IP, else a shallow copy (a few `Arc` clones) whose resolver
    /// uses `fallback_ip` for clients without SNI.
    pub fn for_connection(&self, fallback_ip: Option<IpAddr>) -> Arc<ServerConfig> {
        let Some(ip) = fallback_ip else {
            return Arc::clone(&self.base);
        };
        let mut config = ServerConfig::clone(&self.base);
        config.cert_resolver = Arc::new(LeafResolver::new(Arc::clone(&self.issuer), Some(ip)));
        Arc::new(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::{Ca, NameConstraintsSpec};
    use crate::leaf::LeafConfig;

    fn factory() -> (tempfile::TempDir, ServerConfigFactory) {
        let tmp = tempfile::tempdir().unwrap();
        let spec = NameConstraintsSpec {
            dns: vec!["api.anthropic.com".into()],
            ip_ranges: vec![("127.0.0.0".parse().unwrap(), 8)],
        };
        let ca = Arc::new(Ca::init(tmp.path(), &spec).unwrap());
        let issuer = Arc::new(LeafIssuer::new(ca, LeafConfig::default()).unwrap());
        let factory = ServerConfigFactory::new(issuer, &[b"h2", b"http/1.1"]).unwrap();
        (tmp, factory)
    }

    #[test]
    fn base_config_offers_alpn() {
        let (_tmp, factory) = factory();
        let config = factory.for_connection(None);
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn per_connection_config_shares_base_without_fallback() {
        let (_tmp, factory) = factory();
        let a = factory.for_connection(None);
        let b = factory.for_connection(None);
        assert!(Arc::ptr_eq(&a, &b));
        let ip = factory.for_connection(Some("127.0.0.1".parse().unwrap()));
        assert!(!Arc::ptr_eq(&a, &ip));
        assert_eq!(ip.alpn_protocols, a.alpn_protocols);
    }
}
