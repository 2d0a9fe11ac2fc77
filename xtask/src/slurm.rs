//! A real Slurm cluster on this machine for the Slurm tests: Debian's
//! `slurm-wlm` and `munge` (installed by the set-up, [`crate::setup`]).
//!
//! [`Cluster::start`] starts (for the test step, `crate::test`, and for
//! `cargo xtask slurm`) a `munged` with a key and socket of its own, a `slurmctld` and two `slurmd` (`slurmd -N`, one
//! per node: Debian's build runs several on one host), nodes `polar-n1`
//! and `polar-n2` at 127.0.0.1, ports in a private range ([`PORTS`]), all
//! under `/run/polar-xtask-slurm` (state, spool, logs, pid files). Process
//! tracking is `proctrack/linuxproc` and there is no task plugin, so Slurm
//! makes no cgroups of its own (the gateway makes its own). Dropping the
//! [`Cluster`] stops each daemon by its pid. `POLAR_TEST_SLURM_CONF`
//! ([`Cluster::conf`]) tells the tests its `slurm.conf`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::cmd::Cmd;
use crate::daemon::Daemon;

/// The cluster's directory: short, on `/run`, as unix socket paths must be.
const ROOT: &str = "/run/polar-xtask-slurm";
/// The node names.
pub const NODES: [&str; 2] = ["polar-n1", "polar-n2"];
/// slurmctld, then each slurmd, then srun's range.
const PORTS: (u16, u16, u16, &str) = (16817, 16818, 16819, "16820-16899");
/// How long each daemon has to come up.
const START_WAIT: Duration = Duration::from_secs(30);

fn report(item: &str, state: &str) {
    eprintln!("slurm: {item:<18} {state}");
}

/// A running test cluster, stopped when dropped.
pub struct Cluster {
    conf: PathBuf,
    /// In start order; stopped in reverse.
    daemons: Vec<Daemon>,
}

impl Cluster {
    /// Its `slurm.conf`.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// Writes the configuration and starts munged, slurmctld and the slurmds.
    pub fn start() -> Result<Self> {
        let root = Path::new(ROOT);
        if root.exists() {
            std::fs::remove_dir_all(root).with_context(|| format!("removing {ROOT}"))?;
        }
        for sub in ["munge", "ctld/state", "log"] {
            std::fs::create_dir_all(root.join(sub))?;
        }
        set_mode(&root.join("munge"), 0o700)?;
        let key = root.join("munge/munge.key");
        Cmd::new("mungekey")?
            .arg("--create")
            .arg(format!("--keyfile={}", key.display()))
            .run()
            .context("making the cluster's munge key")?;
        let socket = root.join("munge/socket");
        let mut cluster = Self {
            conf: root.join("slurm.conf"),
            daemons: Vec::new(),
        };
        let munged = Cmd::new("munged")?
            .args(["-F", "-f"])
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--pid-file={}", root.join("munge/pid").display()))
            .arg(format!("--seed-file={}", root.join("munge/seed").display()))
            .arg(format!(
                "--log-file={}",
                root.join("log/munged.log").display()
            ));
        let sock = socket.clone();
        cluster.daemons.push(Daemon::start(
            "munged",
            munged,
            &root.join("log/munged.out"),
            START_WAIT,
            move || sock.exists(),
        )?);
        std::fs::write(&cluster.conf, slurm_conf(root, &socket)?)?;
        let conf = cluster.conf.clone();
        let ctld = Cmd::new("slurmctld")?
            .arg("-D")
            .arg("-f")
            .arg(&conf)
            .env("SLURM_CONF", &conf);
        cluster.daemons.push(Daemon::start(
            "slurmctld",
            ctld,
            &root.join("log/slurmctld.out"),
            START_WAIT,
            || answers(&conf),
        )?);
        for node in NODES {
            std::fs::create_dir_all(root.join(node).join("spool"))?;
            let slurmd = Cmd::new("slurmd")?
                .arg("-D")
                .arg("-f")
                .arg(&conf)
                .args(["-N", node])
                .env("SLURM_CONF", &conf);
            cluster.daemons.push(Daemon::start(
                "slurmd",
                slurmd,
                &root.join(format!("log/slurmd-{node}.out")),
                START_WAIT,
                || node_idle(&conf, node),
            )?);
        }
        report(
            "cluster",
            &format!("started ({}, nodes {})", conf.display(), NODES.join(",")),
        );
        Ok(cluster)
    }
}

/// `cargo xtask slurm -- CMD...`: the set-up's packages, the cluster, and
/// `command` run against it.
pub fn run_with(command: &[String]) -> Result<()> {
    crate::setup::apt_packages(&["slurm-wlm", "munge"])?;
    let cluster = Cluster::start()?;
    let (program, args) = command.split_first().context("no command given")?;
    Cmd::new(program)?
        .args(args)
        .env("SLURM_CONF", cluster.conf())
        .env("POLAR_TEST_SLURM_CONF", cluster.conf())
        .run()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        while let Some(mut daemon) = self.daemons.pop() {
            daemon.stop(Duration::from_secs(15));
        }
        report("cluster", "stopped");
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// slurmctld answers `scontrol ping`.
fn answers(conf: &Path) -> bool {
    Cmd::new("scontrol")
        .ok()
        .and_then(|c| c.arg("ping").env("SLURM_CONF", conf).probe())
        .is_some_and(|out| out.contains("is UP"))
}

/// `node` registered and is idle.
fn node_idle(conf: &Path, node: &str) -> bool {
    Cmd::new("sinfo")
        .ok()
        .and_then(|c| {
            c.args(["-h", "-n", node, "-o", "%t"])
                .env("SLURM_CONF", conf)
                .probe()
        })
        .is_some_and(|out| out.trim() == "idle")
}

/// The configuration: root as SlurmUser, munge on its own socket, nodes of
/// one CPU at 127.0.0.1 on their own ports.
fn slurm_conf(root: &Path, munge_socket: &Path) -> Result<String> {
    let host = Cmd::new("hostname")?
        .arg("-s")
        .probe()
        .context("`hostname -s` fails")?;
    let host = host.trim();
    let root = root.display();
    let (ctld, n1, n2, srun) = PORTS;
    let mut text = format!(
        "ClusterName=polar-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SrunPortRange={srun}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/ctld/state
SlurmdSpoolDir={root}/%n/spool
SlurmctldPidFile={root}/ctld/slurmctld.pid
SlurmdPidFile={root}/%n/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/linear
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=20
InactiveLimit=0
MinJobAge=30
",
        munge = munge_socket.display(),
    );
    for (node, port) in NODES.iter().zip([n1, n2]) {
        text.push_str(&format!(
            "NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} Port={port} \
             CPUs=1 RealMemory=1000 State=UNKNOWN\n"
        ));
    }
    text.push_str(&format!(
        "PartitionName=polar Nodes={} Default=YES MaxTime=30 State=UP\n",
        NODES.join(",")
    ));
    Ok(text)
}
