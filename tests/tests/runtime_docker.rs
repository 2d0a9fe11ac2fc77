//! The `docker` runtime against a real engine (root only): the private
//! `dockerd` and the locally built image `cargo xtask test` provides
//! (`polar_tests::docker`; without them these tests fail, they never skip).
//!
//! - A session's steps run in a container that is hardened (the sandbox
//!   user, no capabilities, `no_new_privs`, Polar's seccomp filter, a
//!   read-only root, the limits), whose processes are in the session's
//!   cgroup v2 directory (so the redirect applies: a model call to the
//!   provider's real hostname over HTTPS is captured, token ids and all)
//!   and whose network namespace holds the agent's listener and DNS and
//!   reaches nothing else; afterwards no container, cgroup (v2 or the v1
//!   groups runc made) or network namespace is left.
//! - The budget kill ends the container with the session, and so does
//!   the guardian when the agent is SIGKILLed, leaving nothing behind.
//! - A spec mount that would show the engine's socket inside is refused.
//!
//! The six harness CLIs in containers are in `harness_e2e.rs`, the escape
//! attempts in `sandbox_escape.rs`.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use polar_capture::read_log;
use polar_mock::{self as mock, MockConfig};
use polar_tests::docker::{self, cgroups_at};
use polar_tests::servers::Banner;
use polar_tests::{
    Netns, Running, eventually, json_lines, sandbox_tempdir, session_run, write_config, write_file,
};
use serde_json::Value;

/// What the container is, as seen from inside, one JSON object; then a
/// model call over HTTPS to the provider's hostname (captured by the
/// agent), and a connection to a loopback port of the host (refused).
const PROBE: &str = r#"
import errno, json, os, socket, sys, urllib.request
def attempt(f):
    try:
        f(); return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
def listening(path):
    try:
        rows = open(path).read().splitlines()[1:]
    except OSError:
        return []
    return sorted({int(r.split()[1].split(":")[1], 16) for r in rows})
facts = {
    "uid": status["Uid"].split()[0],
    "cap_eff": status["CapEff"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(),
    "seccomp": status["Seccomp"].strip(),
    "cgroup": [l for l in open("/proc/self/cgroup").read().splitlines() if l.startswith("0::")][0],
    "pid1": open("/proc/1/comm").read().strip(),
    "write_root": attempt(lambda: open("/polar-escape", "w")),
    "write_usr": attempt(lambda: open("/usr/polar-escape", "w")),
    "write_tmp": attempt(lambda: open("/tmp/ok", "w").write("x")),
    "write_home": attempt(lambda: open(os.environ["HOME"] + "/ok", "w").write("x")),
    "engine_socket": os.path.exists("/var/run/docker.sock") or os.path.exists("/run/docker.sock"),
    "tcp_ports": listening("/proc/net/tcp") + listening("/proc/net/tcp6"),
    "udp_ports": listening("/proc/net/udp") + listening("/proc/net/udp6"),
    "interfaces": sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else None,
    "prepared": open("prepared.txt").read().strip(),
}
def host_port():
    c = socket.create_connection(("127.10.0.7", int(sys.argv[1])), timeout=5)
    c.settimeout(3)
    if c.recv(6) == b"BANNER":
        raise SystemExit("ESCAPE: reached the host's port")
facts["host_port"] = attempt(host_port)
req = urllib.request.Request("https://api.anthropic.com/v1/messages", method="POST",
    headers={"content-type": "application/json", "x-api-key": "dummy", "anthropic-version": "2023-06-01"},
    data=json.dumps({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}).encode())
facts["reply_type"] = json.loads(urllib.request.urlopen(req, timeout=30).read())["type"]
print(json.dumps(facts), flush=True)
"#;

/// The agent configuration: the engine, and the mock behind the
/// Anthropic route.
fn config(dir: &Path, engine: &docker::Engine, mock_url: &str) -> Result<String> {
    let body = format!(
        "[[backend]]\nname = \"mock\"\ndialect = \"vllm\"\nreplicas = [\"{mock_url}\"]\n\
         served_model = \"polar-mock\"\n\n[[route]]\nhost = \"api.anthropic.com\"\n\
         action = \"model\"\nprovider = \"anthropic\"\nbackend = \"mock\"\n\n{}",
        engine.sandbox_table("disk_bytes = 67108864\n")
    );
    Ok(write_config(dir, &body)?.display().to_string())
}

/// The container's cgroup relative to the hierarchies' roots, from its
/// `0::/...` line.
fn cgroup_rel(line: &str) -> &str {
    line.trim_start_matches("0::")
}

/// Nothing of the container is left: no container of the session, none of
/// its cgroups (the container's and the session's, v2 and v1) and, when
/// the test could hold its network namespace while it ran, no process in
/// that.
fn nothing_left(
    engine: &docker::Engine,
    session: &str,
    cgroup: &str,
    netns: Option<&Netns>,
) -> Result<()> {
    let session_cgroup = Path::new(cgroup)
        .parent()
        .context("no parent cgroup")?
        .display()
        .to_string();
    let in_netns = || netns.map(Netns::processes).unwrap_or_default();
    let gone = eventually(Duration::from_secs(60), || {
        engine.containers_of(session).is_ok_and(|c| c.is_empty())
            && cgroups_at(&session_cgroup).is_ok_and(|c| c.is_empty())
            && in_netns().is_empty()
    });
    ensure!(
        gone,
        "left behind: containers {:?}, cgroups {:?}, processes in {:?}: {:?}",
        engine.containers_of(session)?,
        cgroups_at(&session_cgroup)?,
        netns.map(|n| &n.id),
        in_netns()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_session_runs_hardened_in_its_container_with_the_redirect() -> Result<()> {
    let engine = docker::engine()?;
    let mock = mock::start(MockConfig::default()).await?;
    let url = mock.url();
    let result = tokio::task::spawn_blocking(move || hardened_session(&engine, &url)).await?;
    drop(mock);
    result
}

fn hardened_session(engine: &docker::Engine, mock_url: &str) -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = config(tmp.path(), engine, mock_url)?;
    let spec = write_file(
        tmp.path(),
        "rt.toml",
        &engine.spec(
            "[limits]\npids = 128\nmemory_bytes = 536870912\n\
             [[prepare]]\nrun = \"echo prepared > prepared.txt\"\n",
        ),
    )?;
    let banner = Banner::start(&["127.0.0.1", "127.10.0.7"])?;
    let port = banner.port.to_string();
    let session = "docker-hardened";
    let run = session_run(
        &[
            "--config",
            &cfg,
            "--session",
            session,
            "--runtime",
            &spec,
            "--budget-secs",
            "120",
        ],
        &["python3", "-c", PROBE, &port],
    )?;
    run.succeeded()?;
    let dir = Path::new(run.outcome["sandbox_dir"].as_str().unwrap_or_default()).to_owned();
    let out = std::fs::read(dir.join("logs/main-0.out"))?;
    let facts: Value = json_lines(&out)
        .into_iter()
        .next()
        .context("no facts printed")?;
    let f = |k: &str| facts[k].as_str().unwrap_or_default().to_owned();
    // The session's own uid, from the node's default range.
    let uid: u32 = f("uid").parse().unwrap_or(0);
    ensure!((1_500_000_000..1_500_065_536).contains(&uid), "{facts}");
    ensure!(f("cap_eff") == "0000000000000000", "{facts}");
    ensure!(f("no_new_privs") == "1" && f("seccomp") == "2", "{facts}");
    ensure!(f("pid1") == "docker-init", "{facts}");
    ensure!(
        f("write_root") == "EROFS" && f("write_usr") == "EROFS",
        "{facts}"
    );
    ensure!(f("write_tmp") == "ok" && f("write_home") == "ok", "{facts}");
    ensure!(facts["engine_socket"] == false, "{facts}");
    ensure!(f("prepared") == "prepared", "{facts}");
    // In the session's cgroup v2 directory: `.../<session>/<container>`.
    let cgroup = f("cgroup");
    let rel = cgroup_rel(&cgroup).to_owned();
    let parent = Path::new(&rel).parent().context("no parent")?;
    ensure!(
        parent.file_name().is_some_and(|n| n == session) && rel.starts_with("/polar/"),
        "the container is not in the session's cgroup: {cgroup}"
    );
    // Its network namespace: loopback, and only the agent's sockets.
    ensure!(facts["interfaces"] == serde_json::json!(["lo"]), "{facts}");
    ensure!(f("host_port") != "ok", "{facts}");
    // The redirect applied: the HTTPS call to the provider's hostname was
    // answered by the mock, through the agent, and captured.
    ensure!(f("reply_type") == "message", "{facts}");
    let log = run.outcome["capture_log"].as_str().unwrap_or_default();
    let (calls, problems) = read_log(Path::new(log))?;
    ensure!(
        problems.is_empty() && calls.len() == 1,
        "{calls:?} {problems:?}"
    );
    ensure!(
        calls[0]
            .prompt_token_ids
            .as_ref()
            .is_some_and(|ids| !ids.is_empty()),
        "no token ids: {:?}",
        calls[0]
    );
    // The container has exited before the test could hold its network
    // namespace, whose number the kernel may have given to another test's
    // sandbox since; its processes died with its PID namespace's init
    // (`docker-init`, above). The budget and SIGKILL tests check the
    // namespace, held while the container runs.
    nothing_left(engine, session, &rel, None)
}

/// Starts a session whose container sleeps after writing its cgroup and
/// network namespace to the workspace; returns them once written.
fn sleeping_session(
    dir: &Path,
    engine: &docker::Engine,
    session: &str,
    budget: &str,
) -> Result<(Running, String, Netns)> {
    let cfg = config(dir, engine, "http://127.0.0.1:9")?;
    let spec = write_file(dir, "rt.toml", &engine.spec("[limits]\npids = 64\n"))?;
    let running = Running::start(
        &[
            "--config",
            &cfg,
            "--session",
            session,
            "--runtime",
            &spec,
            "--budget-secs",
            budget,
        ],
        &[
            "sh",
            "-c",
            "readlink /proc/self/ns/net > ns.txt; \
             grep ^0:: /proc/self/cgroup > cg.tmp && mv cg.tmp cg.txt; exec sleep 600",
        ],
    )?;
    let ws = dir.join("state/sandboxes").join(session).join("workspace");
    ensure!(
        eventually(Duration::from_secs(90), || ws.join("cg.txt").exists()),
        "the container never ran"
    );
    let cgroup = std::fs::read_to_string(ws.join("cg.txt"))?;
    let netns = std::fs::read_to_string(ws.join("ns.txt"))?;
    ensure!(
        engine.containers_of(session)?.len() == 1,
        "no container of {session}"
    );
    // Held while the container sleeps in it.
    let netns = Netns::find(netns.trim())?;
    Ok((running, cgroup_rel(cgroup.trim()).to_owned(), netns))
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn the_budget_kill_ends_the_container_and_leaves_nothing() -> Result<()> {
    let engine = docker::engine()?;
    let tmp = sandbox_tempdir()?;
    let session = "docker-budget";
    let (mut running, cgroup, netns) = sleeping_session(tmp.path(), &engine, session, "15")?;
    let status = running.wait_exit(Duration::from_secs(90))?;
    // 124: the budget ran out.
    ensure!(status.code() == Some(124), "polar exited with {status}");
    nothing_left(&engine, session, &cgroup, Some(&netns))
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_sigkilled_agent_leaves_no_container_cgroup_or_namespace() -> Result<()> {
    let engine = docker::engine()?;
    let tmp = sandbox_tempdir()?;
    let session = "docker-sigkill";
    let (running, cgroup, netns) = sleeping_session(tmp.path(), &engine, session, "300")?;
    running.signal(nix::sys::signal::Signal::SIGKILL)?;
    // The guardian kills the agent's cgroup subtree, the container's
    // processes with it; the engine removes the container (`--rm`).
    let left = nothing_left(&engine, session, &cgroup, Some(&netns));
    drop(running);
    // The killed agent's disk quota (a tmpfs the next agent on this state
    // directory would release): not the test's to leave mounted.
    let quota = tmp.path().join("state/sandboxes").join(session);
    let _ = nix::mount::umount2(&quota, nix::mount::MntFlags::MNT_DETACH);
    left
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_mount_showing_the_engine_socket_is_refused() -> Result<()> {
    let engine = docker::engine()?;
    let tmp = sandbox_tempdir()?;
    let cfg = config(tmp.path(), &engine, "http://127.0.0.1:9")?;
    let socket_dir = Path::new(engine.host.trim_start_matches("unix://"))
        .parent()
        .context("socket dir")?
        .display()
        .to_string();
    for (i, source) in [socket_dir.as_str(), "/run", "/var/run"].iter().enumerate() {
        let spec = write_file(
            tmp.path(),
            &format!("rt{i}.toml"),
            &engine.spec(&format!(
                "[[mounts]]\nsource = \"{source}\"\ntarget = \"/engine\"\nread_only = true\n"
            )),
        )?;
        let session = format!("docker-socket-{i}");
        let run = session_run(
            &[
                "--config",
                &cfg,
                "--session",
                &session,
                "--runtime",
                &spec,
                "--budget-secs",
                "60",
            ],
            &["true"],
        )?;
        let start = run.outcome["steps"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["phase"] == "start"))
            .cloned()
            .unwrap_or(Value::Null);
        ensure!(
            start["end"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("engine's socket")),
            "{source}: {start}\n{}",
            run.main_logs()
        );
        ensure!(run.code() != Some(0), "{source}: the session ran");
        ensure!(engine.containers_of(&session)?.is_empty());
    }
    Ok(())
}
