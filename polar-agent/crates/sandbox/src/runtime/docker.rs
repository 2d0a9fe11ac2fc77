//! The `docker` runtime: command lines for the docker CLI, and the
//! engine's settings.
//!
//! The container runs `sleep infinity` under `--init`, is created with
//! `--network none` (its own network namespace with only loopback), and
//! each command runs in it with `docker exec`. Once it runs, the agent joins
//! that namespace (`/proc/<pid>/ns/net`, the pid from [`Docker::pid_argv`])
//! to bind the session's listener and DNS socket inside it, as it does for
//! its own isolated namespaces, and points the redirect at them
//! (`SandboxSession::adopt_netns`): the container reaches nothing but the
//! agent, and a session whose namespace cannot be joined does not start
//! (fails closed).
//!
//! `--cgroup-parent` names the session's cgroup v2 directory relative to
//! the cgroup mount (the engine must use the cgroupfs driver: checked by
//! [`Docker::check`]). runc makes the container's group below it, in
//! cgroup v2 and, on a hybrid host (cgroup v1 controllers beside a v2
//! mount, where docker 20.10 is a "cgroup v1" engine), at the same path in
//! each v1 hierarchy too: so the container's processes, `docker exec`'s
//! included, are in the session's v2 subtree, the redirect's programs
//! (attached to the agent's v2 directory, inherited below it) apply to
//! them, and the session's `cgroup.kill` (its budget, the guardian after
//! an agent crash) ends them. The v1 groups runc leaves behind are removed
//! with the container (`cgroup::remove_v1_mirrors`).
//!
//! Hardened by default: `--cap-drop ALL`, `no-new-privileges`, the native
//! runtime's seccomp filter as a profile (`sandbox::seccomp::docker_profile`,
//! written to `<state_dir>/docker/seccomp.json`), the sandbox user,
//! `--read-only` root (the workspace, HOME and `/tmp` are binds on the
//! session's disk quota, and so is `/dev/shm`: `--ipc none` is a private
//! IPC namespace without the engine's tmpfs there), the memory, process and
//! CPU limits of the spec or the node (`--memory` = `--memory-swap`,
//! `--pids-limit`, `--cpus`), `--rm` (the engine removes a container
//! whose processes were killed), no logs kept by the engine. Every bind
//! (the workspace, HOME, trust files, the spec's mounts, the harness's
//! directories) is one `--mount type=bind,...` argument built by
//! [`super::Bind::docker_mount`], which refuses a path docker's CSV syntax
//! would read differently; a mount that would show the engine's socket (or
//! containerd's) inside is refused ([`Docker::check_binds`]).
//!
//! The docker CLI runs as root: its environment is the agent's, never the
//! session's — `HOME` and `DOCKER_CONFIG` point at `<state_dir>/docker/client`
//! (a `config.json` of `{}`), so nothing the sandbox wrote into its HOME
//! (a `.docker/config.json` naming credential helpers or CLI plugin
//! directories) is read by a root process.

use std::ffi::OsString;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};

use super::{BASE_PATH, Layout, RuntimeError, io};
use polar_ids::SessionId;
use polar_spec::runtime::{Limits, RuntimeKind, RuntimeSpec};

/// The docker CLI.
pub const DOCKER: &str = "docker";

/// The docker CLI's default engine socket.
const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// containerd's socket (the engine's own, or one it shares).
const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// How the agent reaches the Docker engine: the node's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Engine {
    /// `sandbox.docker_host` (`unix:///path`); `None` is the CLI's default.
    pub host: Option<String>,
    /// The agent's directory for the docker client (`<state_dir>/docker`):
    /// the client's configuration and the seccomp profile.
    pub dir: PathBuf,
}

impl Engine {
    /// The engine of a node whose state directory is `state_dir`.
    pub fn new(host: Option<String>, state_dir: &Path) -> Self {
        Self {
            host,
            dir: state_dir.join("docker"),
        }
    }

    fn client_dir(&self) -> PathBuf {
        self.dir.join("client")
    }

    /// The seccomp profile's path.
    pub fn seccomp_profile(&self) -> PathBuf {
        self.dir.join("seccomp.json")
    }

    /// The engine's socket on this host.
    pub fn socket(&self) -> PathBuf {
        PathBuf::from(
            self.host
                .as_deref()
                .and_then(|h| h.strip_prefix("unix://"))
                .unwrap_or(DEFAULT_SOCKET),
        )
    }

    /// The docker CLI run with `args`, the engine's client environment
    /// only ([`Self::client_env`]) and no input: the one way the agent
    /// itself asks the engine something (blocking as is, or async through
    /// `tokio::process::Command::from`).
    pub fn cli<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> std::process::Command {
        let mut c = std::process::Command::new(DOCKER);
        c.args(args)
            .env_clear()
            .envs(self.client_env())
            .stdin(std::process::Stdio::null());
        c
    }

    /// The docker CLI's whole environment.
    pub fn client_env(&self) -> Vec<(String, String)> {
        let client = self.client_dir().display().to_string();
        let mut env = vec![
            ("PATH".to_owned(), BASE_PATH.to_owned()),
            ("HOME".to_owned(), client.clone()),
            ("DOCKER_CONFIG".to_owned(), client),
        ];
        if let Some(h) = &self.host {
            env.push(("DOCKER_HOST".to_owned(), h.clone()));
        }
        env
    }

    /// Writes the client's configuration and the seccomp profile (root's,
    /// mode 0600, in a directory only root reaches). Blocks.
    fn write_files(&self) -> Result<(), RuntimeError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let client = self.client_dir();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&client)
            .map_err(io("create", &client))?;
        let profile = crate::seccomp::docker_profile().to_string();
        for (path, text) in [
            (client.join("config.json"), "{}".to_owned()),
            (self.seccomp_profile(), profile),
        ] {
            // Made again from constants at every check: no fsync needed.
            let opts = polar_io::fs::WriteOptions::new().mode(0o600).no_sync();
            polar_io::fs::write_atomic(&path, text.as_bytes(), &opts)
                .map_err(|e| io("write", &path)(std::io::Error::other(e)))?;
        }
        Ok(())
    }
}

/// A docker runtime for one session.
#[derive(Clone, Debug, PartialEq)]
pub struct Docker {
    /// The image.
    pub image: String,
    /// The container's name, `polar-<session>`.
    pub name: String,
    /// The session.
    pub session: SessionId,
    /// Limits: the spec's, else the node's.
    pub limits: Limits,
    /// The engine.
    pub engine: Engine,
}

fn v(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

impl Docker {
    /// The runtime for `spec` (whose image is validated to be there) with
    /// `limits` (the spec's, completed by the node's).
    pub fn new(spec: &RuntimeSpec, session: &SessionId, limits: Limits, engine: Engine) -> Self {
        Self {
            image: spec.image.clone().unwrap_or_default(),
            name: format!("polar-{session}"),
            session: session.clone(),
            limits,
            engine,
        }
    }

    /// Checks that the engine answers and places containers where the
    /// runtime needs them (the cgroupfs driver), and writes the client's
    /// files. Blocks.
    pub fn check(&self) -> Result<(), RuntimeError> {
        self.engine.write_files()?;
        let unavailable = |why: String| RuntimeError::Unavailable {
            kind: RuntimeKind::Docker,
            program: DOCKER,
            why,
        };
        let out = self
            .engine
            .cli(&["info", "--format", "{{.ServerVersion}} {{.CgroupDriver}}"])
            .output()
            .map_err(|e| unavailable(format!("cannot be started: {e}")))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(unavailable(format!(
                "reaches no engine ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        match text.split_whitespace().nth(1) {
            Some("cgroupfs") => Ok(()),
            driver => Err(unavailable(format!(
                "talks to an engine using the {} cgroup driver: the docker runtime places \
                 containers in the session's cgroup with --cgroup-parent, which needs \
                 `native.cgroupdriver=cgroupfs` (dockerd --exec-opt or daemon.json)",
                driver.unwrap_or("unknown")
            ))),
        }
    }

    /// Refuses a bind that would show the engine's socket, or containerd's,
    /// inside the container (the socket itself, or a directory above it),
    /// and any other unix socket bound directly: each is root on the node.
    /// Blocks (reads the file system).
    pub fn check_binds(&self, layout: &Layout) -> Result<(), RuntimeError> {
        let sockets: Vec<PathBuf> = [
            self.engine.socket(),
            PathBuf::from(DEFAULT_SOCKET),
            PathBuf::from(CONTAINERD_SOCKET),
        ]
        .iter()
        .map(|s| std::fs::canonicalize(s).unwrap_or_else(|_| s.clone()))
        .collect();
        for b in layout.binds() {
            let source = std::fs::canonicalize(&b.source).unwrap_or_else(|_| b.source.clone());
            let is_socket = std::fs::metadata(&source).is_ok_and(|m| m.file_type().is_socket());
            if is_socket || sockets.iter().any(|s| s.starts_with(&source)) {
                return Err(RuntimeError::MountSyntax {
                    kind: RuntimeKind::Docker,
                    path: b.source,
                    why: "would show a container engine's socket (or another unix socket) \
                          inside the container",
                });
            }
        }
        Ok(())
    }

    /// `docker run -d ...`: creates and starts the container.
    /// `cgroup_parent` is the session cgroup relative to the v2 mount.
    /// A bind docker could not read as written is an error.
    pub fn run_argv(
        &self,
        layout: &Layout,
        cgroup_parent: &str,
    ) -> Result<Vec<OsString>, RuntimeError> {
        let mut a = v(&[DOCKER, "run", "-d", "--rm", "--name", &self.name]);
        a.extend(v(&[
            "--network",
            "none",
            "--ipc",
            "none",
            "--init",
            "--cgroup-parent",
            cgroup_parent,
            "--log-driver",
            "none",
        ]));
        a.extend(v(&[
            "--label",
            &format!("polar.session={}", self.session),
            "--label",
            &format!("polar.agent={}", self.engine.dir.display()),
        ]));
        a.extend(v(&[
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
        ]));
        a.push("--security-opt".into());
        let mut seccomp = OsString::from("seccomp=");
        seccomp.push(self.engine.seccomp_profile());
        a.push(seccomp);
        a.push("--read-only".into());
        let (uid, gid) = layout.user;
        a.extend(v(&["--user", &format!("{uid}:{gid}")]));
        if let Some(m) = self.limits.memory_bytes {
            a.extend(v(&[
                "--memory",
                &m.to_string(),
                "--memory-swap",
                &m.to_string(),
            ]));
        }
        if let Some(p) = self.limits.pids {
            a.extend(v(&["--pids-limit", &p.to_string()]));
        }
        if let Some(c) = self.limits.cpu {
            a.extend(v(&["--cpus", &format!("{c}")]));
        }
        for b in layout.binds() {
            a.push("--mount".into());
            a.push(b.docker_mount()?);
        }
        // `/dev/shm` is the session's `tmp/` (on its disk quota), not the
        // engine's 64 MiB tmpfs (`--ipc none` mounts none).
        let shm = super::Bind {
            source: layout.tmp.clone(),
            target: "/dev/shm".into(),
            read_only: false,
        };
        a.push("--mount".into());
        a.push(shm.docker_mount()?);
        // The session's uid has no entry in the image's `/etc/passwd`
        // (Node's `os.userInfo()` then fails): the session's own, naming
        // it, over the image's.
        if let Some(dir) = &layout.identity {
            for name in ["passwd", "group"] {
                let id = super::Bind {
                    source: dir.join(name),
                    target: std::path::Path::new("/etc").join(name),
                    read_only: true,
                };
                a.push("--mount".into());
                a.push(id.docker_mount()?);
            }
        }
        a.push("--workdir".into());
        a.push(layout.workdir.clone().into());
        // The image is one argument after `--`-free options: one starting
        // with `-` would be read as an option.
        if self.image.starts_with('-') {
            return Err(RuntimeError::Command {
                what: "docker run".into(),
                detail: format!("the image {:?} starts with '-'", self.image),
            });
        }
        a.extend(v(&[&self.image, "sleep", "infinity"]));
        Ok(a)
    }

    /// `docker exec`: runs `argv` with exactly `env` in the container.
    pub fn exec_argv(
        &self,
        layout: &Layout,
        argv: &[String],
        env: &[(String, String)],
    ) -> Vec<OsString> {
        let mut a = v(&[DOCKER, "exec", "-i", "-w"]);
        a.push(layout.workdir.clone().into());
        for (k, val) in env {
            a.push("-e".into());
            a.push(format!("{k}={val}").into());
        }
        a.push(self.name.clone().into());
        a.extend(argv.iter().map(OsString::from));
        a
    }

    /// `docker inspect`: the container's init pid (whose network namespace
    /// the agent joins), ready to run ([`Engine::cli`]).
    pub fn pid_command(&self) -> std::process::Command {
        self.engine
            .cli(&["inspect", "-f", "{{.State.Pid}}", &self.name])
    }

    /// The host pid of the container's init, from `docker inspect`.
    pub async fn init_pid(&self) -> Result<u32, String> {
        let out = tokio::process::Command::from(self.pid_command())
            .output()
            .await
            .map_err(|e| format!("docker inspect: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        match text.trim().parse::<u32>() {
            Ok(pid) if out.status.success() && pid > 0 => Ok(pid),
            _ => Err(format!(
                "docker inspect gave no pid ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        }
    }

    /// `docker rm -f`: removes the container.
    pub fn rm_argv(&self) -> Vec<OsString> {
        v(&[DOCKER, "rm", "-f", &self.name])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_spec::runtime::Mount;
    use polar_tls::TrustFiles;

    fn layout() -> Layout {
        Layout {
            workspace: "/s/ws".into(),
            home: "/s/home".into(),
            tmp: "/s/tmp".into(),
            workdir: "/workspace".into(),
            trust: Some(TrustFiles {
                bundle: "/st/trust/bundle.pem".into(),
                ca: "/st/trust/polar-ca.pem".into(),
            }),
            bundle_targets: vec!["/etc/ssl/certs/ca-certificates.crt".into()],
            mounts: vec![Mount {
                source: "/data".into(),
                target: "/data".into(),
                read_only: true,
            }],
            read_only: vec![],
            staged: vec![],
            identity: None,
            user: (65534, 65534),
        }
    }

    fn text(a: &[OsString]) -> String {
        a.iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn docker() -> Docker {
        let spec = RuntimeSpec::parse(
            "kind = \"docker\"\nimage = \"python:3.12\"\n[limits]\npids = 64\ncpu = 1.5",
            false,
            "t",
        )
        .unwrap();
        let node = Limits {
            memory_bytes: Some(1 << 30),
            pids: Some(4096),
            ..Limits::default()
        };
        let engine = Engine::new(Some("unix:///run/e/docker.sock".into()), Path::new("/st"));
        Docker::new(&spec, &"s-1".parse().unwrap(), spec.limits.or(node), engine)
    }

    #[test]
    fn run_command_isolates_hardens_and_places_the_container() {
        let a = text(
            &docker()
                .run_argv(&layout(), "/polar/agent-1-0/s-1")
                .unwrap(),
        );
        assert!(
            a.starts_with(
                "docker run -d --rm --name polar-s-1 --network none --ipc none --init \
                 --cgroup-parent /polar/agent-1-0/s-1 --log-driver none"
            ),
            "{a}"
        );
        assert!(a.contains("--label polar.session=s-1 --label polar.agent=/st/docker"));
        assert!(a.contains(
            "--cap-drop ALL --security-opt no-new-privileges \
             --security-opt seccomp=/st/docker/seccomp.json --read-only"
        ));
        assert!(a.contains("--user 65534:65534"));
        // The spec's pids and cpu, the node's memory.
        assert!(a.contains("--memory 1073741824 --memory-swap 1073741824"));
        assert!(a.contains("--pids-limit 64"));
        assert!(a.contains("--cpus 1.5"));
        assert!(a.contains(
            "--mount type=bind,source=/s/ws,target=/workspace \
             --mount type=bind,source=/s/home,target=/home/polar"
        ));
        assert!(a.contains(
            "--mount type=bind,source=/st/trust/bundle.pem,target=/polar/trust/bundle.pem,readonly"
        ));
        assert!(a.contains("--mount type=bind,source=/st/trust/bundle.pem,target=/etc/ssl/certs/ca-certificates.crt,readonly"));
        assert!(a.contains("--mount type=bind,source=/data,target=/data,readonly"));
        assert!(!a.contains(" -v "), "{a}");
        assert!(
            !a.contains("--privileged") && !a.contains("unconfined"),
            "{a}"
        );
        assert!(
            a.ends_with(
                "--mount type=bind,source=/s/tmp,target=/dev/shm \
                 --workdir /workspace python:3.12 sleep infinity"
            ),
            "{a}"
        );
    }

    #[test]
    fn the_cli_runs_with_the_agents_environment_never_the_sessions() {
        let env = docker().engine.client_env();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HOME"), Some("/st/docker/client"));
        assert_eq!(get("DOCKER_CONFIG"), Some("/st/docker/client"));
        assert_eq!(get("DOCKER_HOST"), Some("unix:///run/e/docker.sock"));
        assert_eq!(get("PATH"), Some(BASE_PATH));
        assert_eq!(env.len(), 4);
        assert_eq!(docker().engine.socket(), Path::new("/run/e/docker.sock"));
        let default = Engine::new(None, Path::new("/st"));
        assert!(default.client_env().iter().all(|(k, _)| k != "DOCKER_HOST"));
        assert_eq!(default.socket(), Path::new(DEFAULT_SOCKET));
    }

    #[test]
    fn a_bind_showing_an_engine_socket_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("run/docker.sock");
        std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let mut d = docker();
        d.engine = Engine::new(Some(format!("unix://{}", sock.display())), Path::new("/st"));
        let with = |source: &Path| {
            let mut l = layout();
            l.mounts = vec![Mount {
                source: source.to_owned(),
                target: "/x".into(),
                read_only: true,
            }];
            l
        };
        for bad in [sock.as_path(), sock.parent().unwrap(), tmp.path()] {
            let e = d.check_binds(&with(bad)).unwrap_err().to_string();
            assert!(e.contains("engine's socket"), "{bad:?}: {e}");
        }
        // Any other socket, too.
        let other = tmp.path().join("other.sock");
        let _other = std::os::unix::net::UnixListener::bind(&other).unwrap();
        assert!(d.check_binds(&with(&other)).is_err());
        let data = tmp.path().join("data");
        std::fs::create_dir(&data).unwrap();
        d.check_binds(&with(&data)).unwrap();
    }

    #[test]
    fn hostile_paths_never_make_an_ambiguous_mount() {
        let d = docker();
        for bad in [
            "/d,readonly=false",
            "/d,source=/etc",
            "/d\"x",
            "/d\nx",
            "/d\rx",
            "/d\tx",
            "/d ",
        ] {
            for (src, dst) in [(bad, "/t"), ("/d", bad)] {
                let mut l = layout();
                l.mounts = vec![Mount {
                    source: src.into(),
                    target: dst.into(),
                    read_only: true,
                }];
                let e = d.run_argv(&l, "/p").unwrap_err().to_string();
                assert!(e.contains("cannot mount"), "{src:?} {dst:?}: {e}");
            }
            // The workspace's host path too (the node's state directory).
            let mut l = layout();
            l.workspace = bad.into();
            assert!(d.run_argv(&l, "/p").is_err(), "{bad:?}");
        }
        // `:`, `=` and a leading `-` in a component are literal in a
        // key=value CSV field: one argument, exactly these fields.
        let mut l = layout();
        l.mounts = vec![Mount {
            source: "/d:x=y/-z".into(),
            target: "/-t:ro".into(),
            read_only: false,
        }];
        let a = d.run_argv(&l, "/p").unwrap();
        let i = a
            .iter()
            .position(|s| s == "type=bind,source=/d:x=y/-z,target=/-t:ro")
            .unwrap();
        assert_eq!(a[i - 1], "--mount");
        let mut d = docker();
        d.image = "--privileged".into();
        assert!(d.run_argv(&layout(), "/p").is_err());
    }

    #[test]
    fn exec_inspect_and_rm() {
        let d = docker();
        let a = text(&d.exec_argv(
            &layout(),
            &["sh".into(), "-c".into(), "echo hi".into()],
            &[("HOME".into(), "/home/polar".into())],
        ));
        assert_eq!(
            a,
            "docker exec -i -w /workspace -e HOME=/home/polar polar-s-1 sh -c echo hi"
        );
        let pid = d.pid_command();
        let argv: Vec<OsString> = std::iter::once(pid.get_program())
            .chain(pid.get_args())
            .map(Into::into)
            .collect();
        assert_eq!(text(&argv), "docker inspect -f {{.State.Pid}} polar-s-1");
        let env: Vec<_> = pid.get_envs().map(|(k, _)| k.to_owned()).collect();
        assert!(env.iter().any(|k| k == "DOCKER_CONFIG"), "{env:?}");
        assert_eq!(text(&d.rm_argv()), "docker rm -f polar-s-1");
    }
}
