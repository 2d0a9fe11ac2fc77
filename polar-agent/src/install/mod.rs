//! `polar install` and `polar uninstall`: putting the agent on a node and
//! taking it off again, idempotently, below an install root (`/` on a
//! node, a scratch directory in tests and image builds).
//!
//! Install: the configuration is validated first; then the running binary
//! is copied to `/usr/local/bin/polar`, the configurations to
//! `/etc/polar/{agent,rollout}.toml` (kept when present), the state
//! directory made with mode 0700 and the CA created in it (the same code
//! the agent starts with), the units ([`units`]) written to
//! `/etc/systemd/system` and the agent's unit enabled (`systemctl` when the
//! root is `/` and systemd runs, else the `multi-user.target.wants` link).
//! Every path made is recorded in the [`manifest`]; uninstall removes
//! exactly those (config and state only with `--purge`), after stopping the
//! service, and then looks for [`leftovers`] in the kernel.

pub mod leftovers;
pub mod manifest;
pub mod units;

mod systemd;

use std::fmt;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use polar_config::{Config, ConfigError};
use polar_node::agent::AgentError;

use self::leftovers::Leftover;
use self::manifest::{Kind, MANIFEST, Manifest, under};
use self::units::{
    AGENT_CONFIG, AGENT_UNIT, BIN, ROLLOUT_CONFIG, ROLLOUT_UNIT, UNIT_DIR, WANTS_DIR,
};

/// The example agent configuration shipped as `/etc/polar/agent.toml`.
pub const EXAMPLE_AGENT_CONFIG: &str = include_str!("../../../config/polar.example.toml");
/// The example rollout configuration shipped as `/etc/polar/rollout.toml`.
pub const EXAMPLE_ROLLOUT_CONFIG: &str = include_str!("../../../config/rollout.example.toml");

/// Errors of install and uninstall.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The install root is not an existing absolute directory.
    #[error("install root {0} must be an existing absolute directory")]
    Root(String),
    /// The configuration to install is invalid.
    #[error("the configuration to install is invalid: {0}")]
    Config(#[from] ConfigError),
    /// The CA could not be created.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is unreadable.
    #[error("install manifest {0}: {1}")]
    Manifest(String, String),
    /// Nothing is installed below the root.
    #[error("nothing to uninstall: no install manifest at {0}")]
    NotInstalled(String),
    /// A `systemctl` command failed.
    #[error("systemctl {args} failed: {detail}")]
    Systemctl {
        /// Its arguments.
        args: String,
        /// Exit status and output.
        detail: String,
    },
}

impl InstallError {
    fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.display().to_string(),
            source,
        }
    }
}

/// What to install.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// The install root.
    pub root: PathBuf,
    /// The agent configuration to install (the example when `None`).
    pub config: Option<PathBuf>,
    /// Enable the agent's unit.
    pub enable: bool,
    /// The binary to install (normally the running one).
    pub binary: PathBuf,
}

/// What to uninstall.
#[derive(Debug, Clone)]
pub struct UninstallOptions {
    /// The install root.
    pub root: PathBuf,
    /// Also remove configuration and state (CA, sessions).
    pub purge: bool,
}

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// Entries of the manifest, as paths on the target.
    pub manifest: Manifest,
    /// Configurations that were already there and kept.
    pub kept: Vec<PathBuf>,
    /// How the unit was enabled (`systemctl`, a link, or not).
    pub enabled: String,
}

impl fmt::Display for InstallReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.manifest.entries {
            writeln!(f, "installed {:?} {}", e.kind, e.path.display())?;
        }
        for k in &self.kept {
            writeln!(f, "kept existing {}", k.display())?;
        }
        write!(f, "{}", self.enabled)
    }
}

/// What an uninstall did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UninstallReport {
    /// Paths removed (on the target).
    pub removed: Vec<PathBuf>,
    /// Paths kept (configuration and state without `--purge`, non-empty
    /// directories).
    pub kept: Vec<PathBuf>,
    /// What is left in the kernel.
    pub leftovers: Vec<Leftover>,
}

impl fmt::Display for UninstallReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.removed {
            writeln!(f, "removed {}", p.display())?;
        }
        for p in &self.kept {
            writeln!(
                f,
                "kept {} (`polar uninstall --purge` removes it)",
                p.display()
            )?;
        }
        if self.leftovers.is_empty() {
            write!(f, "no Polar cgroup or BPF program left")
        } else {
            for l in &self.leftovers {
                writeln!(f, "left: {l}")?;
            }
            Ok(())
        }
    }
}

fn check_root(root: &Path) -> Result<(), InstallError> {
    if root.is_absolute() && root.is_dir() {
        Ok(())
    } else {
        Err(InstallError::Root(root.display().to_string()))
    }
}

fn mkdir(
    root: &Path,
    dir: &str,
    mode: u32,
    m: &mut Manifest,
    kind: Kind,
) -> Result<(), InstallError> {
    let path = under(root, Path::new(dir));
    if !path.is_dir() {
        std::fs::create_dir_all(&path).map_err(|e| InstallError::io("creating", &path, e))?;
        m.add(dir, kind);
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| InstallError::io("setting the mode of", &path, e))
}

/// Writes `bytes` to `dest` atomically with `mode` (not fsynced, as
/// before: an interrupted install is run again, not recovered).
fn put(dest: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    let opts = polar_io::fs::WriteOptions::new().mode(mode).no_sync();
    polar_io::fs::write_atomic(dest, bytes, &opts)
        .map_err(|e| InstallError::io("writing", dest, e.into()))
}

/// Installs below `opts.root`; running it again updates the binary and the
/// units and keeps configuration and state.
pub fn install(opts: &InstallOptions) -> Result<InstallReport, InstallError> {
    let root = opts.root.as_path();
    check_root(root)?;
    // Validate before anything is made.
    let (config_text, mut config) = match &opts.config {
        Some(p) => {
            let config = Config::load(p)?;
            let text = std::fs::read_to_string(p).map_err(|e| InstallError::io("reading", p, e))?;
            (text, config)
        }
        None => (
            EXAMPLE_AGENT_CONFIG.to_owned(),
            Config::from_toml_str(EXAMPLE_AGENT_CONFIG)?,
        ),
    };
    let binary =
        std::fs::read(&opts.binary).map_err(|e| InstallError::io("reading", &opts.binary, e))?;

    let mut m = Manifest::load(root)?.unwrap_or_default();
    m.version = env!("CARGO_PKG_VERSION").to_owned();
    let mut kept = Vec::new();
    mkdir(root, "/var/lib/polar", 0o700, &mut m, Kind::State)?;
    for dir in ["/usr/local/bin", UNIT_DIR] {
        let path = under(root, Path::new(dir));
        std::fs::create_dir_all(&path).map_err(|e| InstallError::io("creating", &path, e))?;
    }
    mkdir(root, "/etc/polar", 0o755, &mut m, Kind::Dir)?;

    put(&under(root, Path::new(BIN)), &binary, 0o755)?;
    m.add(BIN, Kind::File);
    for (path, text) in [
        (AGENT_CONFIG, config_text.as_str()),
        (ROLLOUT_CONFIG, EXAMPLE_ROLLOUT_CONFIG),
    ] {
        let dest = under(root, Path::new(path));
        if dest.exists() {
            kept.push(PathBuf::from(path));
        } else {
            put(&dest, text.as_bytes(), 0o640)?;
        }
        m.add(path, Kind::Config);
    }

    // The state directory and the CA, as the agent would make them.
    let state = config.agent.state_dir.clone();
    mkdir(root, &state.to_string_lossy(), 0o700, &mut m, Kind::State)?;
    config.agent.state_dir = under(root, &state);
    polar_node::agent::load_or_init_ca(&config)?;
    m.add(&state, Kind::State);

    for (unit, text) in [
        (AGENT_UNIT, units::agent_unit()),
        (ROLLOUT_UNIT, units::rollout_unit()),
    ] {
        let path = Path::new(UNIT_DIR).join(unit);
        put(&under(root, &path), text.as_bytes(), 0o644)?;
        m.add(path, Kind::File);
    }
    m.save(root)?;
    m.add(MANIFEST, Kind::File);

    let enabled = if !opts.enable {
        "not enabled (--no-enable)".to_owned()
    } else if systemd::manages(root) {
        systemd::systemctl(&["daemon-reload"])?;
        systemd::systemctl(&["enable", AGENT_UNIT])?;
        format!("enabled {AGENT_UNIT} with systemctl; start it with `systemctl start {AGENT_UNIT}`")
    } else {
        mkdir(root, WANTS_DIR, 0o755, &mut m, Kind::Dir)?;
        let link = Path::new(WANTS_DIR).join(AGENT_UNIT);
        let at = under(root, &link);
        let target = Path::new(UNIT_DIR).join(AGENT_UNIT);
        if std::fs::read_link(&at).ok().as_deref() != Some(target.as_path()) {
            let _ = std::fs::remove_file(&at);
            std::os::unix::fs::symlink(&target, &at)
                .map_err(|e| InstallError::io("linking", &at, e))?;
        }
        m.add(link, Kind::Link);
        format!(
            "enabled {AGENT_UNIT} by its multi-user.target.wants link (systemd does not manage this root)"
        )
    };
    m.save(root)?;
    Ok(InstallReport {
        manifest: m,
        kept,
        enabled,
    })
}

/// Removes what the manifest below `opts.root` lists, after stopping the
/// service; reports what the kernel still holds of Polar.
pub fn uninstall(opts: &UninstallOptions) -> Result<UninstallReport, InstallError> {
    let root = opts.root.as_path();
    check_root(root)?;
    let m = Manifest::load(root)?.ok_or_else(|| {
        InstallError::NotInstalled(under(root, Path::new(MANIFEST)).display().to_string())
    })?;
    if systemd::manages(root) {
        for unit in [AGENT_UNIT, ROLLOUT_UNIT] {
            systemd::stop_and_disable(unit)?;
        }
    }
    let mut report = UninstallReport::default();
    // Files and links first, then directories deepest first. Without
    // --purge the manifest stays, listing what was kept, for a later purge.
    let keep_manifest = !opts.purge;
    for e in m
        .entries
        .iter()
        .filter(|e| matches!(e.kind, Kind::File | Kind::Link))
    {
        if keep_manifest && e.path == Path::new(MANIFEST) {
            continue;
        }
        remove_file(root, &e.path, &mut report)?;
    }
    if opts.purge {
        for e in m.entries.iter().filter(|e| e.kind == Kind::Config) {
            remove_file(root, &e.path, &mut report)?;
        }
        let mut states: Vec<&PathBuf> = m
            .entries
            .iter()
            .filter(|e| e.kind == Kind::State)
            .map(|e| &e.path)
            .collect();
        states.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in states {
            let at = under(root, p);
            if at.exists() {
                // Sessions' disk-quota tmpfs first: a purge keeps no files.
                polar_sandbox::runtime::quota::discard_all(
                    &polar_sandbox::runtime::steps::sandboxes_dir(&at),
                );
                std::fs::remove_dir_all(&at).map_err(|e| InstallError::io("removing", &at, e))?;
                report.removed.push(p.clone());
            }
        }
    } else {
        for e in m
            .entries
            .iter()
            .filter(|e| matches!(e.kind, Kind::Config | Kind::State))
        {
            if under(root, &e.path).exists() && !report.kept.contains(&e.path) {
                report.kept.push(e.path.clone());
            }
        }
    }
    let mut dirs: Vec<&PathBuf> = m
        .entries
        .iter()
        .filter(|e| e.kind == Kind::Dir)
        .map(|e| &e.path)
        .collect();
    dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for d in dirs {
        let at = under(root, d);
        match std::fs::remove_dir(&at) {
            Ok(()) => report.removed.push(d.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => report.kept.push(d.clone()),
        }
    }
    if keep_manifest {
        let mut rest = Manifest {
            version: m.version.clone(),
            entries: Vec::new(),
        };
        for e in &m.entries {
            if report.kept.contains(&e.path) || e.path == Path::new(MANIFEST) {
                rest.add(e.path.clone(), e.kind);
            }
        }
        rest.save(root)?;
    }
    if systemd::manages(root) {
        systemd::systemctl(&["daemon-reload"])?;
    }
    report.leftovers = leftovers::cgroups();
    report.leftovers.extend(leftovers::programs());
    Ok(report)
}

fn remove_file(root: &Path, path: &Path, report: &mut UninstallReport) -> Result<(), InstallError> {
    let at = under(root, path);
    match std::fs::remove_file(&at) {
        Ok(()) => {
            report.removed.push(path.to_owned());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(InstallError::io("removing", &at, e)),
    }
}
