//! What `polar status` and `polar submit` say when they cannot work,
//! through the real binary against a rollout server on loopback: the
//! server not running (the URL and where it came from, exit 5), `https://`
//! to a plain server (which side speaks what, exit 5), a token refused
//! (the token the endpoint needs and what the one given is, exit 4), a
//! task with no usable sample is covered by gateway_e2e. Messages are
//! plain lines on a stderr that is not a terminal.

use std::process::{Command, Output};

use anyhow::{Result, ensure};
use polar_rollout::{RolloutConfig, RolloutServer};
use polar_tests::polar_bin;

const TOKEN: &str = "client-errors-trainer-token";

fn polar(args: &[&str]) -> Result<Output> {
    Ok(Command::new(polar_bin()?)
        .args(args)
        .env_remove("POLAR_ROLLOUT_URL")
        .env_remove("POLAR_ROLLOUT_TOKEN")
        .output()?)
}

/// Its one error line (no colour codes), and the exit code.
fn failure(out: &Output) -> Result<(String, Option<i32>)> {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        !stderr.contains('\u{1b}'),
        "colour codes on a pipe: {stderr:?}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    ensure!(lines.len() == 1, "one line expected: {stderr}");
    // Plain: no time stamp, no module path.
    ensure!(
        lines[0].starts_with("ERROR ") && !lines[0].contains("polar_agent::"),
        "a plain error line expected: {stderr}"
    );
    Ok((lines[0].to_owned(), out.status.code()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_plain_and_refused_servers_say_what_to_do() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut cfg = RolloutConfig::new(dir.path().join("rollout.sqlite"), TOKEN);
    cfg.listen = ([127, 0, 0, 1], port).into();
    cfg.gateway_token = "client-errors-gateway-token".into();
    cfg.node_tokens = [("node-x".to_owned(), "client-errors-node-token".to_owned())]
        .into_iter()
        .collect();
    let server = RolloutServer::start(cfg).await?;
    let url = format!("http://127.0.0.1:{port}");

    // Nothing listens there.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let dead_url = format!("http://{dead}");
    let (line, code) = failure(&polar(&[
        "status", "--server", &dead_url, "--token", TOKEN,
    ])?)?;
    ensure!(code == Some(5), "{code:?} {line}");
    ensure!(
        line.contains(&format!("cannot reach the rollout server at {dead_url}/v1/status ("))
            && line.contains("Connection refused")
            && line.ends_with(&format!(
                "Is it running and listening at {dead_url}? The URL comes from --server or POLAR_ROLLOUT_URL (default http://127.0.0.1:7070)."
            )),
        "{line}"
    );

    // https:// to a plain server.
    let https = format!("https://127.0.0.1:{port}");
    let (line, code) = failure(&polar(&["status", "--server", &https, "--token", TOKEN])?)?;
    ensure!(code == Some(5), "{code:?} {line}");
    ensure!(
        line.contains("The server speaks plain HTTP, not HTTPS: use an http:// URL (or give the server [rollout.tls])."),
        "{line}"
    );

    // A token the server does not take, and none.
    let (line, code) = failure(&polar(&[
        "status",
        "--server",
        &url,
        "--token",
        "not-a-token-x",
    ])?)?;
    ensure!(code == Some(4), "{code:?} {line}");
    ensure!(
        line.ends_with(&format!(
            "the rollout server at {url} refused the token: this endpoint needs a trainer token (rollout.tokens, POLAR_ROLLOUT_TOKEN), or a viewer token for GET; the token presented is not a token this server accepts. The token comes from --token or POLAR_ROLLOUT_TOKEN."
        )),
        "{line}"
    );
    ensure!(!line.contains("not-a-token-x"), "{line}");
    let (line, code) = failure(&polar(&["status", "--server", &url])?)?;
    ensure!(code == Some(4), "{code:?} {line}");
    ensure!(
        line.contains("; no bearer token was presented (Authorization: Bearer TOKEN)."),
        "{line}"
    );

    // The right token: works.
    let out = polar(&["status", "--server", &url, "--token", TOKEN])?;
    ensure!(out.status.success(), "{out:?}");
    server.shutdown().await;
    Ok(())
}
