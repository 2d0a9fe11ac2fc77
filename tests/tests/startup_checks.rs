//! Start-up checks through the real binary: missing capabilities (one line
//! naming each with what needs it), a configuration with an unknown key, a
//! state directory others may write to — each a clear error, exit 125, and
//! nothing created. Root only (capabilities are dropped with setpriv).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Output};

use anyhow::{Context as _, Result, ensure};
use polar_redirect::preflight::REQUIRED;
use polar_tests::polar_bin;

fn run(prefix: &[&str], args: &[&str]) -> Result<Output> {
    let polar = polar_bin()?.display().to_string();
    let mut argv: Vec<&str> = prefix.to_vec();
    argv.push(&polar);
    argv.extend_from_slice(args);
    Ok(Command::new(argv[0]).args(&argv[1..]).output()?)
}

fn fails_with(out: &Output, expect: &[&str]) -> Result<String> {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        out.status.code() == Some(125),
        "exit {:?}: {stderr}",
        out.status
    );
    for e in expect {
        ensure!(stderr.contains(e), "expected {e:?} in: {stderr}");
    }
    ensure!(
        stderr.lines().filter(|l| l.contains("ERROR")).count() == 1,
        "one error expected: {stderr}"
    );
    Ok(stderr)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn each_missing_capability_is_named_on_its_own_line() -> Result<()> {
    let out = run(
        &[
            "setpriv",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--",
        ],
        &["sandbox", "run", "--", "true"],
    )?;
    let stderr = fails_with(
        &out,
        &["missing capabilities: CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN"],
    )?;
    for (cap, why) in REQUIRED {
        let line = format!("  {cap} ({why}) is missing");
        ensure!(
            stderr.lines().any(|l| l == line),
            "no line {line:?} in: {stderr}"
        );
    }
    // Only the one that is missing is named.
    let out = run(
        &[
            "setpriv",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-bpf",
            "--",
        ],
        &["sandbox", "run", "--", "true"],
    )?;
    let stderr = fails_with(
        &out,
        &["missing capabilities: CAP_BPF;", "  CAP_BPF (load eBPF"],
    )?;
    ensure!(!stderr.contains("CAP_NET_ADMIN ("), "{stderr}");
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn an_unknown_config_key_is_named() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("agent.toml");
    std::fs::write(
        &file,
        "[agent]\nstate_dir = \"/tmp/x\"\nlog_fromat = \"json\"\n",
    )?;
    let f = file.display().to_string();
    let root = tempfile::tempdir()?;
    let r = root.path().display().to_string();
    for args in [
        vec!["sandbox", "run", "--config", &f, "--", "true"],
        vec!["config", "check", &f],
        vec!["install", "--root", &r, "--config", &f],
    ] {
        fails_with(&run(&[], &args)?, &["unknown field `log_fromat`", "line 3"])?;
    }
    // The install validated before making anything.
    ensure!(std::fs::read_dir(root.path())?.next().is_none());
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_state_directory_others_may_write_is_refused_before_anything_is_made() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    std::fs::create_dir(&state)?;
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777))?;
    let file = dir.path().join("agent.toml");
    std::fs::write(
        &file,
        format!("[agent]\nstate_dir = \"{}\"\n", state.display()),
    )?;
    let out = run(
        &[],
        &[
            "sandbox",
            "run",
            "--config",
            &file.display().to_string(),
            "--",
            "true",
        ],
    )?;
    let s = state.display().to_string();
    fails_with(
        &out,
        &[
            &format!("state directory {s} is writable by group or others (mode 0777)"),
            &format!("fix it with `chmod 700 {s}`"),
        ],
    )?;
    ensure!(
        std::fs::read_dir(&state)?.next().is_none(),
        "something was created in {s}"
    );
    // Fixed as told, the same command gets past the check.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700))?;
    let out = run(
        &[],
        &[
            "sandbox",
            "run",
            "--config",
            &file.display().to_string(),
            "--",
            "true",
        ],
    )?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn the_units_capabilities_are_enough_to_run_a_sandbox() -> Result<()> {
    // The capability set of the installed unit, as `polar __unit` prints it.
    let unit = run(&[], &["__unit", "polar-agent.service"])?;
    ensure!(unit.status.success());
    let text = String::from_utf8_lossy(&unit.stdout).into_owned();
    let caps = text
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .context("no AmbientCapabilities")?;
    let bounding = std::iter::once("-all".to_owned())
        .chain(
            caps.split(' ')
                .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase())),
        )
        .collect::<Vec<_>>()
        .join(",");
    let state = tempfile::tempdir()?;
    let file = state.path().join("agent.toml");
    std::fs::write(
        &file,
        format!("[agent]\nstate_dir = \"{}\"\n", state.path().display()),
    )?;
    let f = file.display().to_string();
    let bounding_arg = format!("--bounding-set={bounding}");
    let out = run(
        &[
            "setpriv",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            &bounding_arg,
            "--",
        ],
        &["sandbox", "run", "--config", &f, "--", "true"],
    )?;
    ensure!(
        out.status.success(),
        "with {bounding}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // With these capabilities only, the session's disk quota was released
    // too (its files copied to disk, the tmpfs unmounted).
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !stderr.contains("releasing the sandbox's disk quota"),
        "with {bounding}: {stderr}"
    );
    let left = polar_sandbox::runtime::quota::mounts_below(state.path())?;
    for m in &left {
        let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
    }
    ensure!(left.is_empty(), "with {bounding}: still mounted: {left:?}");
    Ok(())
}
