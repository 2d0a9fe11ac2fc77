//! The dashboard's side of the server: its embedded files (no token, this
//! origin only), read-only tokens, the endpoints the pages read (whoami,
//! one sample, its exported trajectory beneath the export roots only,
//! mean rewards in task lists, paused state and policy version in node
//! views), and pause/resume forwarded to a node for trainer tokens only.

use std::path::Path;
use std::time::Duration;

use http::{Method, Request, header};
use http_body_util::{BodyExt, Full};
use serde_json::Map;

use super::routes::{api, call};
use super::*;
use polar_gateway::sim::{SimOutcome, default_outcome};

const VIEWER: &str = "viewer-token-1";

fn env_with_viewer() -> Env {
    let mut e = env();
    e.cfg.viewer_tokens = vec![VIEWER.into()];
    e
}

async fn get(api: &crate::server::Api, uri: &str, token: Option<&str>) -> http::Response<Vec<u8>> {
    let mut req = Request::builder().method(Method::GET).uri(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = api
        .handle(req.body(Full::new(bytes::Bytes::new())).unwrap())
        .await;
    let (parts, body) = resp.into_parts();
    http::Response::from_parts(parts, body.collect().await.unwrap().to_bytes().to_vec())
}

#[tokio::test]
async fn the_dashboard_files_are_served_without_a_token_from_this_origin_only() {
    let e = env();
    let api = api(&e);
    for uri in ["/ui", "/ui/", "/ui/index.html"] {
        let r = get(&api, uri, None).await;
        assert_eq!(r.status(), StatusCode::OK, "{uri}");
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        let html = String::from_utf8(r.body().clone()).unwrap();
        assert!(
            html.contains(r#"<script type="module" src="/ui/app.js">"#),
            "{html}"
        );
    }
    for name in crate::ui::assets_names() {
        let r = get(&api, &format!("/ui/{name}"), None).await;
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        let h = r.headers();
        assert_eq!(h[header::CACHE_CONTROL], "no-cache");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
            "{csp}"
        );
        if name.ends_with(".js") {
            assert_eq!(h[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        }
        // Nothing is fetched from elsewhere, and the token never goes in a URL.
        let text = String::from_utf8(r.body().clone()).unwrap();
        for banned in [
            "http://",
            "https://",
            "//cdn",
            "?token=",
            "localStorage",
            "innerHTML",
            "eval(",
        ] {
            assert!(!text.contains(banned), "{name} contains {banned:?}");
        }
    }
    let r = get(&api, "/ui/nope.js", None).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = get(&api, "/ui/../v1/status", None).await;
    assert_ne!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_viewer_token_reads_everything_and_changes_nothing() {
    let e = env_with_viewer();
    let api = api(&e);
    let who = call(&api, Method::GET, "/v1/whoami", Some(VIEWER), "").await;
    assert_eq!(who.status, StatusCode::OK);
    assert_eq!(who.json["role"], "viewer");
    assert_eq!(who.json["may_control"], false);
    let who = call(&api, Method::GET, "/v1/whoami", Some(TOKEN), "").await;
    assert_eq!(
        (who.json["role"].as_str(), who.json["may_control"].as_bool()),
        (Some("trainer"), Some(true))
    );
    for uri in ["/v1/status", "/v1/tasks", "/v1/nodes", "/metrics"] {
        let r = get(&api, uri, Some(VIEWER)).await;
        assert_eq!(r.status(), StatusCode::OK, "{uri}");
    }
    let submit = task("t1", 1).to_string();
    let r = call(&api, Method::POST, "/v1/tasks", Some(VIEWER), &submit).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.json["error"]["code"], "forbidden");
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("read-only"),
        "{}",
        r.json
    );
    // The task exists (a trainer submits it); the viewer may read, not cancel or delete it.
    assert_eq!(
        call(&api, Method::POST, "/v1/tasks", Some(TOKEN), &submit)
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        get(&api, "/v1/tasks/t1", Some(VIEWER)).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        get(&api, "/v1/tasks/t1/samples/0", Some(VIEWER))
            .await
            .status(),
        StatusCode::OK
    );
    for (m, uri) in [
        (Method::POST, "/v1/tasks/t1/cancel"),
        (Method::DELETE, "/v1/tasks/t1"),
        (Method::POST, "/v1/nodes/node-a/drain"),
        (Method::POST, "/v1/nodes/node-a/pause"),
        (Method::POST, "/v1/nodes/node-a/resume"),
    ] {
        let r = call(&api, m.clone(), uri, Some(VIEWER), "{}").await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{m} {uri}: {}", r.json);
    }
    let r = get(&api, "/v1/tasks/t1", None).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // A viewer token is no node's.
    let r = call(&api, Method::POST, "/v1/nodes/register", Some(VIEWER), "{}").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[test]
fn a_viewer_token_must_be_its_own() {
    let mut e = env();
    e.cfg.viewer_tokens = vec![TOKEN.into()];
    let err = e.cfg.check_identities().unwrap_err().to_string();
    assert!(
        err.starts_with("rollout.viewer_tokens[0]: the same token as rollout.tokens[0]"),
        "{err}"
    );
    e.cfg.viewer_tokens = vec!["short".into()];
    assert!(e.cfg.check_identities().is_err());
    let text = "[rollout]\nviewer_tokens = [\"viewer-token-1\"]\n[rollout.dashboard]\n\
                export_roots = [\"/srv/x\"]\nmax_file_bytes = 4096\n";
    let cfg = RolloutConfig::from_toml(text, None).unwrap();
    assert_eq!(cfg.token_sources.viewer_tokens, ["viewer-token-1"]);
    assert_eq!(cfg.dashboard.export_roots, [Path::new("/srv/x")]);
    assert_eq!(cfg.dashboard.max_file_bytes, 4096);
    let e = RolloutConfig::from_toml("[rollout.dashboard]\nexport_roots = [\"x\"]\n", None)
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("rollout.dashboard.export_roots[0]: x: must be absolute"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_and_their_exported_trajectories_are_read_beneath_the_roots_only() {
    let mut e = env_with_viewer();
    let root = e.dir.path().join("exports");
    std::fs::create_dir_all(root.join("task=t1")).unwrap();
    let file = root.join("task=t1/t1-s0.jsonl");
    std::fs::write(&file, format!("{}\n", export_line("t1-s0", "t1"))).unwrap();
    // Outside the roots: never read, even though it exists.
    let outside = e.dir.path().join("outside.jsonl");
    std::fs::write(&outside, format!("{}\n", export_line("t1-s1", "t1"))).unwrap();
    e.cfg.dashboard.export_roots = vec![root.clone()];
    let server = start(&e.cfg).await;
    let mut g = gw_config(&server, "node-a");
    let (inside, out) = (file.display().to_string(), outside.display().to_string());
    g.outcome = Arc::new(move |a| {
        let mut stats = Map::new();
        stats.insert(
            "calls".into(),
            json!([{"call_id": "c0", "seq": 0, "api": "openai_chat", "model": "m",
                    "received_ms": 1000, "first_token_ms": 1010, "finished_ms": 1050,
                    "finish_reason": "tool_calls", "prompt_tokens": 3, "response_tokens": 2,
                    "status": "completed", "retry_of": null}]),
        );
        SimOutcome {
            trajectory_uri: match a.sample_index {
                0 => Some(inside.clone()),
                1 => Some(out.clone()),
                _ => Some("s3://bucket/t1-s2.parquet".into()),
            },
            stats,
            ..default_outcome(a)
        }
    });
    let gw = gateway(g).await;
    let c = client(&server);
    c.submit(&task("t1", 3)).await.unwrap();
    let v = finished(&c, "t1", Duration::from_secs(30)).await;
    assert_completed(&v, 3);
    // Mean reward (1, 1/2, 1/3) in the list.
    let list = c.raw(Method::GET, "/v1/tasks", None).await.unwrap();
    let list: Value = serde_json::from_slice(&list.1).unwrap();
    let mean = list["tasks"][0]["mean_reward"].as_f64().unwrap();
    assert!(
        (mean - (1.0 + 0.5 + 1.0 / 3.0) / 3.0).abs() < 1e-9,
        "{mean}"
    );
    let viewer = RolloutClient::new(server.url(), Some(VIEWER.into()));
    let read = |path: String| {
        let viewer = viewer.clone();
        async move {
            let (code, body) = viewer.raw(Method::GET, &path, None).await.unwrap();
            (code, serde_json::from_slice::<Value>(&body).unwrap())
        }
    };
    let (code, s) = read("/v1/tasks/t1/samples/0".into()).await;
    assert_eq!(code, StatusCode::OK, "{s}");
    assert_eq!(s["session_id"], "t1-s0");
    assert_eq!(s["group_id"], "group-t1");
    assert_eq!(s["policy_version"], "v7");
    assert_eq!(s["state"], "done");
    assert_eq!(s["result"]["stats"]["calls"][0]["first_token_ms"], 1010);
    let (code, t) = read("/v1/tasks/t1/samples/0/trajectory".into()).await;
    assert_eq!(code, StatusCode::OK, "{t}");
    assert_eq!(t["format"], "jsonl");
    assert_eq!(t["uri"], file.display().to_string());
    assert_eq!(t["rows"].as_array().unwrap().len(), 1);
    assert_eq!(t["rows"][0]["loss_mask"], json!([1, 1, 0, 0, 1, 1]));
    assert!(
        t["token_text"]["reason"]
            .as_str()
            .unwrap()
            .contains("set [rollout.dashboard] tokenizer"),
        "{t}"
    );
    assert_eq!(t["token_text"].get("pieces"), None);
    assert_eq!(
        t["rows"][0]["trace_metadata"]["spans"][1]["join"]["kind"],
        "extend"
    );
    let (code, t) = read("/v1/tasks/t1/samples/1/trajectory".into()).await;
    assert_eq!(
        (code, t["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_readable")),
        "{t}"
    );
    assert!(
        t["error"]["message"]
            .as_str()
            .unwrap()
            .contains("outside [rollout.dashboard] export_roots"),
        "{t}"
    );
    let (code, t) = read("/v1/tasks/t1/samples/2/trajectory".into()).await;
    assert_eq!(
        (code, t["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_readable")),
        "{t}"
    );
    assert!(
        t["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this server reads no s3:// export"),
        "{t}"
    );
    for (path, want) in [
        ("/v1/tasks/t1/samples/3", StatusCode::NOT_FOUND),
        ("/v1/tasks/nope/samples/0", StatusCode::NOT_FOUND),
        ("/v1/tasks/t1/samples/x", StatusCode::BAD_REQUEST),
        (
            "/v1/tasks/t1/samples/-1/trajectory",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (code, body) = read(path.into()).await;
        assert_eq!(code, want, "{path}: {body}");
    }
    // A file over the size limit is refused, not read.
    drop(gw);
    server.shutdown().await;
    e.cfg.dashboard.max_file_bytes = 1024;
    std::fs::write(&file, format!("{}\n", export_line("t1-s0", "t1")).repeat(4)).unwrap();
    let server = start(&e.cfg).await;
    let viewer = RolloutClient::new(server.url(), Some(VIEWER.into()));
    let (code, body) = viewer
        .raw(Method::GET, "/v1/tasks/t1/samples/0/trajectory", None)
        .await
        .unwrap();
    assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE, "{body:?}");
}

/// The `s3://` URIs a node may report that are refused before anything is
/// sent (the store here is a loopback port nothing listens on, so a URI
/// that passed would fail as a store error, 502); the real read, and an
/// object over the size limit, are tested against moto in
/// polar-agent/tests/export/dashboard_s3.rs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_exports_outside_the_s3_roots_are_refused_unfetched() {
    let mut e = env_with_viewer();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let text = format!(
        "[rollout.dashboard]\ns3_roots = [\"s3://rollouts/runs\"]\n\
         [rollout.dashboard.s3]\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\n"
    );
    e.cfg.dashboard = RolloutConfig::from_toml(&text, None).unwrap().dashboard;
    // Credentials given here, not taken from the environment: without any,
    // the client would ask the cloud's instance metadata address.
    let s3 = polar_export::S3Options {
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        ..e.cfg.dashboard.s3.clone()
    };
    e.cfg
        .dashboard
        .set_s3_roots(&["s3://rollouts/runs".to_owned()], s3)
        .unwrap();
    let uris = [
        "s3://rollouts/other/t1-s0.jsonl",
        "s3://rollouts/runs/../secret/t1-s1.jsonl",
        "s3://elsewhere/runs/t1-s2.jsonl",
        "s3://rollouts/runsX/t1-s3.jsonl",
        "s3://rollouts/runs//t1-s4.jsonl",
        "s3://rollouts/runs/t1-s5.csv",
        "s3://rollouts/runs/task=t1/t1-s6.jsonl",
    ];
    let server = start(&e.cfg).await;
    let mut g = gw_config(&server, "node-a");
    g.outcome = Arc::new(move |a| SimOutcome {
        trajectory_uri: Some(uris[a.sample_index as usize].to_owned()),
        ..default_outcome(a)
    });
    let gw = gateway(g).await;
    let c = client(&server);
    c.submit(&task("t1", 7)).await.unwrap();
    let v = finished(&c, "t1", Duration::from_secs(30)).await;
    assert_completed(&v, 7);
    let viewer = RolloutClient::new(server.url(), Some(VIEWER.into()));
    for (i, want_code, want_status, want) in [
        (
            0,
            "not_readable",
            StatusCode::NOT_FOUND,
            "outside [rollout.dashboard] s3_roots",
        ),
        (
            1,
            "not_readable",
            StatusCode::NOT_FOUND,
            "a `..` segment in the key",
        ),
        (
            2,
            "not_readable",
            StatusCode::NOT_FOUND,
            "outside [rollout.dashboard] s3_roots",
        ),
        (
            3,
            "not_readable",
            StatusCode::NOT_FOUND,
            "outside [rollout.dashboard] s3_roots",
        ),
        (
            4,
            "not_readable",
            StatusCode::NOT_FOUND,
            "an empty segment in the key",
        ),
        (
            5,
            "not_readable",
            StatusCode::NOT_FOUND,
            "not a .parquet or .jsonl",
        ),
        (
            6,
            "export_store",
            StatusCode::BAD_GATEWAY,
            "the object store failed",
        ),
    ] {
        let (code, body) = viewer
            .raw(
                Method::GET,
                &format!("/v1/tasks/t1/samples/{i}/trajectory"),
                None,
            )
            .await
            .unwrap();
        let t: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (code, t["error"]["code"].as_str()),
            (want_status, Some(want_code)),
            "{i}: {t}"
        );
        let msg = t["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{i}: {msg}");
    }
    drop(gw);
    server.shutdown().await;
    // Bad roots stop the start, naming the key.
    for (text, key) in [
        (
            "s3_roots = [\"s3://rollouts/a/../b\"]",
            "rollout.dashboard.s3_roots[0]",
        ),
        ("s3_roots = [\"/srv/x\"]", "rollout.dashboard.s3_roots[0]"),
        (
            "[rollout.dashboard.s3]\nendpoint = \"ftp://x\"",
            "rollout.dashboard.s3.endpoint",
        ),
    ] {
        let e = RolloutConfig::from_toml(&format!("[rollout.dashboard]\n{text}\n"), None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(key), "{text}: {e}");
    }
    let e = RolloutConfig::from_toml("[rollout.dashboard.s3]\naccess_key_id = \"k\"\n", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("access_key_id"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_reach_the_node_and_its_heartbeats_say_so() {
    let e = env_with_viewer();
    let server = start(&e.cfg).await;
    let gw = gateway(gw_config(&server, "node-a")).await;
    let c = client(&server);
    let node = |c: RolloutClient| async move {
        let (_, b) = c.raw(Method::GET, "/v1/nodes", None).await.unwrap();
        let v: Value = serde_json::from_slice(&b).unwrap();
        v["nodes"][0]["last_heartbeat"].clone()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while node(c.clone()).await.is_null() {
        assert!(Instant::now() < deadline, "node-a never heartbeat");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, body) = c
        .raw(Method::POST, "/v1/nodes/node-a/pause", Some(b"{}".to_vec()))
        .await
        .unwrap();
    assert_eq!(code, StatusCode::OK, "{body:?}");
    loop {
        let hb = node(c.clone()).await;
        if hb["paused"] == true {
            assert_eq!(hb.get("policy_version"), None, "{hb}");
            break;
        }
        assert!(Instant::now() < deadline, "the pause never showed: {hb}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, _) = c
        .raw(
            Method::POST,
            "/v1/nodes/node-a/resume",
            Some(br#"{"policy_version": "w-43"}"#.to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(code, StatusCode::OK);
    loop {
        let hb = node(c.clone()).await;
        if hb.get("paused").is_none() && hb["policy_version"] == "w-43" {
            break;
        }
        assert!(Instant::now() < deadline, "the resume never showed: {hb}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The node refuses a bad body; an unknown node is a 404.
    let (code, body) = c
        .raw(
            Method::POST,
            "/v1/nodes/node-a/resume",
            Some(br#"{"policy_version": 3}"#.to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(code, StatusCode::BAD_GATEWAY, "{body:?}");
    let (code, _) = c
        .raw(Method::POST, "/v1/nodes/node-z/pause", Some(b"{}".to_vec()))
        .await
        .unwrap();
    assert_eq!(code, StatusCode::NOT_FOUND);
    drop(gw);
}

/// A byte-level tokenizer.json (GPT-2 / Qwen style) holding some of
/// `export_line`'s ids: 1 " Hello", 2 a line break, 3 the first two bytes
/// of "€", 10 "<|im_end|>" (special), 11 "world"; the others are not in it.
const TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,
    "added_tokens":[{"id":10,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
    "normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
    "post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
    "model":{"type":"WordLevel","vocab":{"ĠHello":1,"Ċ":2,"âĤ":3,"<|im_end|>":10,"world":11,"a":12},"unk_token":"a"}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trajectory_carries_each_ids_text_from_the_configured_tokenizer() {
    let mut e = env_with_viewer();
    let root = e.dir.path().join("exports");
    std::fs::create_dir_all(root.join("task=t1")).unwrap();
    let file = root.join("task=t1/t1-s0.jsonl");
    std::fs::write(&file, format!("{}\n", export_line("t1-s0", "t1"))).unwrap();
    let tok = e.dir.path().join("tokenizer.json");
    std::fs::write(&tok, TOKENIZER).unwrap();
    let text = format!(
        "[rollout.dashboard]\nexport_roots = [\"{}\"]\ntokenizer = \"{}\"\n",
        root.display(),
        tok.display()
    );
    e.cfg.dashboard = RolloutConfig::from_toml(&text, None).unwrap().dashboard;
    let server = start(&e.cfg).await;
    let mut g = gw_config(&server, "node-a");
    let inside = file.display().to_string();
    g.outcome = Arc::new(move |a| SimOutcome {
        trajectory_uri: Some(inside.clone()),
        ..default_outcome(a)
    });
    let gw = gateway(g).await;
    let c = client(&server);
    c.submit(&task("t1", 1)).await.unwrap();
    let v = finished(&c, "t1", Duration::from_secs(30)).await;
    assert_completed(&v, 1);
    let viewer = RolloutClient::new(server.url(), Some(VIEWER.into()));
    let (code, body) = viewer
        .raw(Method::GET, "/v1/tasks/t1/samples/0/trajectory", None)
        .await
        .unwrap();
    let t: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(code, StatusCode::OK, "{t}");
    // Every distinct id of the trace, once: prompt [1, 2, 3], response
    // [10, 11, 20, 21, 12, 13].
    assert_eq!(
        t["token_text"],
        json!({
            "tokenizer": "tokenizer.json",
            "pieces": {
                "1": {"text": " Hello"},
                "2": {"text": "\n"},
                "3": {"parts": [{"bytes": [0xE2, 0x82]}]},
                "10": {"text": "<|im_end|>", "special": true},
                "11": {"text": "world"},
                "12": {"text": "a"},
                "13": {"unknown": true},
                "20": {"unknown": true},
                "21": {"unknown": true},
            },
        })
    );
    drop(gw);
    server.shutdown().await;
}

#[tokio::test]
async fn a_missing_relative_or_broken_tokenizer_stops_the_start() {
    let e = RolloutConfig::from_toml(
        "[rollout.dashboard]\ntokenizer = \"tokenizer.json\"\n",
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("rollout.dashboard.tokenizer: tokenizer.json: must be absolute"),
        "{e}"
    );
    let env = env();
    let refused = |path: std::path::PathBuf| {
        let mut cfg = env.cfg.clone();
        let text = format!("[rollout.dashboard]\ntokenizer = \"{}\"\n", path.display());
        cfg.dashboard = RolloutConfig::from_toml(&text, None).unwrap().dashboard;
        async move {
            crate::RolloutServer::start(cfg)
                .await
                .map(|_| ())
                .unwrap_err()
                .to_string()
        }
    };
    let e = refused(env.dir.path().join("missing.json")).await;
    assert!(
        e.starts_with("rollout.dashboard.tokenizer: ") && e.contains("missing.json"),
        "{e}"
    );
    let broken = env.dir.path().join("broken.json");
    std::fs::write(&broken, "{\"model\": {\"type\": \"BPE\"}}").unwrap();
    let e = refused(broken).await;
    assert!(e.contains("not a Hugging Face tokenizer.json"), "{e}");
    // Nothing was opened: the database is not there.
    assert!(!env.cfg.database.exists());
}
