//! Hostile input against the interception proxy keeps it serving others:
//! random bytes, a truncated ClientHello, headers sent a byte at a time, a
//! body over the limit (413 in the API's error shape), HTTP/2 rapid reset,
//! and 10,000 half-open connections. The proxy runs in-process on a
//! loopback listener taking direct connections (no redirect, no root).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use polar_tests::proxy::ProxyHarness;
use polar_tests::servers::EchoUpstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Harness {
    proxy: ProxyHarness,
    _upstream: EchoUpstream,
}

impl Harness {
    async fn start() -> Result<Self> {
        let upstream = EchoUpstream::start("127.0.0.1:0", "echo").await?;
        let proxy = ProxyHarness::start(&format!(
            r#"
[proxy]
header_timeout_ms = 1000
max_body_bytes = 1024
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
        Ok(Self {
            proxy,
            _upstream: upstream,
        })
    }

    async fn tls(&self, host: &str) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.proxy.addr).await?;
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
        Ok(self.proxy.tls.connect(name, tcp).await?)
    }

    /// A POST over TLS with HTTP/1.1; returns status and body.
    async fn post(
        &self,
        host: &str,
        path: &str,
        body: Vec<u8>,
        chunked: bool,
    ) -> Result<(u16, String)> {
        let io = TokioIo::new(self.tls(host).await?);
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        let mut req = http::Request::post(path)
            .header("host", host)
            .header("content-type", "application/json");
        if !chunked {
            req = req.header("content-length", body.len());
        }
        let body = if chunked {
            // A streamed body without Content-Length.
            let chunks: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = body
                .chunks(256)
                .map(|c| Ok(hyper::body::Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            http_body_util::StreamBody::new(futures_lite_stream(chunks)).boxed()
        } else {
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed()
        };
        let resp = send.send_request(req.body(body)?).await?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    async fn still_serving(&self) -> Result<()> {
        let (status, body) = self
            .post("api.anthropic.com", "/v1/messages", b"{}".to_vec(), false)
            .await?;
        ensure!(
            status == 200 && body.contains("\"upstream\":\"echo\""),
            "{status} {body}"
        );
        Ok(())
    }
}

/// A stream over a vector of frames.
fn futures_lite_stream<T: Unpin>(items: Vec<T>) -> impl futures_core::Stream<Item = T> {
    struct Iter<T>(std::vec::IntoIter<T>);
    impl<T: Unpin> futures_core::Stream for Iter<T> {
        type Item = T;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<T>> {
            std::task::Poll::Ready(self.0.next())
        }
    }
    Iter(items.into_iter())
}

/// Reads until the peer closes; errors if it stays open past `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Result<()> {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline.into(), stream.read(&mut buf)).await {
            Err(_) => bail!("still open after {within:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(()),
            Ok(Ok(_)) => {}
        }
    }
}

/// The first bytes of a real ClientHello for `host`.
fn client_hello(host: &str) -> Result<Vec<u8>> {
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let mut conn = rustls::ClientConnection::new(
        Arc::new(cfg),
        rustls::pki_types::ServerName::try_from(host.to_owned())?,
    )?;
    let mut out = Vec::new();
    conn.write_tls(&mut out)?;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_truncated_hellos_are_dropped_and_others_served() -> Result<()> {
    let h = Harness::start().await?;
    h.still_serving().await?;
    let mut seed = 0x2545_f491_u32;
    let garbage: Vec<u8> = (0..4096)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as u8
        })
        .collect();
    let mut g = TcpStream::connect(h.proxy.addr).await?;
    g.write_all(&garbage).await?;
    closed_within(&mut g, Duration::from_secs(10))
        .await
        .context("garbage")?;
    let hello = client_hello("api.anthropic.com")?;
    let mut t = TcpStream::connect(h.proxy.addr).await?;
    t.write_all(&hello[..hello.len() / 2]).await?;
    closed_within(&mut t, Duration::from_secs(10))
        .await
        .context("truncated hello")?;
    h.still_serving().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_sent_a_byte_at_a_time_are_cut_by_the_header_timeout() -> Result<()> {
    let h = Harness::start().await?;
    let mut s = TcpStream::connect(h.proxy.addr).await?;
    s.write_all(b"POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n")
        .await?;
    // 40 more header bytes, one every 250 ms: 10 s if nobody stops us.
    let started = Instant::now();
    let mut cut = false;
    for b in b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" {
        if s.write_all(&[*b]).await.is_err() {
            cut = true;
            break;
        }
        let mut probe = [0u8; 512];
        match tokio::time::timeout(Duration::from_millis(250), s.read(&mut probe)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                cut = true;
                break;
            }
            _ => {}
        }
    }
    ensure!(
        cut,
        "the slow client was never cut off ({:?})",
        started.elapsed()
    );
    h.still_serving().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_limit_get_413_in_the_apis_error_shape() -> Result<()> {
    let h = Harness::start().await?;
    let big = vec![b' '; 4096];
    let (status, body) = h
        .post("api.anthropic.com", "/v1/messages", big.clone(), false)
        .await?;
    ensure!(status == 413, "{status} {body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(
        v["type"] == "error" && v["error"]["type"].is_string(),
        "not Anthropic's shape: {body}"
    );
    let (status, body) = h
        .post("api.openai.com", "/v1/chat/completions", big.clone(), true)
        .await?;
    ensure!(status == 413, "chunked: {status} {body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(
        v["error"]["message"].is_string(),
        "not OpenAI's shape: {body}"
    );
    h.still_serving().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_rapid_reset_does_not_take_the_proxy_down() -> Result<()> {
    let h = Harness::start().await?;
    let tls = h.tls("api.anthropic.com").await?;
    ensure!(
        tls.get_ref().1.alpn_protocol() == Some(b"h2"),
        "no h2 negotiated"
    );
    let (mut client, conn) = h2::client::handshake(tls).await?;
    let conn = tokio::spawn(conn);
    let mut sent = 0u32;
    for _ in 0..5000 {
        let req = http::Request::post("https://api.anthropic.com/v1/messages").body(())?;
        let Ok(ready) = client.clone().ready().await else {
            break;
        };
        client = ready;
        match client.send_request(req, false) {
            Ok((_resp, mut stream)) => {
                stream.send_reset(h2::Reason::CANCEL);
                sent += 1;
            }
            Err(_) => break,
        }
    }
    // The server may have sent GOAWAY; the connection ends either way.
    let _ = tokio::time::timeout(Duration::from_secs(10), conn).await;
    ensure!(sent > 0);
    h.still_serving().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_half_open_connections_do_not_lock_others_out() -> Result<()> {
    // The clients live in another process (each side needs 10,000 sockets).
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let h = Harness::start().await?;
    let mut holder = tokio::process::Command::new(env!("CARGO_BIN_EXE_polar-probe"))
        .args(["hold", &h.proxy.addr.to_string(), "10000"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut out = tokio::io::BufReader::new(holder.stdout.take().context("stdout")?);
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(120),
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line),
    )
    .await??;
    let report: serde_json::Value = serde_json::from_str(&line)?;
    ensure!(report["held"] == 10_000, "{report}");
    h.still_serving().await?;
    let accepted = h
        .proxy
        .parts
        .proxy
        .stats
        .connections
        .load(std::sync::atomic::Ordering::Relaxed);
    ensure!(
        accepted >= 10_000,
        "only {accepted} connections reached the proxy"
    );
    drop(holder.stdin.take());
    let _ = tokio::time::timeout(Duration::from_secs(30), holder.wait()).await;
    h.still_serving().await
}
