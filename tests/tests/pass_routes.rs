//! Pass routes bound to their names (root only): a sandbox reaches a pass
//! route's "remote" servers (on loopback addresses such as 127.10.0.1)
//! through the names the route allows, and nothing else on the route's
//! ports: the same name sent (as `Host` or SNI) to a node-local service on
//! 127.0.0.1 or to a "metadata" server on 127.10.0.9 is refused and logged
//! with the session and the dialled address, and those servers never see
//! a connection. The agent resolves names with the node's resolver: the
//! test runs it in a mount namespace of its own whose `/etc/hosts` names
//! the remote servers, so nothing of the machine changes.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, ensure};
use polar_tests::servers::{Banner, EchoUpstream, RemoteTls};
use polar_tests::{Finished, json_lines, polar_bin, sandbox_tempdir, write_config};

/// Runs `polar sandbox run --config CONFIG -- bash -c SCRIPT` in a mount
/// namespace of its own where `hosts` is `/etc/hosts`.
fn sandbox_run_with_hosts(hosts: &std::path::Path, config: &str, script: &str) -> Result<Finished> {
    let output = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount --bind \"$0\" /etc/hosts && exec \"$@\"")
        .arg(hosts)
        .arg(polar_bin()?)
        .args(["--log-format", "json", "sandbox", "run", "--config", config])
        .args(["--", "bash", "-c", script])
        .stdin(Stdio::null())
        .output()
        .context("running polar under unshare")?;
    Ok(Finished {
        events: json_lines(&output.stderr),
        reports: json_lines(&output.stdout),
        output,
    })
}

/// `label|exit|output` lines of the script.
fn lines(run: &Finished) -> BTreeMap<String, (i32, String)> {
    String::from_utf8_lossy(&run.output.stdout)
        .lines()
        .filter_map(|l| {
            let mut p = l.splitn(3, '|');
            let (label, code, rest) = (p.next()?, p.next()?, p.next()?);
            Some((
                label.to_owned(),
                (code.parse().unwrap_or(-1), rest.to_owned()),
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_pass_route_relays_only_to_what_its_name_resolves_to() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    // The remotes the routes allow.
    let a = EchoUpstream::start("127.10.0.1:0", "remote-a").await?;
    let b = EchoUpstream::start("127.10.0.2:0", "remote-b").await?;
    let listed = EchoUpstream::start("127.10.0.3:0", "remote-listed").await?;
    let tls = RemoteTls::start("127.10.0.1:0", "allowed.polar.test", "remote-tls-token").await?;
    // What no route allows: a node-local service and a "metadata" server,
    // on one port.
    let forbidden = Banner::start(&["127.0.0.1", "127.10.0.9"])?;
    let hosts = tmp.path().join("hosts");
    std::fs::write(
        &hosts,
        "127.0.0.1 localhost\n127.10.0.1 allowed.polar.test\n127.10.0.2 b.wild.polar.test\n",
    )?;
    let pem = tmp.path().join("remote.pem");
    std::fs::write(&pem, &tls.cert_pem)?;
    std::fs::set_permissions(&pem, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    let ports = [
        a.addr.port(),
        b.addr.port(),
        listed.addr.port(),
        tls.addr.port(),
        forbidden.port,
    ]
    .map(|p| p.to_string())
    .join(", ");
    let cfg = write_config(
        tmp.path(),
        &format!(
            "[[route]]\nhost = \"allowed.polar.test\"\nports = [{ports}]\naction = \"pass\"\n\n\
             [[route]]\nhost = \"*.wild.polar.test\"\nports = [{ports}]\naction = \"pass\"\n\n\
             [[route]]\nhost = \"listed.polar.test\"\nports = [{ports}]\naction = \"pass\"\n\
             addresses = [\"127.10.0.3\"]\n"
        ),
    )?;
    let (pa, pb, pl, pt, pf) = (
        a.addr.port(),
        b.addr.port(),
        listed.addr.port(),
        tls.addr.port(),
        forbidden.port,
    );
    // The sandbox's /tmp is its own: the certificate is read from the
    // test's directory (bound nowhere), so it is passed inline.
    let pem_text = tls.cert_pem.replace('\n', "\\n");
    let script = format!(
        r#"
r() {{ label=$1; shift; out=$("$@" 2>&1); code=$?; echo "$label|$code|$(echo "$out" | tr '\n' ' ')"; }}
printf '%b' '{pem_text}' > /tmp/remote.pem
c() {{ curl -sS --max-time 20 "$@"; }}
r by_name c http://allowed.polar.test:{pa}/by-name
r wildcard c http://b.wild.polar.test:{pb}/wildcard
r listed c --resolve listed.polar.test:{pl}:127.10.0.3 http://listed.polar.test:{pl}/listed
r tls c --cacert /tmp/remote.pem https://allowed.polar.test:{pt}/
r name_to_local c --resolve allowed.polar.test:{pf}:127.0.0.1 http://allowed.polar.test:{pf}/
r name_to_metadata c --resolve allowed.polar.test:{pf}:127.10.0.9 http://allowed.polar.test:{pf}/
r wildcard_to_metadata c --resolve b.wild.polar.test:{pf}:127.10.0.9 http://b.wild.polar.test:{pf}/
r unresolved_wildcard c --resolve c.wild.polar.test:{pb}:127.10.0.2 http://c.wild.polar.test:{pb}/
r listed_to_metadata c --resolve listed.polar.test:{pf}:127.10.0.9 http://listed.polar.test:{pf}/
r sni_to_metadata c -k --resolve allowed.polar.test:{pf}:127.10.0.9 https://allowed.polar.test:{pf}/
"#
    );
    let run = sandbox_run_with_hosts(&hosts, &cfg.display().to_string(), &script)?;
    let out = lines(&run);
    let get = |k: &str| {
        out.get(k)
            .cloned()
            .with_context(|| format!("no {k} line: {out:?}\n{}", run.stderr()))
    };
    for (label, want) in [
        ("by_name", "\"upstream\":\"remote-a\""),
        ("wildcard", "\"upstream\":\"remote-b\""),
        ("listed", "\"upstream\":\"remote-listed\""),
        ("tls", "remote-tls-token"),
    ] {
        let (code, text) = get(label)?;
        ensure!(
            code == 0 && text.contains(want),
            "{label}: {code} {text}\n{}",
            run.stderr()
        );
    }
    // Plain HTTP refused with the agent's 403; TLS closed.
    for label in [
        "name_to_local",
        "name_to_metadata",
        "wildcard_to_metadata",
        "unresolved_wildcard",
        "listed_to_metadata",
    ] {
        let (code, text) = get(label)?;
        ensure!(
            code == 0 && text.contains("polar: this address is not one the route's name allows"),
            "{label} was not refused: {code} {text}"
        );
    }
    let (code, text) = get("sni_to_metadata")?;
    ensure!(code != 0, "sni_to_metadata reached something: {text}");
    ensure!(
        forbidden.accepted() == 0,
        "a forbidden server was reached {} times",
        forbidden.accepted()
    );
    ensure!(
        a.received().iter().all(|r| r.path == "/by-name"),
        "{:?}",
        a.received()
    );
    // Each refusal logged with the session and the dialled address.
    let refused = run.events("connection refused");
    for dst in ["127.0.0.1", "127.10.0.9", "127.10.0.2"] {
        ensure!(
            refused.iter().any(|e| {
                e["orig_dst"]
                    .as_str()
                    .is_some_and(|o| o.starts_with(&format!("{dst}:")))
                    && e["session"].as_str().is_some_and(|s| s != "-")
                    && e["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("not one the route's name resolves to"))
            }),
            "no refusal of {dst} logged: {refused:?}"
        );
    }
    ensure!(
        refused.len() == 6,
        "{} refusals: {refused:?}",
        refused.len()
    );
    let done = run.events("sandbox finished");
    let fin = done.first().context("no summary")?;
    ensure!(fin["passed"] == 4 && fin["denied"] == 6, "{fin}");
    Ok(())
}
