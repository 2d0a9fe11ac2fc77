//! The Docker engine of the docker runtime's tests: the private `dockerd`
//! `cargo xtask test` runs for its test step (`POLAR_TEST_DOCKER_HOST`)
//! and the image it built on this machine (`POLAR_TEST_DOCKER_IMAGE`), and
//! what a test asks of it: the agent configuration and runtime spec that
//! use them, the containers of a session, and what of a container's
//! cgroups and network namespace is left on the host.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// The tests' engine and image.
#[derive(Clone, Debug)]
pub struct Engine {
    /// `unix:///...`.
    pub host: String,
    /// The image the tests' containers run.
    pub image: String,
}

/// The engine `cargo xtask test` started; an error (never a skip) when the
/// tests run without one.
pub fn engine() -> Result<Engine> {
    let var = |name: &str| {
        std::env::var(name).with_context(|| {
            format!(
                "{name} is not set: the docker runtime's tests need the Docker engine and \
                 test image that `cargo xtask test` starts and builds (run them through it, \
                 e.g. `cargo xtask test -- --test runtime_docker`)"
            )
        })
    };
    let engine = Engine {
        host: var("POLAR_TEST_DOCKER_HOST")?,
        image: var("POLAR_TEST_DOCKER_IMAGE")?,
    };
    let info = engine.docker(&["info", "--format", "{{.ServerVersion}}"])?;
    if info.trim().is_empty() {
        bail!("the engine at {} does not answer", engine.host);
    }
    Ok(engine)
}

impl Engine {
    /// The agent configuration's `[sandbox]` table pointing at the engine,
    /// with `extra` keys.
    pub fn sandbox_table(&self, extra: &str) -> String {
        format!("[sandbox]\ndocker_host = \"{}\"\n{extra}", self.host)
    }

    /// A docker runtime spec on the test image, with `extra` after it.
    pub fn spec(&self, extra: &str) -> String {
        format!("kind = \"docker\"\nimage = \"{}\"\n{extra}", self.image)
    }

    /// Runs the docker CLI against the engine; its stdout, or an error
    /// with its stderr.
    pub fn docker(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("docker")
            .env("DOCKER_HOST", &self.host)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running docker")?;
        if !out.status.success() {
            bail!(
                "docker {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The containers, running or not, of `session`.
    pub fn containers_of(&self, session: &str) -> Result<Vec<String>> {
        let out = self.docker(&[
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("label=polar.session={session}"),
        ])?;
        Ok(out.split_whitespace().map(str::to_owned).collect())
    }
}

/// The cgroup directories at `rel` (relative to the hierarchies' roots, as
/// a container's `/proc/self/cgroup` shows them on a host without cgroup
/// namespaces) that exist: in cgroup v2 and in every v1 hierarchy.
pub fn cgroups_at(rel: &str) -> Result<Vec<PathBuf>> {
    let rel = Path::new(rel.trim_start_matches('/'));
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut mounts = polar_redirect::cgroup::v1_mounts(&text);
    mounts.push(crate::cgroup2_mount()?);
    Ok(mounts
        .into_iter()
        .map(|m| m.join(rel))
        .filter(|d| d.exists())
        .collect())
}
