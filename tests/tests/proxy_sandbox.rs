//! The interception proxy end to end (root only): unmodified clients in a
//! sandbox (curl over HTTP/1.1 and HTTP/2, Python `urllib`, Node `fetch`)
//! call hard-coded HTTPS endpoints, trust Polar's CA inside the sandbox only,
//! and are answered by the upstream their route names; a `pass` host is
//! relayed untouched to a "remote" TLS server with its own certificate; a
//! denied host fails on the client's side; the host's trust store is never
//! touched; a CA key readable by others stops the agent from starting.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use polar_tests::servers::{EchoUpstream, RemoteTls};
use polar_tests::{polar_bin, sandbox_run, sha256};

const HOST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

fn config(
    dir: &Path,
    anthropic: &EchoUpstream,
    openai: &EchoUpstream,
    pass_port: u16,
) -> Result<String> {
    let path = dir.join("polar.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[agent]
state_dir = "{state}"

[proxy]
header_timeout_ms = 5000

[[route]]
host = "api.anthropic.com"
action = "model"
provider = "anthropic"
upstream = "{a}"

[[route]]
host = "api.openai.com"
action = "model"
provider = "openai"
upstream = "{o}"

[[route]]
host = "pass.example"
ports = [{pass_port}]
action = "pass"
# The name does not resolve on the node: the remote's address is listed.
addresses = ["127.10.0.5"]
"#,
            state = dir.join("state").display(),
            a = anthropic.url(),
            o = openai.url(),
        ),
    )?;
    Ok(path.display().to_string())
}

/// Exit code and output of each labelled command.
type Lines = BTreeMap<String, (i32, String)>;

/// Runs `script` in a sandbox; every line it prints as `label|exit|output`
/// becomes an entry.
fn run_script(config: &str, script: &str) -> Result<(Lines, polar_tests::Finished)> {
    let run = sandbox_run(&["--config", config], &["bash", "-c", script])?;
    let stdout = String::from_utf8_lossy(&run.output.stdout).into_owned();
    let mut out = BTreeMap::new();
    for line in stdout.lines() {
        let mut parts = line.splitn(3, '|');
        if let (Some(label), Some(code), Some(rest)) = (parts.next(), parts.next(), parts.next()) {
            out.insert(
                label.to_owned(),
                (code.parse().unwrap_or(-1), rest.to_owned()),
            );
        }
    }
    Ok((out, run))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn unmodified_clients_reach_their_upstreams_pass_hosts_relay_and_denied_hosts_fail()
-> Result<()> {
    // The sandbox user passes through it: bubblewrap binds the session's
    // directories from the state directory below it.
    let tmp = polar_tests::sandbox_tempdir()?;
    let anthropic = EchoUpstream::start("127.0.0.1:0", "anthropic-upstream").await?;
    let openai = EchoUpstream::start("127.0.0.1:0", "openai-upstream").await?;
    let remote = RemoteTls::start("127.10.0.5:0", "pass.example", "remote-token-7").await?;
    // Written by the script into the sandbox's own /tmp: nothing of the
    // host's temporary directories is in its view.
    let pem_text = remote.cert_pem.trim();
    let cfg = config(tmp.path(), &anthropic, &openai, remote.addr.port())?;
    let host_bundle_before = sha256(std::path::Path::new(HOST_BUNDLE))?;
    let port = remote.addr.port();
    let script = format!(
        r#"
r() {{ label=$1; shift; out=$("$@" 2>&1); code=$?; echo "$label|$code|$(echo "$out" | tr '\n' ' ')"; }}
printf '%s\n' '{pem_text}' > /tmp/remote.pem
r curl_h1_anthropic curl -sS --http1.1 --max-time 20 https://api.anthropic.com/v1/messages -H 'content-type: application/json' -d '{{"model":"m","max_tokens":5,"messages":[]}}'
r curl_h2_openai curl -sS --http2 --max-time 20 -w ' http_version=%{{http_version}}' https://api.openai.com/v1/chat/completions -d '{{"model":"m","messages":[]}}'
r python_anthropic python3 -c 'import urllib.request; r=urllib.request.urlopen(urllib.request.Request("https://api.anthropic.com/v1/messages", data=b"{{}}", headers={{"content-type":"application/json"}}), timeout=20); print(r.read().decode())'
r node_openai node -e 'fetch("https://api.openai.com/v1/chat/completions",{{method:"POST",body:"{{}}",headers:{{"content-type":"application/json"}}}}).then(r=>r.text()).then(t=>console.log(t)).catch(e=>{{console.log(String(e.cause||e));process.exit(3)}})'
r pass curl -sS --max-time 20 --cacert /tmp/remote.pem --resolve pass.example:{port}:127.10.0.5 https://pass.example:{port}/
r denied_name curl -sS --max-time 20 https://denied.example/
r denied_addr curl -sS --max-time 20 --resolve denied.example:443:127.10.0.9 https://denied.example/
r bundle_inside grep -c 'BEGIN CERTIFICATE' {HOST_BUNDLE}
"#,
    );
    let ran = run_script(&cfg, &script);
    let (out, run) = ran?;
    let get = |k: &str| {
        out.get(k)
            .cloned()
            .with_context(|| format!("no {k} line: {out:?}\n{}", run.stderr()))
    };
    for (label, upstream) in [
        ("curl_h1_anthropic", "anthropic-upstream"),
        ("curl_h2_openai", "openai-upstream"),
        ("python_anthropic", "anthropic-upstream"),
        ("node_openai", "openai-upstream"),
    ] {
        let (code, text) = get(label)?;
        ensure!(
            code == 0,
            "{label} failed ({code}): {text}\n{}",
            run.stderr()
        );
        ensure!(
            text.contains(&format!("\"upstream\":\"{upstream}\"")),
            "{label}: {text}"
        );
    }
    ensure!(
        get("curl_h2_openai")?.1.contains("http_version=2"),
        "not HTTP/2: {:?}",
        get("curl_h2_openai")
    );
    let paths: Vec<String> = anthropic
        .received()
        .iter()
        .map(|r| r.path.clone())
        .collect();
    ensure!(
        paths.iter().all(|p| p == "/v1/messages") && paths.len() == 2,
        "{paths:?}"
    );
    let openai_paths: Vec<String> = openai.received().iter().map(|r| r.path.clone()).collect();
    ensure!(
        openai_paths.iter().all(|p| p == "/v1/chat/completions") && openai_paths.len() == 2,
        "{openai_paths:?}"
    );
    // Pass-through: the client validated the remote's own certificate and
    // got its answer; the proxy terminated no TLS for it.
    let (code, text) = get("pass")?;
    ensure!(
        code == 0 && text.contains("remote-token-7"),
        "pass: {code} {text}\n{}",
        run.stderr()
    );
    // Denied: no such name, and a refused connection to a denied address.
    let (code, text) = get("denied_name")?;
    ensure!(
        code == 6 && text.contains("Could not resolve host"),
        "denied name: {code} {text}"
    );
    let (code, text) = get("denied_addr")?;
    ensure!(code != 0, "denied address reached: {text}");
    ensure!(
        run.events("connection refused")
            .iter()
            .any(|e| e["action"] == "deny"),
        "no deny logged: {}",
        run.stderr()
    );
    // Counters: four TLS terminations for model calls, one relay, one refusal.
    let done = run.events("sandbox finished");
    let fin = done.first().context("no summary")?;
    ensure!(
        fin["tls_ok"] == 4 && fin["passed"] == 1 && fin["denied"] == 1,
        "{fin}"
    );
    // Trust only inside: the sandbox saw one more certificate than the host
    // has, and the host's bundle is unchanged.
    let host_count = std::fs::read_to_string(HOST_BUNDLE)?
        .matches("BEGIN CERTIFICATE")
        .count();
    let inside: usize = get("bundle_inside")?.1.trim().parse()?;
    ensure!(
        inside == host_count + 1,
        "inside {inside} vs host {host_count}"
    );
    ensure!(
        sha256(std::path::Path::new(HOST_BUNDLE))? == host_bundle_before,
        "the host's bundle changed"
    );
    let ca = std::fs::read_to_string(tmp.path().join("state/ca.crt"))?;
    ensure!(
        !std::fs::read_to_string(HOST_BUNDLE)?.contains(ca.trim()),
        "CA in the host store"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_ca_key_readable_by_others_stops_the_agent() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir()?;
    let state = tmp.path().join("state");
    let polar = polar_bin()?;
    let init = std::process::Command::new(&polar)
        .args(["ca", "init", "--state-dir"])
        .arg(&state)
        .output()?;
    ensure!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    ensure!(String::from_utf8_lossy(&init.stdout).contains("sha256:"));
    let key = state.join("ca.key");
    ensure!(std::fs::metadata(&key)?.permissions().mode() & 0o777 == 0o600);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644))?;
    let out = std::process::Command::new(&polar)
        .args(["sandbox", "run", "--state-dir"])
        .arg(&state)
        .args(["--", "true"])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(125), "{:?}: {stderr}", out.status);
    ensure!(stderr.contains("chmod 600"), "{stderr}");
    Ok(())
}
