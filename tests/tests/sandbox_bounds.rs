//! What a sandbox may use of the node (root only), in real sandboxes:
//!
//! - **Disk.** A session writes a 1 TiB sparse file, thousands of small
//!   files and empty directories, fills `/dev/shm` and `/tmp`, and tries
//!   bwrap's own tmpfs mounts (`/dev`, `/run`); a sibling session runs on
//!   the same node at the same time. After the session the node's disk
//!   holds at most its quota of it (every block of the released directory
//!   counted), the sparse file is still 1 TiB long and sparse, the copy's
//!   `disk-copy-cut.txt` says what was left out, and the sibling completed
//!   with its data intact.
//! - **Socket families.** A sandboxed program opens a socket of every
//!   address family the kernel defines: `AF_UNIX`, `AF_INET`, `AF_INET6`
//!   and `AF_NETLINK` (`NETLINK_ROUTE` only) work, every other family
//!   (`AF_VSOCK`, `AF_PACKET`, `AF_ALG`, `AF_XDP`, ...) gets
//!   `EAFNOSUPPORT`, other netlink protocols `EPROTONOSUPPORT`; Unix, TCP
//!   and UDP still carry data; interface listing (netlink) still works. The
//!   same on the docker runtime (the seccomp profile), where `/dev/shm` is
//!   the session's too.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, ensure};
use polar_tests::{docker, json_lines, sandbox_run, sandbox_tempdir, session_run, write_config};
use serde_json::Value;

/// The quota of every session here: 32 MiB (4096 inodes).
const DISK_BYTES: u64 = 32 << 20;

/// The hostile writer: one JSON line per attempt.
const FILLER: &str = r#"
import errno, json, os
def report(name, how):
    print(json.dumps({"attempt": name, "how": how}), flush=True)
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
# A 1 TiB sparse file with a little data at its start and in its middle.
with open("/workspace/sparse", "wb") as f:
    f.write(b"head" * 1024)
    f.seek(1 << 39); f.write(b"middle" * 1024)
    f.truncate(1 << 40)
report("sparse", "ok")
# Empty directories and small files until the inodes run out.
n = 0
try:
    os.mkdir("/workspace/many")
    while n < 100000:
        if n % 2:
            os.mkdir("/workspace/many/d%05d" % n)
        else:
            with open("/workspace/many/f%05d" % n, "wb") as f:
                f.write(b"x")
        n += 1
    report("small_files", "wrote %d" % n)
except OSError as e:
    report("small_files", "%s after %d" % (err(e), n))
# Free a few inodes, then fill /dev/shm and /tmp with bytes.
for i in range(0, 40, 2):
    os.remove("/workspace/many/f%05d" % i)
for label, path in [("fill_shm", "/dev/shm/fill"), ("fill_tmp", "/tmp/fill2")]:
    n = 0
    try:
        with open(path, "wb") as f:
            while n < 4 * (32 << 20):
                f.write(os.urandom(1 << 16)); f.flush(); n += 1 << 16
        report(label, "wrote %d" % n)
    except OSError as e:
        report(label, "%s after %d KiB" % (err(e), n >> 10))
report("shm_is_tmp", str(os.path.exists("/tmp/fill")))
for label, path in [("write_dev", "/dev/polar-fill"), ("write_run", "/run/polar-fill")]:
    try:
        open(path, "wb").write(b"x" * 4096)
        report(label, "ok")
    except OSError as e:
        report(label, err(e))
"#;

/// The sibling: writes 1 MiB, waits a little, checks it.
const SIBLING: &str = "head -c 1048576 /dev/urandom > /workspace/data && sleep 3 && \
    sha256sum /workspace/data > /workspace/data.sum && sha256sum -c /workspace/data.sum";

/// The disk blocks of everything under `dir` (not following symlinks),
/// `dir` included, in bytes.
fn disk_use(dir: &Path) -> Result<u64> {
    let meta = std::fs::symlink_metadata(dir)?;
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for e in std::fs::read_dir(dir)? {
            total += disk_use(&e?.path())?;
        }
    }
    Ok(total)
}

fn attempts(reports: &[Value]) -> std::collections::BTreeMap<String, String> {
    reports
        .iter()
        .filter_map(|r| {
            Some((
                r.get("attempt")?.as_str()?.to_owned(),
                r["how"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_session_never_makes_the_node_write_more_than_its_quota() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(
        tmp.path(),
        &format!("[sandbox]\ndisk_bytes = {DISK_BYTES}\nmemory_bytes = 536870912\n"),
    )?;
    let cfg_s = cfg.display().to_string();
    let sibling = {
        let cfg_s = cfg_s.clone();
        std::thread::spawn(move || {
            session_run(
                &[
                    "--config",
                    &cfg_s,
                    "--session",
                    "bounds-sibling",
                    "--runtime",
                    "/dev/null",
                ],
                &["sh", "-c", SIBLING],
            )
        })
    };
    let run = session_run(
        &[
            "--config",
            &cfg_s,
            "--runtime",
            "/dev/null",
            "--budget-secs",
            "240",
        ],
        &["python3", "-c", FILLER],
    )?;
    let sibling = sibling
        .join()
        .map_err(|_| anyhow::anyhow!("sibling thread panicked"))??;
    let dir = PathBuf::from(
        run.outcome["sandbox_dir"]
            .as_str()
            .context("no sandbox_dir")?,
    );
    let out = std::fs::read(dir.join("logs/main-0.out")).unwrap_or_default();
    let got = attempts(&json_lines(&out));
    eprintln!("attempts: {got:#?}");
    ensure!(run.code() == Some(0), "filler: {}", run.main_logs());
    ensure!(
        got.get("sparse").map(String::as_str) == Some("ok"),
        "{got:?}"
    );
    for (label, want) in [
        ("small_files", "ENOSPC after"),
        ("fill_shm", "ENOSPC after"),
        ("fill_tmp", "ENOSPC after"),
        ("shm_is_tmp", "True"),
        ("write_dev", "EROFS"),
        ("write_run", "EROFS"),
    ] {
        let how = got
            .get(label)
            .with_context(|| format!("{label} did not run: {got:?}"))?;
        ensure!(how.starts_with(want), "{label}: {how}, expected {want}");
    }
    // The session's directory is on disk now (its tmpfs released), within
    // the quota, block for block.
    ensure!(
        !polar_sandbox::runtime::quota::is_mount_point(&dir)?,
        "still a tmpfs"
    );
    let used = disk_use(&dir)?;
    eprintln!("disk use of the released session: {used} bytes (quota {DISK_BYTES})");
    ensure!(
        used <= DISK_BYTES,
        "{used} bytes on disk for a {DISK_BYTES}-byte quota"
    );
    let sparse = std::fs::symlink_metadata(dir.join("workspace/sparse"))?;
    ensure!(
        sparse.len() == 1 << 40,
        "sparse file length {}",
        sparse.len()
    );
    ensure!(
        sparse.blocks() * 512 <= 64 << 10,
        "sparse file takes {} bytes",
        sparse.blocks() * 512
    );
    let cut = std::fs::read_to_string(dir.join("disk-copy-cut.txt"))
        .context("the copy says nothing of what was cut")?;
    ensure!(
        cut.starts_with("The copy of this sandbox's directory to disk stopped at its quota: "),
        "{cut}"
    );
    ensure!(
        cut.contains("tmp/"),
        "the cut names nothing under tmp/: {cut}"
    );
    let meta = std::fs::symlink_metadata(dir.join("disk-copy-cut.txt"))?;
    ensure!(meta.uid() == 0 && meta.blocks() * 512 <= 4096, "{meta:?}");
    // The sibling completed, its data intact on disk.
    ensure!(
        sibling.code() == Some(0),
        "sibling: {}",
        sibling.main_logs()
    );
    let sdir = PathBuf::from(
        sibling.outcome["sandbox_dir"]
            .as_str()
            .context("sibling dir")?,
    );
    ensure!(std::fs::metadata(sdir.join("workspace/data"))?.len() == 1 << 20);
    ensure!(
        !sdir.join("disk-copy-cut.txt").exists(),
        "the sibling was cut"
    );
    Ok(())
}

/// Opens a socket of every family (and some netlink protocols) and moves
/// data over Unix, TCP and UDP sockets; one JSON line per attempt.
const FAMILIES: &str = r#"
import errno, json, os, socket
def report(name, how):
    print(json.dumps({"attempt": name, "how": how}), flush=True)
def attempt(name, f):
    try:
        f(); report(name, "ok")
    except OSError as e:
        report(name, errno.errorcode.get(e.errno, str(e.errno)))
def open_close(fam, typ, proto=0):
    socket.socket(fam, typ, proto).close()
for fam in range(0, 64):
    for typ, tname in [(socket.SOCK_STREAM, "stream"), (socket.SOCK_DGRAM, "dgram"), (socket.SOCK_RAW, "raw")]:
        attempt("family_%d_%s" % (fam, tname), lambda: open_close(fam, typ))
attempt("socketpair_vsock", lambda: socket.socketpair(40, socket.SOCK_STREAM))
attempt("socketpair_tipc", lambda: socket.socketpair(30, socket.SOCK_SEQPACKET))
for proto, pname in [(0, "route"), (4, "sock_diag"), (9, "audit"), (15, "uevent"), (16, "generic"), (12, "netfilter")]:
    attempt("netlink_" + pname, lambda: open_close(socket.AF_NETLINK, socket.SOCK_RAW, proto))
attempt("if_nameindex", lambda: socket.if_nameindex()[0])
def unix_roundtrip():
    a, b = socket.socketpair()
    a.sendall(b"ping"); assert b.recv(4) == b"ping"
    path = "/tmp/polar-unix.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); srv.bind(path); srv.listen(1)
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); c.connect(path)
    s, _ = srv.accept(); c.sendall(b"pong"); assert s.recv(4) == b"pong"
attempt("unix_roundtrip", unix_roundtrip)
def udp_roundtrip():
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a.bind(("127.0.0.1", 0))
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b.sendto(b"dgram", a.getsockname()); a.settimeout(5); assert a.recv(5) == b"dgram"
attempt("udp_roundtrip", udp_roundtrip)
def tcp_listen():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0)); s.listen(1)
attempt("tcp_listen", tcp_listen)
"#;

/// The families a sandbox may open.
const ALLOWED: [u64; 4] = [1, 2, 10, 16];

/// Checks the family report: the allowed families open (or fail for the
/// kernel's own reasons, never with the filter's errors on the ones
/// allowed), every other family gets `EAFNOSUPPORT`.
fn check_families(got: &std::collections::BTreeMap<String, String>) -> Result<()> {
    let mut wrong = Vec::new();
    for fam in 0..64u64 {
        for t in ["stream", "dgram", "raw"] {
            let label = format!("family_{fam}_{t}");
            let Some(how) = got.get(&label) else {
                wrong.push(format!("{label} did not run"));
                continue;
            };
            if ALLOWED.contains(&fam) {
                // The kernel's own answers stand for these (a raw INET
                // socket needs a capability; netlink has no stream type),
                // but never the filter's.
                if how == "EAFNOSUPPORT" {
                    wrong.push(format!("{label}: {how}, the family is allowed"));
                }
            } else if how != "EAFNOSUPPORT" {
                wrong.push(format!("{label}: {how}, expected EAFNOSUPPORT"));
            }
        }
    }
    let want = [
        ("socketpair_vsock", "EAFNOSUPPORT"),
        ("socketpair_tipc", "EAFNOSUPPORT"),
        ("family_40_stream", "EAFNOSUPPORT"),
        ("family_1_stream", "ok"),
        ("family_2_stream", "ok"),
        ("family_2_dgram", "ok"),
        ("family_10_stream", "ok"),
        ("netlink_route", "ok"),
        ("netlink_sock_diag", "EPROTONOSUPPORT"),
        ("netlink_audit", "EPROTONOSUPPORT"),
        ("netlink_uevent", "EPROTONOSUPPORT"),
        ("netlink_generic", "EPROTONOSUPPORT"),
        ("netlink_netfilter", "EPROTONOSUPPORT"),
        ("if_nameindex", "ok"),
        ("unix_roundtrip", "ok"),
        ("udp_roundtrip", "ok"),
        ("tcp_listen", "ok"),
    ];
    for (label, w) in want {
        match got.get(label) {
            Some(how) if how == w => {}
            other => wrong.push(format!("{label}: {other:?}, expected {w}")),
        }
    }
    ensure!(wrong.is_empty(), "{wrong:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_native_sandbox_opens_only_unix_inet_and_route_netlink_sockets() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?;
    let run = sandbox_run(
        &["--config", &cfg.display().to_string()],
        &["python3", "-c", FAMILIES],
    )?;
    ensure!(run.output.status.success(), "{}", run.stderr());
    check_families(&attempts(&run.reports))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_docker_sandbox_opens_the_same_families_and_its_shm_is_on_the_quota() -> Result<()> {
    let engine = docker::engine()?;
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(
        tmp.path(),
        &engine.sandbox_table(&format!("disk_bytes = {DISK_BYTES}\n")),
    )?;
    let spec = tmp.path().join("rt.toml");
    std::fs::write(&spec, engine.spec(""))?;
    let script = format!(
        "{FAMILIES}\n\
         n = 0\n\
         try:\n    with open('/dev/shm/fill', 'wb') as f:\n        \
         while n < 4 * {DISK_BYTES}:\n            f.write(b'x' * 65536); f.flush(); n += 65536\n    \
         report('fill_shm', 'wrote %d' % n)\n\
         except OSError as e:\n    report('fill_shm', errno.errorcode.get(e.errno, '?'))\n\
         report('shm_is_tmp', str(os.path.exists('/tmp/fill')))\n"
    );
    let run = session_run(
        &[
            "--config",
            &cfg.display().to_string(),
            "--runtime",
            &spec.display().to_string(),
            "--budget-secs",
            "120",
        ],
        &["python3", "-c", &script],
    )?;
    let dir = PathBuf::from(run.outcome["sandbox_dir"].as_str().unwrap_or_default());
    let out = std::fs::read(dir.join("logs/main-0.out")).unwrap_or_default();
    ensure!(run.code() == Some(0), "{}", run.main_logs());
    let got = attempts(&json_lines(&out));
    check_families(&got)?;
    ensure!(
        got.get("fill_shm").map(String::as_str) == Some("ENOSPC"),
        "/dev/shm is not on the quota: {got:?}"
    );
    ensure!(
        got.get("shm_is_tmp").map(String::as_str) == Some("True"),
        "{got:?}"
    );
    Ok(())
}
