//! The forwarding stage's upstream connections: the requests of one
//! HTTP/1.1 downstream connection reuse one upstream connection, each
//! downstream connection has its own, an upstream that closes its idle
//! connection is reconnected to without losing a request, and HTTP/2
//! downstream connections are served through the shared pool.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Result, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use polar_tests::proxy::{ProxyHarness, trusting};
use polar_tests::servers::EchoUpstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn config(upstream: &str) -> String {
    format!(
        r#"
[[route]]
host = "api.anthropic.com"
action = "model"
provider = "anthropic"
upstream = "{upstream}"
"#
    )
}

/// An HTTP/1.1 connection to the proxy over TLS offering `alpn`.
async fn connect_h1(harness: &ProxyHarness) -> Result<SendRequest<Full<Bytes>>> {
    let tls = trusting(&std::fs::read(harness.ca_file())?, &[b"http/1.1"])?;
    let tcp = TcpStream::connect(harness.addr).await?;
    let name = rustls::pki_types::ServerName::try_from("api.anthropic.com")?;
    let (send, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls.connect(name, tcp).await?)).await?;
    tokio::spawn(conn);
    Ok(send)
}

fn request(body: &'static str) -> Result<http::Request<Full<Bytes>>> {
    Ok(http::Request::post("/v1/messages")
        .header("host", "api.anthropic.com")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))?)
}

async fn send(s: &mut SendRequest<Full<Bytes>>, body: &'static str) -> Result<(u16, Bytes)> {
    s.ready().await?;
    let resp = s.send_request(request(body)?).await?;
    let status = resp.status().as_u16();
    Ok((status, resp.into_body().collect().await?.to_bytes()))
}

/// Upstream connections accepted so far, counted by a TCP forwarder in
/// front of `target`.
async fn counting_front(target: SocketAddr) -> Result<(SocketAddr, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((mut down, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut up) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                }
            });
        }
    });
    Ok((addr, count))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_connection_keeps_one_upstream_connection_of_its_own() -> Result<()> {
    let upstream = EchoUpstream::start("127.0.0.1:0", "echo").await?;
    let (front, opened) = counting_front(upstream.addr).await?;
    let harness = ProxyHarness::start(&config(&format!("http://{front}"))).await?;
    let (mut a, mut b) = (connect_h1(&harness).await?, connect_h1(&harness).await?);
    for _ in 0..5 {
        let (s, body) = send(&mut a, r#"{"n":1}"#).await?;
        ensure!(s == 200, "{s} {body:?}");
        let (s, body) = send(&mut b, r#"{"n":2}"#).await?;
        ensure!(s == 200, "{s} {body:?}");
    }
    ensure!(upstream.received().len() == 10, "{:?}", upstream.received());
    let n = opened.load(Ordering::SeqCst);
    ensure!(n == 2, "{n} upstream connections for two downstream ones");
    Ok(())
}

/// An upstream that answers one request per connection, then closes it
/// (as one whose idle timeout passed would).
async fn one_shot_upstream() -> Result<(SocketAddr, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let served = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&served);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let s = Arc::clone(&s);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Headers, then the body by its length.
                loop {
                    let Ok(n) = conn.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                s.fetch_add(1, Ordering::SeqCst);
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok((addr, served))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_closing_its_idle_connection_is_reconnected_to() -> Result<()> {
    let (addr, served) = one_shot_upstream().await?;
    let harness = ProxyHarness::start(&config(&format!("http://{addr}"))).await?;
    let mut a = connect_h1(&harness).await?;
    for i in 0..4 {
        let (s, body) = send(&mut a, "{}").await?;
        ensure!(s == 200 && &body[..] == b"ok", "request {i}: {s} {body:?}");
        // Let the proxy see the upstream's close before the next request.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(served.load(Ordering::SeqCst) == 4);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_requests_are_forwarded_through_the_shared_pool() -> Result<()> {
    let upstream = EchoUpstream::start("127.0.0.1:0", "echo").await?;
    let harness = ProxyHarness::start(&config(&upstream.url())).await?;
    let tls = trusting(&std::fs::read(harness.ca_file())?, &[b"h2"])?;
    let tcp = TcpStream::connect(harness.addr).await?;
    let name = rustls::pki_types::ServerName::try_from("api.anthropic.com")?;
    let io = TokioIo::new(tls.connect(name, tcp).await?);
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
    tokio::spawn(conn);
    let mut joins = Vec::new();
    for _ in 0..8 {
        let mut send = send.clone();
        joins.push(tokio::spawn(async move {
            send.ready().await?;
            let req = http::Request::post("https://api.anthropic.com/v1/messages")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(b"{}")))?;
            let resp = send.send_request(req).await?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        }));
    }
    for j in joins {
        let (s, body) = j.await??;
        ensure!(s == 200, "{s} {body:?}");
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        ensure!(v["upstream"] == "echo", "{v}");
    }
    ensure!(upstream.received().len() == 8);
    Ok(())
}
