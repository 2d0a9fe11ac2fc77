//! The cluster CA's files and certificates, and handshakes (loopback) with
//! the configurations built here: verified, refused for another CA or
//! name, client certificates optional but verified.

use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::ca::{ClusterCa, IssueRequest};
use super::*;

const DAY: Duration = Duration::from_secs(86_400);

fn issue(ca: &ClusterCa, dir: &Path, name: &str) -> Identity {
    let req = IssueRequest {
        name: name.into(),
        dns: vec!["localhost".into()],
        ips: vec!["127.0.0.1".parse().unwrap()],
        validity: DAY,
    };
    let issued = ca.issue(&req, dir).unwrap();
    Identity::load(&issued.cert, &issued.key).unwrap()
}

/// Serves one connection: answers "pong" with the client's certificate
/// names, or the handshake error.
async fn serve_once(
    config: ServerConfig,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<Result<Vec<String>, String>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
        let names = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(dns_names)
            .unwrap_or_default();
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
        let _ = tls.shutdown().await;
        Ok(names)
    });
    (addr, task)
}

async fn exchange(
    addr: std::net::SocketAddr,
    config: ClientConfig,
    name: &str,
) -> Result<(), String> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4];
    tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
    assert_eq!(&buf, b"pong");
    Ok(())
}

#[test]
fn the_ca_writes_private_keys_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ca");
    let ca = ClusterCa::init(&dir, DAY).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.join(ca::KEY_FILE)), 0o600);
    assert_eq!(mode(&dir), 0o700);
    let e = ClusterCa::init(&dir, DAY).unwrap_err();
    assert!(matches!(e, ca::CaError::AlreadyExists { .. }), "{e}");
    let req = IssueRequest {
        name: "node-a".into(),
        dns: vec!["gpu-7.cluster".into()],
        ips: vec!["10.0.0.7".parse().unwrap()],
        validity: DAY,
    };
    let issued = ca.issue(&req, &dir).unwrap();
    assert_eq!(mode(&issued.key), 0o600);
    let chain = read_certs(&issued.cert).unwrap();
    assert_eq!(chain.len(), 2, "the leaf, then the CA");
    assert_eq!(dns_names(&chain[0]), ["node-a", "gpu-7.cluster"]);
    // Issued once: not overwritten.
    let e = ca.issue(&req, &dir).unwrap_err();
    assert!(e.to_string().contains("node-a.crt exists"), "{e}");
    let e = ca
        .issue(
            &IssueRequest {
                name: "../x".into(),
                ..req.clone()
            },
            &dir,
        )
        .unwrap_err();
    assert!(e.to_string().starts_with("--name \"../x\""), "{e}");
    // A loaded CA issues too; a key others may read is refused.
    ClusterCa::load(&dir).unwrap();
    std::fs::set_permissions(
        dir.join(ca::KEY_FILE),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let e = ClusterCa::load(&dir).unwrap_err();
    assert!(e.to_string().contains("chmod 600"), "{e}");
    std::fs::set_permissions(&issued.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Identity::load(&issued.cert, &issued.key).unwrap_err();
    assert!(matches!(e, TlsError::KeyMode { mode: 0o644, .. }), "{e}");
    // Group read (a Kubernetes Secret for the pod's fsGroup) is allowed.
    std::fs::set_permissions(&issued.key, std::fs::Permissions::from_mode(0o440)).unwrap();
    Identity::load(&issued.cert, &issued.key).unwrap();
    let e = ClusterCa::load(&tmp.path().join("none")).unwrap_err();
    assert!(e.to_string().contains("polar rollout ca init"), "{e}");
}

#[tokio::test]
async fn a_client_verifies_the_server_against_its_ca_bundle() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(&tmp.path().join("ca"), DAY).unwrap();
    let server = issue(&ca, tmp.path(), "rollout");
    let other = ClusterCa::init(&tmp.path().join("other"), DAY).unwrap();

    let (addr, task) = serve_once(server_config(&server, None).unwrap()).await;
    let trusting = client_config(Some(&ca.cert_path()), None).unwrap();
    exchange(addr, trusting.clone(), "rollout").await.unwrap();
    assert_eq!(task.await.unwrap().unwrap(), Vec::<String>::new());

    // Another CA's bundle: refused.
    let (addr, _task) = serve_once(server_config(&server, None).unwrap()).await;
    let e = exchange(
        addr,
        client_config(Some(&other.cert_path()), None).unwrap(),
        "rollout",
    )
    .await
    .unwrap_err();
    assert!(e.contains("UnknownIssuer"), "{e}");

    // A name the certificate does not carry: refused.
    let (addr, _task) = serve_once(server_config(&server, None).unwrap()).await;
    let e = exchange(addr, trusting, "elsewhere").await.unwrap_err();
    assert!(e.contains("not valid for name \"elsewhere\""), "{e}");
}

#[tokio::test]
async fn client_certificates_are_optional_but_verified() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = ClusterCa::init(&tmp.path().join("ca"), DAY).unwrap();
    let other = ClusterCa::init(&tmp.path().join("other"), DAY).unwrap();
    let server = issue(&ca, tmp.path(), "rollout");
    let node = issue(&ca, tmp.path(), "node-a");
    let stranger = issue(&other, &tmp.path().join("o"), "node-a");
    let config = || server_config(&server, Some(&ca.cert_path())).unwrap();
    let bundle = ca.cert_path();

    // A node's certificate: its names reach the server.
    let (addr, task) = serve_once(config()).await;
    exchange(
        addr,
        client_config(Some(&bundle), Some(&node)).unwrap(),
        "localhost",
    )
    .await
    .unwrap();
    assert_eq!(task.await.unwrap().unwrap(), ["node-a", "localhost"]);

    // None (a trainer): the handshake passes, no names.
    let (addr, task) = serve_once(config()).await;
    exchange(
        addr,
        client_config(Some(&bundle), None).unwrap(),
        "localhost",
    )
    .await
    .unwrap();
    assert!(task.await.unwrap().unwrap().is_empty());

    // One from another CA: the server refuses the handshake.
    let (addr, task) = serve_once(config()).await;
    let _ = exchange(
        addr,
        client_config(Some(&bundle), Some(&stranger)).unwrap(),
        "localhost",
    )
    .await;
    let e = task.await.unwrap().unwrap_err();
    assert!(e.contains("UnknownIssuer"), "{e}");
}

#[test]
fn loopback_hosts() {
    for h in [
        "localhost",
        "127.0.0.1",
        "127.3.2.1",
        "[::1]",
        "::1",
        "LOCALHOST",
    ] {
        assert!(is_loopback_host(h), "{h}");
    }
    for h in [
        "10.0.0.1",
        "example.com",
        "[fe80::1]",
        "0.0.0.0",
        "localhost.example",
    ] {
        assert!(!is_loopback_host(h), "{h}");
    }
}
