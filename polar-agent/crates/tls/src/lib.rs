//! TLS termination for intercepted model-API connections: Polar's
//! name-constrained CA ([`ca`], [`constraints`]), the leaves it issues per
//! SNI host or destination IP ([`leaf`]), the rustls server side that serves
//! them ([`server`]) and the trust files a sandbox is given ([`bundle`]).
//! Host names are normalized by `polar_wire::peek`, the same code that reads
//! them from a ClientHello.
//!
//! It knows certificates and handshakes only: nothing of the proxy that
//! reads the decrypted bytes, the redirect that brings connections here, or
//! the sandboxes that trust the CA (they get file paths, [`TrustFiles`]).
//!
//! Each submodule has its own error enum; this crate root only re-exports
//! the types the listener and the `polar ca` commands use, and holds the
//! end-to-end handshake tests (loopback only).
#![forbid(unsafe_code)]

pub mod bundle;
pub(crate) mod ca;
pub(crate) mod constraints;
pub(crate) mod leaf;
pub(crate) mod server;

pub use bundle::{BundleError, TrustFiles, write_trust_files};
pub use ca::{Ca, CaError, CaOptions, CaSummary};
pub use constraints::{ConstraintsError, NameConstraintsSpec};
pub use leaf::{LeafConfig, LeafError, LeafIssuer, LeafSubject};
pub use server::{LeafResolver, ServerConfigFactory, server_config};

#[cfg(test)]
mod tests {
    use std::io;
    use std::net::{IpAddr, SocketAddr};
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::sync::Arc;

    use rustls::pki_types::ServerName;
    use rustls::server::ResolvesServerCert;
    use rustls::sign::SingleCertAndKey;
    use rustls::{CertificateError, ClientConfig, RootCertStore, ServerConfig};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    use super::*;

    fn spec(ip_ranges: Vec<(IpAddr, u8)>) -> NameConstraintsSpec {
        NameConstraintsSpec {
            dns: vec!["api.anthropic.com".into(), "*.googleapis.com".into()],
            ip_ranges,
        }
    }

    fn loopback_spec() -> NameConstraintsSpec {
        spec(vec![("127.0.0.0".parse().unwrap(), 8)])
    }

    fn issuer(dir: &Path, spec: &NameConstraintsSpec) -> Arc<LeafIssuer> {
        let ca = Arc::new(Ca::init(dir, spec).unwrap());
        Arc::new(LeafIssuer::new(ca, LeafConfig::default()).unwrap())
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn client(roots: RootCertStore) -> TlsConnector {
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        TlsConnector::from(Arc::new(config))
    }

    fn trusting(ca: &Ca) -> TlsConnector {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        client(roots)
    }

    /// Serves one TLS connection on loopback: reads "ping", answers "pong".
    async fn serve_once(config: Arc<ServerConfig>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await?;
            let mut tls = TlsAcceptor::from(config).accept(tcp).await?;
            let mut buf = [0u8; 4];
            tls.read_exact(&mut buf).await?;
            tls.write_all(b"pong").await?;
            tls.shutdown().await
        });
        addr
    }

    /// Connects as `name`, exchanges ping/pong; returns the negotiated ALPN.
    async fn exchange(
        addr: SocketAddr,
        connector: &TlsConnector,
        name: ServerName<'static>,
    ) -> io::Result<Option<Vec<u8>>> {
        let tcp = TcpStream::connect(addr).await?;
        let mut tls = connector.connect(name, tcp).await?;
        tls.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"pong");
        Ok(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
    }

    fn rustls_error(err: &io::Error) -> &rustls::Error {
        err.get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
            .unwrap()
    }

    /// A server that presents a leaf issued without the issuer's checks.
    fn forged_server(ca: &Ca, subject: &LeafSubject) -> Arc<ServerConfig> {
        let (leaf, _) = leaf::issue_leaf(ca, subject, &LeafConfig::default()).unwrap();
        let resolver: Arc<dyn ResolvesServerCert> = Arc::new(SingleCertAndKey::from(leaf));
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(resolver);
        Arc::new(config)
    }

    fn assert_name_constraint_violation(err: &io::Error) {
        match rustls_error(err) {
            rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
                let text = format!("{other:?}");
                assert!(text.contains("NameConstraintViolation"), "{text}");
            }
            other => panic!("expected a name-constraint violation, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn handshake_succeeds_for_allowed_sni() {
        let tmp = tempfile::tempdir().unwrap();
        let issuer = issuer(tmp.path(), &loopback_spec());
        let factory = ServerConfigFactory::new(Arc::clone(&issuer), &[b"http/1.1"]).unwrap();
        let addr = serve_once(factory.for_connection(None)).await;
        let name = ServerName::try_from("api.anthropic.com").unwrap();
        let alpn = exchange(addr, &trusting(issuer.ca()), name).await.unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
        assert_eq!(issuer.cached(), 1);
    }

    #[tokio::test]
    async fn handshake_without_sni_uses_fallback_ip() {
        let tmp = tempfile::tempdir().unwrap();
        let issuer = issuer(tmp.path(), &loopback_spec());
        let factory = ServerConfigFactory::new(Arc::clone(&issuer), &[]).unwrap();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let addr = serve_once(factory.for_connection(Some(ip))).await;
        let alpn = exchange(addr, &trusting(issuer.ca()), ServerName::from(ip))
            .await
            .unwrap();
        assert_eq!(alpn, None);
    }

    #[tokio::test]
    async fn handshake_without_sni_or_fallback_fails() {
        let tmp = tempfile::tempdir().unwrap();
        let issuer = issuer(tmp.path(), &loopback_spec());
        let config = Arc::new(server_config(Arc::clone(&issuer), &[]).unwrap());
        let addr = serve_once(config).await;
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let result = exchange(addr, &trusting(issuer.ca()), ServerName::from(ip)).await;
        assert!(result.is_err());
        assert_eq!(issuer.cached(), 0);
    }

    #[tokio::test]
    async fn forged_leaf_outside_dns_constraints_is_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let issuer = issuer(tmp.path(), &loopback_spec());
        let ca = issuer.ca();
        let subject = LeafSubject::Dns("evil.example.com".into());
        assert!(matches!(
            issuer.certified_key(&subject),
            Err(LeafError::OutsideConstraints(_))
        ));
        let addr = serve_once(forged_server(ca, &subject)).await;
        let name = ServerName::try_from("evil.example.com").unwrap();
        let err = exchange(addr, &trusting(ca), name).await.unwrap_err();
        assert_name_constraint_violation(&err);
    }

    #[tokio::test]
    async fn forged_leaf_outside_ip_ranges_is_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let issuer = issuer(tmp.path(), &loopback_spec());
        let ip: IpAddr = "10.9.8.7".parse().unwrap();
        let addr = serve_once(forged_server(issuer.ca(), &LeafSubject::Ip(ip))).await;
        let err = exchange(addr, &trusting(issuer.ca()), ServerName::from(ip))
            .await
            .unwrap_err();
        assert_name_constraint_violation(&err);
    }

    #[tokio::test]
    async fn ca_without_ip_ranges_rejects_every_ip_leaf() {
        let tmp = tempfile::tempdir().unwrap();
        let issuer = issuer(tmp.path(), &spec(vec![]));
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(issuer.certified_key(&LeafSubject::Ip(ip)).is_err());
        let addr = serve_once(forged_server(issuer.ca(), &LeafSubject::Ip(ip))).await;
        let err = exchange(addr, &trusting(issuer.ca()), ServerName::from(ip))
            .await
            .unwrap_err();
        assert_name_constraint_violation(&err);
    }

    #[tokio::test]
    async fn client_with_other_roots_does_not_trust_leaf() {
        let tmp = tempfile::tempdir().unwrap();
        let issuer = issuer(tmp.path(), &loopback_spec());
        let factory = ServerConfigFactory::new(issuer, &[]).unwrap();
        let addr = serve_once(factory.for_connection(None)).await;
        let name = ServerName::try_from("api.anthropic.com").unwrap();
        let err = exchange(addr, &client(RootCertStore::empty()), name)
            .await
            .unwrap_err();
        assert!(matches!(
            rustls_error(&err),
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)
        ));
    }

    #[test]
    fn ca_load_refuses_world_readable_key() {
        let tmp = tempfile::tempdir().unwrap();
        Ca::init(tmp.path(), &loopback_spec()).unwrap();
        let key = tmp.path().join(ca::KEY_FILE);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Ca::load(tmp.path()).unwrap_err();
        assert!(matches!(err, CaError::InsecureKeyMode { mode: 0o644, .. }));
        assert!(err.to_string().contains("chmod 600"));
    }
}
