//! The `docker` runtime: command lines for the docker CLI.
//!
//! The container runs `sleep infinity` under `--init`, is created with
//! `--network none` (its own network namespace with only loopback), and
//! each command runs in it with `docker exec`. Once it runs, the agent joins
//! that namespace (`/proc/<pid>/ns/net`, the pid from [`Docker::pid_argv`])
//! to bind the session's listener and DNS socket inside it, as it does for
//! its own isolated namespaces, and points the redirect at them
//! (`SandboxSession::adopt_netns`), so the container reaches nothing but the
//! agent (fails closed). `--cgroup-parent` places the container
//! below the session's cgroup v2 directory (given relative to the cgroup
//! mount: the cgroupfs driver), so the redirect's programs, attached to the
//! agent's cgroup, apply to it and the session's `cgroup.kill` ends it. The
//! limits go to docker's own flags (`--memory`, `--pids-limit`, `--cpus`).
//! The trust files are mounted as in every runtime. Every bind (the
//! workspace, HOME, trust files, the spec's mounts, the harness's
//! directories) is one `--mount type=bind,...` argument built by
//! [`super::Bind::docker_mount`], which refuses a path docker's CSV syntax
//! would read differently.

use std::ffi::OsString;

use super::{Layout, RuntimeError};
use polar_ids::SessionId;
use polar_spec::runtime::{Limits, RuntimeSpec};

/// The docker CLI.
pub const DOCKER: &str = "docker";

/// A docker runtime for one session.
#[derive(Clone, Debug, PartialEq)]
pub struct Docker {
    /// The image.
    pub image: String,
    /// The container's name, `polar-<session>`.
    pub name: String,
    /// Limits.
    pub limits: Limits,
}

fn v(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

impl Docker {
    /// The runtime for `spec` (whose image is validated to be there).
    pub fn new(spec: &RuntimeSpec, session: &SessionId) -> Self {
        Self {
            image: spec.image.clone().unwrap_or_default(),
            name: format!("polar-{session}"),
            limits: spec.limits,
        }
    }

    /// `docker run -d ...`: creates and starts the container.
    /// `cgroup_parent` is the session cgroup relative to the v2 mount.
    /// A bind docker could not read as written is an error.
    pub fn run_argv(
        &self,
        layout: &Layout,
        cgroup_parent: &str,
    ) -> Result<Vec<OsString>, RuntimeError> {
        let mut a = v(&[DOCKER, "run", "-d", "--name", &self.name]);
        a.extend(v(&[
            "--network",
            "none",
            "--init",
            "--cgroup-parent",
            cgroup_parent,
        ]));
        a.extend(v(&[
            "--label",
            &format!("polar.session={}", &self.name[6..]),
        ]));
        a.extend(v(&[
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
        ]));
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
    /// the agent joins).
    pub fn pid_argv(&self) -> Vec<OsString> {
        v(&[DOCKER, "inspect", "-f", "{{.State.Pid}}", &self.name])
    }

    /// `docker rm -f`: removes the container.
    pub fn rm_argv(&self) -> Vec<OsString> {
        v(&[DOCKER, "rm", "-f", &self.name])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::TrustFiles;
    use polar_spec::runtime::Mount;

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
            hide: vec![],
            mounts: vec![Mount {
                source: "/data".into(),
                target: "/data".into(),
                read_only: true,
            }],
            read_only: vec![],
            staged: vec![],
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
            "kind = \"docker\"\nimage = \"python:3.12\"\n[limits]\npids = 64\nmemory_bytes = 1073741824\ncpu = 1.5",
            false,
            "t",
        )
        .unwrap();
        Docker::new(&spec, &"s-1".parse().unwrap())
    }

    #[test]
    fn run_command_isolates_and_places_the_container() {
        let a = text(
            &docker()
                .run_argv(&layout(), "/polar/agent-1-0/s-1")
                .unwrap(),
        );
        assert!(a.starts_with("docker run -d --name polar-s-1 --network none --init --cgroup-parent /polar/agent-1-0/s-1"), "{a}");
        assert!(a.contains("--label polar.session=s-1"));
        assert!(a.contains("--user 65534:65534"));
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
            a.ends_with("--workdir /workspace python:3.12 sleep infinity"),
            "{a}"
        );
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
        assert_eq!(
            text(&d.pid_argv()),
            "docker inspect -f {{.State.Pid}} polar-s-1"
        );
        assert_eq!(text(&d.rm_argv()), "docker rm -f polar-s-1");
    }
}
