//! The systemd units `polar install` writes (pure text), and the capability
//! set of the agent's unit with the reason for each capability — the
//! capabilities are the ones the code really uses, nothing more.

use std::fmt::Write as _;

/// Where the binary is installed (below the root).
pub const BIN: &str = "/usr/local/bin/polar";
/// The agent's configuration file.
pub const AGENT_CONFIG: &str = "/etc/polar/agent.toml";
/// The rollout server's configuration file.
pub const ROLLOUT_CONFIG: &str = "/etc/polar/rollout.toml";
/// The directory of the units.
pub const UNIT_DIR: &str = "/etc/systemd/system";
/// The agent's unit.
pub const AGENT_UNIT: &str = "polar-agent.service";
/// The rollout server's unit.
pub const ROLLOUT_UNIT: &str = "polar-rollout.service";
/// The target that wants the agent.
pub const WANTS_DIR: &str = "/etc/systemd/system/multi-user.target.wants";
/// Time a stopping agent is given to drain (sessions finish or are handed
/// back, capture logs are flushed) before systemd kills what is left.
pub const DRAIN_TIMEOUT: &str = "5min";

/// The agent's capabilities and why each is needed.
pub const AGENT_CAPABILITIES: &[(&str, &str)] = &[
    (
        "CAP_BPF",
        "load the eBPF programs and create their maps (redirect::loader)",
    ),
    (
        "CAP_NET_ADMIN",
        "attach cgroup socket programs (connect/sendmsg/recvmsg/getpeername, sock_ops) and bring up lo in sandbox network namespaces",
    ),
    (
        "CAP_SYS_ADMIN",
        "unshare and setns network namespaces, bind the trust bundle in the sandbox's mount namespace",
    ),
    (
        "CAP_SETUID",
        "sandboxed commands drop to their session's sandbox uid (sandbox.uid_first..) before exec",
    ),
    (
        "CAP_SETGID",
        "sandboxed commands drop their groups and take their session's gid before exec",
    ),
    (
        "CAP_CHOWN",
        "hand the session's workspace, home and log directories to the sandbox user",
    ),
    (
        "CAP_DAC_OVERRIDE",
        "create the agent's cgroup below the cgroup v2 root (often mode 0555) and write into sandbox directories owned by the sandbox user",
    ),
    (
        "CAP_KILL",
        "stop sandboxed processes, which run as another user, at deadlines and on drain",
    ),
];

/// `polar-agent.service`.
pub fn agent_unit() -> String {
    let caps: Vec<&str> = AGENT_CAPABILITIES.iter().map(|(c, _)| *c).collect();
    let mut why = String::new();
    for (cap, reason) in AGENT_CAPABILITIES {
        let _ = writeln!(why, "#   {cap}: {reason}");
    }
    format!(
        "# Installed by `polar install`; `polar uninstall` removes it.\n\
[Unit]\n\
Description=Polar node agent: sandboxed coding-agent CLIs with captured model traffic\n\
After=network-online.target\n\
Wants=network-online.target\n\
\n\
[Service]\n\
Type=simple\n\
ExecStart={BIN} agent --config {AGENT_CONFIG}\n\
# SIGHUP reloads the routing rules (refused, keeping the old ones, when the\n\
# CA does not cover them).\n\
ExecReload=/bin/kill -HUP $MAINPID\n\
Restart=on-failure\n\
RestartSec=5s\n\
# SIGTERM to the agent only: it drains (sessions finish or are handed back,\n\
# capture logs flushed) and removes its cgroups; its cleanup guardian must\n\
# not be signalled before it. Whatever is left after the timeout is killed.\n\
KillSignal=SIGTERM\n\
KillMode=mixed\n\
TimeoutStopSec={DRAIN_TIMEOUT}\n\
LimitNOFILE=1048576\n\
# Capabilities, no more than the code uses (the agent checks the first\n\
# three at start and names any that is missing):\n\
{why}\
CapabilityBoundingSet={caps}\n\
AmbientCapabilities={caps}\n\
\n\
[Install]\n\
WantedBy=multi-user.target\n",
        caps = caps.join(" ")
    )
}

/// `polar-rollout.service` (installed, not enabled: one node of a cluster
/// runs the rollout server).
pub fn rollout_unit() -> String {
    format!(
        "# Installed by `polar install`; `polar uninstall` removes it.\n\
[Unit]\n\
Description=Polar rollout server: fans rollout tasks out to gateway nodes\n\
After=network-online.target\n\
Wants=network-online.target\n\
\n\
[Service]\n\
Type=simple\n\
# Tokens may come from here instead of the file:\n\
# POLAR_ROLLOUT_TOKEN=... and POLAR_ROLLOUT_NODE_TOKEN=...\n\
EnvironmentFile=-/etc/polar/rollout.env\n\
StateDirectory=polar-rollout\n\
StateDirectoryMode=0700\n\
ExecStart={BIN} rollout serve --config {ROLLOUT_CONFIG} --database /var/lib/polar-rollout/rollout.sqlite\n\
Restart=on-failure\n\
RestartSec=5s\n\
KillSignal=SIGTERM\n\
TimeoutStopSec=60s\n\
# No capabilities: an HTTP server and a SQLite file.\n\
CapabilityBoundingSet=\n\
NoNewPrivileges=yes\n\
ProtectSystem=strict\n\
ProtectHome=yes\n\
PrivateTmp=yes\n\
\n\
[Install]\n\
WantedBy=multi-user.target\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(unit: &'a str, k: &str) -> Vec<&'a str> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .collect()
    }

    #[test]
    fn the_agent_unit_has_the_settings_the_service_needs() {
        let u = agent_unit();
        assert_eq!(
            key(&u, "ExecStart"),
            ["/usr/local/bin/polar agent --config /etc/polar/agent.toml"]
        );
        assert_eq!(key(&u, "ExecReload"), ["/bin/kill -HUP $MAINPID"]);
        assert_eq!(key(&u, "Restart"), ["on-failure"]);
        assert_eq!(key(&u, "KillSignal"), ["SIGTERM"]);
        assert_eq!(key(&u, "KillMode"), ["mixed"]);
        assert_eq!(key(&u, "TimeoutStopSec"), ["5min"]);
        let caps = key(&u, "AmbientCapabilities");
        assert_eq!(caps, key(&u, "CapabilityBoundingSet"));
        // The preflight's capabilities are all granted, each explained.
        for (cap, _) in polar_redirect::preflight::REQUIRED {
            assert!(caps[0].split(' ').any(|c| c == cap.to_string()), "{cap}");
        }
        for (cap, _) in AGENT_CAPABILITIES {
            assert!(u.contains(&format!("#   {cap}: ")), "{cap} unexplained");
        }
    }

    #[test]
    fn the_rollout_unit_runs_without_capabilities() {
        let u = rollout_unit();
        assert_eq!(key(&u, "CapabilityBoundingSet"), [""]);
        assert!(key(&u, "ExecStart")[0].starts_with("/usr/local/bin/polar rollout serve"));
    }
}
