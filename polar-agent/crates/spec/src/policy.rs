//! The node-side policy for task specs: what a holder of a trainer token
//! (semi-trusted) may ask of a node, set by the node's own configuration
//! (trusted). `[gateway.policy]` in a gateway's config file, and optionally
//! `[rollout.policy]` on the rollout server, which then refuses a
//! submission outside it before any node sees it:
//!
//! ```toml
//! [gateway.policy]
//! upload_roots = ["/srv/tasks"]          # `upload.from` must be under one (default: none)
//! mount_roots = ["/data"]                # read-only `mounts[].source` (default: none)
//! writable_mount_roots = ["/scratch"]    # mounts with read_only = false (default: none)
//! rootfs_roots = ["/srv/rootfs"]         # native `rootfs` (default: none, the host's root only)
//! image_roots = ["/srv/images"]          # apptainer images given as host paths (default: none)
//! allow_host_network = false             # `network = "host"` (default: false)
//! max_memory_bytes = 8589934592          # `limits.memory_bytes` (default 8 GiB)
//! max_pids = 4096                        # `limits.pids` (default 4096)
//! max_cpu = 8.0                          # `limits.cpu` (default: no ceiling)
//! max_session_secs = 86400               # the task's `timeout_secs` (default 1 day)
//! max_agent_timeout_secs = 86400         # `agent.options.timeout_secs` (default 1 day)
//! ```
//!
//! A task spec cannot carry routing rules, pass routes or extra hosts (the
//! agent options are `command`, `timeout_secs` and `mode`; the runtime spec
//! has no network key but `network`), so there is no key for them.
//!
//! [`Policy::check_runtime`] and [`Policy::check_budgets`] compare paths
//! lexically (the spec's paths are absolute without `..`; components are
//! compared, so `/data2` is not under `/data`): that is all the rollout
//! server can do. On the node, [`Policy::resolve`] canonicalises every
//! host path the spec names (resolving symbolic links in the host's tree,
//! and the roots themselves), requires the canonical path under an allowed
//! root, writes it back into the spec (it is what gets used), and gives a
//! limit the spec leaves out the ceiling's value: a spec never widens what
//! the node allows. Every refusal is a [`KeyError`] naming the field
//! (`runtime.prepare[0].upload.from: /etc/shadow is outside the allowed
//! upload roots [/srv/tasks]`).
//!
//! Configuration checks ([`Policy::from_raw`], [`Policy::check_protected`])
//! refuse roots that are not absolute, a writable mount root overlapping a
//! root the node reads from (a sandbox could plant symbolic links in what a
//! later session uploads or runs on), and roots holding or inside the
//! node's secrets (its state directory: the CA key; its config file: the
//! tokens), each naming its key.

use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use crate::runtime::{Limits, NetworkKind, RuntimeKind, RuntimeSpec, Step};
use crate::{KeyError, KeyPath};

/// The default memory ceiling: 8 GiB.
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 8 << 30;
/// The default process ceiling.
pub const DEFAULT_MAX_PIDS: u32 = 4096;
/// The default ceiling of a session's budget and of the agent timeout: a
/// day.
pub const DEFAULT_MAX_SECS: u64 = 86_400;

/// `[gateway.policy]` or `[rollout.policy]` as written.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// `upload_roots`.
    pub upload_roots: Option<Vec<String>>,
    /// `mount_roots`.
    pub mount_roots: Option<Vec<String>>,
    /// `writable_mount_roots`.
    pub writable_mount_roots: Option<Vec<String>>,
    /// `rootfs_roots`.
    pub rootfs_roots: Option<Vec<String>>,
    /// `image_roots`.
    pub image_roots: Option<Vec<String>>,
    /// `allow_host_network`.
    pub allow_host_network: Option<bool>,
    /// `max_memory_bytes`.
    pub max_memory_bytes: Option<u64>,
    /// `max_pids`.
    pub max_pids: Option<u32>,
    /// `max_cpu`.
    pub max_cpu: Option<f64>,
    // No `max_disk_bytes`: the ceiling of `limits.disk_bytes` is the
    // node's own `sandbox.disk_bytes`, which the node checks when it makes
    // the session's directories (`Limits::disk_quota`).
    /// `max_session_secs`.
    pub max_session_secs: Option<u64>,
    /// `max_agent_timeout_secs`.
    pub max_agent_timeout_secs: Option<u64>,
}

/// Ceilings of what a task may ask for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceilings {
    /// `limits.memory_bytes`.
    pub memory_bytes: u64,
    /// `limits.pids`.
    pub pids: u32,
    /// `limits.cpu` (`None`: no ceiling).
    pub cpu: Option<f64>,
    /// The task's `timeout_secs`.
    pub session_secs: u64,
    /// `agent.options.timeout_secs`.
    pub agent_timeout_secs: u64,
}

impl Default for Ceilings {
    fn default() -> Self {
        Self {
            memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
            pids: DEFAULT_MAX_PIDS,
            cpu: None,
            session_secs: DEFAULT_MAX_SECS,
            agent_timeout_secs: DEFAULT_MAX_SECS,
        }
    }
}

/// The validated policy. The default allows nothing beyond what is safe:
/// no uploads, no mounts, no rootfs or image paths, the isolated network,
/// the default ceilings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    /// Where `upload.from` may be.
    pub upload_roots: Vec<PathBuf>,
    /// Where a read-only mount's source may be.
    pub mount_roots: Vec<PathBuf>,
    /// Where any mount's source may be, read-write too.
    pub writable_mount_roots: Vec<PathBuf>,
    /// Where a native `rootfs` may be.
    pub rootfs_roots: Vec<PathBuf>,
    /// Where an apptainer image given as a path may be.
    pub image_roots: Vec<PathBuf>,
    /// Whether `network = "host"` is allowed.
    pub allow_host_network: bool,
    /// The ceilings.
    pub ceilings: Ceilings,
}

/// `path` with `.` and repeated separators gone (the spec's and the
/// roots' paths are absolute and have no `..`).
fn normalise(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

fn under(path: &Path, roots: &[PathBuf]) -> bool {
    let p = normalise(path);
    roots.iter().any(|r| p.starts_with(r))
}

fn overlap(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn show(roots: &[PathBuf]) -> String {
    let names: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    format!("[{}]", names.join(", "))
}

/// A list of roots, each absolute without `..`, normalised.
fn roots(key: &KeyPath, raw: Option<&Vec<String>>) -> Result<Vec<PathBuf>, KeyError> {
    let mut out = Vec::new();
    for (i, r) in raw.into_iter().flatten().enumerate() {
        let at = key.index(i);
        let p = Path::new(r);
        if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
            return Err(KeyError {
                key: at,
                reason: format!("{r:?} must be an absolute path without \"..\""),
            });
        }
        out.push(normalise(p));
    }
    Ok(out)
}

/// The named root lists of a policy, for the overlap checks.
fn root_lists(p: &Policy) -> [(&'static str, &[PathBuf]); 5] {
    [
        ("upload_roots", &p.upload_roots),
        ("mount_roots", &p.mount_roots),
        ("writable_mount_roots", &p.writable_mount_roots),
        ("rootfs_roots", &p.rootfs_roots),
        ("image_roots", &p.image_roots),
    ]
}

impl Policy {
    /// Checks a policy table; `key` is where it is (`gateway.policy`).
    pub fn from_raw(raw: &RawPolicy, key: &KeyPath) -> Result<Self, KeyError> {
        let bad = |k: &str, reason: &str| KeyError {
            key: key.key(k),
            reason: reason.to_owned(),
        };
        let d = Ceilings::default();
        let ceilings = Ceilings {
            memory_bytes: match raw.max_memory_bytes {
                Some(m) if m < 16 << 20 => {
                    return Err(bad("max_memory_bytes", "at least 16777216 (16 MiB)"));
                }
                m => m.unwrap_or(d.memory_bytes),
            },
            pids: match raw.max_pids {
                Some(p) if p < 8 => return Err(bad("max_pids", "at least 8")),
                p => p.unwrap_or(d.pids),
            },
            cpu: match raw.max_cpu {
                Some(c) if !c.is_finite() || c <= 0.0 => {
                    return Err(bad("max_cpu", "a number of cores above 0"));
                }
                c => c,
            },
            session_secs: match raw.max_session_secs {
                Some(0) => return Err(bad("max_session_secs", "at least 1")),
                s => s.unwrap_or(d.session_secs),
            },
            agent_timeout_secs: match raw.max_agent_timeout_secs {
                Some(0) => return Err(bad("max_agent_timeout_secs", "at least 1")),
                s => s.unwrap_or(d.agent_timeout_secs),
            },
        };
        let p = Self {
            upload_roots: roots(&key.key("upload_roots"), raw.upload_roots.as_ref())?,
            mount_roots: roots(&key.key("mount_roots"), raw.mount_roots.as_ref())?,
            writable_mount_roots: roots(
                &key.key("writable_mount_roots"),
                raw.writable_mount_roots.as_ref(),
            )?,
            rootfs_roots: roots(&key.key("rootfs_roots"), raw.rootfs_roots.as_ref())?,
            image_roots: roots(&key.key("image_roots"), raw.image_roots.as_ref())?,
            allow_host_network: raw.allow_host_network.unwrap_or(false),
            ceilings,
        };
        p.check_overlaps(key)?;
        Ok(p)
    }

    /// A writable mount root may not overlap a root the node reads from
    /// (uploads, rootfs, images): a sandbox could plant symbolic links or
    /// files there for a later session.
    fn check_overlaps(&self, key: &KeyPath) -> Result<(), KeyError> {
        for (i, w) in self.writable_mount_roots.iter().enumerate() {
            for (name, list) in [
                ("upload_roots", &self.upload_roots),
                ("rootfs_roots", &self.rootfs_roots),
                ("image_roots", &self.image_roots),
            ] {
                if let Some((j, r)) = list.iter().enumerate().find(|(_, r)| overlap(w, r)) {
                    return Err(KeyError {
                        key: key.key("writable_mount_roots").index(i),
                        reason: format!(
                            "{} overlaps {name}[{j}] ({}): a sandbox could plant symbolic \
                             links or files there for what the node reads later",
                            w.display(),
                            r.display()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Refuses roots that hold or are inside one of the node's protected
    /// paths (`(what, path)`: its state directory, its config file).
    pub fn check_protected(
        &self,
        key: &KeyPath,
        protected: &[(&str, &Path)],
    ) -> Result<(), KeyError> {
        for (name, list) in root_lists(self) {
            for (i, r) in list.iter().enumerate() {
                for (what, p) in protected {
                    let p = normalise(p);
                    let canon = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
                    let rc = std::fs::canonicalize(r).unwrap_or_else(|_| r.clone());
                    if overlap(r, &p) || overlap(&rc, &canon) {
                        return Err(KeyError {
                            key: key.key(name).index(i),
                            reason: format!(
                                "{} holds or is inside the node's {what} ({}); \
                                 a task could read or write it",
                                r.display(),
                                p.display()
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks a runtime spec against the policy, lexically; fields are
    /// named below `base` (`runtime`).
    pub fn check_runtime(&self, spec: &RuntimeSpec, base: &KeyPath) -> Result<(), KeyError> {
        let v = |field: KeyPath, reason: String| Err(KeyError { key: field, reason });
        if spec.network == NetworkKind::Host && !self.allow_host_network {
            return v(
                base.key("network"),
                "\"host\" is not allowed by the node's policy (allow_host_network)".into(),
            );
        }
        if let Some(r) = &spec.rootfs
            && !under(r, &self.rootfs_roots)
        {
            return v(
                base.key("rootfs"),
                format!(
                    "{} is outside the allowed rootfs roots {}",
                    r.display(),
                    show(&self.rootfs_roots)
                ),
            );
        }
        if let Some(img) = image_path(spec)
            && !under(img, &self.image_roots)
        {
            return v(
                base.key("image"),
                format!(
                    "{} is outside the allowed image roots {}",
                    img.display(),
                    show(&self.image_roots)
                ),
            );
        }
        for (i, m) in spec.mounts.iter().enumerate() {
            let field = base.key("mounts").index(i).key("source");
            if m.read_only {
                if !under(&m.source, &self.mount_roots)
                    && !under(&m.source, &self.writable_mount_roots)
                {
                    let mut all = self.mount_roots.clone();
                    all.extend(self.writable_mount_roots.iter().cloned());
                    return v(
                        field,
                        format!(
                            "{} is outside the allowed mount roots {}",
                            m.source.display(),
                            show(&all)
                        ),
                    );
                }
            } else if !under(&m.source, &self.writable_mount_roots) {
                return v(
                    field,
                    format!(
                        "{} is outside the allowed writable mount roots {} (read_only = false)",
                        m.source.display(),
                        show(&self.writable_mount_roots)
                    ),
                );
            }
        }
        for (name, steps) in [("prepare", &spec.prepare), ("post", &spec.post)] {
            for (i, s) in steps.iter().enumerate() {
                if let Step::Upload { from, .. } = s
                    && !under(from, &self.upload_roots)
                {
                    return v(
                        base.key(name).index(i).key("upload").key("from"),
                        format!(
                            "{} is outside the allowed upload roots {}",
                            from.display(),
                            show(&self.upload_roots)
                        ),
                    );
                }
            }
        }
        self.check_limits(&spec.limits, &base.key("limits"))
    }

    fn check_limits(&self, l: &Limits, base: &KeyPath) -> Result<(), KeyError> {
        let c = &self.ceilings;
        let over = |k: &str, what: String| {
            Err(KeyError {
                key: base.key(k),
                reason: format!("above the node's ceiling of {what}"),
            })
        };
        if l.memory_bytes.is_some_and(|m| m > c.memory_bytes) {
            return over("memory_bytes", c.memory_bytes.to_string());
        }
        if l.pids.is_some_and(|p| p > c.pids) {
            return over("pids", c.pids.to_string());
        }
        if let (Some(cpu), Some(max)) = (l.cpu, c.cpu)
            && cpu > max
        {
            return over("cpu", max.to_string());
        }
        Ok(())
    }

    /// Checks the budgets a task asks for: its session budget
    /// (`timeout_secs`) and, when it sets one, the agent timeout
    /// (`agent.options.timeout_secs`).
    pub fn check_budgets(
        &self,
        session_secs: u64,
        agent_timeout_secs: Option<u64>,
    ) -> Result<(), KeyError> {
        let c = &self.ceilings;
        if session_secs > c.session_secs {
            return Err(KeyError {
                key: KeyPath::root().key("timeout_secs"),
                reason: format!("above the node's ceiling of {} seconds", c.session_secs),
            });
        }
        if let Some(a) = agent_timeout_secs
            && a > c.agent_timeout_secs
        {
            return Err(KeyError {
                key: KeyPath::root()
                    .key("agent")
                    .key("options")
                    .key("timeout_secs"),
                reason: format!(
                    "above the node's ceiling of {} seconds",
                    c.agent_timeout_secs
                ),
            });
        }
        Ok(())
    }

    /// On the node: canonicalises every host path of `spec` (and the roots),
    /// checks the canonical spec with [`Policy::check_runtime`] and its
    /// runtime's mount syntax, writes the canonical paths back, and gives
    /// each limit the spec leaves out its ceiling. Blocking file work.
    pub fn resolve(&self, spec: &mut RuntimeSpec, base: &KeyPath) -> Result<(), KeyError> {
        let canon_roots = Self {
            upload_roots: canonical_roots(&self.upload_roots),
            mount_roots: canonical_roots(&self.mount_roots),
            writable_mount_roots: canonical_roots(&self.writable_mount_roots),
            rootfs_roots: canonical_roots(&self.rootfs_roots),
            image_roots: canonical_roots(&self.image_roots),
            ..self.clone()
        };
        // Lexically first: a path outside every root is refused without
        // being looked at.
        self.check_runtime(spec, base)?;
        if let Some(r) = &mut spec.rootfs {
            *r = canonical(r, &base.key("rootfs"))?;
            if !r.is_dir() {
                return Err(KeyError {
                    key: base.key("rootfs"),
                    reason: format!("{} is not a directory", r.display()),
                });
            }
        }
        if image_path(spec).is_some()
            && let Some(img) = &mut spec.image
        {
            let c = canonical(Path::new(img), &base.key("image"))?;
            *img = c
                .to_str()
                .ok_or_else(|| KeyError {
                    key: base.key("image"),
                    reason: format!("{} is not UTF-8", c.display()),
                })?
                .to_owned();
        }
        for (i, m) in spec.mounts.iter_mut().enumerate() {
            m.source = canonical(&m.source, &base.key("mounts").index(i).key("source"))?;
        }
        for name in ["prepare", "post"] {
            let steps = if name == "prepare" {
                &mut spec.prepare
            } else {
                &mut spec.post
            };
            for (i, s) in steps.iter_mut().enumerate() {
                if let Step::Upload { from, .. } = s {
                    *from = canonical(from, &base.key(name).index(i).key("upload").key("from"))?;
                }
            }
        }
        canon_roots.check_runtime(spec, base)?;
        spec.check_mount_syntax().map_err(|e| match e {
            crate::runtime::SpecError::Invalid { path, message } => KeyError {
                key: KeyPath::from_segments(
                    base.segments()
                        .iter()
                        .chain(path.segments())
                        .cloned()
                        .collect(),
                ),
                reason: format!("its canonical path {message}"),
            },
            other => KeyError {
                key: base.clone(),
                reason: other.to_string(),
            },
        })?;
        self.apply_ceilings(&mut spec.limits);
        Ok(())
    }

    /// Gives each limit `limits` leaves out its ceiling.
    pub fn apply_ceilings(&self, limits: &mut Limits) {
        let c = &self.ceilings;
        *limits = limits.or(Limits {
            memory_bytes: Some(c.memory_bytes),
            pids: Some(c.pids),
            cpu: c.cpu,
            disk_bytes: None,
        });
    }
}

/// An apptainer image given as a host path (not a `docker://`,
/// `library://`... URI).
fn image_path(spec: &RuntimeSpec) -> Option<&Path> {
    match (&spec.image, spec.kind) {
        (Some(i), RuntimeKind::Apptainer) if !i.contains("://") => Some(Path::new(i)),
        _ => None,
    }
}

fn canonical(path: &Path, field: &KeyPath) -> Result<PathBuf, KeyError> {
    std::fs::canonicalize(path).map_err(|e| KeyError {
        key: field.clone(),
        reason: format!("{} cannot be resolved on this node: {e}", path.display()),
    })
}

/// The roots that exist, canonical (a root that is a symbolic link is
/// where it points; a missing root allows nothing).
fn canonical_roots(roots: &[PathBuf]) -> Vec<PathBuf> {
    roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect()
}

#[cfg(test)]
mod tests;
