//! The runtime spec: which runtime runs a session (`native`, `docker`,
//! `apptainer`), on what root, with which mounts, environment, limits,
//! network mode and working directory, and the prepare and post-run steps.
//!
//! A spec is TOML, or JSON when its file name ends in `.json`:
//!
//! ```toml
//! kind = "native"                  # native (default) | docker | apptainer
//! rootfs = "/srv/rootfs"           # native: a directory used as / (default: the host's root)
//! # image = "python:3.12"          # docker, apptainer: required (apptainer: a .sif or a directory)
//! workdir = "/workspace"           # where the workspace appears, absolute
//! network = "isolated"             # isolated (default) | host
//! environment = { PYTHONUNBUFFERED = "1" }
//!
//! [[mounts]]
//! source = "/data/corpus"          # on the host, absolute, must exist
//! target = "/data"                 # in the sandbox, absolute
//! read_only = true                 # default true
//!
//! [limits]
//! memory_bytes = 4294967296        # at least 16 MiB
//! pids = 512                       # at least 8
//! cpu = 2.0                        # cores, above 0
//! disk_bytes = 1073741824          # workspace + HOME + /tmp, at least 16 MiB, at most the node's sandbox.disk_bytes
//!
//! [[prepare]]
//! upload = { from = "/tasks/t1", to = "." }   # a file or directory, `to` relative to the workspace
//! [[prepare]]
//! run = "pip install -e ."         # a string runs through `sh -c`; an array is the argv
//! [[post]]
//! upload = { from = "/tasks/t1/tests", to = "tests", replace = true }  # `to` holds exactly `from`
//! [[post]]
//! run = ["pytest", "-q"]
//! ```
//!
//! [`RawRuntimeSpec`] mirrors the file (`deny_unknown_fields`); it converts
//! with `TryFrom` into a [`RuntimeSpec`] whose errors name the key
//! (`prepare[1].upload.from: ...`). Parsing touches no file: the rollout
//! server checks submissions on another machine than the node, and must not
//! answer whether a host path exists there. [`RuntimeSpec::load`] (a spec
//! file the operator gave) and the node's policy
//! ([`crate::policy::Policy::resolve`]) check the host paths.
//!
//! Paths handed to a container runtime's mount syntax are checked here too
//! ([`mount_path_problem`]): docker's `--mount` value is CSV (`,` `"` and
//! line breaks would change its meaning), apptainer's `--bind` is `:` and
//! `,` separated; such a path is refused naming its key.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use crate::KeyPath;

/// Errors of reading a runtime spec.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The file could not be read.
    #[error("cannot read runtime spec {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The text is not a spec (syntax, unknown key, wrong type).
    #[error("runtime spec {file}: {message}")]
    Parse {
        /// The file (or `<inline>`).
        file: String,
        /// What the parser said, with its position.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("runtime spec: {path}: {message}")]
    Invalid {
        /// The key.
        path: KeyPath,
        /// What is wrong.
        message: String,
    },
}

fn invalid(path: KeyPath, message: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        path,
        message: message.into(),
    }
}

/// Which runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// bubblewrap on the host.
    #[default]
    Native,
    /// A Docker container.
    Docker,
    /// An Apptainer instance.
    Apptainer,
}

/// The network of a sandbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkKind {
    /// Its own network namespace with only loopback (fails closed).
    #[default]
    Isolated,
    /// The host's network namespace.
    Host,
}

/// The file as written.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRuntimeSpec {
    /// `kind`.
    pub kind: Option<RuntimeKind>,
    /// `image`.
    pub image: Option<String>,
    /// `rootfs`.
    pub rootfs: Option<String>,
    /// `workdir`.
    pub workdir: Option<String>,
    /// `network`.
    pub network: Option<NetworkKind>,
    /// `environment`.
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// `[[mounts]]`.
    #[serde(default)]
    pub mounts: Vec<RawMount>,
    /// `[limits]`.
    #[serde(default)]
    pub limits: RawLimits,
    /// `[[prepare]]`.
    #[serde(default)]
    pub prepare: Vec<RawStep>,
    /// `[[post]]`.
    #[serde(default)]
    pub post: Vec<RawStep>,
}

/// One `[[mounts]]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMount {
    /// `source`.
    pub source: String,
    /// `target`.
    pub target: String,
    /// `read_only`.
    pub read_only: Option<bool>,
}

/// `[limits]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// `memory_bytes`.
    pub memory_bytes: Option<u64>,
    /// `pids`.
    pub pids: Option<u32>,
    /// `cpu`.
    pub cpu: Option<f64>,
    /// `disk_bytes`.
    pub disk_bytes: Option<u64>,
}

/// One prepare or post-run step.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    /// `upload = { from, to }`.
    pub upload: Option<RawUpload>,
    /// `run = "..."` or `run = [...]`.
    pub run: Option<RawCommand>,
}

/// `upload`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpload {
    /// `from`: a host path.
    pub from: String,
    /// `to`: relative to the workspace (default `.`).
    pub to: Option<String>,
    /// `replace`: remove what is at `to` first (default false).
    pub replace: Option<bool>,
}

/// `run`: a shell line or an argv.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum RawCommand {
    /// Run through `sh -c`.
    Shell(String),
    /// The argv.
    Argv(Vec<String>),
}

/// A bind mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// Host path.
    pub source: PathBuf,
    /// Sandbox path.
    pub target: PathBuf,
    /// Read-only.
    pub read_only: bool,
}

/// Resource limits; `None` leaves a resource unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Limits {
    /// Memory, bytes.
    pub memory_bytes: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u32>,
    /// CPU, in cores.
    pub cpu: Option<f64>,
    /// Disk for the workspace, HOME and `/tmp` together, bytes: lowers the
    /// node's `sandbox.disk_bytes` (the node refuses a larger one).
    pub disk_bytes: Option<u64>,
}

/// The smallest `limits.disk_bytes`: 16 MiB.
pub const MIN_DISK_BYTES: u64 = 16 << 20;

impl Limits {
    /// The disk quota of a session on a node whose `sandbox.disk_bytes` is
    /// `node`: the spec's value when it has one, which may not exceed the
    /// node's (the error names `limits.disk_bytes`).
    pub fn disk_quota(&self, node: u64) -> Result<u64, SpecError> {
        match self.disk_bytes {
            None => Ok(node),
            Some(d) if d <= node => Ok(d),
            Some(d) => Err(invalid(
                KeyPath::root().key("limits").key("disk_bytes"),
                format!("{d} is above this node's sandbox.disk_bytes ({node})"),
            )),
        }
    }

    /// These limits, with `defaults` (the node's) for the ones left out:
    /// a sandbox is never unlimited unless the node says so.
    #[must_use]
    pub fn or(self, defaults: Limits) -> Limits {
        Limits {
            memory_bytes: self.memory_bytes.or(defaults.memory_bytes),
            pids: self.pids.or(defaults.pids),
            cpu: self.cpu.or(defaults.cpu),
            disk_bytes: self.disk_bytes.or(defaults.disk_bytes),
        }
    }
}

/// A prepare or post-run step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Copy a host file or directory into the workspace.
    Upload {
        /// Host path.
        from: PathBuf,
        /// Relative path inside the workspace (`.` for its top).
        to: PathBuf,
        /// Remove whatever is at `to` before copying, so that it holds
        /// exactly what `from` holds (never `.`: the workspace stays).
        replace: bool,
    },
    /// Run a command in the sandbox.
    Run {
        /// The argv.
        argv: Vec<String>,
    },
}

/// A validated runtime spec.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeSpec {
    /// Which runtime.
    pub kind: RuntimeKind,
    /// Container image (docker, apptainer).
    pub image: Option<String>,
    /// Root file system directory (native).
    pub rootfs: Option<PathBuf>,
    /// Where the workspace appears in the sandbox.
    pub workdir: PathBuf,
    /// Network mode.
    pub network: NetworkKind,
    /// Extra environment.
    pub environment: BTreeMap<String, String>,
    /// Extra mounts.
    pub mounts: Vec<Mount>,
    /// Limits.
    pub limits: Limits,
    /// Steps before the harness.
    pub prepare: Vec<Step>,
    /// Steps after the harness.
    pub post: Vec<Step>,
}

/// The default workspace path in the sandbox.
pub const DEFAULT_WORKDIR: &str = "/workspace";

impl Default for RuntimeSpec {
    fn default() -> Self {
        Self {
            kind: RuntimeKind::Native,
            image: None,
            rootfs: None,
            workdir: PathBuf::from(DEFAULT_WORKDIR),
            network: NetworkKind::Isolated,
            environment: BTreeMap::new(),
            mounts: Vec::new(),
            limits: Limits::default(),
            prepare: Vec::new(),
            post: Vec::new(),
        }
    }
}

impl RuntimeSpec {
    /// Reads and validates a spec file (JSON when it ends in `.json`).
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            path: path.to_owned(),
            source,
        })?;
        let json = path.extension().is_some_and(|e| e == "json");
        let spec = Self::parse(&text, json, &path.display().to_string())?;
        spec.check_host_paths()?;
        Ok(spec)
    }

    /// Checks that the host paths exist on this machine: the rootfs is a
    /// directory, every mount source exists. (Upload sources are read when
    /// their step runs.)
    pub fn check_host_paths(&self) -> Result<(), SpecError> {
        let root = KeyPath::root();
        if let Some(r) = &self.rootfs
            && !r.is_dir()
        {
            return Err(invalid(
                root.key("rootfs"),
                format!("{:?} is not a directory", r.display().to_string()),
            ));
        }
        for (i, m) in self.mounts.iter().enumerate() {
            if !m.source.exists() {
                return Err(invalid(
                    root.key("mounts").index(i).key("source"),
                    format!("{} does not exist", m.source.display()),
                ));
            }
        }
        Ok(())
    }

    /// Checks every path this spec hands to its runtime's mount syntax
    /// (mount sources and targets, the workdir) with [`mount_path_problem`].
    pub fn check_mount_syntax(&self) -> Result<(), SpecError> {
        let root = KeyPath::root();
        let check = |key: KeyPath, p: &Path| match mount_path_problem(self.kind, p) {
            Some(why) => Err(invalid(key, format!("{:?} {why}", p.display().to_string()))),
            None => Ok(()),
        };
        check(root.key("workdir"), &self.workdir)?;
        for (i, m) in self.mounts.iter().enumerate() {
            let at = root.key("mounts").index(i);
            check(at.key("source"), &m.source)?;
            check(at.key("target"), &m.target)?;
        }
        Ok(())
    }
}

/// Why `path` cannot be written in `kind`'s mount syntax, if it cannot:
/// docker's `--mount type=bind,source=...,target=...` is a CSV record
/// (`,` splits it, `"` quotes, a line break ends it); apptainer's `--bind
/// src:dst:ro` splits on `:` and `,`. Control characters, surrounding
/// white space and bytes that are not UTF-8 are refused for both (a CLI
/// that trims or re-encodes would mount another path than the one
/// checked). The native runtime passes paths as separate arguments and
/// needs no check.
pub fn mount_path_problem(kind: RuntimeKind, path: &Path) -> Option<&'static str> {
    let bad: &[char] = match kind {
        RuntimeKind::Native => return None,
        RuntimeKind::Docker => &[',', '"'],
        RuntimeKind::Apptainer => &[':', ','],
    };
    let Some(s) = path.to_str() else {
        return Some("is not UTF-8");
    };
    if s.chars().any(char::is_control) {
        return Some("holds a control character (a line break...)");
    }
    if s.trim() != s {
        return Some("begins or ends with white space");
    }
    if s.contains(bad) {
        return Some(match kind {
            RuntimeKind::Docker => {
                "holds `,` or `\"`, which docker's --mount syntax (CSV) cannot carry"
            }
            _ => "holds `:` or `,`, which apptainer's --bind syntax cannot carry",
        });
    }
    None
}

impl RuntimeSpec {
    /// Parses and validates a spec text.
    pub fn parse(text: &str, json: bool, file: &str) -> Result<Self, SpecError> {
        let raw: RawRuntimeSpec = if json {
            serde_json::from_str(text).map_err(|e| SpecError::Parse {
                file: file.to_owned(),
                message: e.to_string(),
            })?
        } else {
            toml::from_str(text).map_err(|e| SpecError::Parse {
                file: file.to_owned(),
                message: e.to_string().trim_end().to_owned(),
            })?
        };
        Self::try_from(raw)
    }
}

/// An absolute path without `..`.
fn abs_path(path: &KeyPath, s: &str) -> Result<PathBuf, SpecError> {
    let p = PathBuf::from(s);
    if !p.is_absolute() {
        return Err(invalid(
            path.clone(),
            format!("{s:?} is not an absolute path"),
        ));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(invalid(path.clone(), format!("{s:?} contains \"..\"")));
    }
    Ok(p)
}

fn step(path: &KeyPath, raw: RawStep) -> Result<Step, SpecError> {
    match (raw.upload, raw.run) {
        (Some(u), None) => {
            let up = path.key("upload");
            let from = abs_path(&up.key("from"), &u.from)?;
            let to = PathBuf::from(u.to.as_deref().unwrap_or("."));
            let inside = to
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            if !inside {
                return Err(invalid(
                    up.key("to"),
                    format!("{to:?} must be a relative path inside the workspace, without \"..\""),
                ));
            }
            let replace = u.replace.unwrap_or(false);
            if replace && to.components().all(|c| c == Component::CurDir) {
                return Err(invalid(
                    up.key("replace"),
                    "replaces what is at `to`, which cannot be the workspace itself",
                ));
            }
            Ok(Step::Upload { from, to, replace })
        }
        (None, Some(RawCommand::Shell(line))) => {
            if line.trim().is_empty() {
                return Err(invalid(path.key("run"), "the command is empty"));
            }
            Ok(Step::Run {
                argv: vec!["sh".into(), "-c".into(), line],
            })
        }
        (None, Some(RawCommand::Argv(argv))) => {
            if argv.first().is_none_or(String::is_empty) {
                return Err(invalid(path.key("run"), "the command is empty"));
            }
            Ok(Step::Run { argv })
        }
        (Some(_), Some(_)) => Err(invalid(
            path.clone(),
            "a step is either `upload` or `run`, not both",
        )),
        (None, None) => Err(invalid(path.clone(), "a step needs `upload` or `run`")),
    }
}

fn env_name_ok(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl TryFrom<RawRuntimeSpec> for RuntimeSpec {
    type Error = SpecError;

    fn try_from(raw: RawRuntimeSpec) -> Result<Self, SpecError> {
        let root = KeyPath::root();
        let kind = raw.kind.unwrap_or_default();
        let image = match (&raw.image, kind) {
            (Some(i), RuntimeKind::Native) => {
                return Err(invalid(
                    root.key("image"),
                    format!("{i:?}: the native runtime takes `rootfs`, not an image"),
                ));
            }
            (Some(i), _) if i.trim().is_empty() => {
                return Err(invalid(root.key("image"), "the image is empty"));
            }
            (None, RuntimeKind::Docker | RuntimeKind::Apptainer) => {
                return Err(invalid(
                    root.key("image"),
                    "required for the docker and apptainer runtimes",
                ));
            }
            (i, _) => i.clone(),
        };
        let rootfs = match (&raw.rootfs, kind) {
            (Some(r), RuntimeKind::Native) => Some(abs_path(&root.key("rootfs"), r)?),
            (Some(_), _) => {
                return Err(invalid(
                    root.key("rootfs"),
                    "only the native runtime takes a root file system; use `image`",
                ));
            }
            (None, _) => None,
        };
        let workdir = match &raw.workdir {
            Some(w) => {
                let p = abs_path(&root.key("workdir"), w)?;
                if p == Path::new("/") {
                    return Err(invalid(root.key("workdir"), "cannot be /"));
                }
                p
            }
            None => PathBuf::from(DEFAULT_WORKDIR),
        };
        for name in raw.environment.keys() {
            if !env_name_ok(name) {
                return Err(invalid(
                    root.key("environment").key(name),
                    "not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)",
                ));
            }
        }
        let mut mounts = Vec::with_capacity(raw.mounts.len());
        for (i, m) in raw.mounts.into_iter().enumerate() {
            let at = root.key("mounts").index(i);
            let source = abs_path(&at.key("source"), &m.source)?;
            let target = abs_path(&at.key("target"), &m.target)?;
            if target == Path::new("/") || target == workdir {
                return Err(invalid(
                    at.key("target"),
                    "cannot be / or the workspace directory",
                ));
            }
            mounts.push(Mount {
                source,
                target,
                read_only: m.read_only.unwrap_or(true),
            });
        }
        let lim = root.key("limits");
        if raw.limits.memory_bytes.is_some_and(|m| m < 16 << 20) {
            return Err(invalid(
                lim.key("memory_bytes"),
                "at least 16777216 (16 MiB)",
            ));
        }
        if raw.limits.pids.is_some_and(|p| p < 8) {
            return Err(invalid(lim.key("pids"), "at least 8"));
        }
        if raw
            .limits
            .cpu
            .is_some_and(|c| !c.is_finite() || c <= 0.0 || c > 4096.0)
        {
            return Err(invalid(lim.key("cpu"), "a number of cores above 0"));
        }
        if raw.limits.disk_bytes.is_some_and(|d| d < MIN_DISK_BYTES) {
            return Err(invalid(lim.key("disk_bytes"), "at least 16777216 (16 MiB)"));
        }
        let steps = |name: &str, raw: Vec<RawStep>| {
            raw.into_iter()
                .enumerate()
                .map(|(i, s)| step(&root.key(name).index(i), s))
                .collect::<Result<Vec<_>, _>>()
        };
        let spec = Self {
            kind,
            image,
            rootfs,
            workdir,
            network: raw.network.unwrap_or_default(),
            environment: raw.environment,
            mounts,
            limits: Limits {
                memory_bytes: raw.limits.memory_bytes,
                pids: raw.limits.pids,
                cpu: raw.limits.cpu,
                disk_bytes: raw.limits.disk_bytes,
            },
            prepare: steps("prepare", raw.prepare)?,
            post: steps("post", raw.post)?,
        };
        spec.check_mount_syntax()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toml(text: &str) -> Result<RuntimeSpec, String> {
        RuntimeSpec::parse(text, false, "t.toml").map_err(|e| e.to_string())
    }

    #[test]
    fn empty_is_native_isolated_at_workspace() {
        assert_eq!(toml(""), Ok(RuntimeSpec::default()));
    }

    #[test]
    fn full_toml_and_json_agree() {
        let t = toml(
            r#"
kind = "docker"
image = "python:3.12"
workdir = "/work"
network = "host"
environment = { A = "1" }
[[mounts]]
source = "/etc"
target = "/host-etc"
[limits]
memory_bytes = 1073741824
pids = 64
cpu = 1.5
[[prepare]]
upload = { from = "/etc/hostname", to = "task/hostname" }
[[prepare]]
run = "echo hi"
[[post]]
run = ["true"]
[[post]]
upload = { from = "/etc/hostname", to = "tests", replace = true }
"#,
        )
        .unwrap();
        assert_eq!(t.kind, RuntimeKind::Docker);
        assert_eq!(t.workdir, PathBuf::from("/work"));
        assert_eq!(t.network, NetworkKind::Host);
        assert!(t.mounts[0].read_only);
        assert_eq!(t.limits.pids, Some(64));
        assert_eq!(
            t.post[1],
            Step::Upload {
                from: PathBuf::from("/etc/hostname"),
                to: PathBuf::from("tests"),
                replace: true,
            }
        );
        assert!(matches!(t.prepare[0], Step::Upload { replace: false, .. }));
        assert_eq!(
            t.prepare[1],
            Step::Run {
                argv: vec!["sh".into(), "-c".into(), "echo hi".into()]
            }
        );
        let j = RuntimeSpec::parse(
            r#"{"kind":"docker","image":"python:3.12","workdir":"/work","network":"host",
                "environment":{"A":"1"},"mounts":[{"source":"/etc","target":"/host-etc"}],
                "limits":{"memory_bytes":1073741824,"pids":64,"cpu":1.5},
                "prepare":[{"upload":{"from":"/etc/hostname","to":"task/hostname"}},{"run":"echo hi"}],
                "post":[{"run":["true"]},{"upload":{"from":"/etc/hostname","to":"tests","replace":true}}]}"#,
            true,
            "t.json",
        )
        .unwrap();
        assert_eq!(t, j);
    }

    #[test]
    fn disk_bytes_may_only_lower_the_nodes_quota() {
        let t = toml("[limits]\ndisk_bytes = 33554432").unwrap();
        assert_eq!(t.limits.disk_quota(1 << 30).unwrap(), 32 << 20);
        assert_eq!(
            RuntimeSpec::default().limits.disk_quota(1 << 30).unwrap(),
            1 << 30
        );
        let e = t.limits.disk_quota(16 << 20).unwrap_err().to_string();
        assert!(e.contains("limits.disk_bytes: 33554432 is above"), "{e}");
        assert!(e.contains("sandbox.disk_bytes (16777216)"), "{e}");
    }

    #[test]
    fn errors_name_the_key() {
        for (text, needle) in [
            ("kind = \"podman\"", "unknown variant `podman`"),
            ("bogus = 1", "unknown field `bogus`"),
            ("kind = \"docker\"", "image: required"),
            ("image = \"x\"", "image: \"x\": the native runtime"),
            (
                "rootfs = \"relative\"",
                "rootfs: \"relative\" is not an absolute",
            ),
            ("workdir = \"/\"", "workdir: cannot be /"),
            ("workdir = \"/a/../b\"", "workdir: \"/a/../b\" contains"),
            (
                "environment = { \"1X\" = \"v\" }",
                "environment.1X: not a valid",
            ),
            (
                "[[mounts]]\nsource = \"/etc\"\ntarget = \"/workspace\"",
                "mounts[0].target: cannot be",
            ),
            ("[limits]\npids = 2", "limits.pids: at least 8"),
            ("[limits]\ndisk_bytes = 1000", "limits.disk_bytes: at least"),
            (
                "[limits]\nmemory_bytes = 1000",
                "limits.memory_bytes: at least",
            ),
            ("[limits]\ncpu = 0.0", "limits.cpu: a number of cores"),
            (
                "[[prepare]]\nrun = \"\"",
                "prepare[0].run: the command is empty",
            ),
            (
                "[[prepare]]\nrun = []",
                "prepare[0].run: the command is empty",
            ),
            ("[[post]]\n", "post[0]: a step needs"),
            (
                "[[post]]\nrun = \"x\"\nupload = { from = \"/etc\" }",
                "post[0]: a step is either",
            ),
            (
                "[[prepare]]\nupload = { from = \"rel\" }",
                "prepare[0].upload.from: \"rel\" is not an absolute",
            ),
            (
                "[[prepare]]\nupload = { from = \"/etc\", to = \"../x\" }",
                "prepare[0].upload.to:",
            ),
            (
                "[[prepare]]\nupload = { from = \"/etc\", to = \"/abs\" }",
                "prepare[0].upload.to:",
            ),
            (
                "[[post]]\nupload = { from = \"/etc\", replace = true }",
                "post[0].upload.replace: replaces what is at `to`",
            ),
            (
                "[[post]]\nupload = { from = \"/etc\", to = \"./.\", replace = true }",
                "post[0].upload.replace:",
            ),
        ] {
            match toml(text) {
                Ok(s) => panic!("{text:?} was accepted: {s:?}"),
                Err(e) => assert!(e.contains(needle), "{text:?}: {e}"),
            }
        }
    }

    #[test]
    fn parsing_touches_no_file_and_load_checks_the_host_paths() {
        let text = "rootfs = \"/no/such/dir\"\n[[mounts]]\nsource = \"/nope/x\"\ntarget = \"/x\"";
        let spec = RuntimeSpec::parse(text, false, "t").unwrap();
        let e = spec.check_host_paths().unwrap_err().to_string();
        assert!(
            e.contains("rootfs: \"/no/such/dir\" is not a directory"),
            "{e}"
        );
        let dir = std::env::temp_dir().join(format!("polar-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rt.toml");
        std::fs::write(&file, "[[mounts]]\nsource = \"/nope/x\"\ntarget = \"/x\"").unwrap();
        let e = RuntimeSpec::load(&file).unwrap_err().to_string();
        assert!(
            e.contains("mounts[0].source: /nope/x does not exist"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn container_mount_syntax_is_refused_naming_the_key() {
        let mount = |kind: &str, src: &str, dst: &str| {
            let img = if kind == "native" {
                ""
            } else {
                "image = \"img\"\n"
            };
            toml(&format!(
                "kind = \"{kind}\"\n{img}[[mounts]]\nsource = {src:?}\ntarget = {dst:?}"
            ))
        };
        for (kind, src, dst, needle) in [
            (
                "docker",
                "/a,b",
                "/x",
                "mounts[0].source: \"/a,b\" holds `,`",
            ),
            ("docker", "/a\"b", "/x", "mounts[0].source:"),
            ("docker", "/a", "/x,readonly=false", "mounts[0].target:"),
            (
                "docker",
                "/a\nb",
                "/x",
                "mounts[0].source: \"/a\\nb\" holds a control",
            ),
            (
                "docker",
                "/a ",
                "/x",
                "mounts[0].source: \"/a \" begins or ends",
            ),
            (
                "apptainer",
                "/a:b",
                "/x",
                "mounts[0].source: \"/a:b\" holds `:`",
            ),
            ("apptainer", "/a", "/x:rw", "mounts[0].target:"),
            ("apptainer", "/a,b", "/x", "mounts[0].source:"),
        ] {
            match mount(kind, src, dst) {
                Ok(s) => panic!("{kind} {src:?} {dst:?} accepted: {s:?}"),
                Err(e) => assert!(e.contains(needle), "{kind} {src:?}: {e}"),
            }
        }
        // What each syntax can carry.
        assert!(mount("docker", "/a:b=c-d", "/-x").is_ok());
        assert!(mount("apptainer", "/a=b,", "/x").is_err());
        assert!(mount("apptainer", "/a=b-c", "/-x").is_ok());
        assert!(mount("native", "/a:b,c\"d", "/x").is_ok());
        let e = toml("kind = \"apptainer\"\nimage = \"i\"\nworkdir = \"/w:x\"").unwrap_err();
        assert!(e.contains("workdir: \"/w:x\" holds `:`"), "{e}");
    }
}
