//! An interception proxy running in the test process on a loopback
//! listener that takes direct connections (as after the redirect, without
//! needing root), and TLS clients that trust exactly the given certificates.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use polar_config::Config;
use polar_io::tasks::Tasks;
use polar_node::agent::AgentParts;
use polar_redirect::listener::{AcceptContext, accept_loop};
use tokio_rustls::TlsConnector;

/// A TLS connector trusting only the certificates in `pem` and offering the
/// `alpn` protocols.
pub fn trusting(pem: &[u8], alpn: &[&[u8]]) -> Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(
            pem,
        )
    {
        roots.add(cert?)?;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsConnector::from(Arc::new(cfg)))
}

/// The proxy and its listener.
pub struct ProxyHarness {
    /// Where the proxy listens.
    pub addr: SocketAddr,
    /// The assembled agent.
    pub parts: AgentParts,
    /// A client trusting Polar's CA (offering HTTP/2 and HTTP/1.1).
    pub tls: TlsConnector,
    /// The listener's tasks (cancelled on drop).
    pub tasks: Tasks,
    _state: tempfile::TempDir,
}

impl ProxyHarness {
    /// Starts the proxy with `config` (TOML without `[agent]`, which is set
    /// to a fresh state directory).
    pub async fn start(config: &str) -> Result<Self> {
        let state = tempfile::tempdir()?;
        let text = format!(
            "[agent]\nstate_dir = \"{}\"\n{config}",
            state.path().join("state").display()
        );
        let parts = AgentParts::build(Config::from_toml_str(&text)?)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        polar_sandbox::netns::deep_backlog(&listener)?;
        let addr = listener.local_addr()?;
        let tasks = Tasks::new();
        let ctx = Arc::new(AcceptContext {
            redirect: None,
            fake: Arc::clone(parts.resolver.fake_ips()),
            session: None,
            handler: Arc::clone(&parts.proxy),
            handlers: tasks.clone(),
        });
        tasks.spawn(accept_loop(listener, ctx, tasks.shutdown_token()));
        let tls = trusting(&std::fs::read(&parts.trust.ca)?, &[b"h2", b"http/1.1"])?;
        Ok(Self {
            addr,
            parts,
            tls,
            tasks,
            _state: state,
        })
    }

    /// The CA file sandboxes are given.
    pub fn ca_file(&self) -> &Path {
        &self.parts.trust.ca
    }
}

impl Drop for ProxyHarness {
    fn drop(&mut self) {
        self.tasks.shutdown_token().cancel();
    }
}
