//! The route table and [`Api::handle`] without sockets: every route to its
//! endpoint and side, 404, 405 with `Allow`, percent-encoded path segments
//! and query values, repeated and unknown query keys.

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Full};

use super::*;
use crate::core::Core;
use crate::server::{Api, Endpoint, Role, routes};
use polar_rollout_api::route::Found;

#[test]
fn every_route_has_its_endpoint_side_and_allow() {
    let t = routes().unwrap();
    let table: [(Method, &str, Endpoint, Role, &str); 23] = [
        (Method::GET, "/health", Endpoint::Health, Role::Open, "GET"),
        (Method::GET, "/ui", Endpoint::Ui, Role::Open, "GET"),
        (Method::GET, "/ui/", Endpoint::Ui, Role::Open, "GET"),
        (Method::GET, "/ui/app.js", Endpoint::Ui, Role::Open, "GET"),
        (
            Method::GET,
            "/v1/whoami",
            Endpoint::WhoAmI,
            Role::Client,
            "GET",
        ),
        (
            Method::GET,
            "/v1/tasks/t1/samples/3",
            Endpoint::Sample,
            Role::Client,
            "GET",
        ),
        (
            Method::GET,
            "/v1/tasks/t1/samples/3/trajectory",
            Endpoint::Trajectory,
            Role::Client,
            "GET",
        ),
        (
            Method::POST,
            "/v1/nodes/n1/pause",
            Endpoint::Pause,
            Role::Client,
            "POST",
        ),
        (
            Method::POST,
            "/v1/nodes/n1/resume",
            Endpoint::Resume,
            Role::Client,
            "POST",
        ),
        (
            Method::GET,
            "/metrics",
            Endpoint::Metrics,
            Role::Client,
            "GET",
        ),
        (
            Method::GET,
            "/v1/status",
            Endpoint::Status,
            Role::Client,
            "GET",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Endpoint::Submit,
            Role::Client,
            "POST, GET",
        ),
        (
            Method::GET,
            "/v1/tasks",
            Endpoint::List,
            Role::Client,
            "POST, GET",
        ),
        (
            Method::GET,
            "/v1/tasks/t1",
            Endpoint::Task,
            Role::Client,
            "GET, DELETE",
        ),
        (
            Method::DELETE,
            "/v1/tasks/t1",
            Endpoint::Delete,
            Role::Client,
            "GET, DELETE",
        ),
        (
            Method::POST,
            "/v1/tasks/t1/cancel",
            Endpoint::Cancel,
            Role::Client,
            "POST",
        ),
        (
            Method::GET,
            "/v1/events",
            Endpoint::Events,
            Role::Client,
            "GET",
        ),
        (Method::GET, "/v1/nodes", Endpoint::Nodes, Role::Any, "GET"),
        (
            Method::POST,
            "/v1/nodes/register",
            Endpoint::Register,
            Role::Node,
            "POST",
        ),
        (
            Method::POST,
            "/v1/nodes/n1/heartbeat",
            Endpoint::Heartbeat,
            Role::Node,
            "POST",
        ),
        (
            Method::POST,
            "/v1/nodes/n1/drain",
            Endpoint::Drain,
            Role::Any,
            "POST",
        ),
        (
            Method::POST,
            "/v1/sessions/t1-s0/state",
            Endpoint::Progress,
            Role::Node,
            "POST",
        ),
        (
            Method::POST,
            "/v1/sessions/t1-s0/result",
            Endpoint::Result,
            Role::Node,
            "POST",
        ),
    ];
    for (m, path, want, role, allow) in table {
        let Found::Endpoint { endpoint, data, .. } = t.find(&m, path) else {
            panic!("{m} {path}: no endpoint");
        };
        assert_eq!((endpoint, *data), (want, role), "{m} {path}");
        let Found::WrongMethod { data, allow: got } = t.find(&Method::PATCH, path) else {
            panic!("PATCH {path}: not a 405");
        };
        assert_eq!((*data, got.to_str().unwrap()), (role, allow), "{path}");
    }
    // A node named like a static segment still has its heartbeat.
    let Found::Endpoint {
        endpoint, params, ..
    } = t.find(&Method::POST, "/v1/nodes/register/heartbeat")
    else {
        panic!("no heartbeat route");
    };
    assert_eq!(endpoint, Endpoint::Heartbeat);
    assert_eq!(params.get("id"), Some("register"));
    // Unknown paths: the gateways' under /v1/sessions, nobody's elsewhere.
    for path in ["/v1/sessions", "/v1/sessions/x", "/v1/sessions/x/y/z"] {
        assert!(
            matches!(
                t.find(&Method::POST, path),
                Found::NotFound {
                    data: Some(Role::Node)
                }
            ),
            "{path}"
        );
    }
    for path in ["/", "/v1", "/v1/tasks/t1/x", "/v1/nodes/n1", "/v2/tasks"] {
        assert!(
            matches!(t.find(&Method::GET, path), Found::NotFound { data: None }),
            "{path}"
        );
    }
}

/// A server's API over a fresh database, no socket and no background loop.
pub(super) fn api(e: &Env) -> Api {
    let (core, _) = Core::open(e.cfg.clone(), polar_io::tls::default_client_config()).unwrap();
    Api::new(core, routes().unwrap())
}

pub(super) async fn call(
    api: &Api,
    m: Method,
    uri: &str,
    token: Option<&str>,
    body: &str,
) -> Reply {
    let mut req = Request::builder().method(m).uri(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let resp = api.handle(req).await;
    let status = resp.status();
    let allow = resp
        .headers()
        .get(header::ALLOW)
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        allow,
        json,
    }
}

pub(super) struct Reply {
    pub status: StatusCode,
    pub allow: Option<String>,
    pub json: Value,
}

#[tokio::test]
async fn not_found_and_method_not_allowed_in_the_error_shape() {
    let e = env();
    let api = api(&e);
    let r = call(&api, Method::GET, "/health", None, "").await;
    assert_eq!(r.status, StatusCode::OK);
    let r = call(&api, Method::GET, "/nope", Some(TOKEN), "").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        r.json,
        json!({"error": {"code": "not_found", "message": "no route /nope"}})
    );
    assert_eq!(r.allow, None);
    let r = call(&api, Method::DELETE, "/v1/tasks", Some(TOKEN), "").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.allow.as_deref(), Some("POST, GET"));
    assert_eq!(
        r.json,
        json!({"error": {"code": "method_not_allowed", "message": "method not allowed"}})
    );
    // Was a 404 before the route table.
    let r = call(
        &api,
        Method::GET,
        "/v1/nodes/register",
        Some(NODE_TOKEN),
        "",
    )
    .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.allow.as_deref(), Some("POST"));
    // The token of the path's side comes first, 405 or not.
    let r = call(&api, Method::DELETE, "/v1/tasks", None, "").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = call(&api, Method::POST, "/health", None, "").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    // Unknown paths under /v1/sessions are the gateways'.
    let r = call(&api, Method::POST, "/v1/sessions/x/y", Some(TOKEN), "{}").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = call(
        &api,
        Method::POST,
        "/v1/sessions/x/y",
        Some(NODE_TOKEN),
        "{}",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // Known route, unknown session: the scheduler's 404.
    let r = call(
        &api,
        Method::POST,
        "/v1/sessions/nope-s0/state",
        Some(NODE_TOKEN),
        r#"{"node_id": "node-a", "attempt": 1, "stage": "running"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json["error"]["code"], "not_found");
}

#[tokio::test]
async fn path_segments_and_query_values_are_percent_decoded() {
    let e = env();
    let api = api(&e);
    let r = call(
        &api,
        Method::POST,
        "/v1/tasks",
        Some(TOKEN),
        &task("t-1", 2).to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.json);
    // `%2D` is `-`; a trailing slash does not count.
    for uri in ["/v1/tasks/t%2D1", "/v1/tasks/t-1/"] {
        let r = call(&api, Method::GET, uri, Some(TOKEN), "").await;
        assert_eq!(r.status, StatusCode::OK, "{uri}");
        assert_eq!(r.json["task_id"], "t-1", "{uri}");
    }
    let r = call(&api, Method::GET, "/v1/tasks/t%2D2", Some(TOKEN), "").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json["error"]["message"], "unknown task \"t-2\"");
    let listed = |r: &Reply| -> Vec<String> {
        r.json["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["task_id"].as_str().unwrap().to_owned())
            .collect()
    };
    for (query, want) in [
        // Decoded value.
        ("status=qu%65ued", vec!["t-1"]),
        // The first of repeated keys wins.
        ("status=queued&status=running", vec!["t-1"]),
        ("status=running&status=queued", vec![]),
        // Unknown keys are ignored; an empty status is no filter.
        ("bogus=1&status=", vec!["t-1"]),
        ("limit=0", vec![]),
    ] {
        let r = call(
            &api,
            Method::GET,
            &format!("/v1/tasks?{query}"),
            Some(TOKEN),
            "",
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{query}: {}", r.json);
        assert_eq!(listed(&r), want, "{query}");
    }
    // `+` is a space in a query: not a status.
    let r = call(
        &api,
        Method::GET,
        "/v1/tasks?status=queued+",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json["error"]["field"], "status");
    let r = call(&api, Method::GET, "/v1/tasks?limit", Some(TOKEN), "").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json["error"]["field"], "limit");
    // A cancel through an encoded id.
    let r = call(
        &api,
        Method::POST,
        "/v1/tasks/t%2d1/cancel",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.json);
    assert_eq!(r.json["status"], "cancelled");
}

/// A raw call to a gateway: status, `Allow`, JSON body.
async fn to_gateway(
    base: &str,
    m: Method,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> Reply {
    let mut req = Request::builder().method(m).uri(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req.body(Full::new(Bytes::from(body))).unwrap();
    let resp = polar_rollout_api::http::default_client()
        .request(req)
        .await
        .unwrap();
    let status = resp.status();
    let allow = resp
        .headers()
        .get(header::ALLOW)
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        allow,
        json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_answers_404_405_and_takes_encoded_session_ids() {
    let e = env();
    let server = start(&e.cfg).await;
    let mut g = gw_config(&server, "node-r");
    g.session_time = Duration::from_secs(60);
    let gw = gateway(g).await;
    let base = gw.address().to_owned();
    let tok = Some(GATEWAY_TOKEN);
    // /healthz needs no token, under its own method only.
    let r = to_gateway(&base, Method::GET, "/healthz", None, vec![]).await;
    assert_eq!((r.status, r.json), (StatusCode::OK, json!({"ok": true})));
    let r = to_gateway(&base, Method::POST, "/healthz", None, vec![]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = to_gateway(&base, Method::POST, "/healthz", tok, vec![]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.allow.as_deref(), Some("GET"));
    // Known paths under another method were 404s before the route table.
    let r = to_gateway(&base, Method::GET, "/v1/sessions", tok, vec![]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.allow.as_deref(), Some("POST"));
    assert_eq!(
        r.json,
        json!({"error": {"code": "method_not_allowed", "message": "method not allowed"}})
    );
    let r = to_gateway(&base, Method::GET, "/v1/nope", tok, vec![]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        r.json,
        json!({"error": {"code": "not_found", "message": "no route"}})
    );
    // The assignment route reads the body.
    let r = to_gateway(&base, Method::POST, "/v1/sessions/", tok, b"{}".to_vec()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json["error"]["code"], "invalid_request");
    // A session the server dispatched here, cancelled through an encoded id.
    client(&server).submit(&task("enc", 1)).await.unwrap();
    until("node-r holds the session", Duration::from_secs(5), || {
        gw.holding() == 1
    })
    .await;
    let cancel = br#"{"attempt": 1, "reason": "test"}"#.to_vec();
    let r = to_gateway(
        &base,
        Method::POST,
        "/v1/sessions/other/cancel",
        tok,
        cancel.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json["error"]["message"], "no such session here");
    let r = to_gateway(
        &base,
        Method::POST,
        "/v1/sessions/enc%2Ds0/cancel",
        tok,
        cancel,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.json);
    assert_eq!(gw.cancelled(), ["enc-s0"]);
    gw.stop().await;
    server.shutdown().await;
}
