//! TLS on the control plane with certificates of a cluster CA made here:
//! a trainer, a gateway and a callback over HTTPS, each verified; a client
//! trusting another CA is refused; plain HTTP beyond loopback is refused
//! at start, at registration and at submission; mutual TLS binds a node's
//! certificate to its node id; tokens rotate on both sides.

use std::path::PathBuf;

use http::Method;

use super::*;
use polar_gateway::NodeError;
use polar_gateway::sim::{SimWork, default_outcome};
use polar_io::tls::ca::{ClusterCa, IssueRequest};
use polar_rollout_api::ClientError;
use polar_rollout_api::tls::TlsSettings;

/// A cluster CA in a temporary directory, issuing certificates for
/// `localhost` and 127.0.0.1.
struct Pki {
    dir: TempDir,
    ca: ClusterCa,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::init(&dir.path().join("ca"), Duration::from_secs(86_400)).unwrap();
        Self { dir, ca }
    }

    /// `name`'s certificate and key (for `localhost` and 127.0.0.1 too),
    /// issued on first use.
    fn issue(&self, name: &str) -> (PathBuf, PathBuf) {
        self.issue_in("certs", name, true)
    }

    /// `name`'s certificate naming `name` alone.
    fn issue_bare(&self, name: &str) -> (PathBuf, PathBuf) {
        self.issue_in("bare", name, false)
    }

    fn issue_in(&self, sub: &str, name: &str, local: bool) -> (PathBuf, PathBuf) {
        let out = self.dir.path().join(sub);
        let (cert, key) = (
            out.join(format!("{name}.crt")),
            out.join(format!("{name}.key")),
        );
        if !cert.exists() {
            let req = IssueRequest {
                name: name.into(),
                dns: if local {
                    vec!["localhost".into()]
                } else {
                    vec![]
                },
                ips: if local {
                    vec!["127.0.0.1".parse().unwrap()]
                } else {
                    vec![]
                },
                validity: Duration::from_secs(86_400),
            };
            self.ca.issue(&req, &out).unwrap();
        }
        (cert, key)
    }

    /// Settings serving `name`'s certificate (none: plain HTTP), trusting
    /// this CA, asking callers for certificates of it when `mtls`.
    fn settings(&self, table: &str, name: Option<&str>, mtls: bool) -> TlsSettings {
        let mut s = TlsSettings::plain(table);
        s.identity = name.map(|n| self.issue(n));
        s.ca_file = Some(self.ca.cert_path());
        s.client_ca_file = mtls.then(|| self.ca.cert_path());
        s
    }

    fn client(&self) -> rustls::ClientConfig {
        polar_io::tls::client_config(Some(&self.ca.cert_path()), None).unwrap()
    }
}

/// A simulated node-like gateway with these TLS settings.
fn tls_gateway(server: &RolloutServer, id: &str, tls: &TlsSettings) -> SimGatewayConfig {
    let mut g = gw_config(server, id);
    g.tls = Some(tls.configs().unwrap());
    g
}

fn transport(e: &ClientError) -> &str {
    match e {
        ClientError::Transport { reason, .. } => reason,
        other => panic!("not a transport error: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_a_gateway_and_a_callback_over_https_with_verified_certificates() {
    let pki = Pki::new();
    let mut e = env();
    e.cfg.tls = pki.settings("rollout.tls", Some("rollout"), true);
    let server = start(&e.cfg).await;
    assert!(
        server.url().starts_with("https://127.0.0.1:"),
        "{}",
        server.url()
    );
    // The trainer presents no certificate: only nodes must.
    let c = client(&server).with_tls(pki.client());
    let gw = gateway(tls_gateway(
        &server,
        "node-a",
        &pki.settings("gateway.tls", Some("node-a"), false),
    ))
    .await;
    assert!(
        gw.address().starts_with("https://127.0.0.1:"),
        "{}",
        gw.address()
    );
    let sink_tls = pki
        .settings("callback", Some("callback"), false)
        .configs()
        .unwrap()
        .server;
    let sink = callback_sink_over(vec![], sink_tls).await;
    let mut t = task("over-tls", 3);
    t["callback_url"] = json!(format!("https://localhost:{}/done", sink.addr.port()));
    c.submit(&t).await.unwrap();
    let v = finished(&c, "over-tls", Duration::from_secs(30)).await;
    assert_completed(&v, 3);
    until("the https:// callback", Duration::from_secs(10), || {
        !sink.bodies.lock().unwrap().is_empty()
    })
    .await;
    let body = sink.bodies.lock().unwrap()[0].clone();
    let view: TaskView = serde_json::from_value(body).unwrap();
    assert_completed(&view, 3);
    // Counted by the gateway once the server's answer is back.
    until(
        "the gateway counts its 3 results reported",
        Duration::from_secs(5),
        || gw.reported() == 3,
    )
    .await;
    gw.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_is_refused() {
    let (pki, other) = (Pki::new(), Pki::new());
    let mut e = env();
    e.cfg.tls = pki.settings("rollout.tls", Some("rollout"), false);
    let server = start(&e.cfg).await;
    let wrong = client(&server).with_tls(other.client());
    let err = wrong.status().await.unwrap_err();
    assert!(
        transport(&err).contains("invalid peer certificate: UnknownIssuer"),
        "{err}"
    );
    // The system's roots do not know the cluster CA either.
    let err = client(&server).status().await.unwrap_err();
    assert!(transport(&err).contains("UnknownIssuer"), "{err}");
    // A gateway trusting another CA cannot register.
    let g = tls_gateway(
        &server,
        "node-a",
        &other.settings("gateway.tls", None, false),
    );
    let Err(NodeError::Register { source, .. }) = SimGateway::start(g).await else {
        panic!("registered through a certificate it cannot verify");
    };
    assert!(transport(&source).contains("UnknownIssuer"), "{source}");
    // The right CA: served.
    client(&server)
        .with_tls(pki.client())
        .status()
        .await
        .unwrap();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_beyond_loopback_is_refused() {
    let mut e = env();
    e.cfg.listen = "0.0.0.0:0".parse().unwrap();
    let err = RolloutServer::start(e.cfg.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "rollout.listen: 0.0.0.0:0 is not a loopback address and rollout.tls has no cert_file"
        ),
        "{err}"
    );
    e.cfg.listen = "127.0.0.1:0".parse().unwrap();
    let server = start(&e.cfg).await;
    // A node advertising a plain HTTP address on the network.
    let node = RolloutClient::new(server.url(), Some(node_token("node-a")));
    let reg = json!({
        "version": 1, "node_id": "node-a", "address": "http://10.9.9.9:7071", "instance": "i-1",
        "capacity": {"max_sessions": 4},
    });
    let (code, body) = node
        .raw(
            Method::POST,
            "/v1/nodes/register",
            Some(reg.to_string().into_bytes()),
        )
        .await
        .unwrap();
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body:?}");
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("address: http://10.9.9.9:7071 is plain HTTP to a host that is not loopback"),
        "{text}"
    );
    // A plain HTTP callback on the network.
    let mut t = task("plain-cb", 1);
    t["callback_url"] = json!("http://10.9.9.9/results");
    let err = client(&server).submit(&t).await.unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::BAD_REQUEST), "{err}");
    assert!(
        err.to_string()
            .contains("callback_url: http://10.9.9.9/results is plain HTTP"),
        "{err}"
    );
    server.shutdown().await;
    // Opted in: the same callback is taken.
    e.cfg.tls.allow_plain_http = true;
    let server = start(&e.cfg).await;
    t["task_id"] = json!("plain-cb-2");
    client(&server).submit(&t).await.unwrap();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_binds_a_node_certificate_to_its_node_id() {
    let (pki, other) = (Pki::new(), Pki::new());
    let mut e = env();
    e.cfg.tls = pki.settings("rollout.tls", Some("rollout"), true);
    let server = start(&e.cfg).await;
    let refused = |g: SimGatewayConfig| async move {
        match SimGateway::start(g).await {
            Err(NodeError::Register { source, .. }) => source,
            Ok(_) => panic!("registered"),
            Err(e) => panic!("{e}"),
        }
    };
    // No client certificate: 403.
    let e1 = refused(tls_gateway(
        &server,
        "node-a",
        &pki.settings("gateway.tls", None, false),
    ))
    .await;
    assert_eq!(e1.status(), Some(StatusCode::FORBIDDEN), "{e1}");
    assert!(
        e1.to_string()
            .contains("node \"node-a\": no client certificate"),
        "{e1}"
    );
    // node-b's certificate with node-a's token: 403.
    let e2 = refused(tls_gateway(
        &server,
        "node-a",
        &pki.settings("gateway.tls", Some("node-b"), false),
    ))
    .await;
    assert_eq!(e2.status(), Some(StatusCode::FORBIDDEN), "{e2}");
    assert!(
        e2.to_string()
            .contains("the client certificate names [\"node-b\", \"localhost\"], not this node"),
        "{e2}"
    );
    // A certificate of another CA: the handshake is refused.
    let mut s = other.settings("gateway.tls", Some("node-a"), false);
    s.ca_file = Some(pki.ca.cert_path());
    let e3 = refused(tls_gateway(&server, "node-a", &s)).await;
    assert_eq!(e3.status(), None, "{e3}");
    // Its own certificate: registered, and its sessions run.
    let gw = gateway(tls_gateway(
        &server,
        "node-a",
        &pki.settings("gateway.tls", Some("node-a"), false),
    ))
    .await;
    let c = client(&server).with_tls(pki.client());
    c.submit(&task("mtls", 2)).await.unwrap();
    assert_completed(&finished(&c, "mtls", Duration::from_secs(30)).await, 2);
    gw.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_may_be_verified_by_node_id_whatever_address_they_advertise() {
    let pki = Pki::new();
    let mut e = env();
    e.cfg.tls = pki.settings("rollout.tls", Some("rollout"), true);
    e.cfg.verify_gateway_as = crate::config::GatewayName::NodeId;
    let server = start(&e.cfg).await;
    // node-a's certificate names node-a only, not the 127.0.0.1 it serves on.
    let mut s = pki.settings("gateway.tls", None, false);
    s.identity = Some(pki.issue_bare("node-a"));
    let gw = gateway(tls_gateway(&server, "node-a", &s)).await;
    assert!(
        gw.address().starts_with("https://127.0.0.1:"),
        "{}",
        gw.address()
    );
    let c = client(&server).with_tls(pki.client());
    c.submit(&task("by-id", 2)).await.unwrap();
    assert_completed(&finished(&c, "by-id", Duration::from_secs(30)).await, 2);
    gw.stop().await;
    server.shutdown().await;
}

/// Sessions that end at once (node-a's work in the rotation tests).
fn quick_work() -> SimWork {
    SimWork::new(
        "node-a",
        Duration::ZERO,
        Duration::from_millis(20),
        0.0,
        Arc::new(default_outcome),
    )
}

/// `cfg` with both of node-a's sides rotated: the server's gateway token
/// and node-a's token.
fn rotated(cfg: &RolloutConfig) -> RolloutConfig {
    let mut rotated = cfg.clone();
    rotated.gateway_token = "gateway-token-rotated".into();
    rotated
        .node_tokens
        .insert("node-a".into(), "node-a-token-rotated".into());
    rotated
}

/// After a rotation: a task of three sessions runs with the new tokens
/// both ways, and node-a counts its results reported (the server records
/// a result before its answer reaches the node, which counts it only
/// then); then both stop.
async fn sessions_run_with_the_rotated_tokens(
    server: RolloutServer,
    node: Node<SimWork>,
    task_id: &str,
) {
    let c = client(&server);
    c.submit(&task(task_id, 3)).await.unwrap();
    assert_completed(&finished(&c, task_id, Duration::from_secs(30)).await, 3);
    until(
        "node-a counts its 3 results reported",
        Duration::from_secs(5),
        || node.reported() == 3,
    )
    .await;
    node.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rotate_on_the_server_and_the_gateway() {
    let e = env();
    let server = start(&e.cfg).await;
    let node = node_a(&server, quick_work()).await;
    // Both sides rotate: the server's gateway token and node-a's token.
    server.set_tokens(&rotated(&e.cfg)).unwrap();
    node.set_tokens("node-a-token-rotated", vec!["gateway-token-rotated".into()]);
    let status = |token: &str| {
        let c = RolloutClient::new(node.address().to_owned(), Some(token.into()));
        async move { c.raw(Method::GET, "/v1/status", None).await.unwrap().0 }
    };
    assert_eq!(status(GATEWAY_TOKEN).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status("gateway-token-rotated").await, StatusCode::OK);
    // The old node token no longer speaks for node-a.
    let old = RolloutClient::new(server.url(), Some(node_token("node-a")));
    let err = old
        .heartbeat(
            "node-a",
            &serde_json::from_value(json!({"active": 0})).unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::UNAUTHORIZED), "{err}");
    sessions_run_with_the_rotated_tokens(server, node, "rotated").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_reads_tokens_rotated_in_their_files_without_a_signal() {
    let e = env();
    let server = start(&e.cfg).await;
    let node = node_a(&server, quick_work()).await;
    // The node's token files, as a mounted Secret replaced in place.
    let files = Arc::new(std::sync::Mutex::new((
        node_token("node-a"),
        vec![GATEWAY_TOKEN.to_owned()],
    )));
    let reads = Arc::new(std::sync::atomic::AtomicU32::new(0));
    {
        let (files, reads) = (Arc::clone(&files), Arc::clone(&reads));
        node.set_token_source(Arc::new(move || {
            reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(files.lock().unwrap().clone())
        }));
    }
    // The server rotates both tokens, then the files change; nobody tells
    // the node.
    server.set_tokens(&rotated(&e.cfg)).unwrap();
    *files.lock().unwrap() = (
        "node-a-token-rotated".to_owned(),
        vec!["gateway-token-rotated".to_owned()],
    );
    // Its next heartbeat is refused (401): it reads its files again.
    until(
        "node-a reads its rotated token files",
        Duration::from_secs(10),
        || reads.load(std::sync::atomic::Ordering::Relaxed) >= 1,
    )
    .await;
    let status = |token: &str| {
        let c = RolloutClient::new(node.address().to_owned(), Some(token.into()));
        async move { c.raw(Method::GET, "/v1/status", None).await.unwrap().0 }
    };
    assert_eq!(status("gateway-token-rotated").await, StatusCode::OK);
    // A caller presenting tokens the node does not take is refused, and
    // makes it read its files at most once a second.
    tokio::time::sleep(polar_gateway::REREAD_EVERY).await;
    let before = reads.load(std::sync::atomic::Ordering::Relaxed);
    for _ in 0..20 {
        assert_eq!(status(GATEWAY_TOKEN).await, StatusCode::UNAUTHORIZED);
    }
    let after = reads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(after - before <= 2, "{before} -> {after} reads");
    sessions_run_with_the_rotated_tokens(server, node, "read-again").await;
}
