//! The redirect through the `polar` command: a sandboxed client dialling
//! "remote" loopback addresses lands at the agent with the exact original
//! destination; DNS goes through the agent; QUIC is refused; the agent leaves
//! nothing behind however it stops; missing privileges fail clearly.
//! Root only (real cgroups, eBPF, network namespaces).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::time::Duration;

use anyhow::{Result, ensure};
use nix::sys::signal::Signal;
use polar_tests::{
    Netns, Running, alive, bpf_program_exists, bpf_programs_of, eventually, netns_of, probe_bin,
    sandbox_run,
};

fn probe() -> Result<String> {
    Ok(probe_bin()?.display().to_string())
}

const TARGETS: &[&str] = &[
    "127.10.0.1:443",
    "127.20.0.2:8080",
    "[::1]:9999",
    "[::ffff:127.10.0.3]:444",
];

fn check_captures(network: &str) -> Result<()> {
    let probe = probe()?;
    let (_dir, cfg) = polar_tests::probe_config()?;
    let mut cmd = vec![probe.as_str(), "connect"];
    cmd.extend_from_slice(TARGETS);
    let run = sandbox_run(
        &[
            "--config",
            &cfg,
            "--inspect",
            "--network",
            network,
            "--read-timeout-ms",
            "500",
        ],
        &cmd,
    )?;
    ensure!(
        run.output.status.success(),
        "polar failed: {}",
        run.stderr()
    );
    let started = run.events("sandbox started");
    ensure!(started.len() == 1, "{}", run.stderr());
    let session = started[0]["session"].clone();
    let captured = run.events("captured connection");
    for target in TARGETS {
        // What the program saw: connected, and getpeername shows the address it dialled.
        let report = run
            .reports
            .iter()
            .find(|r| r["target"] == *target)
            .ok_or_else(|| anyhow::anyhow!("no report for {target}: {:?}", run.reports))?;
        ensure!(report["ok"] == true, "{target}: {report}");
        ensure!(
            report["peer"] == *target,
            "getpeername for {target}: {report}"
        );
        // What the agent saw: the exact destination, the session, the bytes.
        let ev = captured
            .iter()
            .find(|e| e["orig_dst"] == *target)
            .ok_or_else(|| anyhow::anyhow!("{target} not captured: {}", run.stderr()))?;
        ensure!(ev["session"] == session, "{ev}");
        let sent = report["sent"].as_str().unwrap_or_default();
        ensure!(ev["bytes"] == sent.len(), "{ev} vs {sent}");
        ensure!(ev["preview"] == sent, "{ev} vs {sent}");
    }
    ensure!(captured.len() == TARGETS.len(), "{}", run.stderr());
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn isolated_sandbox_connections_reach_the_agent_with_their_original_destination() -> Result<()> {
    check_captures("isolated")
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn host_mode_sandbox_connections_reach_the_agent_with_their_original_destination() -> Result<()> {
    check_captures("host")
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn dns_goes_through_the_agent_and_quic_is_refused() -> Result<()> {
    let probe = probe()?;
    let script = format!(
        "getent hosts api.anthropic.com && {probe} resolve api.openai.com && \
         {probe} dns 127.53.0.1:53 generativelanguage.googleapis.com && \
         {probe} dns [::1]:53 api.anthropic.com && \
         {probe} udp 127.10.0.1:443 && {probe} udp [::1]:443 && {probe} udp 127.10.0.9:9"
    );
    let (_dir, cfg) = polar_tests::probe_config()?;
    for network in ["isolated", "host"] {
        let run = sandbox_run(
            &["--config", &cfg, "--inspect", "--network", network],
            &["sh", "-c", &script],
        )?;
        let stdout = String::from_utf8_lossy(&run.output.stdout);
        ensure!(
            run.output.status.success(),
            "{network}: {stdout}\n{}",
            run.stderr()
        );
        // getent's line: a fake address from the agent's range.
        let first = stdout.lines().next().unwrap_or_default();
        ensure!(
            first.starts_with("127.100.") && first.ends_with("api.anthropic.com"),
            "{network}: getent said {first:?}"
        );
        let resolve = &run.reports[0];
        ensure!(resolve["ok"] == true, "{resolve}");
        ensure!(
            resolve["addrs"][0]
                .as_str()
                .is_some_and(|a| a.starts_with("127.100.")),
            "{resolve}"
        );
        // Unconnected sendto/recvfrom: the answer seems to come from the server asked.
        for (report, server) in run.reports[1..3].iter().zip(["127.53.0.1:53", "[::1]:53"]) {
            ensure!(report["ok"] == true, "{network}: {report}");
            ensure!(
                report["from"] == server,
                "{network}: source not restored: {report}"
            );
            ensure!(report["answers"] == 1 && report["rcode"] == 0, "{report}");
            ensure!(
                report["last_a"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("127.100.")),
                "{report}"
            );
        }
        // QUIC and other non-loopback UDP refused with EPERM; loopback UDP is not.
        for report in &run.reports[3..5] {
            ensure!(
                report["ok"] == false && report["errno"] == 1,
                "{network}: {report}"
            );
        }
        ensure!(
            run.reports[5]["ok"] == true,
            "{network}: {}",
            run.reports[5]
        );
    }
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn servers_inside_an_isolated_sandbox_stay_reachable() -> Result<()> {
    let probe = probe()?;
    let (_dir, cfg) = polar_tests::probe_config()?;
    let run = sandbox_run(&["--config", &cfg, "--inspect"], &[&probe, "selfserve"])?;
    ensure!(
        run.reports.first().is_some_and(|r| r["ok"] == true),
        "{:?} {}",
        run.reports,
        run.stderr()
    );
    ensure!(
        run.events("captured connection").is_empty(),
        "{}",
        run.stderr()
    );
    Ok(())
}

/// Starts a long-running sandbox and returns what to check after it stops:
/// the agent's programs, cgroup, the sandboxed process and its namespace.
struct Snapshot {
    programs: std::collections::BTreeSet<u64>,
    cgroup: String,
    sandboxed: i32,
    netns: Netns,
    /// The session's directory (the default state directory's).
    session_dir: std::path::PathBuf,
}

fn start_long_sandbox() -> Result<(Running, Snapshot)> {
    let mut run = Running::start(&["--inspect"], &["sleep", "600"])?;
    let attached = run.wait_for("eBPF programs attached", Duration::from_secs(30))?;
    let started = run.wait_for("sandbox started", Duration::from_secs(30))?;
    let programs = bpf_programs_of(run.pid())?;
    ensure!(programs.len() == 10, "agent holds {programs:?}");
    let sandboxed = i32::try_from(started["pid"].as_i64().unwrap_or(0))?;
    let snap = Snapshot {
        programs,
        cgroup: attached["cgroup"].as_str().unwrap_or_default().to_owned(),
        netns: Netns::of(sandboxed)?,
        sandboxed,
        session_dir: polar_sandbox::runtime::steps::sandboxes_dir(
            &polar_config::Config::default().agent.state_dir,
        )
        .join(started["session"].as_str().unwrap_or("?")),
    };
    ensure!(
        std::path::Path::new(&snap.cgroup).is_dir(),
        "{}",
        snap.cgroup
    );
    ensure!(
        netns_of(std::process::id() as i32)? != snap.netns.id,
        "sandbox shares our netns"
    );
    Ok((run, snap))
}

fn check_nothing_left(snap: &Snapshot) -> Result<()> {
    ensure!(
        eventually(Duration::from_secs(15), || !std::path::Path::new(
            &snap.cgroup
        )
        .exists()),
        "cgroup {} left behind",
        snap.cgroup
    );
    ensure!(
        eventually(Duration::from_secs(5), || !alive(snap.sandboxed)),
        "sandboxed process {} still alive",
        snap.sandboxed
    );
    for id in &snap.programs {
        ensure!(!bpf_program_exists(*id)?, "program {id} still loaded");
    }
    ensure!(
        eventually(Duration::from_secs(5), || snap.netns.processes().is_empty()),
        "processes left in the sandbox namespace"
    );
    // Its disk quota (a tmpfs over the session's directory) is released,
    // by the guardian when the agent was killed.
    let mounted =
        || polar_sandbox::runtime::quota::mounts_below(&snap.session_dir).unwrap_or_default();
    ensure!(
        eventually(Duration::from_secs(15), || mounted().is_empty()),
        "the sandbox's disk quota is still mounted: {:?}",
        mounted()
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_clean_stop_leaves_no_program_cgroup_or_namespace() -> Result<()> {
    let (mut run, snap) = start_long_sandbox()?;
    run.signal(Signal::SIGTERM)?;
    let status = run.wait_exit(Duration::from_secs(20))?;
    ensure!(status.code() == Some(128 + 15), "exit {status:?}");
    check_nothing_left(&snap)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn sigkill_leaves_no_program_cgroup_or_namespace() -> Result<()> {
    let (mut run, snap) = start_long_sandbox()?;
    run.signal(Signal::SIGKILL)?;
    run.wait_exit(Duration::from_secs(10))?;
    check_nothing_left(&snap)
}

fn polar_fails_with(prefix: &[&str], expect: &str) -> Result<()> {
    let polar = polar_tests::polar_bin()?.display().to_string();
    let mut argv: Vec<&str> = prefix.to_vec();
    argv.extend([polar.as_str(), "sandbox", "run", "--inspect", "--", "true"]);
    let child = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let out = child.wait_with_output()?;
    // Nothing half-made: no cgroup of this agent.
    let prefix = format!("agent-{pid}-");
    ensure!(
        !agent_dirs()?.iter().any(|d| d.starts_with(&prefix)),
        "agent {pid} left a cgroup"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(125),
        "exit {:?}: {stderr}",
        out.status
    );
    ensure!(stderr.contains(expect), "expected {expect:?} in: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    ensure!(lines.len() == 1, "one clear error expected: {stderr}");
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn missing_capabilities_fail_with_one_clear_error() -> Result<()> {
    polar_fails_with(
        &[
            "setpriv",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--",
        ],
        "missing capabilities: CAP_BPF",
    )
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn no_cgroup2_fails_with_one_clear_error() -> Result<()> {
    let mount = polar_tests::cgroup2_mount()?.display().to_string();
    // A private mount namespace without the cgroup2 mount.
    let script = format!("umount -l {mount} && exec \"$@\"");
    polar_fails_with(
        &[
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ],
        "no cgroup v2 hierarchy is mounted",
    )
}

fn agent_dirs() -> Result<Vec<String>> {
    let dir = polar_tests::cgroup2_mount()?.join("polar");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    Ok(names)
}
