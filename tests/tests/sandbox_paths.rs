//! The host side never follows a path the sandbox controls, and a sandbox
//! cannot fill the node's disk, end to end through `polar sandbox run
//! --runtime` (root only): a hostile main command plants `tests ->` a host
//! directory and a file symlink to a host file, then a `[[post]]` upload of
//! `tests` and of that file runs as root (the host files keep their SHA-256,
//! the uploads land in the workspace); a symlink planted in HOME by one
//! attempt does not get the next attempt's HOME file written through it;
//! and a sandbox that writes past its `sandbox.disk_bytes` gets `ENOSPC`
//! while the state directory's filesystem loses at most the quota, and its
//! session ends normally with its logs. Every test unmounts what it mounted,
//! even on failure.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, ensure};
use polar_tests::{
    sandbox_tempdir, session_run, session_run_env, sha256, write_config, write_file,
};

/// Every file below `dir` with its hash (symlinks not followed).
fn hashes(dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let meta = std::fs::symlink_metadata(&p)?;
        if meta.is_dir() {
            out.extend(hashes(&p)?);
        } else {
            out.push((p.clone(), sha256(&p)?));
        }
    }
    out.sort();
    Ok(out)
}

/// Unmounts, on drop, every session tmpfs under `state/sandboxes` and
/// then the mounts listed (a test's own filesystems), even after a failure.
struct Mounts {
    state: PathBuf,
    own: Vec<PathBuf>,
}

impl Drop for Mounts {
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(self.state.join("sandboxes")) {
            for e in rd.filter_map(Result::ok) {
                let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
        for m in self.own.iter().rev() {
            let _ = nix::mount::umount2(m.as_path(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn post_run_uploads_do_not_follow_symlinks_the_sandbox_planted() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let _mounts = Mounts {
        state: tmp.path().join("state"),
        own: Vec::new(),
    };
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    // Host files the sandbox cannot see (a root-only directory), which a
    // root upload following the planted links would overwrite.
    let host = tmp.path().join("host");
    std::fs::create_dir_all(host.join("dir"))?;
    std::fs::set_permissions(&host, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    std::fs::write(host.join("dir/test_hidden.py"), "host's own\n")?;
    std::fs::write(host.join("file.txt"), "host's file\n")?;
    let before = hashes(&host)?;
    // The task's hidden tests, uploaded after the harness had the workspace.
    let task = tmp.path().join("task");
    std::fs::create_dir_all(task.join("tests"))?;
    std::fs::write(task.join("tests/test_hidden.py"), "assert True\n")?;
    std::fs::write(task.join("answer.txt"), "42\n")?;
    let spec = write_file(
        tmp.path(),
        "rt.toml",
        &format!(
            r#"
[[post]]
upload = {{ from = "{task}/tests", to = "tests" }}
[[post]]
upload = {{ from = "{task}/answer.txt", to = "answer.txt" }}
[[post]]
run = "cat tests/test_hidden.py answer.txt > post.txt"
"#,
            task = task.display()
        ),
    )?;
    let hostile = format!(
        "rm -rf tests answer.txt; ln -s {dir} tests && ln -s {file} answer.txt && ls -l",
        dir = host.join("dir").display(),
        file = host.join("file.txt").display()
    );
    let run = session_run(
        &["--config", &cfg, "--runtime", &spec, "--budget-secs", "60"],
        &["sh", "-c", &hostile],
    )?;
    run.succeeded()?;
    let ws = run.workspace();
    ensure!(
        hashes(&host)? == before,
        "a host file changed: {:?}",
        hashes(&host)?
    );
    ensure!(std::fs::read_dir(host.join("dir"))?.count() == 1);
    for (p, want) in [
        ("tests/test_hidden.py", "assert True\n"),
        ("answer.txt", "42\n"),
        ("post.txt", "assert True\n42\n"),
    ] {
        let got = std::fs::read_to_string(ws.join(p)).with_context(|| p.to_owned())?;
        ensure!(got == want, "{p}: {got:?}");
    }
    ensure!(std::fs::symlink_metadata(ws.join("tests"))?.is_dir());
    ensure!(std::fs::symlink_metadata(ws.join("answer.txt"))?.is_file());
    let steps = run.outcome["steps"].as_array().cloned().unwrap_or_default();
    ensure!(
        steps
            .iter()
            .all(|s| s["end"]["status"] == "exited" && s["end"]["code"] == 0),
        "{steps:?}"
    );
    // The replacement is logged with the session.
    let logs = run.finished.stderr();
    ensure!(
        logs.contains("replaced an entry the sandbox planted") && logs.contains("tests"),
        "{logs}"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_retried_attempt_does_not_write_its_home_files_through_a_planted_symlink() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let _mounts = Mounts {
        state: tmp.path().join("state"),
        own: Vec::new(),
    };
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host)?;
    std::fs::set_permissions(&host, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    std::fs::write(host.join("settings.json"), "{\"host\": true}\n")?;
    let before = hashes(&host)?;
    // A stand-in for the Gemini CLI (the preset writes
    // ~/.gemini/settings.json before it starts): the first attempt
    // replaces that directory with a link to the host's, the second
    // reports what it finds.
    let harness = tmp.path().join("harness");
    let bin = harness.join("node_modules/.bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::write(
        bin.join("gemini"),
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && {{ echo 0.0.0-test; exit 0; }}\n\
             if [ -e \"$HOME/.attempted\" ]; then\n\
               [ -L \"$HOME/.gemini\" ] && echo gemini=link || echo gemini=dir\n\
               cat \"$HOME/.gemini/settings.json\"\n\
             else\n\
               touch \"$HOME/.attempted\"; rm -rf \"$HOME/.gemini\"; ln -s {host} \"$HOME/.gemini\"\n\
               ln -s {host}/settings.json \"$HOME/.profile\"\n\
             fi\n",
            host = host.display()
        ),
    )?;
    for d in [&harness, &harness.join("node_modules"), &bin] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    std::fs::set_permissions(
        bin.join("gemini"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let env = [("POLAR_HARNESS_DIR", harness.to_str().unwrap_or_default())];
    let args = [
        "--config",
        &cfg,
        "--runtime",
        "/dev/null",
        "--harness",
        "gemini_cli",
        "--instruction",
        "do it",
        "--session",
        "retried-1",
        "--budget-secs",
        "60",
    ];
    let first = session_run_env(&args, &[], &env)?;
    ensure!(first.code() == Some(0), "{}", first.main_logs());
    let home = tmp.path().join("state/sandboxes/retried-1/home");
    ensure!(std::fs::symlink_metadata(home.join(".gemini"))?.is_symlink());
    let second = session_run_env(&args, &[], &env)?;
    ensure!(second.code() == Some(0), "{}", second.main_logs());
    ensure!(
        hashes(&host)? == before,
        "a host file changed: {:?}",
        hashes(&host)?
    );
    let out =
        std::fs::read_to_string(tmp.path().join("state/sandboxes/retried-1/logs/main-0.out"))?;
    ensure!(out.starts_with("gemini=dir\n"), "{out}");
    ensure!(out.contains("\"selectedType\""), "{out}");
    ensure!(std::fs::symlink_metadata(home.join(".gemini"))?.is_dir());
    ensure!(
        second
            .finished
            .stderr()
            .contains("replaced an entry the sandbox planted"),
        "{}",
        second.finished.stderr()
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_sandbox_filling_its_disk_gets_enospc_and_the_node_loses_at_most_the_quota() -> Result<()> {
    let tmp = sandbox_tempdir()?;
    // The state directory on a filesystem of its own, so that its free
    // space is this test's alone to measure.
    let fs_dir = tmp.path().join("statefs");
    std::fs::create_dir_all(&fs_dir)?;
    nix::mount::mount(
        Some("polar-test-state"),
        &fs_dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=256m,mode=0711"),
    )?;
    let state = fs_dir.join("state");
    let _mounts = Mounts {
        state: state.clone(),
        own: vec![fs_dir.clone()],
    };
    let quota: u64 = 32 << 20;
    let cfg = fs_dir.join("polar.toml");
    std::fs::write(
        &cfg,
        format!(
            "[agent]\nstate_dir = \"{}\"\n\n[sandbox]\ndisk_bytes = {quota}\n",
            state.display()
        ),
    )?;
    let free = || -> Result<u64> {
        let s = nix::sys::statvfs::statvfs(&fs_dir)?;
        Ok(s.blocks_available() * s.fragment_size())
    };
    // The agent makes its CA and trust files on the first run: measure
    // from a state directory that has them.
    let warm = session_run(
        &[
            "--config",
            &cfg.display().to_string(),
            "--runtime",
            "/dev/null",
        ],
        &["true"],
    )?;
    ensure!(warm.code() == Some(0), "{}", warm.main_logs());
    let before = free()?;
    // 200 MiB into the workspace, then /tmp and HOME: the first write
    // fills the quota they share, the others fail at once. The sandbox's
    // stdout is on its quota too (a log flood is bounded the same way), so
    // each message is kept in memory and printed once space is freed.
    let script = r#"
w=$(dd if=/dev/zero of=/workspace/fill bs=1M count=200 2>&1); wrc=$?
t=$(head -c 10485760 /dev/zero 2>&1 > /tmp/fill); trc=$?
h=$(dd if=/dev/zero of=$HOME/fill bs=1M count=10 2>&1); hrc=$?
size=$(stat -c %s /workspace/fill)
rm -f /workspace/fill /tmp/fill $HOME/fill
echo "workspace rc=$wrc tmp rc=$trc home rc=$hrc"
echo "$w"; echo "$t"; echo "$h"; echo "written=$size"
head -c 1048576 /dev/zero > /workspace/kept && echo kept
"#;
    let run = session_run(
        &[
            "--config",
            &cfg.display().to_string(),
            "--runtime",
            "/dev/null",
            "--budget-secs",
            "60",
        ],
        &["sh", "-c", script],
    )?;
    run.succeeded()?;
    let dir = PathBuf::from(run.outcome["sandbox_dir"].as_str().unwrap_or_default());
    let out = std::fs::read_to_string(dir.join("logs/main-0.out"))?;
    ensure!(out.matches("No space left on device").count() >= 2, "{out}");
    ensure!(out.contains("workspace rc=1 tmp rc=1 home rc=1"), "{out}");
    let written: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("written="))
        .context("no size")?
        .parse()?;
    ensure!(
        written <= quota && written > quota / 2,
        "{written} bytes written with a quota of {quota}: {out}"
    );
    ensure!(out.contains("kept"), "{out}");
    // The session's tmpfs is gone (released at its end), its files kept.
    ensure!(
        !polar_sandbox::runtime::quota::is_mount_point(&dir)?,
        "the session's tmpfs is still mounted"
    );
    ensure!(std::fs::metadata(run.workspace().join("kept"))?.len() == 1 << 20);
    let lost = before.saturating_sub(free()?);
    ensure!(
        lost <= quota,
        "the state directory's filesystem lost {lost} bytes, more than the quota {quota}"
    );
    // A spec may lower the quota, never raise it.
    let spec = write_file(
        &fs_dir,
        "rt.toml",
        &format!("[limits]\ndisk_bytes = {}\n", quota * 2),
    )?;
    let refused = session_run(
        &["--config", &cfg.display().to_string(), "--runtime", &spec],
        &["true"],
    )?;
    ensure!(refused.code() != Some(0));
    let err = refused.finished.stderr();
    ensure!(
        err.contains("limits.disk_bytes") && err.contains("sandbox.disk_bytes"),
        "{err}"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_crashed_agents_disk_quota_is_released_by_the_next_start_with_its_files() -> Result<()> {
    use polar_sandbox::runtime::quota;
    let tmp = sandbox_tempdir()?;
    let sandboxes = tmp.path().join("state/sandboxes");
    let _mounts = Mounts {
        state: tmp.path().join("state"),
        own: Vec::new(),
    };
    std::fs::create_dir_all(&sandboxes)?;
    // A directory kept from an earlier attempt moves into the tmpfs.
    let root = sandboxes.join("crashed");
    std::fs::create_dir_all(root.join("workspace"))?;
    std::fs::write(root.join("workspace/kept"), "earlier")?;
    ensure!(quota::mount(&root, 1 << 20)?);
    ensure!(quota::is_mount_point(&root)?);
    ensure!(std::fs::read_to_string(root.join("workspace/kept"))? == "earlier");
    let big = std::fs::write(root.join("workspace/big"), vec![0u8; 2 << 20]);
    ensure!(
        big.as_ref().err().and_then(std::io::Error::raw_os_error) == Some(libc::ENOSPC),
        "{big:?}"
    );
    std::fs::remove_file(root.join("workspace/big"))?;
    std::os::unix::fs::symlink("/etc/passwd", root.join("workspace/link"))?;
    // This process owns it: a start-up leaves it alone.
    let live = quota::reclaim_stale(&sandboxes);
    ensure!(live.released.is_empty(), "{live:?}");
    // Neither does it take a running agent's release between its unmount
    // and its rename (its copy names it), nor a tmpfs whose owner file is
    // not written yet: agents sharing a state directory start and end
    // while the others' sessions run.
    let midway = sandboxes.join("midway");
    std::fs::create_dir(&midway)?;
    std::fs::create_dir(sandboxes.join(".midway.persist"))?;
    std::fs::write(sandboxes.join(".midway.persist/f"), "copied")?;
    let me = std::fs::read_to_string(root.join(quota::OWNER_FILE))?;
    std::fs::write(
        sandboxes.join(".midway.persist").join(quota::OWNER_FILE),
        &me,
    )?;
    let mounting = sandboxes.join("mounting");
    ensure!(quota::mount(&mounting, 1 << 20)?);
    std::fs::remove_file(mounting.join(quota::OWNER_FILE))?;
    let live = quota::reclaim_stale(&sandboxes);
    ensure!(
        live == quota::Reclaimed::default(),
        "a live release or mount was taken: {live:?}"
    );
    ensure!(std::fs::read_dir(&midway)?.next().is_none());
    ensure!(sandboxes.join(".midway.persist/f").exists());
    ensure!(quota::is_mount_point(&mounting)?);
    ensure!(quota::discard(&mounting));
    std::fs::remove_dir(&mounting)?;
    std::fs::remove_dir_all(sandboxes.join(".midway.persist"))?;
    std::fs::remove_dir(&midway)?;
    // Its agent "died".
    std::fs::write(root.join(quota::OWNER_FILE), "999999999 1\n")?;
    // And another release was cut short after its unmount.
    let cut = sandboxes.join("cut");
    std::fs::create_dir(&cut)?;
    std::fs::create_dir(sandboxes.join(".cut.persist"))?;
    std::fs::write(sandboxes.join(".cut.persist/f"), "saved")?;
    // The next agent's start-up (through the real binary's config check
    // path is not enough: the parts are built by a session run).
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    let run = session_run(&["--config", &cfg, "--runtime", "/dev/null"], &["true"])?;
    run.succeeded()?;
    ensure!(!quota::is_mount_point(&root)?, "still mounted");
    ensure!(std::fs::read_to_string(root.join("workspace/kept"))? == "earlier");
    ensure!(std::fs::read_link(root.join("workspace/link"))? == Path::new("/etc/passwd"));
    ensure!(!root.join(quota::OWNER_FILE).exists());
    ensure!(std::fs::read_to_string(cut.join("f"))? == "saved");
    ensure!(!sandboxes.join(".cut.persist").exists());
    let stderr = run.finished.stderr();
    ensure!(
        stderr.contains("released the disk quota of a session whose agent is gone"),
        "{stderr}"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_swept_session_s_tmpfs_is_unmounted_and_a_mount_beneath_is_not_crossed() -> Result<()> {
    use polar_node::gateway::retention::{Keep, Retention};
    use polar_sandbox::runtime::quota;
    let tmp = sandbox_tempdir()?;
    let state = tmp.path().join("state");
    let sandboxes = state.join("sandboxes");
    let inner = sandboxes.join("left/workspace/inner");
    let mut mounts = Mounts {
        state: state.clone(),
        own: Vec::new(),
    };
    // A session on its disk quota, with a link to a host file.
    let quota_root = sandboxes.join("on-quota");
    std::fs::create_dir_all(&sandboxes)?;
    ensure!(quota::mount(&quota_root, 1 << 20)?);
    std::fs::create_dir_all(quota_root.join("workspace"))?;
    std::fs::write(quota_root.join("workspace/f"), "x")?;
    std::os::unix::fs::symlink("/etc/passwd", quota_root.join("workspace/link"))?;
    // A session with another file system left mounted inside it.
    std::fs::create_dir_all(&inner)?;
    nix::mount::mount(
        Some("polar-test"),
        &inner,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )?;
    mounts.own.push(inner.clone());
    std::fs::write(inner.join("precious"), "keep")?;
    let passwd = sha256(Path::new("/etc/passwd"))?;
    let keep = Keep {
        failed_for: std::time::Duration::ZERO,
        max_bytes: u64::MAX,
    };
    let swept = Retention::new(&state, keep).sweep(std::time::SystemTime::now());
    ensure!(
        swept.removed.len() == 1 && swept.removed[0].0 == "on-quota",
        "{swept:?}"
    );
    ensure!(!quota_root.exists(), "the quota session is left");
    ensure!(!quota::is_mount_point(&quota_root).unwrap_or(false));
    ensure!(sha256(Path::new("/etc/passwd"))? == passwd);
    // The other file system is not entered: the removal fails there.
    ensure!(
        swept.failed.len() == 1 && swept.failed[0].contains("left"),
        "{swept:?}"
    );
    ensure!(std::fs::read_to_string(inner.join("precious"))? == "keep");
    Ok(())
}
