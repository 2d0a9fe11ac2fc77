//! End-to-end tests of the rollout server with simulated gateways, all on
//! 127.0.0.1 with ports picked by the kernel. Every wait is bounded.
//!
//! - `dispatch`: one and three gateways, priority order, early stop;
//! - `failures`: a killed gateway, a restarted server;
//! - `commit`: commits that fail (injected) change nothing;
//! - `attempts`: a newer attempt on the node waits for the old one's
//!   tear-down;
//! - `api`: bad input (400/409/401/404), callbacks, the event stream;
//! - `routes`: the route table and the API without sockets (404, 405,
//!   percent-decoding);
//! - `live`: a running session's calls reported by the real node, kept
//!   bounded, published as `calls` events and shown with the sample until
//!   its result;
//! - `ui`: the dashboard's files, read-only tokens, the sample and
//!   exported-trajectory endpoints, pause and resume forwarded to a node;
//! - `tls`: HTTPS with the cluster CA's certificates (trainer, gateway,
//!   callback), a wrong CA, plain HTTP beyond loopback, mutual TLS bound
//!   to the node id, token rotation on both sides.

mod api;
mod attempts;
mod commit;
mod dispatch;
mod failures;
mod live;
mod routes;
mod tls;
mod ui;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Response, StatusCode};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::net::TcpListener;

use super::{RolloutConfig, RolloutServer};
use polar_gateway::sim::{SimGateway, SimGatewayConfig};
use polar_gateway::stages::{StageLimits, Stages, Work};
use polar_gateway::{Node, NodeOptions, Progress};
use polar_rollout_api::RolloutClient;
use polar_rollout_api::http::{full, read_body};
use polar_rollout_api::{TaskStatus, TaskView};

pub(crate) const TOKEN: &str = "trainer-token-1";
/// node-a's token.
pub(crate) const NODE_TOKEN: &str = "node-token-node-a";
pub(crate) const GATEWAY_TOKEN: &str = "gateway-token-333";

/// One complete JSONL export row of `session` (the columns of
/// docs/EXPORT-SCHEMA.md): 3 prompt tokens, then a call's 2 tokens, 2
/// tokens of glue and a second call's 2 tokens.
pub(crate) fn export_line(session: &str, task: &str) -> String {
    let mut row = json!({
        "schema_version": 1, "trace_id": format!("{session}/0"), "session_id": session,
        "task_id": task, "group_id": task, "attempt": 1, "policy_version": "v7",
        "weight_version": null, "status": "completed", "error": null,
        "builder": "prefix_merging", "trace_index": 0, "chain": 0, "chain_role": "main",
        "segment": 0, "segment_kind": "start", "break_reason": null, "labels": [],
        "finish_reason": "stop", "reward": 1.0,
    });
    let tokens = json!({
        "prompt_ids": [1, 2, 3], "response_ids": [10, 11, 20, 21, 12, 13],
        "loss_mask": [1, 1, 0, 0, 1, 1],
        "response_logprobs": [-0.5, -0.25, 0.0, 0.0, -1.0, -0.125],
        "prompt_messages": [], "response_messages": [], "tools": [],
        "call_ids": ["c0", "c1"],
        "trace_metadata": {"spans": [
            {"response_start": 0, "response_len": 2, "join": {"kind": "first"}},
            {"response_start": 4, "response_len": 2, "join": {"kind": "extend"}}
        ]},
        "trajectory_metadata": {"builder": {"kind": "prefix_merging"}, "session_id": session},
    });
    let stats = json!({
        "calls": 2, "chains": 1, "segments": 1, "calls_merged": 2, "calls_dropped": [],
        "retries_superseded": 0, "forks": 0, "breaks": 0,
        "template_mismatches_detected": 0, "template_mismatches_spliced": 0,
        "truncated_calls": 0, "prompt_tokens": 3, "response_tokens": 6, "loss_tokens": 4,
    });
    if let (Some(o), Some(t)) = (row.as_object_mut(), tokens.as_object()) {
        o.extend(t.clone());
        o.insert("stats".into(), stats);
    }
    row.to_string()
}

/// A database directory and settings for fast tests.
pub(crate) struct Env {
    pub dir: TempDir,
    pub cfg: RolloutConfig,
}

pub(crate) fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RolloutConfig::new(dir.path().join("rollout.sqlite"), TOKEN);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    // node-a .. node-z, each with its own token.
    cfg.node_tokens = ('a'..='z')
        .map(|c| {
            let id = format!("node-{c}");
            let t = node_token(&id);
            (id, t)
        })
        .collect();
    cfg.gateway_token = GATEWAY_TOKEN.into();
    cfg.heartbeat_interval = Duration::from_millis(50);
    cfg.heartbeat_timeout = Duration::from_millis(400);
    cfg.push_timeout = Duration::from_secs(2);
    cfg.callback.initial_backoff = Duration::from_millis(20);
    cfg.callback.max_backoff = Duration::from_millis(200);
    cfg.callback.timeout = Duration::from_secs(2);
    cfg.callback.max_attempts = 3;
    Env { dir, cfg }
}

/// The token of node `id` in [`env`].
pub(crate) fn node_token(id: &str) -> String {
    format!("node-token-{id}")
}

pub(crate) async fn start(cfg: &RolloutConfig) -> RolloutServer {
    RolloutServer::start(cfg.clone()).await.unwrap()
}

pub(crate) fn client(server: &RolloutServer) -> RolloutClient {
    RolloutClient::new(server.url(), Some(TOKEN.into())).with_timeout(Duration::from_secs(10))
}

/// A simulated gateway with the test tokens.
pub(crate) fn gw_config(server: &RolloutServer, id: &str) -> SimGatewayConfig {
    let mut c = SimGatewayConfig::new(id, &server.url(), &node_token(id));
    c.accept_token = GATEWAY_TOKEN.into();
    c
}

pub(crate) async fn gateway(cfg: SimGatewayConfig) -> SimGateway {
    SimGateway::start(cfg).await.unwrap()
}

/// A real gateway node `node-a` on 127.0.0.1 doing `work`: 4 sessions,
/// a worker per session in every stage, heartbeats every 50 ms, no
/// progress reports.
pub(crate) async fn node_a<W: Work>(server: &RolloutServer, work: W) -> Node<W> {
    node_a_reporting(server, work, Progress::None).await
}

/// [`node_a`] reporting `progress`.
pub(crate) async fn node_a_reporting<W: Work>(
    server: &RolloutServer,
    work: W,
    progress: Progress,
) -> Node<W> {
    let opts = NodeOptions {
        node_id: "node-a".into(),
        server_url: server.url(),
        token: NODE_TOKEN.into(),
        accept_tokens: vec![GATEWAY_TOKEN.into()],
        advertise: None,
        max_sessions: 4,
        heartbeat_interval: Duration::from_millis(50),
        progress,
        labels: Default::default(),
        limits: Default::default(),
        tls: None,
    };
    let limits = StageLimits {
        init: 4,
        ready_buffer: 0,
        running: 4,
        postrun: 4,
    };
    Node::start(
        opts,
        "127.0.0.1:0".parse().unwrap(),
        Stages::new(limits),
        work,
    )
    .await
    .unwrap()
}

pub(crate) fn task(id: &str, n: u32) -> Value {
    json!({
        "task_id": id,
        "instruction": "make the tests pass",
        "num_samples": n,
        "timeout_secs": 60,
        "runtime": {"kind": "docker", "image": "debian:12"},
        "agent": {"harness": "shell", "options": {"command": "python3 client.py"}},
        "builder": {"kind": "prefix_merging"},
        "evaluator": {"kind": "session_completed"},
        "metadata": {"group_id": format!("group-{id}"), "policy_version": "v7"},
    })
}

/// Polls until the task is finished; panics after `limit`.
pub(crate) async fn finished(c: &RolloutClient, id: &str, limit: Duration) -> TaskView {
    task_until(c, id, "finished", limit, |v| v.status.is_finished()).await
}

/// Polls the task's view until `cond` holds; panics after `limit`.
pub(crate) async fn task_until(
    c: &RolloutClient,
    id: &str,
    what: &str,
    limit: Duration,
    cond: impl Fn(&TaskView) -> bool,
) -> TaskView {
    let deadline = Instant::now() + limit;
    loop {
        match c.task(id).await {
            Ok(v) if cond(&v) => return v,
            view => assert!(
                Instant::now() < deadline,
                "task {id} not {what} within {limit:?}: {:?}",
                view.map(|v| (v.counts, v.samples))
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The least time a liveness wait gives: these machines are shared, and
/// a test waiting for something that must happen is not a benchmark.
const LIVENESS_FLOOR: Duration = Duration::from_secs(30);

/// Polls `cond` until it holds; panics after `limit` (at least
/// [`LIVENESS_FLOOR`]).
pub(crate) async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let limit = limit.max(LIVENESS_FLOOR);
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) fn assert_completed(v: &TaskView, n: u32) {
    assert_eq!(v.status, TaskStatus::Completed, "{v:#?}");
    assert_eq!(v.counts.done, n, "{:?}", v.counts);
    assert_eq!(v.samples.len(), n as usize);
}

/// A callback receiver answering the scripted statuses in turn (then 200),
/// recording every body.
pub(crate) struct CallbackSink {
    pub addr: SocketAddr,
    pub bodies: Arc<Mutex<Vec<Value>>>,
}

pub(crate) async fn callback_sink(script: Vec<u16>) -> CallbackSink {
    callback_sink_over(script, None).await
}

/// [`callback_sink`] over TLS with `tls` (plain HTTP without).
pub(crate) async fn callback_sink_over(
    script: Vec<u16>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> CallbackSink {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let script = Arc::new(Mutex::new(script.into_iter()));
    let b = Arc::clone(&bodies);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let b = Arc::clone(&b);
            let script = Arc::clone(&script);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let b = Arc::clone(&b);
                    let script = Arc::clone(&script);
                    async move {
                        let body = read_body(req.into_body(), 1 << 24)
                            .await
                            .unwrap_or_default();
                        b.lock()
                            .unwrap()
                            .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                        let code = script.lock().unwrap().next().unwrap_or(200);
                        let mut resp = Response::new(full("ok"));
                        *resp.status_mut() = StatusCode::from_u16(code).unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                match acceptor {
                    None => {
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    }
                    Some(a) => {
                        let Ok(tls) = a.accept(stream).await else {
                            return;
                        };
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), svc)
                            .await;
                    }
                }
            });
        }
    });
    CallbackSink { addr, bodies }
}
