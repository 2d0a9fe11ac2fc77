//! Runtimes: how a session's commands are run — `native` (bubblewrap on
//! the host), `docker` or `apptainer` — chosen by a [`spec::RuntimeSpec`].
//!
//! - [`spec`]: the runtime spec file and its validation;
//! - [`limits`]: memory, process and CPU limits through cgroups;
//! - [`native`], [`docker`], [`apptainer`]: the command lines of each
//!   runtime (pure, unit-tested);
//! - [`steps`]: the session's directories, HOME files and uploads into the
//!   workspace, written beneath directories the sandbox controls;
//! - [`quota`]: the disk quota (a size-limited tmpfs per session);
//! - [`eval`]: the HOME and tmp of one evaluation, made fresh for it;
//! - [`restore`]: workspace paths kept before the harness and put back
//!   before an evaluation;
//! - [`view`]: what a native sandbox sees of the node's file system (an
//!   allowlist);
//! - [`oneshot`]: one command in the native runtime with the caller's
//!   stdio (`polar sandbox run -- CMD`);
//! - [`plan`]: a whole session — prepare steps, the main command, post-run
//!   steps — each with the remaining time budget.
//!
//! Every runtime sees the same [`Layout`]: a host workspace directory shown
//! at the spec's `workdir`, a host HOME directory shown at
//! [`native::HOME`], a host tmp directory shown at `/tmp` (all three on the
//! session's disk quota), Polar's trust files at [`native::TRUST_DIR`] and over
//! the distribution bundles, and the same environment ([`base_env`]).

pub(crate) mod apptainer;
pub mod docker;
pub mod eval;
pub(crate) mod leftovers;
pub(crate) mod native;
pub mod oneshot;
pub mod plan;
pub mod quota;
pub mod restore;
pub mod steps;
pub mod view;

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use polar_ids::SessionId;
use polar_tls::TrustFiles;

use polar_spec::runtime::{Mount, RuntimeKind, RuntimeSpec};

/// The sandbox user (uid, gid) when none is given: `nobody`/`nogroup`.
pub const SANDBOX_USER: (u32, u32) = (65534, 65534);

/// `PATH` inside sandboxes, before the harness's own directories.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The [`RuntimeError::Io`] of `op` on `path`, for `map_err`.
pub(crate) fn io(
    op: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> RuntimeError + use<> {
    let path = path.to_owned();
    move |source| RuntimeError::Io { op, path, source }
}

/// Errors of preparing or running a runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The spec is invalid.
    #[error(transparent)]
    Spec(#[from] polar_spec::runtime::SpecError),
    /// A directory or file of the sandbox could not be made.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The runtime's program is missing or does not work.
    #[error("the {kind:?} runtime needs `{program}`, which {why}")]
    Unavailable {
        /// The runtime.
        kind: RuntimeKind,
        /// The program.
        program: &'static str,
        /// What went wrong.
        why: String,
    },
    /// The disk quota's tmpfs could not be mounted or released.
    #[error(transparent)]
    Quota(#[from] quota::QuotaError),
    /// Running a command failed.
    #[error(transparent)]
    Sandbox(#[from] crate::SandboxError),
    /// The seccomp filter could not be built or passed.
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
    /// A bind cannot be written in the runtime's mount syntax (a path
    /// holding `,` for docker, `:` for apptainer...): refused rather than
    /// passed ambiguously.
    #[error("the {kind:?} runtime cannot mount {path}: it {why}")]
    MountSyntax {
        /// The runtime.
        kind: RuntimeKind,
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The sandbox's view cannot be built as asked (a bind source holding
    /// other sessions' directories).
    #[error("the sandbox cannot be shown {path}: {why}")]
    View {
        /// The source.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// No sandbox uid could be leased.
    #[error(transparent)]
    Uid(#[from] crate::uids::UidError),
    /// A runtime command (container start or stop) failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// What was run.
        what: String,
        /// Exit status and output.
        detail: String,
    },
}

/// One entry of the root directory shown in a native sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootEntry {
    /// Its name in `/`.
    pub name: String,
    /// The host path.
    pub source: PathBuf,
    /// Its target, when it is a symbolic link (recreated, not followed).
    pub symlink: Option<PathBuf>,
}

impl RootEntry {
    /// A directory `name` under `root`.
    pub fn dir(root: &str, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            source: Path::new(root).join(name),
            symlink: None,
        }
    }
}

/// The entries of `root` (the host's `/` or a rootfs).
pub fn list_root(root: &Path) -> Result<Vec<RootEntry>, RuntimeError> {
    let err = |source| RuntimeError::Io {
        op: "list",
        path: root.to_owned(),
        source,
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).map_err(err)? {
        let e = e.map_err(err)?;
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let ty = e.file_type().map_err(err)?;
        let symlink = if ty.is_symlink() {
            Some(std::fs::read_link(e.path()).map_err(err)?)
        } else if ty.is_dir() || ty.is_file() {
            None
        } else {
            continue;
        };
        out.push(RootEntry {
            name,
            source: e.path(),
            symlink,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Where a session's directories are on the host and where they appear in
/// the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Host directory of the workspace.
    pub workspace: PathBuf,
    /// Host directory of HOME.
    pub home: PathBuf,
    /// Host directory shown at `/tmp`.
    pub tmp: PathBuf,
    /// Where the workspace appears.
    pub workdir: PathBuf,
    /// The trust files on the host (none for `polar sandbox run --inspect`,
    /// which terminates no TLS).
    pub trust: Option<TrustFiles>,
    /// Distribution bundle paths to cover with the trust bundle.
    pub bundle_targets: Vec<PathBuf>,
    /// The spec's mounts.
    pub mounts: Vec<Mount>,
    /// Host directories shown read-only at the same path (the harness
    /// installation).
    pub read_only: Vec<PathBuf>,
    /// `(staging, target)`: read-only directories the sandbox user could
    /// not reach on the host (a parent without `o+x`), bound by the agent's
    /// child at `staging` (see [`steps::stage`]) and shown at `target`.
    pub staged: Vec<(PathBuf, PathBuf)>,
    /// The directory holding the session's `passwd` and `group`
    /// ([`view::passwd`]), bound over the native sandbox's (none: the
    /// image's own).
    pub identity: Option<PathBuf>,
    /// The sandbox user: the session's leased uid
    /// ([`crate::uids`]).
    pub user: (u32, u32),
}

/// A bind mount of a host path into the sandbox. Container runtimes get
/// it as one structured argument ([`Bind::docker_mount`],
/// [`Bind::apptainer_bind`]), never a string the paths could change the
/// meaning of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    /// Host path.
    pub source: PathBuf,
    /// Sandbox path.
    pub target: PathBuf,
    /// Read-only.
    pub read_only: bool,
}

impl Bind {
    fn checked(&self, kind: RuntimeKind) -> Result<(&str, &str), RuntimeError> {
        fn one(kind: RuntimeKind, p: &Path) -> Result<&str, RuntimeError> {
            match polar_spec::runtime::mount_path_problem(kind, p) {
                Some(why) => Err(RuntimeError::MountSyntax {
                    kind,
                    path: p.to_owned(),
                    why,
                }),
                // mount_path_problem refuses what is not UTF-8.
                None => p.to_str().ok_or(RuntimeError::MountSyntax {
                    kind,
                    path: p.to_owned(),
                    why: "is not UTF-8",
                }),
            }
        }
        Ok((one(kind, &self.source)?, one(kind, &self.target)?))
    }

    /// docker's `--mount` value: `type=bind,source=S,target=T[,readonly]`,
    /// a CSV record, refused when a path holds `,`, `"`, a control
    /// character or surrounding white space (its fields are then exactly
    /// these; `=` and `:` in a value are literal, as docker splits a field
    /// at its first `=`).
    pub fn docker_mount(&self) -> Result<OsString, RuntimeError> {
        let (src, dst) = self.checked(RuntimeKind::Docker)?;
        let ro = if self.read_only { ",readonly" } else { "" };
        Ok(format!("type=bind,source={src},target={dst}{ro}").into())
    }

    /// apptainer's `--bind` value: `S:T[:ro]`, refused when a path holds
    /// `:`, `,`, a control character or surrounding white space.
    pub fn apptainer_bind(&self) -> Result<OsString, RuntimeError> {
        let (src, dst) = self.checked(RuntimeKind::Apptainer)?;
        let ro = if self.read_only { ":ro" } else { "" };
        Ok(format!("{src}:{dst}{ro}").into())
    }
}

impl Layout {
    /// Every host path the sandbox is given, in mount order: the trust
    /// files (at [`native::TRUST_DIR`] and over the distribution bundles),
    /// the workspace, HOME, `/tmp`, the spec's mounts, the read-only
    /// directories.
    pub fn binds(&self) -> Vec<Bind> {
        let b = |source: &Path, target: &Path, read_only: bool| Bind {
            source: source.to_owned(),
            target: target.to_owned(),
            read_only,
        };
        let inside = trust_in_sandbox();
        let mut out = Vec::new();
        if let Some(trust) = &self.trust {
            out.push(b(&trust.bundle, &inside.bundle, true));
            out.push(b(&trust.ca, &inside.ca, true));
            out.extend(
                self.bundle_targets
                    .iter()
                    .map(|t| b(&trust.bundle, t, true)),
            );
        }
        out.push(b(&self.workspace, &self.workdir, false));
        out.push(b(&self.home, Path::new(native::HOME), false));
        out.push(b(&self.tmp, Path::new("/tmp"), false));
        out.extend(
            self.mounts
                .iter()
                .map(|m| b(&m.source, &m.target, m.read_only)),
        );
        out.extend(self.read_only.iter().map(|d| b(d, d, true)));
        out.extend(self.staged.iter().map(|(s, t)| b(s, t, true)));
        out
    }
}

/// The trust files as the sandbox sees them.
pub fn trust_in_sandbox() -> TrustFiles {
    let dir = Path::new(native::TRUST_DIR);
    TrustFiles {
        bundle: dir.join("bundle.pem"),
        ca: dir.join("polar-ca.pem"),
    }
}

/// Seconds since the epoch of `deadline` (a monotonic instant), with
/// millisecond precision.
fn epoch_of(deadline: tokio::time::Instant) -> String {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let at = SystemTime::now() + left;
    let d = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}", d.as_secs(), d.subsec_millis())
}

/// The environment every command of a session starts from: `PATH` (with
/// `extra_path` first), `HOME`, locale, the trust variables pointing at
/// [`native::TRUST_DIR`], `POLAR_SESSION`, and the time budget:
/// `POLAR_DEADLINE` (seconds since the epoch) and `POLAR_TIMEOUT_SECS`
/// (whole seconds left), then the spec's environment.
pub fn base_env(
    session: &SessionId,
    spec: &RuntimeSpec,
    extra_path: &[PathBuf],
    deadline: Option<tokio::time::Instant>,
) -> Vec<(String, String)> {
    let mut path: Vec<String> = extra_path.iter().map(|p| p.display().to_string()).collect();
    path.push(BASE_PATH.to_owned());
    let mut env = vec![
        ("PATH".to_owned(), path.join(":")),
        ("HOME".to_owned(), native::HOME.to_owned()),
        ("USER".to_owned(), "polar".to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("TERM".to_owned(), "dumb".to_owned()),
        ("TMPDIR".to_owned(), "/tmp".to_owned()),
        ("POLAR_SESSION".to_owned(), session.to_string()),
        (
            "POLAR_WORKSPACE".to_owned(),
            spec.workdir.display().to_string(),
        ),
    ];
    env.extend(trust_in_sandbox().env());
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(tokio::time::Instant::now());
        env.push(("POLAR_DEADLINE".to_owned(), epoch_of(d)));
        env.push(("POLAR_TIMEOUT_SECS".to_owned(), left.as_secs().to_string()));
    }
    env.extend(spec.environment.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Sets `key` in `env`, replacing an earlier value.
pub fn set_env(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value));
}

/// A runtime ready to run commands of one session.
#[derive(Clone, Debug)]
pub enum Runtime {
    /// bubblewrap on the host.
    Native {
        /// What it shows of the node's file system.
        view: view::View,
        /// The agent's state directory: no bind source holds it, and none
        /// is another session's ([`view::View::check`]).
        state_dir: PathBuf,
    },
    /// A Docker container.
    Docker(docker::Docker),
    /// An Apptainer instance.
    Apptainer(apptainer::Apptainer),
}

/// What the node's configuration says about running sessions.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The limits a sandbox gets where its spec sets none.
    pub limits: polar_spec::runtime::Limits,
    /// The Docker engine.
    pub docker: docker::Engine,
    /// Directories native sandboxes are shown besides the system's
    /// (`sandbox.view_dirs`).
    pub view_dirs: Vec<PathBuf>,
    /// The agent's state directory.
    pub state_dir: PathBuf,
    /// The sandboxes' uids.
    pub uids: crate::uids::UidPool,
}

impl Node {
    /// The node of `config`.
    pub fn of(config: &polar_config::Config) -> Self {
        Self {
            limits: config.sandbox.default_limits(),
            docker: docker::Engine::new(
                config.sandbox.docker_host.clone(),
                &config.agent.state_dir,
            ),
            view_dirs: config.sandbox.view_dirs.clone(),
            state_dir: config.agent.state_dir.clone(),
            uids: crate::uids::UidPool::new(config.sandbox.uids),
        }
    }
}

impl Runtime {
    /// The native runtime on `spec`'s root (the node's allowlisted view,
    /// or the spec's `rootfs`), checked to be usable here (`bwrap
    /// --version` runs and the view is listed).
    pub fn native(spec: &RuntimeSpec, node: &Node) -> Result<Self, RuntimeError> {
        check_program(RuntimeKind::Native, native::BWRAP, "--version")?;
        let view = match &spec.rootfs {
            Some(root) => view::View::rootfs(root)?,
            None => view::View::host(&node.view_dirs)?,
        };
        Ok(Self::Native {
            view,
            state_dir: node.state_dir.clone(),
        })
    }

    /// The runtime `spec` asks for on `node`, checked to be usable here
    /// (native: see [`Runtime::native`]; docker: the engine answers and uses
    /// the cgroupfs driver, [`docker::Docker::check`]; apptainer:
    /// `apptainer --version` runs). Blocks.
    pub fn for_spec(
        spec: &RuntimeSpec,
        session: &SessionId,
        node: &Node,
    ) -> Result<Self, RuntimeError> {
        match spec.kind {
            RuntimeKind::Native => Self::native(spec, node),
            RuntimeKind::Docker => {
                let d = docker::Docker::new(
                    spec,
                    session,
                    spec.limits.or(node.limits),
                    node.docker.clone(),
                );
                d.check()?;
                Ok(Self::Docker(d))
            }
            RuntimeKind::Apptainer => {
                check_program(RuntimeKind::Apptainer, apptainer::APPTAINER, "--version")?;
                Ok(Self::Apptainer(apptainer::Apptainer::new(spec, session)))
            }
        }
    }

    /// The command line the agent execs for `argv` with `env` (the
    /// sandbox's whole environment), and the descriptors it must inherit
    /// (the native runtime's seccomp programs).
    pub fn command(
        &self,
        layout: &Layout,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<RuntimeCommand, RuntimeError> {
        Ok(match self {
            Self::Native { view, state_dir } => {
                view.check(layout, state_dir)?;
                let mut fds = crate::seccomp::memfds()?;
                let numbers: Vec<i32> = fds.iter().map(AsRawFd::as_raw_fd).collect();
                let (status, status_w) =
                    native::status_pipe().map_err(|source| RuntimeError::Io {
                        op: "create",
                        path: PathBuf::from("bwrap's status pipe"),
                        source,
                    })?;
                let argv = native::bwrap_argv(layout, view, &numbers, status_w.as_raw_fd(), argv);
                fds.push(status_w);
                RuntimeCommand {
                    argv,
                    keep_fds: fds,
                    status: Some(status),
                }
            }
            Self::Docker(d) => RuntimeCommand {
                argv: d.exec_argv(layout, argv, env),
                keep_fds: Vec::new(),
                status: None,
            },
            Self::Apptainer(a) => RuntimeCommand {
                argv: a.exec_argv(layout, argv, env),
                keep_fds: Vec::new(),
                status: None,
            },
        })
    }

    /// Whether the agent's child sets `no_new_privs` before exec (native:
    /// nothing it runs may gain privileges; the container runtimes' own
    /// programs may need setuid helpers).
    pub fn no_new_privs(&self) -> bool {
        matches!(self, Self::Native { .. })
    }

    /// Whether the environment goes to the exec'd program directly
    /// (native) rather than on its command line (docker, apptainer).
    pub fn passes_env(&self) -> bool {
        matches!(self, Self::Native { .. })
    }

    /// The whole environment of the runtime's own program (the docker or
    /// apptainer CLI) where [`Runtime::passes_env`] is false: docker's is
    /// the agent's ([`docker::Engine::client_env`]), never the session's
    /// HOME, since its CLI runs as root; rootless apptainer runs as the
    /// sandbox user with the session's HOME.
    pub fn client_env(&self, layout: &Layout) -> Vec<(String, String)> {
        match self {
            Self::Docker(d) => d.engine.client_env(),
            Self::Native { .. } | Self::Apptainer(_) => vec![
                ("PATH".into(), BASE_PATH.into()),
                ("HOME".into(), layout.home.display().to_string()),
            ],
        }
    }

    /// Whether the agent drops to the sandbox user before exec (native,
    /// apptainer: rootless). The docker CLI talks to its daemon as root.
    pub fn drops_user(&self) -> bool {
        !matches!(self, Self::Docker(_))
    }
}

/// What the agent execs for one command of a runtime.
#[derive(Debug)]
pub struct RuntimeCommand {
    /// The command line.
    pub argv: Vec<OsString>,
    /// Descriptors the command must inherit.
    pub keep_fds: Vec<OwnedFd>,
    /// The read end of bubblewrap's status pipe (native): whether the
    /// command was started at all ([`native::started`]).
    pub status: Option<std::fs::File>,
}

/// Where the trust bundle is bound: every distribution's bundle path, or
/// for a native runtime only those that exist in its root.
pub fn bundle_targets(runtime: &Runtime, spec: &RuntimeSpec) -> Vec<PathBuf> {
    match runtime {
        Runtime::Native { .. } => {
            let root = spec.rootfs.clone().unwrap_or_else(|| PathBuf::from("/"));
            polar_tls::bundle::DISTRO_BUNDLES
                .iter()
                .map(PathBuf::from)
                .filter(|p| root.join(p.strip_prefix("/").unwrap_or(p)).is_file())
                .collect()
        }
        _ => polar_tls::bundle::DISTRO_BUNDLES
            .iter()
            .map(PathBuf::from)
            .collect(),
    }
}

/// Checks that `program arg` runs.
pub fn check_program(
    kind: RuntimeKind,
    program: &'static str,
    arg: &str,
) -> Result<String, RuntimeError> {
    let out = std::process::Command::new(program)
        .arg(arg)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| RuntimeError::Unavailable {
            kind,
            program,
            why: format!("cannot be started: {e}"),
        })?;
    if !out.status.success() {
        return Err(RuntimeError::Unavailable {
            kind,
            program,
            why: format!(
                "fails ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The time left until `deadline`.
pub fn remaining(deadline: tokio::time::Instant) -> Duration {
    deadline.saturating_duration_since(tokio::time::Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_has_trust_budget_and_spec_values() {
        let mut spec = RuntimeSpec::default();
        spec.environment.insert("A".into(), "1".into());
        let s: SessionId = "s-1".parse().unwrap();
        let d = tokio::time::Instant::now() + Duration::from_secs(90);
        let env = base_env(&s, &spec, &[PathBuf::from("/opt/h/bin")], Some(d));
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("PATH").unwrap(), format!("/opt/h/bin:{BASE_PATH}"));
        assert_eq!(get("HOME").as_deref(), Some("/home/polar"));
        assert_eq!(
            get("SSL_CERT_FILE").as_deref(),
            Some("/polar/trust/bundle.pem")
        );
        assert_eq!(
            get("NODE_EXTRA_CA_CERTS").as_deref(),
            Some("/polar/trust/polar-ca.pem")
        );
        assert_eq!(get("POLAR_SESSION").as_deref(), Some("s-1"));
        let secs: u64 = get("POLAR_TIMEOUT_SECS").unwrap().parse().unwrap();
        assert!((88..=90).contains(&secs));
        let at: f64 = get("POLAR_DEADLINE").unwrap().parse().unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((at - now - 90.0).abs() < 2.0);
        assert_eq!(get("A").as_deref(), Some("1"));
    }

    #[test]
    fn lists_the_root_with_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("usr")).unwrap();
        std::os::unix::fs::symlink("usr/bin", tmp.path().join("bin")).unwrap();
        let entries = list_root(tmp.path()).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].name, "bin");
        assert_eq!(entries[0].symlink.as_deref(), Some(Path::new("usr/bin")));
        assert_eq!(entries[1].symlink, None);
    }
}
