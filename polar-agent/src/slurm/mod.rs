//! Polar inside a Slurm job: one job directory per job that holds the
//! job's control plane (what `polar slurm run` makes on the batch node and
//! `polar slurm node` reads on every allocated node).
//!
//! The job directory, `<root>/<job id>/` on storage every node of the job
//! sees, mode 0700, holds:
//! - `job.json` ([`Job`]): the nodes and their addresses, the rollout
//!   server's URL, the gateways' port and drain time;
//! - `tls/`: the job's own cluster CA certificate, the server's and each
//!   node's certificate and key (keys 0600); the CA's key is deleted once
//!   the certificates are issued, so nothing can issue another;
//! - `tokens/`: fresh random tokens, each in a 0600 file: `trainer`,
//!   `gateway` (the server's, presented to the gateways) and
//!   `nodes/<node>` (each node's own, bound to its node id by the server);
//! - `rollout.toml`, `rollout.sqlite`: the server's settings and state;
//! - `agent.toml` (the operator's node configuration, copied) and
//!   `nodes/<node>/agent.toml`, each node's with its `[gateway]` table;
//!   `nodes/gateway-<rank>.log`, each gateway's output.
//!
//! At the job's end (at once when Slurm signals it: `KillWait` is short)
//! the keys and tokens are removed first, then the whole directory
//! (unless kept for inspection). Configuration composition is
//! pure ([`compose`]); the Slurm queries are [`scontrol`].

pub mod compose;
pub mod scontrol;

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What went wrong running Polar in a Slurm job.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// A variable Slurm sets in a job is missing.
    #[error("{0} is not set: run this inside a Slurm job (sbatch, salloc)")]
    NotInJob(&'static str),
    /// A Slurm command failed or printed what we cannot read.
    #[error("{command}: {reason}")]
    Command { command: String, reason: String },
    /// An operator's configuration file is unusable here.
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    /// A file of the job directory.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The job's control plane did not come up or went away.
    #[error("{0}")]
    ControlPlane(String),
}

impl SlurmError {
    /// A closure making an [`SlurmError::Io`] for `path`.
    pub fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| Self::Io {
            what,
            path: path.to_owned(),
            source,
        }
    }
}

/// One allocated node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNode {
    /// The Slurm node name: the gateway's node id.
    pub name: String,
    /// The address the node is reached at (`NodeAddr`).
    pub addr: std::net::IpAddr,
}

/// `job.json`: what every node of the job reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// The allocated nodes, in Slurm's order.
    pub nodes: Vec<JobNode>,
    /// The rollout server's URL (`https://`).
    pub server_url: String,
    /// The port each gateway listens on (0: any free port, advertised).
    pub gateway_port: u16,
    /// The gateways' drain time on SIGTERM: below Slurm's `KillWait`.
    pub drain_secs: u64,
}

/// The job directory's paths.
#[derive(Debug, Clone)]
pub struct JobDir {
    pub root: PathBuf,
}

impl JobDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn job_file(&self) -> PathBuf {
        self.root.join("job.json")
    }
    pub fn tls(&self) -> PathBuf {
        self.root.join("tls")
    }
    pub fn ca_cert(&self) -> PathBuf {
        self.tls().join(polar_io::tls::ca::CERT_FILE)
    }
    /// A certificate and key `polar_io::tls::ca::ClusterCa::issue` wrote.
    pub fn identity(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.tls().join(format!("{name}.crt")),
            self.tls().join(format!("{name}.key")),
        )
    }
    pub fn tokens(&self) -> PathBuf {
        self.root.join("tokens")
    }
    pub fn trainer_token(&self) -> PathBuf {
        self.tokens().join("trainer")
    }
    pub fn gateway_token(&self) -> PathBuf {
        self.tokens().join("gateway")
    }
    pub fn node_tokens(&self) -> PathBuf {
        self.tokens().join("nodes")
    }
    pub fn rollout_config(&self) -> PathBuf {
        self.root.join("rollout.toml")
    }
    pub fn base_agent_config(&self) -> PathBuf {
        self.root.join("agent.toml")
    }
    pub fn nodes(&self) -> PathBuf {
        self.root.join("nodes")
    }
    pub fn node_config(&self, node: &str) -> PathBuf {
        self.nodes().join(node).join("agent.toml")
    }

    /// Creates the directory (0700; its parents 0700 when made here).
    /// Refuses one that exists: a job directory is never reused.
    pub fn create(&self) -> Result<(), SlurmError> {
        if let Some(parent) = self.root.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(SlurmError::io("creating", parent))?;
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.root)
            .map_err(SlurmError::io("creating the job directory", &self.root))?;
        for d in [self.tls(), self.tokens(), self.node_tokens(), self.nodes()] {
            make_private_dir(&d)?;
        }
        Ok(())
    }

    /// Reads `job.json`.
    pub fn read_job(&self) -> Result<Job, SlurmError> {
        let path = self.job_file();
        let text = std::fs::read(&path).map_err(SlurmError::io("reading", &path))?;
        serde_json::from_slice(&text).map_err(|e| SlurmError::Config {
            path,
            reason: e.to_string(),
        })
    }

    /// Writes `job.json`.
    pub fn write_job(&self, job: &Job) -> Result<(), SlurmError> {
        let text = serde_json::to_vec_pretty(job).map_err(|e| SlurmError::Config {
            path: self.job_file(),
            reason: e.to_string(),
        })?;
        write_private(&self.job_file(), &text)
    }

    /// Removes what could speak for the job (the keys and tokens), then,
    /// unless `keep`, the whole directory. Best effort: each failure is
    /// logged.
    pub fn tear_down(&self, keep: bool) {
        self.remove_secrets();
        if !keep && let Err(e) = std::fs::remove_dir_all(&self.root) {
            tracing::error!(dir = %self.root.display(), error = %e, "the job directory could not be removed");
        }
    }

    /// Removes the keys and tokens (the processes that read them at start
    /// keep what they read). Best effort: each failure is logged.
    pub fn remove_secrets(&self) {
        let mut secrets = vec![self.tokens()];
        if let Ok(entries) = std::fs::read_dir(self.tls()) {
            secrets.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "key")),
            );
        }
        for path in secrets {
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(e) = removed
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::error!(path = %path.display(), error = %e, "a job secret could not be removed");
            }
        }
    }
}

/// Makes a directory of mode 0700.
pub fn make_private_dir(path: &Path) -> Result<(), SlurmError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(SlurmError::io("creating", path))
}

/// Writes a new file of mode 0600 (refuses to replace one).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), SlurmError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(SlurmError::io("creating", path))?;
    f.write_all(bytes).map_err(SlurmError::io("writing", path))
}

/// A fresh token: 32 random bytes from the OS, hex.
pub fn fresh_token() -> String {
    format!(
        "polar-{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_job_directory_is_private_never_reused_and_loses_its_secrets_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JobDir::new(tmp.path().join("jobs/42"));
        dir.create().unwrap();
        assert_eq!(mode(&dir.root), 0o700);
        assert_eq!(mode(dir.root.parent().unwrap()), 0o700);
        assert_eq!(mode(&dir.node_tokens()), 0o700);
        assert!(dir.create().is_err(), "an existing job directory is reused");
        write_private(&dir.trainer_token(), fresh_token().as_bytes()).unwrap();
        assert_eq!(mode(&dir.trainer_token()), 0o600);
        assert!(write_private(&dir.trainer_token(), b"x").is_err());
        let (crt, key) = dir.identity("n1");
        std::fs::write(&crt, "cert").unwrap();
        write_private(&key, b"key").unwrap();
        let job = Job {
            job_id: "42".into(),
            nodes: vec![JobNode {
                name: "n1".into(),
                addr: "10.0.0.7".parse().unwrap(),
            }],
            server_url: "https://10.0.0.7:7070".into(),
            gateway_port: 0,
            drain_secs: 15,
        };
        dir.write_job(&job).unwrap();
        assert_eq!(dir.read_job().unwrap(), job);
        dir.tear_down(true);
        assert!(!dir.tokens().exists() && !key.exists());
        assert!(crt.exists() && dir.job_file().exists());
        dir.tear_down(false);
        assert!(!dir.root.exists());
    }

    #[test]
    fn tokens_are_fresh_and_long() {
        let (a, b) = (fresh_token(), fresh_token());
        assert_ne!(a, b);
        assert_eq!(a.len(), "polar-".len() + 64);
    }
}
