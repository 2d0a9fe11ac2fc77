//! The API's edges: bad input, tokens, unknown ids, callbacks, cancel, the
//! event stream.

use std::time::Duration;

use http::Method;
use serde_json::json;

use super::*;
use crate::events::Event;
use polar_rollout_api::sse::EventStream;
use polar_rollout_types::{CallbackState, ErrorBody, SessionKind};

async fn post(c: &RolloutClient, path: &str, body: &str) -> (StatusCode, ErrorBody) {
    let (code, bytes) = c
        .raw(Method::POST, path, Some(body.as_bytes().to_vec()))
        .await
        .unwrap();
    let err = serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("{code}: {bytes:?}"));
    (code, err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_task_requests_get_400_naming_the_field() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let mut zero = task("bad", 1);
    zero["num_samples"] = json!(0);
    let (code, err) = post(&c, "/v1/tasks", &zero.to_string()).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(err.error.code, "invalid_request");
    assert_eq!(err.error.field.as_deref(), Some("num_samples"));
    assert_eq!(err.error.message, "num_samples: must be between 1 and 1024");
    let mut no_id = task("bad", 1);
    no_id.as_object_mut().unwrap().remove("task_id");
    let (code, err) = post(&c, "/v1/tasks", &no_id.to_string()).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(err.error.field.as_deref(), Some("task_id"));
    let mut typo = task("bad", 1);
    typo["metadata"]["group"] = json!("x");
    let (_, err) = post(&c, "/v1/tasks", &typo.to_string()).await;
    assert!(
        err.error.field.as_deref().unwrap().starts_with("metadata"),
        "{err:?}"
    );
    let (code, err) = post(&c, "/v1/tasks", "{\"task_id\": ").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(err.error.field.as_deref(), Some("body"));
    // Nothing was created.
    assert!(c.tasks(None).await.unwrap().tasks.is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_outside_the_server_s_policy_get_400_naming_the_field() {
    let mut e = env();
    let cfg = crate::RolloutConfig::from_toml(
        "[rollout.policy]\nupload_roots = [\"/srv/tasks\"]\nmount_roots = [\"/data\"]",
        None,
    )
    .unwrap();
    e.cfg.policy = cfg.policy;
    let server = start(&e.cfg).await;
    let c = client(&server);
    for (runtime, field, message) in [
        (
            json!({"prepare": [{"run": "true"}, {"upload": {"from": "/etc/shadow", "to": "x"}}]}),
            "runtime.prepare[1].upload.from",
            "runtime.prepare[1].upload.from: /etc/shadow is outside the allowed upload roots [/srv/tasks]",
        ),
        (
            json!({"post": [{"upload": {"from": "/srv/tasks2/hidden"}}]}),
            "runtime.post[0].upload.from",
            "runtime.post[0].upload.from: /srv/tasks2/hidden is outside the allowed upload roots [/srv/tasks]",
        ),
        (
            json!({"mounts": [{"source": "/", "target": "/host", "read_only": false}]}),
            "runtime.mounts[0].source",
            "runtime.mounts[0].source: / is outside the allowed writable mount roots [] (read_only = false)",
        ),
        (
            json!({"mounts": [{"source": "/data/corpus", "target": "/d", "read_only": false}]}),
            "runtime.mounts[0].source",
            "runtime.mounts[0].source: /data/corpus is outside the allowed writable mount roots [] (read_only = false)",
        ),
        (
            json!({"network": "host"}),
            "runtime.network",
            "runtime.network: \"host\" is not allowed by the node's policy (allow_host_network)",
        ),
        (
            json!({"limits": {"pids": 100000}}),
            "runtime.limits.pids",
            "runtime.limits.pids: above the node's ceiling of 4096",
        ),
        (
            json!({"kind": "docker", "image": "debian:12",
                   "mounts": [{"source": "/data/a,readonly=false", "target": "/d"}]}),
            "runtime.mounts[0].source",
            "runtime.mounts[0].source: \"/data/a,readonly=false\" holds `,` or `\"`, which docker's --mount syntax (CSV) cannot carry",
        ),
    ] {
        let mut t = task("outside", 1);
        t["runtime"] = runtime;
        let (code, err) = post(&c, "/v1/tasks", &t.to_string()).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{field}: {err:?}");
        assert_eq!(err.error.code, "invalid_request");
        assert_eq!(err.error.field.as_deref(), Some(field));
        assert_eq!(err.error.message, message);
    }
    let mut long = task("outside", 1);
    long["timeout_secs"] = json!(86_401);
    let (code, err) = post(&c, "/v1/tasks", &long.to_string()).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(err.error.field.as_deref(), Some("timeout_secs"));
    assert!(c.tasks(None).await.unwrap().tasks.is_empty());
    // Inside the policy: accepted.
    let mut ok = task("inside", 1);
    ok["runtime"] = json!({"prepare": [{"upload": {"from": "/srv/tasks/t1"}}],
                           "mounts": [{"source": "/data/corpus", "target": "/d"}]});
    c.submit(&ok).await.unwrap();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_task_ids_get_409_and_unknown_ones_404() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    c.submit(&task("dup", 2)).await.unwrap();
    let (code, err) = post(&c, "/v1/tasks", &task("dup", 3).to_string()).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert_eq!(err.error.code, "duplicate_task");
    assert_eq!(c.task("dup").await.unwrap().num_samples, 2);
    let e404 = c.task("nope").await.unwrap_err();
    assert_eq!(e404.status(), Some(StatusCode::NOT_FOUND));
    assert_eq!(
        c.cancel("nope").await.unwrap_err().status(),
        Some(StatusCode::NOT_FOUND)
    );
    // Cancel with no gateway: every pending session is cancelled.
    let v = c.cancel("dup").await.unwrap();
    assert_eq!(v.status, TaskStatus::Cancelled);
    assert_eq!(v.counts.cancelled, 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_tokens_get_401_on_every_api() {
    let e = env();
    let server = start(&e.cfg).await;
    let none = RolloutClient::new(server.url(), None);
    let wrong = RolloutClient::new(server.url(), Some("wrong-token-xx".into()));
    let trainer = client(&server);
    let node = RolloutClient::new(server.url(), Some(NODE_TOKEN.into()));
    let reg = json!({"node_id": "node-a", "address": "http://127.0.0.1:9", "instance": "i",
                     "capacity": {"max_sessions": 1}})
    .to_string();
    let calls: [(Method, &str, Option<&str>); 9] = [
        (Method::POST, "/v1/tasks", Some("{}")),
        (Method::GET, "/v1/tasks", None),
        (Method::GET, "/v1/tasks/x", None),
        (Method::POST, "/v1/tasks/x/cancel", Some("{}")),
        (Method::GET, "/v1/events", None),
        (Method::GET, "/v1/status", None),
        (Method::GET, "/metrics", None),
        (Method::POST, "/v1/nodes/register", Some(&reg)),
        (Method::POST, "/v1/sessions/x/result", Some("{}")),
    ];
    for (m, path, body) in &calls {
        for c in [&none, &wrong] {
            let (code, _) = c
                .raw(m.clone(), path, body.map(|b| b.as_bytes().to_vec()))
                .await
                .unwrap();
            assert_eq!(code, StatusCode::UNAUTHORIZED, "{m} {path}");
        }
    }
    // The message names the token the endpoint needs and what the one
    // presented is, never the token.
    let message = |body: &[u8]| -> String {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        v["error"]["message"].as_str().unwrap().to_owned()
    };
    let trainer_needed = "this endpoint needs a trainer token (rollout.tokens, POLAR_ROLLOUT_TOKEN), or a viewer token for GET";
    let (_, body) = none.raw(Method::GET, "/v1/tasks", None).await.unwrap();
    assert_eq!(
        message(&body),
        format!("{trainer_needed}; no bearer token was presented (Authorization: Bearer TOKEN)")
    );
    let (_, body) = wrong.raw(Method::GET, "/v1/tasks", None).await.unwrap();
    assert_eq!(
        message(&body),
        format!("{trainer_needed}; the token presented is not a token this server accepts")
    );
    let gateway_token = RolloutClient::new(server.url(), Some(e.cfg.gateway_token.clone()));
    let (_, body) = gateway_token
        .raw(Method::GET, "/v1/tasks", None)
        .await
        .unwrap();
    assert_eq!(
        message(&body),
        format!(
            "{trainer_needed}; the token presented is the gateway token (rollout.gateway_token: what this server presents to gateways, not a token it accepts)"
        )
    );
    // Each side's token opens only its side.
    let (code, body) = trainer
        .raw(
            Method::POST,
            "/v1/nodes/register",
            Some(reg.clone().into_bytes()),
        )
        .await
        .unwrap();
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(
        message(&body),
        "this endpoint needs the node's own token (rollout.node_tokens); the token presented is a trainer token"
    );
    let (code, body) = node.raw(Method::GET, "/v1/tasks", None).await.unwrap();
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(
        message(&body),
        format!("{trainer_needed}; the token presented is the node token of \"node-a\"")
    );
    assert!(!message(&body).contains(NODE_TOKEN));
    let (code, _) = node
        .raw(Method::POST, "/v1/nodes/register", Some(reg.into_bytes()))
        .await
        .unwrap();
    assert_eq!(code, StatusCode::OK);
    // /health is open.
    let (code, _) = none.raw(Method::GET, "/health", None).await.unwrap();
    assert_eq!(code, StatusCode::OK);
    // The gateway side checks the server's token too.
    let gw = gateway(gw_config(&server, "node-g")).await;
    let to_gw = RolloutClient::new(gw.address(), Some(TOKEN.into()));
    let (code, body) = to_gw
        .raw(Method::POST, "/v1/sessions", Some(b"{}".to_vec()))
        .await
        .unwrap();
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(
        message(&body),
        "this gateway takes the token the rollout server presents to it (its gateway.accept_tokens: the server's rollout.gateway_token, POLAR_GATEWAY_TOKEN for a trainer's pause and resume); the token presented is not one of them (a trainer's or a node's own token is not)"
    );
    gw.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_url_that_is_down_does_not_block_the_task() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let gw = gateway(gw_config(&server, "node-a")).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let mut t = task("cb-down", 4);
    t["callback_url"] = json!(format!("http://127.0.0.1:{port}/results"));
    c.submit(&t).await.unwrap();
    let v = finished(&c, "cb-down", Duration::from_secs(10)).await;
    assert_completed(&v, 4);
    // Delivery goes on in the background and gives up after 3 attempts.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let cb = c.task("cb-down").await.unwrap().callback;
        if cb.state == CallbackState::Failed {
            assert_eq!(cb.attempts, 3);
            assert!(cb.last_error.is_some());
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{cb:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_that_fails_twice_then_succeeds_receives_the_results() {
    let mut e = env();
    e.cfg.callback.max_attempts = 5;
    e.cfg.callback_token = Some("callback-token".into());
    let server = start(&e.cfg).await;
    let c = client(&server);
    let gw = gateway(gw_config(&server, "node-a")).await;
    let sink = callback_sink(vec![500, 503]).await;
    let mut t = task("cb-flaky", 4);
    t["callback_url"] = json!(format!("http://{}/done", sink.addr));
    c.submit(&t).await.unwrap();
    finished(&c, "cb-flaky", Duration::from_secs(10)).await;
    until("three callback attempts", Duration::from_secs(10), || {
        sink.bodies.lock().unwrap().len() == 3
    })
    .await;
    let body = sink.bodies.lock().unwrap()[2].clone();
    let view: TaskView = serde_json::from_value(body).unwrap();
    assert_completed(&view, 4);
    assert_eq!(view.group_id, "group-cb-flaky");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let cb = c.task("cb-flaky").await.unwrap().callback;
        if cb.state == CallbackState::Delivered {
            assert_eq!(cb.attempts, 3);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{cb:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_arrive_in_order() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let mut stream = EventStream::connect(&server.url(), TOKEN, "task_id=ev")
        .await
        .unwrap();
    let gw = gateway(gw_config(&server, "node-a")).await;
    c.submit(&task("ev", 2)).await.unwrap();
    let mut events = Vec::new();
    let collect = async {
        while let Some(n) = stream.next().await {
            let last = matches!(&n.event, Event::Task { status, .. } if status.is_finished());
            events.push(n);
            if last {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), collect)
        .await
        .unwrap();
    let ids: Vec<u64> = events.iter().map(|n| n.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(matches!(
        &events[0].event,
        Event::Task {
            status: TaskStatus::Queued,
            ..
        }
    ));
    for sid in ["ev-s0", "ev-s1"] {
        let states: Vec<SessionKind> = events
            .iter()
            .filter_map(|n| match &n.event {
                Event::Session {
                    session_id, state, ..
                } if session_id == sid => Some(state.kind()),
                _ => None,
            })
            .collect();
        assert_eq!(
            states,
            [
                SessionKind::Dispatched,
                SessionKind::Running,
                SessionKind::Done
            ],
            "{sid}"
        );
    }
    // A client that reconnects with Last-Event-ID gets what it missed.
    let mut again = EventStream::connect(&server.url(), TOKEN, &format!("after={}", ids[0]))
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), again.next())
        .await
        .unwrap()
        .unwrap();
    assert!(next.id > ids[0]);
    gw.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_token_speaks_for_its_own_node_only() {
    let e = env();
    let server = start(&e.cfg).await;
    let a = RolloutClient::new(server.url(), Some(node_token("node-a")));
    let b = RolloutClient::new(server.url(), Some(node_token("node-b")));
    let reg = json!({"node_id": "node-a", "address": "http://127.0.0.1:9", "instance": "i",
                     "capacity": {"max_sessions": 1}})
    .to_string()
    .into_bytes();
    let hb = br#"{"active": 0}"#.to_vec();
    let result = br#"{"node_id": "node-a", "attempt": 1, "status": "completed"}"#.to_vec();
    let progress = br#"{"node_id": "node-a", "attempt": 1, "stage": "running"}"#.to_vec();
    let forbidden: [(&str, Vec<u8>); 5] = [
        ("/v1/nodes/register", reg.clone()),
        ("/v1/nodes/node-a/heartbeat", hb.clone()),
        ("/v1/nodes/node-a/drain", b"{}".to_vec()),
        ("/v1/sessions/t-s0/result", result),
        ("/v1/sessions/t-s0/state", progress),
    ];
    for (path, body) in forbidden {
        let (code, body) = b.raw(Method::POST, path, Some(body)).await.unwrap();
        assert_eq!(code, StatusCode::FORBIDDEN, "{path}: {body:?}");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "forbidden", "{path}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("belongs to node \"node-b\""),
            "{v}"
        );
    }
    // Its own token works; a trainer may drain any node.
    let (code, _) = a
        .raw(Method::POST, "/v1/nodes/register", Some(reg))
        .await
        .unwrap();
    assert_eq!(code, StatusCode::OK);
    let (code, _) = a
        .raw(Method::POST, "/v1/nodes/node-a/heartbeat", Some(hb))
        .await
        .unwrap();
    assert_eq!(code, StatusCode::OK);
    let (code, _) = client(&server)
        .raw(Method::POST, "/v1/nodes/node-a/drain", Some(b"{}".to_vec()))
        .await
        .unwrap();
    assert_eq!(code, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_tokens_are_refused_at_start_and_rotated_ones_take_effect() {
    let e = env();
    let mut bad = e.cfg.clone();
    bad.node_tokens.insert("node-a".into(), TOKEN.into());
    let err = RolloutServer::start(bad.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("rollout.node_tokens.node-a: the same token as rollout.tokens[0]"),
        "{err}"
    );
    let server = start(&e.cfg).await;
    let mut next = e.cfg.clone();
    next.tokens = vec!["trainer-token-rotated".into()];
    next.node_tokens
        .insert("node-a".into(), "node-a-token-rotated".into());
    server.set_tokens(&next).unwrap();
    let old = client(&server);
    let new = RolloutClient::new(server.url(), Some("trainer-token-rotated".into()));
    assert_eq!(
        old.tasks(None).await.unwrap_err().status(),
        Some(StatusCode::UNAUTHORIZED)
    );
    new.tasks(None).await.unwrap();
    let reg = json!({"node_id": "node-a", "address": "http://127.0.0.1:9", "instance": "i",
                     "capacity": {"max_sessions": 1}})
    .to_string()
    .into_bytes();
    for (token, want) in [
        (node_token("node-a"), StatusCode::UNAUTHORIZED),
        ("node-a-token-rotated".to_owned(), StatusCode::OK),
    ] {
        let c = RolloutClient::new(server.url(), Some(token));
        let (code, _) = c
            .raw(Method::POST, "/v1/nodes/register", Some(reg.clone()))
            .await
            .unwrap();
        assert_eq!(code, want);
    }
    // Tokens that break the rules are not put in force.
    assert!(server.set_tokens(&bad).is_err());
    new.tasks(None).await.unwrap();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_tasks_are_deleted_on_request_and_after_the_retention() {
    let mut e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let delete = |id: &str| {
        let c = c.clone();
        let path = format!("/v1/tasks/{id}");
        async move { c.raw(Method::DELETE, &path, None).await.unwrap() }
    };
    assert_eq!(delete("nope").await.0, StatusCode::NOT_FOUND);
    c.submit(&task("d1", 2)).await.unwrap();
    let (code, body) = delete("d1").await;
    assert_eq!(code, StatusCode::CONFLICT, "{body:?}");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "task_not_finished");
    c.cancel("d1").await.unwrap();
    assert_eq!(delete("d1").await.0, StatusCode::OK);
    assert_eq!(
        c.task("d1").await.unwrap_err().status(),
        Some(StatusCode::NOT_FOUND)
    );
    // The same id may be submitted again.
    c.submit(&task("d1", 1)).await.unwrap();
    c.cancel("d1").await.unwrap();
    server.shutdown().await;

    // With a retention, finished tasks go by themselves; live ones stay.
    e.cfg.retention = Some(Duration::from_secs(1));
    let server = start(&e.cfg).await;
    let c = client(&server);
    c.submit(&task("live", 1)).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c.task("d1").await.is_ok() {
        assert!(std::time::Instant::now() < deadline, "d1 not expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(c.task("live").await.unwrap().status, TaskStatus::Queued);
    server.shutdown().await;
    // Gone from the database too.
    let conn = rusqlite::Connection::open(&e.cfg.database).unwrap();
    let n: u32 = conn
        .query_row(
            "SELECT count(*) FROM sessions WHERE task_id = 'd1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_sessions_are_forgotten_by_the_gateway_and_expired_by_the_server() {
    let mut e = env();
    e.cfg.retention = Some(Duration::from_secs(1));
    let server = start(&e.cfg).await;
    let c = client(&server);
    let mut g = gw_config(&server, "node-a");
    g.max_sessions = 8;
    g.session_time = Duration::from_millis(5);
    let gw = gateway(g).await;
    for t in 0..4 {
        c.submit(&task(&format!("f{t}"), 25)).await.unwrap();
    }
    for t in 0..4 {
        assert_completed(
            &finished(&c, &format!("f{t}"), Duration::from_secs(60)).await,
            25,
        );
    }
    // Every result was taken: the node keeps nothing of any session.
    until("the results acknowledged", Duration::from_secs(30), || {
        gw.reported() == 100 && gw.remembered() == 0
    })
    .await;
    assert_eq!(gw.holding(), 0);
    // Past the retention the server holds no task and no session.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let st = c.status().await.unwrap();
        if st.tasks.values().sum::<u64>() == 0 && st.sessions.values().sum::<u64>() == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.shutdown().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_server_drained_takes_sessions_again_once_the_drain_is_lifted() {
    let e = env();
    let server = start(&e.cfg).await;
    let c = client(&server);
    let gw = gateway(gw_config(&server, "node-a")).await;
    let node_says = |draining: bool| {
        let c = c.clone();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let nodes = c.nodes().await.unwrap().nodes;
                if nodes
                    .iter()
                    .any(|n| n.node_id == "node-a" && n.last_heartbeat.draining == draining)
                {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the node's heartbeat never said draining = {draining}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let reply = c.drain("node-a", true).await.unwrap();
    assert!(reply.draining && reply.node_id == "node-a", "{reply:?}");
    node_says(true).await;
    c.drain("node-a", false).await.unwrap();
    node_says(false).await;
    c.submit(&task("after-drain", 2)).await.unwrap();
    let v = finished(&c, "after-drain", Duration::from_secs(10)).await;
    assert_completed(&v, 2);
    gw.stop().await;
    server.shutdown().await;
}
