//! What a native sandbox sees, who it runs as, and how it starts, end to
//! end through `polar sandbox run` (root only):
//!
//! - the view is an allowlist: the node's configuration file, the state
//!   directory (the rollout server's database beside it, another
//!   session's directories, a task's upload root), `/root`, `/home`,
//!   `/srv` and `/var/lib` are not there, in a plain `polar sandbox run`
//!   and in a runtime-spec session alike; `python3`, `node`, `git` and
//!   `bash` run, `/etc` holds only the curated files and the session's
//!   own `passwd` naming its user;
//! - each session runs as a uid of its own: one that exhausts the
//!   per-user inotify instances and pipe pages leaves its sibling's
//!   `inotify_init` and full-size pipes working;
//! - 24 sessions started and torn down at once (each mounting and
//!   unmounting its disk quota) all start, within a bounded time.
//! - a sandbox bwrap cannot build ends `not_started` (the node's fault),
//!   never as the command's exit 1.
//!
//! The state directory lives under `/var/lib` (as the default
//! `/var/lib/polar` does), not under `/tmp`, which is the sandbox's own.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use polar_tests::{Running, sandbox_run, session_run, write_config, write_file};
use serde_json::Value;

/// A directory under `/var/lib` the sandbox user may pass through, with
/// every session tmpfs below its state directory unmounted on drop.
struct VarLibDir {
    dir: tempfile::TempDir,
}

impl VarLibDir {
    fn new() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("polar-view-test-")
            .tempdir_in("/var/lib")?;
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )?;
        Ok(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for VarLibDir {
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(self.dir.path().join("state/sandboxes")) {
            for e in rd.filter_map(Result::ok) {
                let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// The probe: prints one JSON object of what the sandbox sees.
const PROBE: &str = r#"
import json, os, subprocess, sys
hidden = sys.argv[1:]
def run(*cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return p.returncode == 0 and (p.stdout + p.stderr).strip() != ""
    except Exception as e:
        return False
print(json.dumps({
    "visible": [h for h in hidden if os.path.lexists(h)],
    "etc": sorted(os.listdir("/etc")),
    "root": sorted(os.listdir("/")),
    "uid": os.getuid(),
    "passwd": open("/etc/passwd").read(),
    "whoami": subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip(),
    "python3": run("python3", "-c", "print(1)"),
    "node": run("node", "-e", "console.log(1)"),
    "git": run("git", "--version"),
    "bash": run("bash", "-c", "echo ok"),
    "hosts": os.access("/etc/hosts", os.R_OK),
    "certs": os.path.isdir("/etc/ssl/certs"),
    "var_tmp": os.path.realpath("/var/tmp"),
    "home": sorted(os.listdir("/home")),
}))
"#;

/// Paths a sandbox must not see: the node's files and the other
/// session's, given the test's directory `base` and the earlier session.
fn secrets(base: &Path, config: &Path, earlier: &Path) -> Vec<PathBuf> {
    vec![
        config.to_owned(),
        base.join("state"),
        base.join("state/ca.key"),
        base.join("state/sandboxes"),
        earlier.to_owned(),
        base.join("rollout/rollout.db"),
        base.join("uploads/tests/test_hidden.py"),
        "/root".into(),
        "/srv".into(),
        "/var/lib".into(),
        "/etc/shadow".into(),
        "/etc/polar".into(),
        "/etc/ssh".into(),
        "/work".into(),
    ]
}

fn check_view(facts: &Value) -> Result<()> {
    let visible = facts["visible"].as_array().context("no visible")?;
    ensure!(visible.is_empty(), "the sandbox sees {visible:?}");
    for k in ["python3", "node", "git", "bash", "hosts", "certs"] {
        ensure!(facts[k] == true, "{k} does not work: {facts}");
    }
    let uid = facts["uid"].as_u64().context("no uid")?;
    ensure!(
        (1_500_000_000..1_500_065_536).contains(&uid),
        "uid {uid} is not from the node's range"
    );
    let passwd = facts["passwd"].as_str().unwrap_or_default();
    ensure!(
        passwd.contains(&format!("polar:x:{uid}:{uid}:")),
        "{passwd}"
    );
    ensure!(facts["whoami"] == "polar", "{facts}");
    ensure!(facts["var_tmp"] == "/tmp", "{facts}");
    // `/home` holds the sandbox's HOME and nothing of the host's.
    ensure!(facts["home"] == serde_json::json!(["polar"]), "{facts}");
    let etc: Vec<&str> = facts["etc"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for name in &etc {
        let curated = polar_sandbox::runtime::view::ETC
            .iter()
            .any(|e| e.split('/').next() == Some(*name))
            || ["passwd", "group"].contains(name);
        ensure!(curated, "/etc/{name} is not in the curated /etc: {etc:?}");
    }
    let root: Vec<&str> = facts["root"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for name in &root {
        let allowed = polar_sandbox::runtime::view::SYSTEM.contains(name)
            || [
                "etc",
                "proc",
                "dev",
                "sys",
                "run",
                "tmp",
                "var",
                "workspace",
                "home",
                "polar",
            ]
            .contains(name);
        ensure!(allowed, "/{name} is in the sandbox's root: {root:?}");
    }
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_sandbox_sees_the_allowlist_and_none_of_the_nodes_or_siblings_files() -> Result<()> {
    let base = VarLibDir::new()?;
    let config = write_config(base.path(), "")?;
    let cfg = config.display().to_string();
    // The rollout server's database and a task's hidden tests, beside the
    // state directory.
    for (dir, file) in [
        ("rollout", "rollout.db"),
        ("uploads/tests", "test_hidden.py"),
    ] {
        std::fs::create_dir_all(base.path().join(dir))?;
        std::fs::write(base.path().join(dir).join(file), "secret")?;
    }
    // An earlier session, whose directories stay in the state directory.
    let first = sandbox_run(
        &["--config", &cfg, "--session", "view-earlier"],
        &["sh", "-c", "echo mine > /workspace/left.txt"],
    )?;
    ensure!(first.output.status.success(), "{}", first.stderr());
    let earlier = base.path().join("state/sandboxes/view-earlier");
    ensure!(
        earlier.join("workspace/left.txt").is_file(),
        "the earlier session left nothing"
    );
    let mut argv = vec!["python3", "-c", PROBE];
    let hidden: Vec<String> = secrets(base.path(), &config, &earlier)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    argv.extend(hidden.iter().map(String::as_str));
    // `polar sandbox run -- CMD`.
    let plain = sandbox_run(&["--config", &cfg, "--session", "view-plain"], &argv)?;
    ensure!(plain.output.status.success(), "{}", plain.stderr());
    let facts = plain.reports.first().context("no facts printed")?;
    check_view(facts)?;
    // A runtime-spec session (the harness sessions' path).
    let spec = write_file(base.path(), "rt.toml", "kind = \"native\"\n")?;
    let run = session_run(
        &[
            "--config",
            &cfg,
            "--runtime",
            &spec,
            "--budget-secs",
            "120",
            "--session",
            "view-spec",
        ],
        &argv,
    )?;
    run.succeeded()?;
    let out = std::fs::read(
        base.path()
            .join("state/sandboxes/view-spec/logs/main-0.out"),
    )?;
    let facts = polar_tests::json_lines(&out)
        .into_iter()
        .next()
        .context("no facts printed")?;
    check_view(&facts)?;
    Ok(())
}

/// Exhausts the per-user inotify instances and pipe pages, writes `ready`
/// in its workspace, and holds them.
const HOG: &str = r#"
import ctypes, fcntl, os, resource, time
libc = ctypes.CDLL(None, use_errno=True)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, inotify = [], 0
while True:
    fd = libc.inotify_init()
    if fd < 0:
        break
    held.append(fd); inotify += 1
pipes = 0
while pipes < 4096:
    try:
        r, w = os.pipe()
    except OSError:
        break
    held += [r, w]; pipes += 1
    if fcntl.fcntl(w, 1032) < 65536:  # F_GETPIPE_SZ: over the soft limit
        break
open("/workspace/ready", "w").write(f"{inotify} {pipes} {os.getuid()}\n")
time.sleep(60)
"#;

/// Tries what the hog exhausted: prints `inotify pipe_size uid`.
const SIBLING: &str = r#"
import ctypes, fcntl, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
r, w = os.pipe()
print(f"{fd} {fcntl.fcntl(w, 1032)} {os.getuid()}")
"#;

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_session_exhausting_per_user_limits_leaves_its_sibling_unaffected() -> Result<()> {
    let base = VarLibDir::new()?;
    let cfg = write_config(base.path(), "")?.display().to_string();
    let mut hog = Running::start(
        &["--config", &cfg, "--session", "limits-hog"],
        &["python3", "-c", HOG],
    )?;
    let ready = base
        .path()
        .join("state/sandboxes/limits-hog/workspace/ready");
    let deadline = Instant::now() + Duration::from_secs(60);
    let hog_said = loop {
        if let Ok(t) = std::fs::read_to_string(&ready)
            && t.ends_with('\n')
        {
            break t;
        }
        ensure!(
            Instant::now() < deadline,
            "the hog never got ready: {:?}",
            hog.events
        );
        ensure!(hog.child.try_wait()?.is_none(), "the hog exited early");
        std::thread::sleep(Duration::from_millis(100));
    };
    let hog_fields: Vec<u64> = hog_said
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let [instances, pipes, hog_uid] = hog_fields[..] else {
        anyhow::bail!("the hog said {hog_said:?}");
    };
    let max: u64 = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")?
        .trim()
        .parse()?;
    // It used up what its uid may have (less what its own processes took
    // before the probe ran).
    ensure!(
        instances > 0 && instances <= max,
        "the hog made {instances} inotify instances of {max}"
    );
    ensure!(pipes > 0, "the hog made no pipes");
    let sib = sandbox_run(
        &["--config", &cfg, "--session", "limits-sibling"],
        &["python3", "-c", SIBLING],
    )?;
    ensure!(sib.output.status.success(), "{}", sib.stderr());
    let said = String::from_utf8_lossy(&sib.output.stdout).into_owned();
    let fields: Vec<i64> = said
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let [fd, pipe_size, uid] = fields[..] else {
        anyhow::bail!("the sibling said {said:?}");
    };
    ensure!(
        u64::try_from(uid)? != hog_uid,
        "both sessions ran as uid {uid}"
    );
    ensure!(fd >= 0, "the sibling's inotify_init failed beside the hog");
    ensure!(
        pipe_size == 65536,
        "the sibling's new pipe holds {pipe_size} bytes, not 65536"
    );
    drop(hog);
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn many_sessions_start_and_end_at_once_and_every_one_starts() -> Result<()> {
    const SESSIONS: usize = 24;
    let base = VarLibDir::new()?;
    let cfg = write_config(base.path(), "")?.display().to_string();
    let spec = write_file(base.path(), "rt.toml", "kind = \"native\"\n")?;
    let started = Instant::now();
    let runs: Vec<_> = (0..SESSIONS)
        .map(|i| {
            let (cfg, spec) = (cfg.clone(), spec.clone());
            std::thread::spawn(move || {
                // Staggered ends: sessions tear down (unmount their quota)
                // while others are still building their views.
                let script = format!("sleep 0.{}; echo started-{i}", i % 10);
                session_run(
                    &[
                        "--config",
                        &cfg,
                        "--runtime",
                        &spec,
                        "--budget-secs",
                        "120",
                        "--session",
                        &format!("many-{i}"),
                    ],
                    &["sh", "-c", &script],
                )
            })
        })
        .collect();
    let mut failed = Vec::new();
    for (i, r) in runs.into_iter().enumerate() {
        let run = r
            .join()
            .map_err(|_| anyhow::anyhow!("session {i}'s thread panicked"))??;
        if let Err(e) = run.succeeded() {
            failed.push(format!("session {i}: {e:#}"));
        }
    }
    let took = started.elapsed();
    ensure!(
        failed.is_empty(),
        "{} did not start:\n{}",
        failed.len(),
        failed.join("\n")
    );
    ensure!(
        took < Duration::from_secs(240),
        "{SESSIONS} sessions took {took:?}"
    );
    for i in 0..SESSIONS {
        let out = base
            .path()
            .join(format!("state/sandboxes/many-{i}/logs/main-0.out"));
        let text = std::fs::read_to_string(&out).with_context(|| out.display().to_string())?;
        ensure!(
            text.trim() == format!("started-{i}"),
            "session {i}: {text:?}"
        );
    }
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_sandbox_bwrap_cannot_build_is_not_started_rather_than_a_failed_command() -> Result<()> {
    let base = VarLibDir::new()?;
    let cfg = write_config(base.path(), "")?.display().to_string();
    // A mount whose source the sandbox's uid cannot reach: bwrap, which
    // builds the view as that uid, fails before the command exists.
    let closed = base.path().join("closed");
    std::fs::create_dir_all(closed.join("data"))?;
    std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let spec = write_file(
        base.path(),
        "rt.toml",
        &format!(
            "[[mounts]]\nsource = \"{}\"\ntarget = \"/data\"\n",
            closed.join("data").display()
        ),
    )?;
    let run = session_run(
        &["--config", &cfg, "--runtime", &spec, "--budget-secs", "60"],
        &["true"],
    )?;
    let main = run.outcome["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["phase"] == "main")
        .with_context(|| format!("no main step: {}", run.outcome))?;
    ensure!(main["end"]["status"] == "not_started", "{main}");
    let error = main["end"]["error"].as_str().unwrap_or_default();
    ensure!(error.contains("bwrap"), "{main}");
    // Not the command's exit: `polar sandbox run` says Polar failed.
    ensure!(run.code() == Some(125), "exit {:?}", run.code());
    Ok(())
}
