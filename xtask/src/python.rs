//! The Python environments of `python/` (the `polar-client` package and
//! its trainer bridges): one virtual environment per lock file of
//! `python/requirements/` (`client.txt`: the package's dependencies and
//! its test tools; `verl.txt`, `skyrl.txt`, `nemo-gym.txt`: a trainer and
//! what it pulls in, for its bridge's tests), under
//! `.polar-cache/venvs/<name>`; and one per Python harness preset
//! (`mini-swe-agent.txt`, `aider.txt`, `openhands.txt`: the harness and what it runs with, for the
//! sandboxes; [`HARNESSES`], made by `cargo xtask harnesses`), made with the interpreter the lock file
//! needs (the `python3` on `PATH`, or a Python 3.12 for the trainers that
//! require it: `python3.12` on `PATH`, else pyenv's, which this kind of
//! machine ships) and filled by pip from PyPI at the lock file's exact
//! versions.
//!
//! A stamp holding the lock file and the interpreter's version it was made
//! from makes a second run a no-op; any change to either makes the
//! environment again. `polar-client` itself is installed into each
//! environment by [`install_client`] before its tests (`pip install
//! ./python`, as a user installs it), so the tests run the working tree's
//! code.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};

/// A lock file of `python/requirements/` and the environment made from it.
#[derive(Clone, Copy, Debug)]
pub struct Venv {
    /// The lock file's stem and the environment's directory name.
    pub name: &'static str,
    /// The Python it needs: `None` for the `python3` on `PATH`, else a
    /// `major.minor` version, or an interpreter's absolute path.
    pub python: Option<&'static str>,
}

/// The client's environment: its dependencies, pytest, mypy, moto.
pub const CLIENT: Venv = Venv {
    name: "client",
    python: None,
};
/// verl 0.9.1 with torch (PyPI's wheel: CUDA libraries included, about
/// 5.6 GB), for the verl bridge's tests.
pub const VERL: Venv = Venv {
    name: "verl",
    python: None,
};
/// skyrl-train 0.3.1 (Python 3.12 only) with torch, for the SkyRL
/// bridge's tests.
pub const SKYRL: Venv = Venv {
    name: "skyrl",
    python: Some("3.12"),
};
/// nemo-gym 0.4.0 (Python 3.12 or newer), for the NeMo Gym bridge's tests.
pub const NEMO_GYM: Venv = Venv {
    name: "nemo-gym",
    python: Some("3.12"),
};

/// Hermes Agent (`hermes-agent` 0.19.0, Python 3.11 or newer), the
/// `hermes` preset's harness, made by `cargo xtask harnesses` beside the
/// npm-installed CLIs ([`crate::harnesses`]). With Debian's interpreter:
/// a sandbox user runs it, and pyenv's lives under `/root`, which only
/// root may enter.
pub const HERMES: Venv = Venv {
    name: "hermes",
    python: Some("/usr/bin/python3"),
};

/// Every environment `cargo xtask setup` makes.
pub const ALL: [Venv; 4] = [CLIENT, VERL, SKYRL, NEMO_GYM];

/// mini-swe-agent 2.4.6 (Python >= 3.10), the `mini_swe_agent` preset's
/// environment (its `bin/mini` runs in the sandboxes).
pub const MINI_SWE_AGENT: Venv = Venv {
    name: "mini-swe-agent",
    python: None,
};

/// Aider 0.86.2 (Python 3.10 to 3.12), the `aider` preset's environment.
pub const AIDER: Venv = Venv {
    name: "aider",
    python: None,
};

/// openhands-sdk and openhands-tools 1.58.2 (Python 3.12 or newer), the
/// `openhands` preset's environment.
pub const OPENHANDS: Venv = Venv {
    name: "openhands",
    python: Some("3.12"),
};

/// The environments of the Python harness presets, which `cargo xtask
/// harnesses` makes with the npm CLIs, in `venvs/` beside their prefix.
pub const HARNESSES: [Venv; 4] = [MINI_SWE_AGENT, AIDER, OPENHANDS, HERMES];

const STAMP: &str = ".polar-installed";

fn report(item: &str, state: &str) {
    eprintln!("setup: {item:<18} {state}");
}

/// Whether the environment at `dir` was made there: its scripts name its
/// interpreter by the path it was made at (`pyvenv.cfg`'s `command`), so
/// one made elsewhere and moved or reached through another path
/// (a symbolic link to the cache) cannot run.
fn made_at(dir: &Path) -> bool {
    let Ok(cfg) = std::fs::read_to_string(dir.join("pyvenv.cfg")) else {
        return false;
    };
    cfg.lines()
        .filter_map(|l| l.strip_prefix("command = "))
        .any(|c| c.ends_with(&format!(" {}", dir.display())))
}

impl Venv {
    /// The environment's directory.
    pub fn dir(self) -> Result<PathBuf> {
        Ok(workspace_root()?.join(".polar-cache/venvs").join(self.name))
    }

    /// Its interpreter.
    pub fn python(self) -> Result<PathBuf> {
        Ok(self.dir()?.join("bin/python"))
    }

    fn lock(self) -> Result<PathBuf> {
        Ok(workspace_root()?
            .join("python/requirements")
            .join(format!("{}.txt", self.name)))
    }

    /// Makes the environment unless its stamp says it is up to date.
    pub fn ensure(self) -> Result<()> {
        self.ensure_at(&self.dir()?)
    }

    /// [`Self::ensure`] with the environment at `dir`.
    pub fn ensure_at(self, dir: &Path) -> Result<()> {
        let item = format!("venv {}", self.name);
        let lock = self.lock()?;
        let locked = std::fs::read_to_string(&lock)
            .with_context(|| format!("reading {}", lock.display()))?;
        let interpreter = self.interpreter()?;
        let version = Cmd::new(&interpreter)?
            .arg("--version")
            .probe()
            .with_context(|| format!("{} is not runnable", interpreter.display()))?;
        let stamp = format!("{}\n{locked}", version.trim());
        if std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp) && made_at(dir) {
            report(&item, "present");
            return Ok(());
        }
        let started = Instant::now();
        if dir.exists() {
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("removing the stale {}", dir.display()))?;
        }
        Cmd::new(&interpreter)?
            .args(["-m", "venv"])
            .arg(dir)
            .run()
            .context("could not make a virtual environment (python3 -m venv)")?;
        // A lock file is a whole `pip freeze`: nothing to resolve, and
        // dependencies a trainer declares but its tested path never imports
        // (skyrl-train's flash-attn, which builds against CUDA) stay out.
        pip_install(dir)?
            .arg("--requirement")
            .arg(&lock)
            .run()
            .with_context(|| format!("could not install {}", lock.display()))?;
        std::fs::write(dir.join(STAMP), stamp)?;
        report(
            &item,
            &format!(
                "installed in {} s ({})",
                started.elapsed().as_secs(),
                du(dir)
            ),
        );
        Ok(())
    }

    /// The interpreter the environment is made with.
    fn interpreter(self) -> Result<PathBuf> {
        let Some(version) = self.python else {
            return Ok(PathBuf::from("python3"));
        };
        if version.starts_with('/') {
            return Ok(PathBuf::from(version));
        }
        let name = format!("python{version}");
        if Cmd::new(&name)?.arg("--version").probe().is_some() {
            return Ok(PathBuf::from(name));
        }
        let root = std::env::var_os("PYENV_ROOT")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")))
            .context("neither PYENV_ROOT nor HOME is set")?;
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{version}.")))
            })
            .map(|p| p.join("bin").join(&name))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        found.pop().with_context(|| {
            format!(
                "the {} environment needs Python {version}: no {name} on PATH nor under {}/versions",
                self.name,
                root.display()
            )
        })
    }

    /// Installs the working tree's `polar-client` (without dependencies:
    /// the lock file has them) into the environment.
    pub fn install_client(self) -> Result<()> {
        let dir = self.dir()?;
        if !dir.join(STAMP).exists() {
            bail!("{} is not set up (cargo xtask setup)", dir.display());
        }
        pip_install(&dir)?
            .args(["--force-reinstall", "--no-build-isolation"])
            .arg(workspace_root()?.join("python"))
            .run()
            .context("could not install polar-client (pip install ./python)")
    }
}

/// `pip install` in the environment `dir`, quiet, never asking, and never
/// resolving dependencies: a lock file lists them all.
///
/// Without pip's cache: the stamped environments are the cache, and pip's
/// copy of every wheel (the trainers' CUDA builds of torch among them) would
/// take gigabytes more of a fresh machine's disk for nothing.
fn pip_install(dir: &Path) -> Result<Cmd> {
    Ok(Cmd::new(dir.join("bin/python"))?.args([
        "-m",
        "pip",
        "--disable-pip-version-check",
        "--no-cache-dir",
        "install",
        "--quiet",
        "--no-input",
        "--no-deps",
    ]))
}

/// The size of a directory as `du -sh` prints it.
fn du(dir: &Path) -> String {
    Cmd::new("du")
        .ok()
        .and_then(|c| c.arg("-sh").arg(dir).probe())
        .and_then(|out| out.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "size unknown".into())
}
