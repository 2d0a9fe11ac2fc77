//! The escape suite (root only): a hostile program runs as a session's main
//! command — in a harness session (`polar sandbox run --runtime SPEC`, the
//! shell preset's path), in `polar sandbox run -- CMD`, and in a harness
//! session on the docker runtime (a container of the engine and image
//! `cargo xtask test` provides) — and tries, each
//! in turn, to write the host's `/etc`, ptrace a host process, mount,
//! make user/mount/network namespaces (`unshare`, `clone`, `clone3`),
//! `setns`, `bpf()`, `perf_event_open`, `keyctl`/`add_key`, `userfaultfd`,
//! `io_uring`, `personality`, `process_vm_readv`, `open_by_handle_at`,
//! `init_module`, `kexec_load`, reach the host through `/proc/1/root` and
//! a host pid's `/proc` entry, read the CA key and the agent's
//! configuration (with its token), read a live peer session's workspace,
//! reach the gateway's and the rollout server's ports, and (with the
//! runtime spec's limits, or the node's defaults) fork-bomb and
//! memory-bomb, and fill its disk
//! (workspace and /tmp) past the node's quota. Every attempt is
//! recorded with how it failed (errno name, exit status) and checked
//! against the threat model; the targeted host files hash the same before
//! and after; the peer session, running at the same time, completes its
//! model call normally.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use polar_capture::read_log;
use polar_mock::{self as mock, MockConfig};
use polar_tests::servers::Banner;
use polar_tests::{
    docker, eventually, json_lines, processes_with, sandbox_run, sandbox_tempdir, session_run,
    sha256,
};
use serde_json::{Value, json};

/// The hostile program: every attempt prints one JSON line
/// `{"attempt", "ok" (it worked: an escape), "how"}`; facts about the
/// sandbox print as `{"facts": {...}}`.
const HOSTILE: &str = r#"
import ctypes, errno, json, os, platform, socket, subprocess, sys, time
A = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
X86 = platform.machine() == "x86_64"
NR = {"bpf": (321, 280), "perf_event_open": (298, 241), "keyctl": (250, 219),
      "add_key": (248, 217), "clone": (56, 220), "clone3": (435, 435),
      "userfaultfd": (323, 282), "io_uring_setup": (425, 425), "personality": (135, 92),
      "process_vm_readv": (310, 270), "open_by_handle_at": (304, 265),
      "init_module": (175, 105), "kexec_load": (246, 104)}
def report(name, ok, how):
    print(json.dumps({"attempt": name, "ok": ok, "how": how}), flush=True)
def name(e):
    return errno.errorcode.get(e, str(e))
def sc(nr_name, *args, label=None):
    nr = NR[nr_name][0 if X86 else 1]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    if r == 0 and nr_name == "clone":
        os._exit(0)  # the child of a clone that worked
    report(label or nr_name, r >= 0, "returned %d" % r if r >= 0 else name(e))
def lc(label, fn, *args):
    ctypes.set_errno(0)
    r = fn(*args)
    report(label, r >= 0, "returned %d" % r if r >= 0 else name(ctypes.get_errno()))
def io(label, f):
    try:
        report(label, True, repr(f())[:100])
    except OSError as e:
        report(label, False, name(e.errno))
def cmd(label, argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    last = (p.stderr.strip().splitlines() or [""])[0]
    report(label, p.returncode == 0, "exit %d: %s" % (p.returncode, last))
def read(p):
    with open(p, "rb") as f:
        return f.read(64)
def status():
    s = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
    return {k: s[k].strip() for k in ("Uid", "NoNewPrivs", "Seccomp")}
facts = status()
facts["sys"] = sorted(os.listdir("/sys"))
facts["cgroup"] = open("/proc/self/cgroup").read().splitlines()[-1]
facts["pid1"] = open("/proc/1/comm").read().strip()
facts["max_user_namespaces"] = open("/proc/sys/user/max_user_namespaces").read().strip()
print(json.dumps({"facts": facts}), flush=True)

def write(p, mode="w"):
    with open(p, mode) as f:
        f.write("escaped\n")
io("write_etc", lambda: write(A["etc_target"]))
io("append_etc_passwd", lambda: write("/etc/passwd", "a"))
io("write_usr_bin", lambda: write("/usr/bin/polar-escape"))
for label, pid in [("ptrace_attach_host_pid", A["host_pid"]), ("ptrace_attach_peer_pid", A["peer_pid"]),
                   ("ptrace_attach_pid1", 1)]:
    lc(label, libc.ptrace, ctypes.c_long(16), ctypes.c_long(pid), None, None)
lc("ptrace_traceme", libc.ptrace, ctypes.c_long(0), ctypes.c_long(0), None, None)
sc("process_vm_readv", A["host_pid"], 0, 0, 0, 0, 0)
io("proc_host_pid", lambda: os.listdir("/proc/%d" % A["host_pid"]))
io("proc1_root_host_file", lambda: read("/proc/1/root" + A["host_marker"]))
io("proc_peer_root_workspace", lambda: read("/proc/%d/root/workspace/started" % A["peer_pid"]))
lc("mount_tmpfs", libc.mount, b"none", b"/tmp", b"tmpfs", ctypes.c_ulong(0), None)
lc("umount_proc", libc.umount2, b"/proc", 2)
cmd("mount_cmd", ["mount", "-t", "tmpfs", "none", "/tmp"])
cmd("unshare_user_cmd", ["unshare", "-U", "true"])
cmd("unshare_mount_cmd", ["unshare", "-m", "true"])
cmd("unshare_user_map_root_cmd", ["unshare", "-Ur", "id"])
lc("unshare_newuser", libc.unshare, 0x10000000)
lc("unshare_newns", libc.unshare, 0x00020000)
lc("unshare_newnet", libc.unshare, 0x40000000)
if hasattr(os, "unshare"):
    io("os_unshare_newuser", lambda: os.unshare(os.CLONE_NEWUSER))
sc("clone", 0x10000000 | 17, 0, 0, 0, 0, label="clone_newuser")
sc("clone3", 0, 0, label="clone3")
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
lc("setns_net", libc.setns, fd, 0)
sc("bpf", 5, 0, 0, label="bpf_prog_load")
sc("perf_event_open", 0, 0, -1, -1, 0)
sc("keyctl", 0, -3, 0, label="keyctl_session_keyring")
sc("add_key", 0, 0, 0, 0, -3)
sc("userfaultfd", 0)
sc("io_uring_setup", 1, 0)
sc("personality", 0x0040000, label="personality_no_aslr")
sc("open_by_handle_at", -100, 0, 0)
sc("init_module", 0, 0, 0)
sc("kexec_load", 0, 0, 0, 0)
io("read_ca_key", lambda: read(A["ca_key"]))
io("read_agent_config", lambda: read(A["config"]))
io("read_config_copy", lambda: read(A["config_copy"]))
io("read_peer_workspace", lambda: read(A["peer_workspace"] + "/started"))
for label, host, port in [("gateway_port_loopback", "127.0.0.1", A["gateway_port"]),
                          ("gateway_port_host_addr", "127.10.0.7", A["gateway_port"]),
                          ("rollout_port_loopback", "127.0.0.1", A["rollout_port"]),
                          ("rollout_port_host_addr", "127.10.0.7", A["rollout_port"])]:
    try:
        c = socket.create_connection((host, port), timeout=5)
    except socket.timeout:
        report(label, False, "connect timeout"); continue
    except OSError as e:
        report(label, False, name(e.errno)); continue
    try:
        c.settimeout(3)
        got = c.recv(100).decode(errors="replace")
        report(label, "BANNER" in got, "connected to the agent, got " + (got or "EOF"))
    except socket.timeout:
        report(label, False, "connected to the agent, nothing received")
    except OSError as e:
        report(label, False, "connected to the agent, then " + name(e.errno))
for label, path in [("fill_workspace", "/workspace/fill"), ("fill_tmp", "/tmp/fill")]:
    n = 0
    try:
        with open(path, "wb") as f:
            while n < 4 * A["disk_bytes"]:
                f.write(b"\0" * (1 << 20)); f.flush(); n += 1 << 20
        report(label, True, "wrote %d bytes" % n)
    except OSError as e:
        report(label, False, "%s after %d MiB" % (name(e.errno), n >> 20))
    os.remove(path)
kids = []
try:
    while len(kids) < 10000:
        p = os.fork()
        if p == 0:
            time.sleep(60); os._exit(0)
        kids.append(p)
    report("fork_bomb", True, "%d forks" % len(kids))
except OSError as e:
    report("fork_bomb", False, "%s after %d forks" % (name(e.errno), len(kids)))
for p in kids:
    os.kill(p, 9); os.waitpid(p, 0)
p = subprocess.run([sys.executable, "-c",
    "a = []\nwhile True: a.append(b'x' * (32 << 20))"], capture_output=True)
report("memory_bomb", p.returncode == 0, "exit %d" % p.returncode)
"#;

/// Each sandbox's disk quota in the test's configuration: 32 MiB.
const DISK_BYTES: u64 = 32 << 20;

/// How each attempt must fail: the accepted `how` values (errno names, or
/// a prefix of `exit N: ...` for commands).
fn expected() -> BTreeMap<&'static str, &'static [&'static str]> {
    const EPERM: &[&str] = &["EPERM"];
    const ROFS: &[&str] = &["EROFS"];
    const GONE: &[&str] = &["ENOENT"];
    const CMD: &[&str] = &["exit 1:"];
    const NET: &[&str] = &["ECONNREFUSED", "connect timeout", "connected to the agent"];
    BTreeMap::from([
        ("write_etc", ROFS),
        // Not the owner: refused before the file system is asked.
        ("append_etc_passwd", &["EACCES", "EROFS"]),
        ("write_usr_bin", ROFS),
        ("ptrace_attach_host_pid", EPERM),
        ("ptrace_attach_peer_pid", EPERM),
        ("ptrace_attach_pid1", EPERM),
        ("ptrace_traceme", EPERM),
        ("process_vm_readv", EPERM),
        ("proc_host_pid", GONE),
        ("proc1_root_host_file", GONE),
        ("proc_peer_root_workspace", GONE),
        ("mount_tmpfs", EPERM),
        ("umount_proc", EPERM),
        ("mount_cmd", &["exit 32: mount:"]),
        ("unshare_user_cmd", CMD),
        ("unshare_mount_cmd", CMD),
        ("unshare_user_map_root_cmd", CMD),
        ("unshare_newuser", EPERM),
        ("unshare_newns", EPERM),
        ("unshare_newnet", EPERM),
        ("clone_newuser", EPERM),
        ("clone3", &["ENOSYS"]),
        ("setns_net", EPERM),
        ("bpf_prog_load", EPERM),
        ("perf_event_open", EPERM),
        ("keyctl_session_keyring", EPERM),
        ("add_key", EPERM),
        ("userfaultfd", EPERM),
        ("io_uring_setup", EPERM),
        ("personality_no_aslr", EPERM),
        ("open_by_handle_at", EPERM),
        ("init_module", EPERM),
        ("kexec_load", EPERM),
        ("read_ca_key", GONE),
        ("read_agent_config", GONE),
        // `/var/tmp` is the session's own `/tmp`: the host's is not shown.
        ("read_config_copy", &["ENOENT"]),
        ("read_peer_workspace", GONE),
        ("gateway_port_loopback", NET),
        ("gateway_port_host_addr", NET),
        ("rollout_port_loopback", NET),
        ("rollout_port_host_addr", NET),
        // The disk quota (`sandbox.disk_bytes` of the test's config).
        ("fill_workspace", &["ENOSPC"]),
        ("fill_tmp", &["ENOSPC"]),
        // The process and memory limits: the spec's (harness session) or
        // the node's `[sandbox]` defaults (`polar sandbox run -- CMD`).
        ("fork_bomb", &["EAGAIN after"]),
        // SIGKILL from the OOM killer of the session's memory limit.
        ("memory_bomb", &["exit -9"]),
    ])
}

/// The peer: a normal session that marks its workspace, waits for `go`,
/// makes one model call through the proxy and keeps the reply.
const PEER: &str = "echo started > /workspace/started; \
    for i in $(seq 1200); do [ -f /workspace/go ] && break; sleep 0.1; done; \
    curl -sS --max-time 30 -H 'content-type: application/json' -H 'x-api-key: dummy' \
    -H 'anthropic-version: 2023-06-01' https://api.anthropic.com/v1/messages \
    -d '{\"model\":\"m\",\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}' \
    > /workspace/reply.json; echo escape-peer-31402 > /dev/null";

/// Which way the hostile program comes in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// A harness session (shell preset) on a runtime spec with limits.
    Harness,
    /// `polar sandbox run -- CMD`.
    SandboxRun,
    /// A harness session on the docker runtime, with limits.
    Docker,
}

async fn escape_suite(way: Way) -> Result<()> {
    let mock = mock::start(MockConfig::default()).await?;
    let url = mock.url();
    let result = tokio::task::spawn_blocking(move || run_suite(way, &url)).await?;
    drop(mock);
    result
}

fn run_suite(way: Way, mock_url: &str) -> Result<()> {
    let engine = (way == Way::Docker).then(docker::engine).transpose()?;
    let tmp = sandbox_tempdir()?;
    let docker_host = engine
        .as_ref()
        .map(|e| format!("docker_host = \"{}\"\n", e.host))
        .unwrap_or_default();
    let body = format!(
        "# trainer token: POLAR-SECRET-TOKEN-77\n\n[[backend]]\nname = \"mock\"\n\
         dialect = \"vllm\"\nreplicas = [\"{}\"]\nserved_model = \"polar-mock\"\n\n\
         [[route]]\nhost = \"api.anthropic.com\"\naction = \"model\"\n\
         provider = \"anthropic\"\nbackend = \"mock\"\n\n\
         [sandbox]\ndisk_bytes = {DISK_BYTES}\nmemory_bytes = 268435456\npids = 64\n{docker_host}",
        mock_url
    );
    let cfg = polar_tests::write_config(tmp.path(), &body)?;
    let state = tmp.path().join("state");
    let pid = std::process::id();
    let tag = match way {
        Way::Harness => "h",
        Way::SandboxRun => "s",
        Way::Docker => "d",
    };
    // Host files the program targets, hashed before and after.
    let config_copy = PathBuf::from(format!("/var/tmp/polar-escape-{pid}-{tag}.toml"));
    std::fs::copy(&cfg, &config_copy)?;
    std::fs::set_permissions(
        &config_copy,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    let host_marker = PathBuf::from(format!("/root/polar-escape-{pid}-{tag}"));
    std::fs::write(&host_marker, "HOST-ONLY")?;
    let etc_target = PathBuf::from(format!("/etc/polar-escape-{pid}-{tag}"));
    let peer_session = format!("escape-peer-{tag}");
    let peer_ws = state
        .join("sandboxes")
        .join(&peer_session)
        .join("workspace");
    let spec = tmp.path().join("rt.toml");
    let limits = "[limits]\npids = 64\nmemory_bytes = 268435456\n";
    match &engine {
        Some(e) => std::fs::write(&spec, e.spec(limits))?,
        None => std::fs::write(&spec, limits)?,
    }
    let gateway = Banner::start(&["127.0.0.1", "127.10.0.7"])?;
    let rollout = Banner::start(&["127.0.0.1", "127.10.0.7"])?;

    // The peer, running all along.
    let cfg_s = cfg.display().to_string();
    let peer = {
        let (cfg_s, peer_session) = (cfg_s.clone(), peer_session.clone());
        std::thread::spawn(move || {
            session_run(
                &[
                    "--config",
                    &cfg_s,
                    "--session",
                    &peer_session,
                    "--runtime",
                    "/dev/null",
                    "--budget-secs",
                    "240",
                ],
                &["sh", "-c", PEER],
            )
        })
    };
    ensure!(
        eventually(Duration::from_secs(60), || peer_ws.join("started").exists()),
        "the peer never started"
    );
    // The innermost of the peer's processes (a host pid).
    let peer_pid = processes_with("escape-peer-31402")
        .into_iter()
        .max()
        .context("no peer process")?;
    let targets: Vec<PathBuf> = vec![
        "/etc/passwd".into(),
        "/etc/hostname".into(),
        state.join("ca.key"),
        cfg.clone(),
        config_copy.clone(),
        host_marker.clone(),
        peer_ws.join("started"),
    ];
    let before = targets
        .iter()
        .map(|p| sha256(p))
        .collect::<Result<Vec<_>>>()?;

    let args = json!({
        "etc_target": etc_target,
        "host_pid": pid,
        "peer_pid": peer_pid,
        "host_marker": host_marker,
        "ca_key": state.join("ca.key"),
        "config": cfg,
        "config_copy": config_copy,
        "peer_workspace": peer_ws,
        "gateway_port": gateway.port,
        "rollout_port": rollout.port,
        "disk_bytes": DISK_BYTES,
    })
    .to_string();
    let hostile = ["python3", "-c", HOSTILE, &args];
    let reports: Vec<Value> = match way {
        Way::Harness | Way::Docker => {
            let run = session_run(
                &[
                    "--config",
                    &cfg_s,
                    "--runtime",
                    &spec.display().to_string(),
                    "--budget-secs",
                    "120",
                ],
                &hostile,
            )?;
            let dir = PathBuf::from(run.outcome["sandbox_dir"].as_str().unwrap_or_default());
            let out = std::fs::read(dir.join("logs/main-0.out")).unwrap_or_default();
            ensure!(run.code() == Some(0), "hostile: {}", run.main_logs());
            json_lines(&out)
        }
        Way::SandboxRun => {
            let run = sandbox_run(&["--config", &cfg_s], &hostile)?;
            ensure!(run.output.status.success(), "hostile: {}", run.stderr());
            run.reports
        }
    };
    // Release the peer and let it finish its rollout.
    std::fs::write(peer_ws.join("go"), "")?;
    let peer = peer
        .join()
        .map_err(|_| anyhow::anyhow!("peer thread panicked"))??;
    let after = targets
        .iter()
        .map(|p| sha256(p))
        .collect::<Result<Vec<_>>>()?;
    let _ = std::fs::remove_file(&config_copy);
    let _ = std::fs::remove_file(&host_marker);

    // What the sandbox is.
    let facts = reports
        .iter()
        .find_map(|r| r.get("facts"))
        .context("no facts")?;
    // The session's own uid, from the node's default range.
    let uid: u32 = facts["Uid"]
        .as_str()
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .parse()
        .unwrap_or(0);
    ensure!((1_500_000_000..1_500_065_536).contains(&uid), "{facts}");
    ensure!(
        facts["NoNewPrivs"] == "1" && facts["Seccomp"] == "2",
        "{facts}"
    );
    if way == Way::Docker {
        // Docker's own /sys (read-only) and no cgroup namespace on a
        // cgroup v1 engine: the container is in the session's cgroup.
        let cgroup = facts["cgroup"].as_str().unwrap_or_default();
        ensure!(cgroup.starts_with("0::/polar/"), "{facts}");
        ensure!(facts["pid1"] == "docker-init", "{facts}");
    } else {
        ensure!(facts["sys"] == json!([]), "/sys is not empty: {facts}");
        ensure!(facts["cgroup"] == "0::/", "no cgroup namespace: {facts}");
        ensure!(facts["pid1"] == "bwrap", "{facts}");
    }
    // Every attempt, and how it failed.
    let got: BTreeMap<String, &Value> = reports
        .iter()
        .filter_map(|r| Some((r.get("attempt")?.as_str()?.to_owned(), r)))
        .collect();
    let mut table = String::new();
    let mut wrong = Vec::new();
    let mut expected = expected();
    if way == Way::Docker {
        // pid 1 is docker-init (which runc made undumpable): its root,
        // the container's own, is not even open to the sandbox user.
        expected.insert("proc1_root_host_file", &["ENOENT", "EACCES"]);
    }
    for (attempt, allowed) in expected {
        let Some(r) = got.get(attempt) else {
            wrong.push(format!("{attempt} did not run"));
            continue;
        };
        let how = r["how"].as_str().unwrap_or_default();
        table.push_str(&format!("{attempt}: {how}\n"));
        if r["ok"] != false {
            wrong.push(format!("ESCAPE: {attempt} worked: {how}"));
        } else if !allowed.iter().any(|a| how.starts_with(a)) {
            wrong.push(format!("{attempt} failed as {how:?}, expected {allowed:?}"));
        }
    }
    for r in got.values() {
        if r["ok"] != false {
            wrong.push(format!("ESCAPE: {r}"));
        }
    }
    eprintln!("escape attempts ({tag}):\n{table}");
    ensure!(wrong.is_empty(), "{wrong:#?}\n{table}");
    // The host is unchanged.
    for ((p, b), a) in targets.iter().zip(&before).zip(&after) {
        ensure!(b == a, "{} changed", p.display());
    }
    ensure!(!etc_target.exists(), "{} appeared", etc_target.display());
    ensure!(!Path::new("/usr/bin/polar-escape").exists());
    ensure!(gateway.accepted() == 0, "gateway reached");
    ensure!(rollout.accepted() == 0, "rollout reached");
    // The peer completed its rollout normally.
    ensure!(peer.code() == Some(0), "peer: {}", peer.main_logs());
    let reply = std::fs::read_to_string(peer_ws.join("reply.json"))?;
    ensure!(
        reply.contains("\"type\":\"message\""),
        "peer reply: {reply}"
    );
    let (records, problems) =
        read_log(&state.join(format!("sessions/{peer_session}/calls.jsonl")))?;
    ensure!(
        problems.is_empty() && records.len() == 1,
        "{records:?} {problems:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_hostile_harness_session_escapes_nothing_while_a_peer_completes() -> Result<()> {
    escape_suite(Way::Harness).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_hostile_sandbox_run_command_escapes_nothing_while_a_peer_completes() -> Result<()> {
    escape_suite(Way::SandboxRun).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_hostile_docker_session_escapes_nothing_while_a_peer_completes() -> Result<()> {
    escape_suite(Way::Docker).await
}
