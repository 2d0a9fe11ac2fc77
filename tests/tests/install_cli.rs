//! `polar install` / `polar uninstall` into a scratch root (no systemd):
//! every file made is in the manifest and accounted for, the installed
//! binary runs, a second install changes nothing, uninstall removes exactly
//! what it made (config and state only with `--purge`), removes a stale
//! agent cgroup and reports a running agent's programs by id.
//! Root only (real cgroups, a real redirect).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Result, ensure};
use polar_tests::{Running, bpf_programs_of, cgroup2_mount, polar_bin};

fn polar(args: &[&str]) -> Result<Output> {
    Ok(Command::new(polar_bin()?).args(args).output()?)
}

/// Every file and link below `root` (relative, with a leading `/`).
fn files(root: &Path) -> Result<BTreeSet<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) -> Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                walk(root, &e.path(), out)?;
            } else {
                out.insert(format!("/{}", e.path().strip_prefix(root)?.display()));
            }
        }
        Ok(())
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out)?;
    Ok(out)
}

fn mode(p: &Path) -> Result<u32> {
    Ok(std::fs::metadata(p)?.permissions().mode() & 0o7777)
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

const INSTALLED: &[&str] = &[
    "/usr/local/bin/polar",
    "/etc/polar/agent.toml",
    "/etc/polar/rollout.toml",
    "/etc/systemd/system/polar-agent.service",
    "/etc/systemd/system/polar-rollout.service",
    "/etc/systemd/system/multi-user.target.wants/polar-agent.service",
    "/var/lib/polar/install-manifest.json",
];
const STATE: &[&str] = &["/var/lib/polar/ca.crt", "/var/lib/polar/ca.key"];

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn install_then_uninstall_accounts_for_every_file() -> Result<()> {
    let root = tempfile::tempdir()?;
    let r = root.path();
    let rs = r.display().to_string();
    let out = polar(&["install", "--root", &rs])?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Exactly the installed files plus the CA; the manifest names them all.
    let mut expected = set(INSTALLED);
    expected.extend(set(STATE));
    ensure!(files(r)? == expected, "{:?}", files(r)?);
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(
        r.join("var/lib/polar/install-manifest.json"),
    )?)?;
    let listed: BTreeSet<String> = manifest["entries"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["path"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    for f in INSTALLED {
        ensure!(listed.contains(*f), "{f} not in the manifest {listed:?}");
    }
    ensure!(listed.contains("/var/lib/polar"), "{listed:?}");
    ensure!(mode(&r.join("var/lib/polar"))? == 0o700);
    ensure!(mode(&r.join("var/lib/polar/ca.key"))? == 0o600);
    ensure!(mode(&r.join("usr/local/bin/polar"))? == 0o755);
    ensure!(
        std::fs::read_link(
            r.join("etc/systemd/system/multi-user.target.wants/polar-agent.service")
        )? == Path::new("/etc/systemd/system/polar-agent.service")
    );
    let unit = std::fs::read_to_string(r.join("etc/systemd/system/polar-agent.service"))?;
    ensure!(
        unit.contains("\nExecStart=/usr/local/bin/polar agent --config /etc/polar/agent.toml\n")
    );

    // The installed binary runs and accepts the installed configuration.
    let check = Command::new(r.join("usr/local/bin/polar"))
        .args(["config", "check"])
        .arg(r.join("etc/polar/agent.toml"))
        .output()?;
    ensure!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    ensure!(String::from_utf8_lossy(&check.stdout).contains(": valid"));

    // Idempotent: a second install keeps the config and the CA, same files.
    let ca = std::fs::read(r.join("var/lib/polar/ca.crt"))?;
    std::fs::write(r.join("etc/polar/agent.toml"), "# edited by the operator\n")?;
    let again = polar(&["install", "--root", &rs])?;
    ensure!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    ensure!(String::from_utf8_lossy(&again.stdout).contains("kept existing /etc/polar/agent.toml"));
    ensure!(
        std::fs::read(r.join("var/lib/polar/ca.crt"))? == ca,
        "CA replaced"
    );
    ensure!(
        std::fs::read_to_string(r.join("etc/polar/agent.toml"))? == "# edited by the operator\n"
    );
    ensure!(files(r)? == expected, "{:?}", files(r)?);

    // A stale agent cgroup (its agent gone) is removed by uninstall.
    let mut dead = Command::new("true").spawn()?;
    let dead_pid = dead.id();
    dead.wait()?;
    let parent = cgroup2_mount()?.join("polar");
    std::fs::create_dir_all(&parent)?;
    let stale = parent.join(format!("agent-{dead_pid}-0"));
    std::fs::create_dir(&stale)?;

    // Without --purge: configuration, state and the manifest stay.
    let out = polar(&["uninstall", "--root", &rs])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        !stale.exists(),
        "stale cgroup {} left: {stdout}",
        stale.display()
    );
    let mut kept = set(&[
        "/etc/polar/agent.toml",
        "/etc/polar/rollout.toml",
        "/var/lib/polar/install-manifest.json",
    ]);
    kept.extend(set(STATE));
    ensure!(files(r)? == kept, "{:?}\n{stdout}", files(r)?);

    // --purge: nothing of Polar is left.
    let out = polar(&["uninstall", "--root", &rs, "--purge"])?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(files(r)?.is_empty(), "{:?}", files(r)?);
    ensure!(!r.join("etc/polar").exists() && !r.join("var/lib/polar").exists());
    // And then there is nothing to uninstall.
    let out = polar(&["uninstall", "--root", &rs])?;
    ensure!(out.status.code() == Some(125));
    ensure!(String::from_utf8_lossy(&out.stderr).contains("nothing to uninstall"));
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn uninstall_names_a_running_agents_programs() -> Result<()> {
    let root = tempfile::tempdir()?;
    let rs = root.path().display().to_string();
    let out = polar(&["install", "--root", &rs, "--no-enable"])?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        !root
            .path()
            .join("etc/systemd/system/multi-user.target.wants")
            .exists()
    );
    let mut run = Running::start(&["--inspect"], &["sleep", "600"])?;
    run.wait_for("sandbox started", Duration::from_secs(30))?;
    let programs = bpf_programs_of(run.pid())?;
    let out = polar(&["uninstall", "--root", &rs, "--purge"])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Live leftovers are reported, not an error.
    ensure!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        stdout.contains(&format!("belongs to Polar agent pid {}", run.pid())),
        "{stdout}"
    );
    for id in &programs {
        ensure!(
            stdout.contains(&format!("BPF program {id} ")),
            "program {id} not reported: {stdout}"
        );
    }
    Ok(())
}
