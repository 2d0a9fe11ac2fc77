//! The Docker engine the docker runtime's tests run against.
//!
//! - Debian's `docker.io` (dockerd, containerd, runc, tini) and
//!   `debootstrap` are installed by the set-up ([`crate::setup`]).
//! - [`Engine::start`] starts a private `dockerd` for the test step only:
//!   its own socket, pid file and exec root under [`EXEC_ROOT`], its data
//!   root in `.polar-cache/docker/data`, no bridge, no iptables, no
//!   masquerading (containers of the tests run with `--network none`), so
//!   it touches nothing of a Docker the machine may run. Dropping the
//!   [`Engine`] stops it by its pid, so a failing test step stops it too;
//!   one left running by a killed xtask (its pid file says so) is stopped
//!   before a new one starts.
//! - The test image, [`IMAGE`], is built on this machine (no registry
//!   serves images here): a minimal Debian 12 root file system made with
//!   `debootstrap` from Debian's packages, with python3, pytest and git for the
//!   tests' programs, and the host's Node (the harness CLIs, bound
//!   read-only from `.polar-cache/harnesses` by the runtime, need Node 20,
//!   which Debian 12 does not package). Its tarball is cached in
//!   `.polar-cache/docker/`, named by [`RECIPE`] and Node's version, and
//!   imported (`docker import`) when the engine lacks the image.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::daemon::{Daemon, tail, terminate};

/// Bump when what goes into the image changes.
const RECIPE: &str = "2";
/// The test image's name (what `POLAR_TEST_DOCKER_IMAGE` holds).
pub const IMAGE: &str = "polar-test/bookworm:2";
/// Debian packages in the image, beyond debootstrap's minimal base.
const IMAGE_PACKAGES: &str = "python3,python3-pytest,ca-certificates,git,procps";
/// Where the image's packages come from.
const MIRROR: &str = "http://deb.debian.org/debian";
/// The engine's exec root (its socket and pid file): short, on the host's
/// `/run`, as unix socket paths must be.
const EXEC_ROOT: &str = "/run/polar-xtask-docker";
/// How long the engine has to answer `docker info`.
const START_WAIT: Duration = Duration::from_secs(90);

fn report(item: &str, state: &str) {
    eprintln!("docker: {item:<18} {state}");
}

/// `.polar-cache/docker`, made if missing, with symbolic links resolved
/// (runc refuses a container root whose path holds one).
fn cache_dir() -> Result<PathBuf> {
    let dir = workspace_root()?.join(".polar-cache/docker");
    std::fs::create_dir_all(&dir)?;
    Ok(std::fs::canonicalize(&dir)?)
}

/// The engine's address, for `DOCKER_HOST` and Polar's
/// `sandbox.docker_host`.
pub fn host() -> String {
    format!("unix://{EXEC_ROOT}/docker.sock")
}

/// The host's Node: its path and version.
fn node() -> Result<(PathBuf, String)> {
    let version = Cmd::new("node")?
        .arg("--version")
        .probe()
        .context("the test image needs the host's Node (`node --version` fails)")?;
    let which = Cmd::new("sh")?
        .args(["-c", "command -v node"])
        .probe()
        .context("cannot find node on PATH")?;
    let path = std::fs::canonicalize(which.trim())?;
    Ok((path, version.trim().to_owned()))
}

/// The image's root file system as a tarball, built once and cached.
pub fn image_tarball() -> Result<PathBuf> {
    let dir = cache_dir()?;
    let (node, node_version) = node()?;
    let tarball = dir.join(format!("bookworm-{RECIPE}-node-{node_version}.tar"));
    if tarball.is_file() {
        report("image rootfs", "present");
        return Ok(tarball);
    }
    let build = dir.join("rootfs.build");
    if build.exists() {
        std::fs::remove_dir_all(&build).with_context(|| format!("removing {}", build.display()))?;
    }
    report("image rootfs", "building with debootstrap (a few minutes)");
    Cmd::new("debootstrap")?
        .args(["--variant=minbase", "--include", IMAGE_PACKAGES, "bookworm"])
        .arg(&build)
        .arg(MIRROR)
        .run()
        .context("debootstrap of the test image failed")?;
    let target = build.join("usr/local/bin/node");
    std::fs::copy(&node, &target)
        .with_context(|| format!("copying {} into the image", node.display()))?;
    // Node must run on the image's libraries.
    let inside = Cmd::new("chroot")?
        .arg(&build)
        .args(["/usr/local/bin/node", "--version"])
        .probe();
    if inside.as_deref().map(str::trim) != Some(node_version.as_str()) {
        bail!(
            "the host's Node ({}) does not run in the test image",
            node.display()
        );
    }
    let partial = dir.join(format!(".bookworm-{RECIPE}.partial"));
    Cmd::new("tar")?
        .args(["--numeric-owner", "-C"])
        .arg(&build)
        .args(["-cf"])
        .arg(&partial)
        .arg(".")
        .run()?;
    std::fs::rename(&partial, &tarball)?;
    std::fs::remove_dir_all(&build)?;
    report("image rootfs", "built");
    Ok(tarball)
}

/// A private Docker engine, stopped when dropped.
pub struct Engine {
    daemon: Daemon,
}

fn docker() -> Result<Cmd> {
    Ok(Cmd::new("docker")?.env("DOCKER_HOST", host()))
}

fn answers() -> bool {
    docker()
        .ok()
        .and_then(|d| d.args(["info", "--format", "{{.ServerVersion}}"]).probe())
        .is_some()
}

/// Stops an engine a killed xtask left running (its pid file names it).
fn stop_stale(pidfile: &Path) {
    let Some(pid) = std::fs::read_to_string(pidfile)
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
    else {
        return;
    };
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim() != "dockerd" {
        return;
    }
    report("engine", &format!("stopping a stale dockerd (pid {pid})"));
    terminate(pid);
    for _ in 0..300 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Engine {
    /// Starts the engine and makes sure it has [`IMAGE`].
    pub fn start() -> Result<Self> {
        let tarball = image_tarball()?;
        let cache = cache_dir()?;
        let exec_root = Path::new(EXEC_ROOT);
        let pidfile = exec_root.join("dockerd.pid");
        stop_stale(&pidfile);
        std::fs::create_dir_all(exec_root)?;
        let log = cache.join("dockerd.log");
        let cmd = Cmd::new("dockerd")?
            .arg("--data-root")
            .arg(cache.join("data"))
            .arg("--exec-root")
            .arg(exec_root)
            .arg("--pidfile")
            .arg(&pidfile)
            .args(["-H", &host()])
            .args(["--bridge", "none", "--iptables=false", "--ip6tables=false"])
            .args(["--ip-masq=false", "--userland-proxy=false"])
            // The runtime places containers with --cgroup-parent paths.
            .args(["--exec-opt", "native.cgroupdriver=cgroupfs"])
            .args(["--containerd-namespace", "polar-xtask"])
            .args(["--containerd-plugins-namespace", "polar-xtask-plugins"]);
        let daemon = Daemon::start("Docker engine", cmd, &log, START_WAIT, answers)?;
        report(
            "engine",
            &format!("started (pid {}, {})", daemon.pid(), host()),
        );
        let engine = Self { daemon };
        let present = docker()?
            .args(["image", "inspect", "--format", "{{.Id}}", IMAGE])
            .probe()
            .is_some();
        if present {
            report("test image", "present");
        } else {
            docker()?
                .args([
                    "import",
                    "--change",
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ])
                .arg(&tarball)
                .arg(IMAGE)
                .run()
                .with_context(|| format!("importing the test image:\n{}", tail(&log, 10)))?;
            report("test image", "imported");
        }
        Ok(engine)
    }
}

impl Drop for Engine {
    /// SIGTERM, so that dockerd stops its containers and its containerd
    /// (a SIGKILL would leave both running).
    fn drop(&mut self) {
        self.daemon.stop(Duration::from_secs(30));
        report("engine", "stopped");
    }
}
