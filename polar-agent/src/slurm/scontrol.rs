//! What Polar asks of Slurm about its job, through its commands (run on
//! the async runtime; their output is read by the pure parsers below):
//! the allocated nodes, each node's address and `KillWait` (`scontrol`),
//! the gateways' step (`squeue`), and signalling that step (`scancel`).

use std::net::IpAddr;
use std::time::Duration;

use super::{JobNode, SlurmError};

/// Runs `scontrol ARGS` and returns its standard output.
async fn scontrol(args: &[&str]) -> Result<String, SlurmError> {
    run("scontrol", args).await
}

/// Runs a Slurm command and returns its standard output.
async fn run(program: &str, args: &[&str]) -> Result<String, SlurmError> {
    let command = format!("{program} {}", args.join(" "));
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| SlurmError::Command {
            command: command.clone(),
            reason: format!("cannot run it: {e}"),
        })?;
    if !out.status.success() {
        return Err(SlurmError::Command {
            command,
            reason: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    String::from_utf8(out.stdout).map_err(|_| SlurmError::Command {
        command,
        reason: "its output is not UTF-8".into(),
    })
}

/// The job's nodes (`SLURM_JOB_NODELIST` expanded), with their addresses.
pub async fn job_nodes(nodelist: &str) -> Result<Vec<JobNode>, SlurmError> {
    let names = hostnames(&scontrol(&["show", "hostnames", nodelist]).await?);
    if names.is_empty() {
        return Err(SlurmError::Command {
            command: format!("scontrol show hostnames {nodelist}"),
            reason: "no node".into(),
        });
    }
    let text = scontrol(&["show", "node", "-o", &names.join(",")]).await?;
    let mut nodes = Vec::with_capacity(names.len());
    for name in names {
        let addr = node_addr(&text, &name).ok_or_else(|| SlurmError::Command {
            command: format!("scontrol show node -o {name}"),
            reason: "no NodeAddr for this node".into(),
        })?;
        let addr = match addr.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => resolve(&addr).await?,
        };
        nodes.push(JobNode { name, addr });
    }
    Ok(nodes)
}

/// A `NodeAddr` that is a host name, resolved (IPv4 first).
async fn resolve(host: &str) -> Result<IpAddr, SlurmError> {
    let addrs: Vec<_> = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|e| SlurmError::Command {
            command: format!("resolving NodeAddr {host}"),
            reason: e.to_string(),
        })?
        .map(|a| a.ip())
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| SlurmError::Command {
            command: format!("resolving NodeAddr {host}"),
            reason: "no address".into(),
        })
}

/// The cluster's `KillWait`: how long Slurm waits between SIGTERM and
/// SIGKILL when a job ends.
pub async fn kill_wait() -> Result<Duration, SlurmError> {
    let text = scontrol(&["show", "config"]).await?;
    parse_kill_wait(&text).ok_or_else(|| SlurmError::Command {
        command: "scontrol show config".into(),
        reason: "no KillWait in its output".into(),
    })
}

/// The id (`JOB.STEP`) of the job's step named `name`, once Slurm lists it.
pub async fn step_named(job_id: &str, name: &str) -> Result<Option<String>, SlurmError> {
    let text = run(
        "squeue",
        &["--noheader", "--steps", "--jobs", job_id, "--format=%i %j"],
    )
    .await?;
    Ok(step_id(&text, name))
}

/// Sends `signal` (`TERM`) to every task of a step, on every node.
pub async fn signal_step(step: &str, signal: &str) -> Result<(), SlurmError> {
    run("scancel", &[&format!("--signal={signal}"), step])
        .await
        .map(drop)
}

/// `squeue --steps --format="%i %j"`: `JOB.STEP NAME` per line.
fn step_id(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (id, step_name) = line.trim().split_once(' ')?;
        (step_name.trim() == name).then(|| id.to_owned())
    })
}

/// `scontrol show hostnames` prints one name per line.
fn hostnames(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_owned).collect()
}

/// `NodeAddr=` of `name` in `scontrol show node -o` output (one node per
/// line, `Key=Value` fields separated by spaces).
fn node_addr(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find(|line| {
            line.split_whitespace()
                .any(|f| f.strip_prefix("NodeName=") == Some(name))
        })?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("NodeAddr="))
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
}

/// `KillWait = 20 sec` in `scontrol show config`.
fn parse_kill_wait(text: &str) -> Option<Duration> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        if key.trim() != "KillWait" {
            return None;
        }
        let secs = value.split_whitespace().next()?.parse().ok()?;
        Some(Duration::from_secs(secs))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_and_addresses_are_read_from_scontrol() {
        assert_eq!(hostnames("polar-n1\npolar-n2\n"), ["polar-n1", "polar-n2"]);
        let text = "NodeName=polar-n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=box Version=22.05.8\n\
                    NodeName=polar-n10 Arch=x86_64 NodeAddr=10.0.0.10 NodeHostName=gpu10\n\
                    NodeName=gpu-07 Arch=x86_64 NodeAddr=gpu-07.cluster NodeHostName=gpu-07\n";
        assert_eq!(node_addr(text, "polar-n1").as_deref(), Some("127.0.0.1"));
        assert_eq!(node_addr(text, "polar-n10").as_deref(), Some("10.0.0.10"));
        assert_eq!(node_addr(text, "gpu-07").as_deref(), Some("gpu-07.cluster"));
        assert_eq!(node_addr(text, "polar-n"), None);
        assert_eq!(node_addr("NodeName=x NodeAddr= Arch=y", "x"), None);
    }

    #[test]
    fn the_gateways_step_is_found_by_name() {
        let text = "       7.batch batch\n   7.0 polar-gateways\n   7.1 train\n";
        assert_eq!(step_id(text, "polar-gateways").as_deref(), Some("7.0"));
        assert_eq!(step_id(text, "polar"), None);
        assert_eq!(step_id("", "polar-gateways"), None);
    }

    #[test]
    fn kill_wait_is_read_from_the_configuration() {
        let text = "Configuration data as of 2026-12-03T07:00:00\nInactiveLimit           = 0 sec\nKillWait                = 20 sec\nKillOnBadExit           = 0\n";
        assert_eq!(parse_kill_wait(text), Some(Duration::from_secs(20)));
        assert_eq!(parse_kill_wait("KillOnBadExit = 0\n"), None);
    }
}
