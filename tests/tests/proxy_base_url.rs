//! Base-URL mode on the host listener: the model pipeline reached directly
//! over HTTP by a harness configured with a base URL. The session is proven
//! by its secret key (an API key or `x-polar-key`); `x-polar-session` may
//! confirm it but is no proof alone. Requests without a valid key are
//! refused with 401, those whose header names another session than their
//! key's with 403, in the API's error shape.

use std::sync::Arc;

use anyhow::{Result, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use polar_proxy::base_url;
use polar_tests::proxy::ProxyHarness;
use polar_tests::servers::EchoUpstream;

async fn post(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, serde_json::Value)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let mut req = http::Request::post(path)
        .header("host", "polar")
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = send
        .send_request(req.body(Full::new(Bytes::from_static(b"{}")))?)
        .await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&body)?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_come_from_the_header_or_key_and_unknown_ones_are_refused() -> Result<()> {
    let upstream = EchoUpstream::start("127.0.0.1:0", "echo").await?;
    let harness = ProxyHarness::start(&format!(
        r#"
[[route]]
host = "api.anthropic.com"
action = "model"
provider = "anthropic"
upstream = "{u}"
[[route]]
host = "api.openai.com"
action = "model"
provider = "openai"
upstream = "{u}"
"#,
        u = upstream.url()
    ))
    .await?;
    let parts = &harness.parts;
    parts
        .sessions
        .register(&"s-known".parse()?, Some("polar-key-known"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let tasks = &harness.tasks;
    tasks.spawn(base_url::serve(
        listener,
        Arc::clone(&parts.sessions),
        parts.rules.clone(),
        parts.proxy.pipeline(),
        parts.proxy.limits(),
        Arc::clone(parts.proxy.shares()),
        Arc::clone(&parts.proxy.stats),
        tasks.clone(),
    ));
    parts
        .sessions
        .register(&"s-other".parse()?, Some("polar-key-other"));
    let (s, b) = post(
        addr,
        "/v1/messages",
        &[
            ("x-polar-session", "s-known"),
            ("x-polar-key", "polar-key-known"),
        ],
    )
    .await?;
    ensure!(s == 200 && b["upstream"] == "echo", "{s} {b}");
    let (s, b) = post(
        addr,
        "/v1/chat/completions",
        &[("authorization", "Bearer polar-key-known")],
    )
    .await?;
    ensure!(s == 200 && b["path"] == "/v1/chat/completions", "{s} {b}");
    let (s, b) = post(addr, "/v1/messages", &[("x-api-key", "polar-key-known")]).await?;
    ensure!(s == 200, "{s} {b}");
    // Unknown sessions, and known ones named without their key: 401, in
    // the shape of the API that was called.
    for named in ["s-unknown", "s-known"] {
        let (s, b) = post(addr, "/v1/messages", &[("x-polar-session", named)]).await?;
        ensure!(
            s == 401 && b["type"] == "error" && b["error"]["message"].is_string(),
            "{named}: {s} {b}"
        );
    }
    // A key with a header naming another session: 403, counted.
    let (s, b) = post(
        addr,
        "/v1/messages",
        &[
            ("x-polar-session", "s-other"),
            ("x-api-key", "polar-key-known"),
        ],
    )
    .await?;
    ensure!(s == 403 && b["type"] == "error", "{s} {b}");
    ensure!(
        parts
            .proxy
            .stats
            .session_mismatch_header
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    );
    let (s, b) = post(
        addr,
        "/v1/chat/completions",
        &[("x-api-key", "not-a-session-key")],
    )
    .await?;
    ensure!(s == 401 && b["error"]["message"].is_string(), "{s} {b}");
    let (s, b) = post(addr, "/v1beta/models/gemini-pro:generateContent", &[]).await?;
    ensure!(s == 401 && b["error"]["status"].is_string(), "{s} {b}");
    ensure!(
        upstream.received().len() == 3,
        "refused requests reached the upstream"
    );
    Ok(())
}
