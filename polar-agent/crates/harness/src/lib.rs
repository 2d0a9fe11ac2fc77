//! Harnesses: the presets (the coding-agent CLIs Polar runs unmodified,
//! and a custom shell command) and the harnesses the node's configuration
//! defines (`[harness.NAME]`, named `custom:NAME` by a task).
//!
//! - [`presets`]: each preset's non-interactive command line, variables
//!   and HOME files, in transparent and base-URL mode;
//! - [`custom`]: the same for a configured harness, and its install check;
//! - [`litellm`]: the presets of the Python harnesses that reach the
//!   model through LiteLLM (mini-swe-agent, Aider, OpenHands);
//! - [`venv`]: the Python presets' virtual environments (the installed
//!   version, the Python installation the sandbox must see);
//! - this file: the names, [`Harness`] (a preset or a configured one), the
//!   modes, and the check that a harness is installed (where its binary
//!   is, its version, what the sandbox must see of its installation).
//!
//! What a harness needs is values: its command line, variables and files.
//! This crate runs nothing and knows nothing of the proxy or the agent that
//! serve its sessions; running a session end to end is the agent's
//! (`polar_node::harness::run`). It names the sandbox's errors only so that
//! one error type, [`HarnessError`], covers a harness session.
#![forbid(unsafe_code)]

pub(crate) mod custom;
pub(crate) mod litellm;
pub mod presets;
pub(crate) mod venv;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use polar_config::{Config, CustomHarness};
pub use polar_spec::harness::{
    BadHarness, CUSTOM_PREFIX, HarnessChoice, HarnessName, ModeKind, UnknownHarness,
};

/// Errors of the harness layer.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// Neither a preset nor a well-formed `custom:NAME`.
    #[error(transparent)]
    Unknown(#[from] BadHarness),
    /// `custom:NAME` that this node's configuration does not define.
    #[error(
        "{CUSTOM_PREFIX}{name} is not defined on this node (its [harness.*] tables: {defined})"
    )]
    NotDefined {
        /// The name asked for.
        name: String,
        /// The names defined.
        defined: String,
    },
    /// The harness's binary was not found.
    #[error(
        "{harness} is not installed: no `{binary}` in {searched}; install the pinned CLIs with \
         `cargo xtask harnesses` (or set POLAR_HARNESS_DIR to their npm prefix)"
    )]
    NotInstalled {
        /// The harness.
        harness: String,
        /// The binary looked for.
        binary: String,
        /// Where.
        searched: String,
    },
    /// A harness other than the shell preset was asked for without an
    /// instruction.
    #[error("the harness {0} needs an instruction (--instruction TEXT)")]
    NoInstruction(String),
    /// The binary is there but `--version` failed.
    #[error("the install check of {binary} failed: {why}")]
    Broken {
        /// The binary.
        binary: PathBuf,
        /// What happened.
        why: String,
    },
    /// The runtime failed.
    #[error(transparent)]
    Runtime(Box<polar_sandbox::runtime::RuntimeError>),
    /// The sandbox failed.
    #[error(transparent)]
    Sandbox(Box<polar_sandbox::SandboxError>),
}

// The runtime's and the sandbox's errors are boxed: they are large, and
// every `Result` of a harness carries the enum.
impl From<polar_sandbox::runtime::RuntimeError> for HarnessError {
    fn from(e: polar_sandbox::runtime::RuntimeError) -> Self {
        Self::Runtime(Box::new(e))
    }
}

impl From<polar_sandbox::SandboxError> for HarnessError {
    fn from(e: polar_sandbox::SandboxError) -> Self {
        Self::Sandbox(Box::new(e))
    }
}

/// How a harness reaches the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Its hard-coded endpoint, redirected and decrypted by the agent.
    Transparent,
    /// A base URL the agent serves, with a per-session API key.
    BaseUrl {
        /// `http://host:port`, without a path.
        url: String,
        /// The session's key.
        key: String,
    },
}

/// The harness a session runs: a preset, or one the node's configuration
/// defines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Harness {
    /// A preset.
    Preset(HarnessName),
    /// `[harness.NAME]` of the configuration.
    Custom(Arc<CustomHarness>),
}

impl Harness {
    /// The harness `choice` names, among `config`'s: a custom name the
    /// configuration does not define is an error. The task only picks: the
    /// command line of a custom harness is the operator's.
    pub fn resolve(choice: &HarnessChoice, config: &Config) -> Result<Self, HarnessError> {
        match choice {
            HarnessChoice::Preset(h) => Ok(Self::Preset(*h)),
            HarnessChoice::Custom(name) => config
                .harnesses
                .get(name)
                .map(|h| Self::Custom(Arc::new(h.clone())))
                .ok_or_else(|| HarnessError::NotDefined {
                    name: name.clone(),
                    defined: if config.harnesses.is_empty() {
                        "none".into()
                    } else {
                        config
                            .harnesses
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                }),
        }
    }

    /// Whether this is the shell preset (the only one that runs without an
    /// instruction and takes a command of the task's).
    pub fn is_shell(&self) -> bool {
        *self == Self::Preset(HarnessName::Shell)
    }

    /// The mode used unless another is asked for.
    pub fn default_mode(&self) -> ModeKind {
        match self {
            Self::Preset(h) => h.default_mode(),
            Self::Custom(c) => c.mode,
        }
    }

    /// Checks that the harness is installed ([`check_installed`],
    /// [`custom::check_installed`]); `None` for the shell preset.
    pub fn check_installed(
        &self,
        dirs: &[PathBuf],
        timeout: Duration,
    ) -> Result<Option<Install>, HarnessError> {
        match self {
            Self::Preset(h) => check_installed(*h, dirs, timeout),
            Self::Custom(c) => custom::check_installed(c, dirs, timeout).map(Some),
        }
    }
}

impl fmt::Display for Harness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Preset(h) => h.fmt(f),
            Self::Custom(c) => write!(f, "{CUSTOM_PREFIX}{}", c.name),
        }
    }
}

impl From<HarnessName> for Harness {
    fn from(h: HarnessName) -> Self {
        Self::Preset(h)
    }
}

/// An installed harness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Install {
    /// The binary.
    pub binary: PathBuf,
    /// What `--version` printed (first line).
    pub version: String,
    /// Directory to put first on `PATH` in the sandbox.
    pub bin_dir: PathBuf,
    /// Directories the sandbox must see (read-only) for it to run.
    pub read_only: Vec<PathBuf>,
    /// Variables the installation adds to the harness's own
    /// ([`copilot_dist`]).
    pub env: Vec<(String, String)>,
}

/// Where harness binaries are looked for: `$POLAR_HARNESS_DIR/node_modules/.bin`
/// and the `bin/` of each Python harness's virtual environment beside it
/// (`$POLAR_HARNESS_DIR/../venvs/NAME/bin`), the same under the first
/// `.polar-cache/harnesses` below the current directory or one of its
/// ancestors, then `PATH`.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("POLAR_HARNESS_DIR") {
        dirs.extend(install_dirs(Path::new(&d)));
    }
    if let Ok(cwd) = std::env::current_dir() {
        for a in cwd.ancestors() {
            let d = a.join(".polar-cache/harnesses");
            if d.join("node_modules/.bin").is_dir() || a.join(".polar-cache/venvs").is_dir() {
                dirs.extend(install_dirs(&d));
                break;
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs
}

/// The binary directories of the harnesses installed at `dir` (what `cargo
/// xtask harnesses` fills): its npm prefix's `node_modules/.bin`, then each
/// Python harness's virtual environment's `bin/` in `venvs/` beside it.
fn install_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![dir.join("node_modules/.bin")];
    if let Some(parent) = dir.parent() {
        dirs.extend(
            HarnessName::ALL
                .iter()
                .filter_map(|h| h.venv())
                .map(|v| parent.join("venvs").join(v).join("bin")),
        );
    }
    dirs
}

/// Checks that `harness` is installed: finds its binary and runs
/// `--version` (bounded by `timeout`).
pub fn check_installed(
    harness: HarnessName,
    dirs: &[PathBuf],
    timeout: Duration,
) -> Result<Option<Install>, HarnessError> {
    let Some(binary) = harness.binary() else {
        return Ok(None);
    };
    // A Python preset in its own environment, never another's (`python`
    // is in each of them).
    let venv_of = |d: &Path| {
        HarnessName::ALL
            .iter()
            .filter_map(|h| h.venv())
            .find(|v| d.ends_with(Path::new("venvs").join(v).join("bin")))
    };
    let own = harness.venv();
    let searched: Vec<PathBuf> = dirs
        .iter()
        .filter(|d| own.is_some() && venv_of(d) == own)
        .chain(dirs.iter().filter(|d| venv_of(d).is_none()))
        .cloned()
        .collect();
    let found = searched
        .iter()
        .map(|d| d.join(binary))
        .find(|p| p.is_file());
    let Some(path) = found else {
        return Err(HarnessError::NotInstalled {
            harness: harness.to_string(),
            binary: binary.to_owned(),
            searched: searched
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let version = match harness.distribution() {
        Some(dist) => venv::installed_version(&path, dist, timeout)?,
        None => first_line_of(&path, &["--version".to_owned()], timeout)?,
    };
    let mut install = install_at(path, version);
    if harness == HarnessName::Copilot {
        copilot_dist(&mut install);
    }
    Ok(Some(install))
}

/// The installation of the binary at `path`: its directory (first on the
/// sandbox's `PATH`) and the directories the sandbox must see read-only
/// (the `node_modules` it links into, the Python virtual environment it
/// belongs to).
pub(crate) fn install_at(path: PathBuf, version: String) -> Install {
    // With symbolic links resolved: the sandbox binds these directories at
    // the same paths, and a path through a link (an install directory
    // that is a link to elsewhere) cannot be made in the sandbox's root.
    let bin_dir = path
        .parent()
        .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.to_path_buf()))
        .unwrap_or_default();
    // node_modules/.bin/X links into node_modules: the sandbox needs all of
    // node_modules (codex.js starts a binary from a sibling package).
    let real = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    let mut read_only = vec![bin_dir.clone()];
    if let Some(nm) = real
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "node_modules"))
    {
        read_only.push(nm.to_owned());
    }
    if bin_dir.ends_with("node_modules/.bin") {
        read_only.retain(|d| d != &bin_dir);
        if let Some(nm) = bin_dir.parent() {
            read_only.push(nm.to_owned());
        }
    }
    // A virtual environment's bin/X runs its interpreter from bin/ and its
    // packages from lib/: the sandbox needs the whole environment, and the
    // Python installation it was made from (its `home`), unless that is
    // the system's own.
    let venv = [bin_dir.parent(), real.parent().and_then(Path::parent)]
        .into_iter()
        .flatten()
        .find(|v| v.join("pyvenv.cfg").is_file());
    if let Some(venv) = venv {
        if bin_dir.parent() == Some(venv) {
            read_only.retain(|d| d != &bin_dir);
        }
        read_only.push(venv.to_owned());
        read_only.extend(venv::python_prefix(venv));
    }
    read_only.sort();
    read_only.dedup();
    Install {
        binary: path,
        version,
        bin_dir,
        read_only,
        env: Vec::new(),
    }
}

/// Where `cargo xtask harnesses` unpacks Copilot CLI's JavaScript package,
/// in the npm prefix.
pub const COPILOT_DIST: &str = "copilot-dist";

/// Copilot CLI's binary unpacks the JavaScript package it carries (235 MB)
/// into `~/.cache/copilot` on its first start, so into every session's HOME
/// and disk quota. `cargo xtask harnesses` unpacks it once into
/// [`COPILOT_DIST`] beside `node_modules`; when that copy is there and of
/// the installed version, the sandbox sees it read-only and
/// `COPILOT_CLI_DIST_DIR` (read by the binary's loader) makes the binary
/// run it instead of unpacking its own.
fn copilot_dist(install: &mut Install) {
    let Some(nm) = install
        .read_only
        .iter()
        .find(|d| d.ends_with("node_modules"))
    else {
        return;
    };
    let dist = nm.with_file_name(COPILOT_DIST);
    let version = |p: PathBuf| {
        std::fs::read(p)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["version"].as_str().map(str::to_owned))
    };
    let installed = version(nm.join("@github/copilot/package.json"));
    if installed.is_some()
        && installed == version(dist.join("package.json"))
        && dist.join("index.js").is_file()
    {
        install.env.push((
            "COPILOT_CLI_DIST_DIR".to_owned(),
            dist.display().to_string(),
        ));
        install.read_only.push(dist);
    }
}

/// Runs `path ARGS` (bounded by `timeout`), which must exit 0, and returns
/// the first line it printed (on stdout, else stderr).
pub(crate) fn first_line_of(
    path: &Path,
    args: &[String],
    timeout: Duration,
) -> Result<String, HarnessError> {
    let broken = |why: String| HarnessError::Broken {
        binary: path.to_owned(),
        why,
    };
    let mut child = std::process::Command::new(path)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| broken(e.to_string()))?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => return Err(broken(status.to_string())),
            Ok(None) if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(broken(format!("no answer within {timeout:?}")));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(broken(e.to_string())),
        }
    }
    // Some print it on stderr (pi).
    let mut out = String::new();
    for pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut { pipe }, &mut text);
        if out.trim().is_empty() {
            out = text;
        }
    }
    Ok(out.lines().next().unwrap_or_default().trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases() {
        for h in HarnessName::ALL {
            assert_eq!(h.as_str().parse::<HarnessName>().unwrap(), h);
        }
        assert_eq!(
            "claude-code".parse::<HarnessName>().unwrap(),
            HarnessName::ClaudeCode
        );
        assert_eq!(
            "claude".parse::<HarnessName>().unwrap(),
            HarnessName::ClaudeCode
        );
        assert!("cursor".parse::<HarnessName>().is_err());
    }

    #[test]
    fn copilot_runs_its_unpacked_package_only_when_it_is_the_installed_version() {
        let tmp = tempfile::tempdir().unwrap();
        let nm = tmp.path().join("node_modules");
        let pkg = nm.join("@github/copilot");
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::write(pkg.join("package.json"), r#"{"version": "1.0.102"}"#).unwrap();
        let dist = tmp.path().join(COPILOT_DIST);
        std::fs::create_dir_all(&dist).unwrap();
        std::fs::write(dist.join("index.js"), "").unwrap();
        let install = || Install {
            binary: nm.join(".bin/copilot"),
            version: "1.0.102".into(),
            bin_dir: nm.join(".bin"),
            read_only: vec![nm.clone()],
            env: Vec::new(),
        };
        std::fs::write(dist.join("package.json"), r#"{"version": "1.0.101"}"#).unwrap();
        let mut stale = install();
        copilot_dist(&mut stale);
        assert_eq!(stale, install());
        std::fs::write(dist.join("package.json"), r#"{"version": "1.0.102"}"#).unwrap();
        let mut current = install();
        copilot_dist(&mut current);
        assert_eq!(
            current.env,
            vec![(
                "COPILOT_CLI_DIST_DIR".to_owned(),
                dist.display().to_string()
            )]
        );
        assert_eq!(current.read_only, vec![nm.clone(), dist]);
    }

    #[test]
    fn python_harnesses_are_looked_for_in_their_venv_beside_the_npm_prefix() {
        let dirs = install_dirs(Path::new("/c/harnesses"));
        assert_eq!(dirs[0], Path::new("/c/harnesses/node_modules/.bin"));
        assert!(dirs.contains(&PathBuf::from("/c/venvs/hermes/bin")));
        assert_eq!(HarnessName::Hermes.venv(), Some("hermes"));
        assert_eq!(HarnessName::Copilot.venv(), None);
    }

    #[test]
    fn finds_a_binary_and_its_version_or_says_where_it_looked() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("node_modules/.bin");
        std::fs::create_dir_all(&bin).unwrap();
        let err = check_installed(
            HarnessName::Pi,
            std::slice::from_ref(&bin),
            Duration::from_secs(5),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("pi is not installed") && err.contains(".bin"),
            "{err}"
        );
        let script = bin.join("pi");
        std::fs::write(&script, "#!/bin/sh\necho 0.73.1\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let i = check_installed(
            HarnessName::Pi,
            std::slice::from_ref(&bin),
            Duration::from_secs(5),
        )
        .unwrap()
        .unwrap();
        assert_eq!(i.version, "0.73.1");
        assert_eq!(i.bin_dir, bin);
        assert_eq!(i.read_only, vec![tmp.path().join("node_modules")]);
        // Found through a symbolic link: the real directories.
        let link = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(tmp.path(), link.path().join("l")).unwrap();
        let via = link.path().join("l/node_modules/.bin");
        let i = check_installed(HarnessName::Pi, &[via], Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(i.bin_dir, bin);
        assert_eq!(i.read_only, vec![tmp.path().join("node_modules")]);
        assert!(
            check_installed(HarnessName::Shell, &[], Duration::from_secs(1))
                .unwrap()
                .is_none()
        );
    }
}
