//! The part of `cargo xtask test`'s set-up that waits on registries and
//! disks rather than on the CPU, made by a second xtask process while the
//! first builds the cargo tools and runs the checks and builds:
//! polar-client's Python environments ([`setup::python_envs`]), the real
//! tokenizers and chat templates with their reference environment
//! ([`chat_models::run`]) and, for
//! the privileged tests, the harness CLIs with the Python harnesses'
//! environments ([`harnesses::run`]), the Docker test image's root file
//! system ([`docker::image_tarball`]) and the dashboard tests' browser
//! clients ([`dashboard::install`]). On a fresh machine these take 20 to
//! 35 minutes, nearly all of it downloading and unpacking, about as long
//! as the builds beside them; a second run finds them present (97 s in
//! one run).
//!
//! - [`Background::start`] runs `cargo xtask test-downloads` (hidden) in a
//!   process group of its own, its output in [`LOG`]; [`Background::wait`]
//!   waits for it before the tests, prints what it installed and fails
//!   with its log's tail if it failed.
//! - Dropping a [`Background`] that was not waited for (a step before the
//!   tests failed) stops the whole group (pip, npm, debootstrap) by its
//!   id, and so does an interrupted `cargo xtask test`
//!   ([`crate::group::forward_interrupts`]).
//! - [`run`] holds an exclusive lock on [`LOCK`] while it installs, so two
//!   of them (one left by an interrupted run) never write to the same
//!   directories at once: the second waits, then finds everything present.

use std::fs::{File, TryLockError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use crate::daemon::tail;
use crate::group::Group;
use crate::{chat_models, dashboard, docker, harnesses, setup};

/// The background process's output, from the workspace root.
const LOG: &str = "target/xtask/test-downloads.log";
/// Held by the process that installs, from the workspace root.
const LOCK: &str = ".polar-cache/test-downloads.lock";
/// The subcommand (`main.rs`) that runs [`run`].
pub const SUBCOMMAND: &str = "test-downloads";
/// How long a stopped group has to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// The prefixes of the one-line reports of the set-up's items.
const REPORTS: [&str; 3] = ["setup: ", "harnesses: ", "docker: "];

/// Installs what the tests need from the registries (`privileged`: also
/// what only the privileged tests and the dashboard step use).
pub fn run(privileged: bool) -> Result<()> {
    let _lock = lock()?;
    setup::python_envs()?;
    chat_models::run()?;
    if privileged {
        harnesses::run()?;
        docker::image_tarball()?;
        dashboard::install()?;
    }
    dedupe()
}

/// Hard-links the identical files of the Python environments and the
/// harness installs (`hardlink` from util-linux, essential on Debian:
/// same contents, mode and owner; times ignored), so that a package
/// several environments pin at one version is stored once (1.6 GiB
/// on a fresh machine). pip and npm replace files rather than write into
/// them, and an environment is made again from scratch, so a link never
/// carries one environment's change into another.
fn dedupe() -> Result<()> {
    let cache = workspace_root()?.join(".polar-cache");
    let dirs: Vec<PathBuf> = ["venvs", "harnesses"]
        .iter()
        .map(|d| cache.join(d))
        .filter(|d| d.is_dir())
        .collect();
    if dirs.is_empty() {
        return Ok(());
    }
    let out = Cmd::new("hardlink")?
        .arg("--ignore-time")
        .args(&dirs)
        .capture(Duration::from_secs(600))?;
    if !out.status.success() {
        bail!("`hardlink` failed ({}): {}", out.status, out.stderr.trim());
    }
    let saved = out
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Saved:"))
        .map_or("nothing".to_owned(), |s| s.trim().to_owned());
    eprintln!(
        "setup: identical files of the environments and harnesses hard-linked: {saved} saved"
    );
    Ok(())
}

/// Takes [`LOCK`], waiting for whoever holds it.
fn lock() -> Result<File> {
    let path = workspace_root()?.join(LOCK);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            eprintln!("setup: another set-up holds {}; waiting", path.display());
            file.lock()
                .with_context(|| format!("locking {}", path.display()))?;
        }
        Err(TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(file)
}

/// [`run`] in a process of its own.
pub struct Background {
    /// `None` once waited for.
    group: Option<Group>,
    log: PathBuf,
    started: Instant,
}

impl Background {
    /// Starts it (after the Debian packages: it needs python3-venv,
    /// debootstrap and Node).
    pub fn start(privileged: bool) -> Result<Self> {
        let log = workspace_root()?.join(LOG);
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let exe = std::env::current_exe().context("cannot find the running xtask binary")?;
        let mut cmd = Cmd::new(exe)?.arg(SUBCOMMAND);
        if !privileged {
            cmd = cmd.arg("--unprivileged");
        }
        let group = Group::spawn(cmd, &log, STOP_GRACE)?;
        eprintln!(
            "==> in the background (pid {}, log {LOG}): the Python environments, the chat models{}",
            group.id(),
            if privileged {
                ", the harness CLIs, the Docker test image and the browser clients"
            } else {
                ""
            }
        );
        Ok(Self {
            group: Some(group),
            log,
            started: Instant::now(),
        })
    }

    /// Waits for it to finish; prints its reports; fails if it failed.
    pub fn wait(mut self) -> Result<()> {
        let Some(mut group) = self.group.take() else {
            return Ok(());
        };
        let waited = Instant::now();
        let status = group.wait().context("waiting for the background set-up")?;
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        for line in text
            .lines()
            .filter(|l| REPORTS.iter().any(|p| l.starts_with(p)))
        {
            eprintln!("{line}");
        }
        if !status.success() {
            bail!(
                "the background set-up failed ({status}); the end of {LOG}:\n{}",
                tail(&self.log, 40)
            );
        }
        eprintln!(
            "==> background set-up done after {} s (waited {} s for it)",
            self.started.elapsed().as_secs(),
            waited.elapsed().as_secs()
        );
        Ok(())
    }
}

impl Drop for Background {
    /// Stops the group if it still runs.
    fn drop(&mut self) {
        let Some(group) = self.group.as_mut() else {
            return;
        };
        if matches!(group.try_wait(), Ok(None)) {
            eprintln!(
                "xtask: stopping the background set-up (process group {})",
                group.id()
            );
            group.stop();
        }
    }
}
