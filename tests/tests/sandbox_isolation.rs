//! The `native` runtime's isolation, end to end through `polar sandbox run
//! --runtime` (root only; none of this needs the capture stage): a sandbox
//! reaches neither the agent's control API nor the host network nor another
//! sandbox's listener; it cannot write outside its workspace, HOME and
//! private /tmp, nor read secrets outside the tree it is given; a fork bomb
//! stays inside its process limit while the host stays responsive; a
//! sandbox that outlives its budget is killed with everything it started;
//! prepare and post-run steps run in order with the remaining budget;
//! clients trust Polar's CA inside the sandbox; base-URL mode works from a
//! sandbox with the per-session key.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use polar_tests::servers::EchoUpstream;
use polar_tests::{
    Running, eventually, processes_with, sandbox_tempdir, session_run, session_run_env,
    write_config, write_file,
};

/// A loopback server that greets every connection with a banner and
/// counts them.
struct Banner {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
}

impl Banner {
    fn start(bind: &str, banner: &'static str) -> Result<Self> {
        let l = TcpListener::bind(bind)?;
        let addr = l.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for mut c in l.incoming().map_while(Result::ok) {
                count.fetch_add(1, Ordering::Relaxed);
                let _ = c.write_all(banner.as_bytes());
            }
        });
        Ok(Self { addr, accepted })
    }
}

/// `key=value` lines of a file.
fn pairs(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

const SERVE_A: &str = r#"
import socket, pathlib
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 18555)); s.listen(16)
pathlib.Path("ready").write_text("1")
while True:
    c, _ = s.accept(); c.sendall(b"SANDBOX-A"); c.close()
"#;

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_sandbox_reaches_neither_the_control_api_nor_the_host_network_nor_another_sandbox() -> Result<()>
{
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?;
    let cfg = cfg.display().to_string();
    let control = Banner::start("127.0.0.1:0", "CONTROL-API")?;
    let hostnet = Banner::start("127.10.0.7:0", "HOST-NET")?;
    let mut a = Running::start(
        &[
            "--config",
            &cfg,
            "--session",
            "iso-a",
            "--runtime",
            "/dev/null",
            "--budget-secs",
            "90",
        ],
        &["python3", "-c", SERVE_A],
    )?;
    let ready = tmp.path().join("state/sandboxes/iso-a/workspace/ready");
    ensure!(
        eventually(Duration::from_secs(30), || ready.exists()),
        "sandbox A never served"
    );
    let client = format!(
        r#"
import socket
for name, host, port in [("control", "127.0.0.1", {c}), ("hostnet", "127.10.0.7", {h}),
                         ("sandbox_a", "127.0.0.1", 18555), ("internet", "1.1.1.1", 443)]:
    try:
        c = socket.create_connection((host, port), timeout=5); c.settimeout(3)
        got = c.recv(100).decode(errors="replace") or "closed"
    except Exception as e:
        got = "error:" + type(e).__name__
    print(f"{{name}}={{got}}", flush=True)
"#,
        c = control.addr.port(),
        h = hostnet.addr.port(),
    );
    let b = session_run(
        &[
            "--config",
            &cfg,
            "--session",
            "iso-b",
            "--budget-secs",
            "60",
            "--runtime",
            "/dev/null",
        ],
        &["python3", "-c", &client],
    )?;
    a.signal(nix::sys::signal::Signal::SIGTERM)?;
    a.wait_exit(Duration::from_secs(30))?;
    ensure!(b.code() == Some(0), "B failed: {}", b.main_logs());
    let out = pairs(&tmp.path().join("state/sandboxes/iso-b/logs/main-0.out"));
    ensure!(out.len() == 4, "B printed {out:?}: {}", b.main_logs());
    for (name, got) in &out {
        ensure!(
            !["CONTROL-API", "HOST-NET", "SANDBOX-A"]
                .iter()
                .any(|b| got.contains(b)),
            "B reached {name}: {got}"
        );
    }
    ensure!(
        control.accepted.load(Ordering::Relaxed) == 0,
        "the control API saw a connection"
    );
    ensure!(
        hostnet.accepted.load(Ordering::Relaxed) == 0,
        "the host server saw a connection"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_sandbox_writes_only_its_workspace_home_and_tmp_and_reads_no_secret() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?;
    let state = tmp.path().join("state");
    // Secrets: a root-only file in the host's /var/tmp (the sandbox's
    // /var/tmp is its own /tmp), and another session's workspace file in
    // the agent's state directory.
    let secret = PathBuf::from(format!("/var/tmp/polar-secret-{}", std::process::id()));
    std::fs::write(&secret, "TOPSECRET")?;
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let other = state.join("sandboxes/other/workspace");
    std::fs::create_dir_all(&other)?;
    std::fs::write(other.join("notes.txt"), "OTHERSESSION")?;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let host_marker = format!("/var/tmp/polar-write-{}", std::process::id());
    let script = format!(
        r#"
r() {{ label=$1; shift; if "$@" >/dev/null 2>&1; then echo "$label=yes"; else echo "$label=no"; fi; }}
r read_secret cat {secret}
r read_other_session cat {other}/notes.txt
r list_state ls {state}/ca.key
r read_host_tmp cat {tmp}/polar.toml
r write_etc sh -c 'echo x > /etc/polar-test'
r write_usr touch /usr/polar-test
r write_var_tmp touch {host_marker}
r write_root touch /polar-test
r write_repo touch {repo}/polar-test
r write_trust sh -c 'echo x >> /polar/trust/bundle.pem'
r write_workspace sh -c 'echo ok > /workspace/mine.txt'
r write_home sh -c 'echo ok > $HOME/h.txt'
r write_tmp sh -c 'echo ok > /tmp/private.txt'
"#,
        secret = secret.display(),
        other = other.display(),
        state = state.display(),
        tmp = tmp.path().display(),
        repo = repo.display(),
    );
    let run = session_run(
        &[
            "--config",
            &cfg.display().to_string(),
            "--runtime",
            "/dev/null",
            "--budget-secs",
            "60",
        ],
        &["sh", "-c", &script],
    );
    let _ = std::fs::remove_file(&secret);
    let run = run?;
    run.succeeded()?;
    let sandbox_dir = PathBuf::from(run.outcome["sandbox_dir"].as_str().unwrap_or_default());
    let out = pairs(&sandbox_dir.join("logs/main-0.out"));
    // `/var/tmp` is the session's `/tmp`, on its disk quota.
    let expected_yes = [
        "write_workspace",
        "write_home",
        "write_tmp",
        "write_var_tmp",
    ];
    ensure!(out.len() == 13, "{out:?} {}", run.main_logs());
    for (label, got) in &out {
        let want = if expected_yes.contains(&label.as_str()) {
            "yes"
        } else {
            "no"
        };
        ensure!(got == want, "{label}: {got}, expected {want}; all: {out:?}");
    }
    ensure!(run.workspace().join("mine.txt").is_file());
    ensure!(sandbox_dir.join("home/h.txt").is_file());
    for p in [
        "/etc/polar-test",
        "/usr/polar-test",
        "/polar-test",
        "/tmp/private.txt",
    ] {
        ensure!(!Path::new(p).exists(), "{p} appeared on the host");
    }
    ensure!(!Path::new(&host_marker).exists());
    let marker_name = Path::new(&host_marker).file_name().unwrap_or_default();
    ensure!(sandbox_dir.join("tmp").join(marker_name).is_file());
    ensure!(!repo.join("polar-test").exists());
    Ok(())
}

/// The pids cgroup (v1 group or v2 session cgroup) of `session`.
fn pids_group(session: &str) -> Option<PathBuf> {
    // The v2 session cgroup is named after the session, a v1 limit group
    // `polar-<agent pid>-<session>`.
    fn ours(name: &str, session: &str) -> bool {
        name == session
            || name
                .strip_prefix("polar-")
                .and_then(|n| n.strip_suffix(session))
                .is_some_and(|pid| pid.ends_with('-'))
    }
    fn walk(dir: &Path, session: &str, depth: u32) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.filter_map(Result::ok) {
            let p = e.path();
            if !p.is_dir() || p.is_symlink() {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if ours(&name, session) && p.join("pids.current").exists() {
                return Some(p);
            }
            if depth > 0
                && let Some(found) = walk(&p, session, depth - 1)
            {
                return Some(found);
            }
        }
        None
    }
    walk(Path::new("/sys/fs/cgroup"), session, 5)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_fork_bomb_stays_inside_its_process_limit_and_the_host_stays_responsive() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    let spec = write_file(
        tmp.path(),
        "rt.toml",
        "[limits]\npids = 64\nmemory_bytes = 536870912\n",
    )?;
    let session = "bomb-1";
    let started = Instant::now();
    let mut run = Running::start(
        &[
            "--config",
            &cfg,
            "--session",
            session,
            "--runtime",
            &spec,
            "--budget-secs",
            "8",
        ],
        &[
            "sh",
            "-c",
            // The bomb starts in a subshell: the main shell forks once,
            // before the bomb exists, then becomes the sleeper, so it
            // never meets the full limit itself (dash exits 2 when a fork
            // fails) and the budget is what ends the session.
            "bomb() { bomb | bomb & }; (bomb); exec sleep 31401",
        ],
    )?;
    let group = {
        let mut g = None;
        eventually(Duration::from_secs(20), || {
            g = pids_group(session);
            g.is_some()
        });
        g.context("no pids cgroup for the session")?
    };
    let mut peak = 0u64;
    let mut refused = 0u64;
    let mut slowest = Duration::ZERO;
    while run.child.try_wait()?.is_none() && started.elapsed() < Duration::from_secs(30) {
        if let Ok(n) = std::fs::read_to_string(group.join("pids.current")) {
            peak = peak.max(n.trim().parse().unwrap_or(0));
        }
        // `max N`: forks refused for the limit (v1 and v2 alike).
        if let Ok(ev) = std::fs::read_to_string(group.join("pids.events")) {
            refused = ev
                .lines()
                .find_map(|l| l.strip_prefix("max "))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(refused)
                .max(refused);
        }
        let t = Instant::now();
        std::process::Command::new("true").status()?;
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = run.wait_exit(Duration::from_secs(30))?;
    ensure!(
        status.code() == Some(124),
        "expected the budget to end it: {status}"
    );
    ensure!(refused > 0, "the limit never refused a fork (peak {peak})");
    ensure!(peak <= 64, "peak processes {peak}");
    ensure!(
        slowest < Duration::from_secs(2),
        "the host stalled for {slowest:?}"
    );
    ensure!(
        eventually(Duration::from_secs(10), || processes_with("31401")
            .is_empty()),
        "bomb processes survived"
    );
    ensure!(
        eventually(Duration::from_secs(10), || pids_group(session).is_none()),
        "the limit group was left behind"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_sandbox_that_outlives_its_budget_is_killed_with_everything_it_started() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    let started = Instant::now();
    let run = session_run(
        &[
            "--config",
            &cfg,
            "--runtime",
            "/dev/null",
            "--budget-secs",
            "3",
        ],
        &[
            "sh",
            "-c",
            "sleep 31337 & setsid sleep 31338 & nohup sleep 31339 >/dev/null 2>&1 & \
             echo started > started; sleep 31340",
        ],
    )?;
    let took = started.elapsed();
    ensure!(
        run.code() == Some(124),
        "exit {:?}: {}",
        run.code(),
        run.finished.stderr()
    );
    ensure!(run.outcome["steps"][0]["end"]["status"] == "timed_out");
    ensure!(run.workspace().join("started").is_file());
    ensure!(took < Duration::from_secs(15), "took {took:?}");
    ensure!(
        eventually(Duration::from_secs(5), || processes_with("sleep 3133")
            .is_empty()
            && processes_with("sleep 31340").is_empty()),
        "left running: {:?}",
        processes_with("sleep 313")
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn prepare_and_post_steps_run_in_order_with_the_remaining_budget() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    let task = tmp.path().join("task");
    std::fs::create_dir_all(task.join("src"))?;
    std::fs::write(task.join("src/in.txt"), "from the task\n")?;
    let spec = write_file(
        tmp.path(),
        "rt.toml",
        &format!(
            r#"
environment = {{ TASK_NAME = "t1" }}
[[prepare]]
upload = {{ from = "{task}", to = "task" }}
[[prepare]]
run = "cat task/src/in.txt > prepared.txt && echo $TASK_NAME >> prepared.txt"
[[post]]
run = "echo $POLAR_TIMEOUT_SECS $POLAR_DEADLINE > post-budget.txt; ls > post-ls.txt"
"#,
            task = task.display()
        ),
    )?;
    let run = session_run(
        &["--config", &cfg, "--runtime", &spec, "--budget-secs", "60"],
        &["sh", "-c", "test -f prepared.txt && echo main > main.txt"],
    )?;
    run.succeeded()?;
    let ws = run.workspace();
    ensure!(std::fs::read_to_string(ws.join("prepared.txt"))? == "from the task\nt1\n");
    ensure!(ws.join("main.txt").is_file());
    let ls = std::fs::read_to_string(ws.join("post-ls.txt"))?;
    ensure!(ls.contains("main.txt") && ls.contains("task"), "{ls}");
    let budget = std::fs::read_to_string(ws.join("post-budget.txt"))?;
    let mut parts = budget.split_whitespace();
    let left: u64 = parts.next().context("no budget")?.parse()?;
    let deadline: f64 = parts.next().context("no deadline")?.parse()?;
    ensure!(left > 0 && left <= 60, "{budget}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    ensure!(deadline > now && deadline < now + 61.0, "{budget}");
    let phases: Vec<String> = run.outcome["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["phase"].as_str().unwrap_or_default().to_owned())
        .collect();
    ensure!(
        phases == ["prepare", "prepare", "main", "post"],
        "{phases:?}"
    );

    // A failed prepare step skips the main command; post-run steps still run.
    let spec = write_file(
        tmp.path(),
        "rt2.toml",
        "[[prepare]]\nrun = \"exit 3\"\n[[post]]\nrun = \"echo post > post.txt\"\n",
    )?;
    let run = session_run(
        &["--config", &cfg, "--runtime", &spec, "--budget-secs", "60"],
        &["sh", "-c", "echo main > main.txt"],
    )?;
    ensure!(run.code() == Some(125));
    ensure!(!run.workspace().join("main.txt").exists());
    ensure!(run.workspace().join("post.txt").is_file());
    ensure!(run.outcome["steps"][1]["end"]["status"] == "skipped");
    Ok(())
}

/// What a shell in the sandbox reports of what the harness left: its HOME
/// and `/tmp` files, a git configuration in HOME, a Python module in the
/// user site, a process still running, Python's path flags.
const REPORT_LEFTOVERS: &str = r#"{
  test -e "$HOME/planted.txt" && echo home=planted || echo home=clean
  test -e /tmp/planted.txt && echo tmp=planted || echo tmp=clean
  echo "git=$(git config --get user.name || echo none)"
  python3 -c 'import planted_mod' 2>/dev/null && echo usersite=planted || echo usersite=clean
  pgrep -f 'polar-leftover-sleepe[r]' >/dev/null && echo process=alive || echo process=gone
  echo "safepath=$(python3 -c 'import sys; print(sys.flags.safe_path)')"
}"#;

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn post_run_steps_run_isolated_from_what_the_harness_left() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    let spec = write_file(
        tmp.path(),
        "rt.toml",
        &format!("[[post]]\nrun = '''{REPORT_LEFTOVERS} > post.txt'''\n"),
    )?;
    // The harness plants in its HOME and `/tmp`, leaves a process behind,
    // and reports what it sees itself (the control: the plants work).
    let plant = format!(
        "echo x > \"$HOME/planted.txt\" && echo x > /tmp/planted.txt && \
         printf '[user]\\n\\tname = planted\\n' > \"$HOME/.gitconfig\" && \
         site=$(python3 -c 'import site; print(site.getusersitepackages())') && \
         mkdir -p \"$site\" && echo 'X = 1' > \"$site/planted_mod.py\" && \
         cp \"$(command -v sleep)\" /tmp/polar-leftover-sleeper && \
         (setsid /tmp/polar-leftover-sleeper 300 >/dev/null 2>&1 &) && \
         sleep 0.2 && {REPORT_LEFTOVERS} > main.txt"
    );
    let run = session_run(
        &["--config", &cfg, "--runtime", &spec, "--budget-secs", "60"],
        &["sh", "-c", &plant],
    )?;
    run.succeeded()?;
    let ws = run.workspace();
    let main = std::fs::read_to_string(ws.join("main.txt"))?;
    ensure!(
        main == "home=planted\ntmp=planted\ngit=planted\nusersite=planted\nprocess=alive\nsafepath=False\n",
        "the control: {main}"
    );
    let post = std::fs::read_to_string(ws.join("post.txt"))?;
    ensure!(
        post == "home=clean\ntmp=clean\ngit=none\nusersite=clean\nprocess=gone\nsafepath=True\n",
        "{post}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn clients_in_a_native_sandbox_trust_the_ca_and_base_url_mode_takes_the_session_key()
-> Result<()> {
    let tmp = sandbox_tempdir()?;
    let anthropic = EchoUpstream::start("127.0.0.1:0", "anthropic-upstream").await?;
    let openai = EchoUpstream::start("127.0.0.1:0", "openai-upstream").await?;
    let cfg = write_config(
        tmp.path(),
        &format!(
            r#"
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
"#,
            a = anthropic.url(),
            o = openai.url()
        ),
    )?
    .display()
    .to_string();
    let transparent = r#"
r() { label=$1; shift; out=$("$@" 2>&1 | tr '\n' ' '); echo "$label=$out"; }
r curl curl -sS --max-time 20 https://api.anthropic.com/v1/messages -d '{}'
r python python3 -c 'import urllib.request; print(urllib.request.urlopen(urllib.request.Request("https://api.anthropic.com/v1/messages", data=b"{}"), timeout=20).read().decode())'
r node node -e 'fetch("https://api.openai.com/v1/chat/completions",{method:"POST",body:"{}"}).then(r=>r.text()).then(console.log).catch(e=>console.log(String(e.cause||e)))'
"#;
    let cfg2 = cfg.clone();
    let run = tokio::task::spawn_blocking(move || {
        session_run(
            &[
                "--config",
                &cfg2,
                "--runtime",
                "/dev/null",
                "--budget-secs",
                "60",
            ],
            &["bash", "-c", transparent],
        )
    })
    .await??;
    let dir = PathBuf::from(run.outcome["sandbox_dir"].as_str().unwrap_or_default());
    let out = pairs(&dir.join("logs/main-0.out"));
    ensure!(
        out.get("curl")
            .is_some_and(|v| v.contains("anthropic-upstream")),
        "{out:?}"
    );
    ensure!(
        out.get("python")
            .is_some_and(|v| v.contains("anthropic-upstream")),
        "{out:?}"
    );
    ensure!(
        out.get("node")
            .is_some_and(|v| v.contains("openai-upstream")),
        "{out:?}"
    );

    let base = r#"
r() { label=$1; shift; out=$("$@" 2>&1 | tr '\n' ' '); echo "$label=$out"; }
r keyed curl -sS --max-time 20 -H "Authorization: Bearer $POLAR_API_KEY" "$POLAR_BASE_URL/v1/chat/completions" -d '{"model":"m","messages":[]}'
r unkeyed curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer not-the-key" "$POLAR_BASE_URL/v1/chat/completions" -d '{}'
"#;
    let run = tokio::task::spawn_blocking(move || {
        session_run(
            &[
                "--config",
                &cfg,
                "--runtime",
                "/dev/null",
                "--base-url",
                "--budget-secs",
                "60",
            ],
            &["bash", "-c", base],
        )
    })
    .await??;
    let dir = PathBuf::from(run.outcome["sandbox_dir"].as_str().unwrap_or_default());
    let out = pairs(&dir.join("logs/main-0.out"));
    ensure!(
        out.get("keyed")
            .is_some_and(|v| v.contains("openai-upstream")),
        "{out:?}"
    );
    ensure!(
        out.get("unkeyed").is_some_and(|v| v.trim() == "401"),
        "{out:?}"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_harness_installed_behind_a_directory_the_sandbox_user_cannot_pass_still_runs() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    // A fake `pi` in node_modules/.bin below a root-only directory.
    let closed = tmp.path().join("closed");
    let bin = closed.join("prefix/node_modules/.bin");
    std::fs::create_dir_all(&bin)?;
    let pi = bin.join("pi");
    std::fs::write(
        &pi,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 0.0.0-fake; exit 0; fi\n\
         echo \"$@\" > ran.txt\n",
    )?;
    std::fs::set_permissions(&pi, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let prefix = closed.join("prefix").display().to_string();
    let run = session_run_env(
        &[
            "--config",
            &cfg,
            "--harness",
            "pi",
            "--instruction",
            "say hi",
            "--budget-secs",
            "60",
        ],
        &[],
        &[("POLAR_HARNESS_DIR", &prefix)],
    )?;
    ensure!(
        run.code() == Some(0),
        "{}\n{}",
        run.finished.stderr(),
        run.main_logs()
    );
    ensure!(run.outcome["version"] == "0.0.0-fake");
    let ran = std::fs::read_to_string(run.workspace().join("ran.txt"))?;
    ensure!(
        ran.trim() == "-p --model anthropic/claude-sonnet-4-5 say hi",
        "{ran}"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_process_over_its_memory_limit_is_killed_inside_the_sandbox() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    let spec = write_file(
        tmp.path(),
        "rt.toml",
        "[limits]\nmemory_bytes = 134217728\n",
    )?;
    let run = session_run(
        &["--config", &cfg, "--runtime", &spec, "--budget-secs", "60"],
        &[
            "sh",
            "-c",
            "python3 -c 'x = bytearray(1 << 30); print(len(x))'; echo \"python=$?\" > result.txt",
        ],
    )?;
    run.succeeded()?;
    ensure!(
        run.outcome["enforced"]["memory"] != "not_enforced",
        "{}",
        run.outcome
    );
    let result = std::fs::read_to_string(run.workspace().join("result.txt"))?;
    // SIGKILL from the cgroup's OOM killer (or a MemoryError): never success.
    ensure!(result.trim() != "python=0", "{result}");
    Ok(())
}
