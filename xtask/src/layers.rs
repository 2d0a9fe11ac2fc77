//! `cargo xtask layers`: the workspace's crate layering, checked against a
//! table of rules, and the crate graph in ARCHITECTURE.md.
//!
//! [`LAYERS`] has one row per workspace crate: its [`Class`] and the
//! workspace crates it may depend on (normal and build dependencies). The
//! check reads `cargo metadata` (each member's declared dependencies, and the
//! resolved graph for what a crate pulls in transitively) and fails when
//!
//! - a workspace member has no row (a new crate must be declared);
//! - a crate depends on a workspace crate its row does not allow;
//! - a `pure` crate pulls in an I/O crate ([`IO_CRATES`]) through its normal
//!   dependencies, however indirectly (`libc`: direct dependencies only);
//! - a crate names an owned dependency ([`OWNED`]) it is not an owner of
//!   (while none of its owners exists yet, the agent crate, which then
//!   still holds that code, may);
//! - a crate that must build on stable without bpf-linker or LLVM
//!   ([`STABLE_ONLY`]) pulls in the eBPF side ([`EBPF_SIDE`]);
//! - a crate other than the tests crate depends on the `agent` crate;
//! - workspace crates depend on one another in a cycle, dev-dependencies
//!   included (cargo accepts a dev-dependency cycle; we do not).
//!
//! Dev-dependencies are checked for cycles only.
//!
//! To add a crate, add a [`Layer`] row to [`LAYERS`] below the crates it uses
//! and list them in `may_use`; rows for crates that do not exist yet are
//! simply unused. `cargo xtask layers --write` then regenerates the crate
//! graph in ARCHITECTURE.md (between the [`BEGIN`] and [`END`] markers);
//! `cargo xtask layers`, which `cargo xtask test` runs, fails while that block
//! is out of date.

mod check;
mod graph;
mod metadata;
#[cfg(test)]
mod tests;

use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::cmd::{Cmd, workspace_root};
use check::check;
pub use graph::{BEGIN, END};
use metadata::Workspace;

/// What a crate is allowed to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Data types and algorithms: no I/O crate, even transitively.
    Pure,
    /// eBPF programs, built for the BPF target.
    Kernel,
    /// Sockets, files, databases, object storage.
    Io,
    /// The `polar` binary: wires the crates together.
    Agent,
    /// The end-to-end tests.
    Tests,
    /// Development commands (this crate).
    Tool,
}

impl Class {
    pub const ALL: [Self; 6] = [
        Self::Pure,
        Self::Kernel,
        Self::Io,
        Self::Agent,
        Self::Tests,
        Self::Tool,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Pure => "pure",
            Self::Kernel => "kernel",
            Self::Io => "io",
            Self::Agent => "agent",
            Self::Tests => "tests",
            Self::Tool => "tool",
        }
    }
}

/// The workspace crates a row may depend on (normal and build dependencies).
#[derive(Clone, Copy, Debug)]
pub enum Allowed {
    /// These, and no other.
    Only(&'static [&'static str]),
    /// Any crate in a row above this one.
    Above,
    /// Any workspace crate.
    Any,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct Layer {
    /// The package name.
    pub name: &'static str,
    pub class: Class,
    pub may_use: Allowed,
    /// Workspace crates allowed as build-dependencies only (even if
    /// `may_use` lists them).
    pub build_only: &'static [&'static str],
    /// Crates of [`IO_CRATES`] this crate may name directly; every walk of
    /// the resolved graph skips these edges. For an optional dependency
    /// behind a feature that only a crate allowed to use it turns on (the
    /// resolved graph unifies features across the workspace). The owned
    /// rule ([`OWNED`]) lets the crate name these too.
    pub io_allowed: &'static [&'static str],
}

const fn row(name: &'static str, class: Class, may_use: &'static [&'static str]) -> Layer {
    Layer {
        name,
        class,
        may_use: Allowed::Only(may_use),
        build_only: &[],
        io_allowed: &[],
    }
}

/// The layer table: one row per workspace crate, each below the crates it
/// may use.
pub const LAYERS: &[Layer] = &[
    Layer {
        // `unsafe impl aya::Pod` for the shared types, behind the `user`
        // feature, which only polar-redirect turns on.
        io_allowed: &["aya"],
        ..row("polar-common", Class::Pure, &[])
    },
    row("polar-ebpf", Class::Kernel, &["polar-common"]),
    row("polar-ids", Class::Pure, &["polar-common"]),
    row("polar-json", Class::Pure, &[]),
    row("polar-sse", Class::Pure, &[]),
    row("polar-wire", Class::Pure, &[]),
    row("polar-metrics", Class::Pure, &[]),
    // A model's own chat template and tokenizer: a leaf, below polar-chat's
    // users, knowing nothing of Polar's chat model.
    row("polar-template", Class::Pure, &[]),
    row("polar-chat", Class::Pure, &["polar-json", "polar-sse"]),
    row("polar-faithful", Class::Pure, &["polar-template"]),
    row(
        "polar-record",
        Class::Pure,
        &["polar-chat", "polar-json", "polar-faithful"],
    ),
    row(
        "polar-trajectory",
        Class::Pure,
        &["polar-record", "polar-chat", "polar-json"],
    ),
    row("polar-spec", Class::Pure, &[]),
    row(
        "polar-rollout-types",
        Class::Pure,
        &["polar-spec", "polar-trajectory"],
    ),
    row("polar-io", Class::Io, &[]),
    row(
        "polar-inference",
        Class::Io,
        &[
            "polar-spec",
            "polar-chat",
            "polar-json",
            "polar-sse",
            "polar-io",
            "polar-faithful",
            "polar-template",
        ],
    ),
    row(
        "polar-mock",
        Class::Io,
        &[
            "polar-chat",
            "polar-json",
            "polar-sse",
            "polar-io",
            "polar-inference",
            "polar-faithful",
            "polar-template",
        ],
    ),
    // The capture log's format and reader: what export and the rollout
    // server read logs with, without the writer or the inference client.
    row(
        "polar-capture-log",
        Class::Io,
        &["polar-record", "polar-chat", "polar-json"],
    ),
    row(
        "polar-capture",
        Class::Io,
        &[
            "polar-capture-log",
            "polar-record",
            "polar-chat",
            "polar-json",
            "polar-ids",
            "polar-inference",
            "polar-io",
            "polar-metrics",
        ],
    ),
    row(
        "polar-export",
        Class::Io,
        &[
            "polar-record",
            "polar-capture-log",
            "polar-trajectory",
            "polar-chat",
            "polar-json",
            "polar-ids",
            "polar-io",
        ],
    ),
    row("polar-evaluate", Class::Io, &["polar-spec", "polar-io"]),
    row(
        "polar-rollout-api",
        Class::Io,
        &[
            "polar-rollout-types",
            "polar-spec",
            "polar-evaluate",
            "polar-trajectory",
            "polar-io",
            "polar-sse",
        ],
    ),
    row(
        "polar-gateway",
        Class::Io,
        &[
            "polar-rollout-api",
            "polar-trajectory",
            "polar-ids",
            "polar-io",
            "polar-metrics",
        ],
    ),
    row(
        "polar-rollout",
        Class::Io,
        &[
            "polar-export",
            "polar-rollout-api",
            "polar-rollout-types",
            "polar-spec",
            "polar-trajectory",
            "polar-io",
            "polar-metrics",
        ],
    ),
    // The agent's configuration file: above the crates whose settings it
    // holds (backends, capture durability, specs), below everything that
    // reads a validated `Config`.
    row(
        "polar-config",
        Class::Io,
        &[
            "polar-capture",
            "polar-chat",
            "polar-inference",
            "polar-spec",
        ],
    ),
    // TLS termination: the sandboxes' CA, its leaves, the rustls server
    // side; knows nothing of the proxy behind it.
    row("polar-tls", Class::Io, &["polar-io", "polar-wire"]),
    // How a sandbox's connections and DNS reach the agent: the eBPF loader
    // (its build script embeds the object), cgroups, the DNS responder and
    // the accept loop; knows nothing of what handlers do.
    Layer {
        build_only: &["polar-ebpf"],
        ..row(
            "polar-redirect",
            Class::Io,
            &["polar-common", "polar-ids", "polar-io", "polar-wire"],
        )
    },
    // Sandbox sessions and the runtimes in them: cgroups, limits, seccomp,
    // uids, network namespaces, bwrap, Docker, Apptainer; connections go to
    // the caller's handler, so it knows nothing of the proxy.
    row(
        "polar-sandbox",
        Class::Io,
        &[
            "polar-config",
            "polar-evaluate",
            "polar-ids",
            "polar-io",
            "polar-redirect",
            "polar-spec",
            "polar-tls",
        ],
    ),
    // Harness presets and configured harnesses as values (command lines,
    // variables, files); the sandbox's errors only for one error type.
    row(
        "polar-harness",
        Class::Io,
        &["polar-chat", "polar-config", "polar-sandbox", "polar-spec"],
    ),
    // The interception proxy and its capture stage: connections from the
    // accept loop, leaves from polar-tls, records to polar-capture; knows
    // nothing of sandboxes, harnesses or trajectories.
    row(
        "polar-proxy",
        Class::Io,
        &[
            "polar-capture",
            "polar-chat",
            "polar-config",
            "polar-ids",
            "polar-inference",
            "polar-io",
            "polar-json",
            "polar-record",
            "polar-redirect",
            "polar-tls",
            "polar-wire",
        ],
    ),
    // A node's work: the agent's parts, harness sessions end to end, the
    // gateway daemon's work; below the `polar` command, which wires it.
    row(
        "polar-node",
        Class::Io,
        &[
            "polar-capture",
            "polar-chat",
            "polar-config",
            "polar-evaluate",
            "polar-export",
            "polar-gateway",
            "polar-harness",
            "polar-ids",
            "polar-inference",
            "polar-io",
            "polar-proxy",
            "polar-record",
            "polar-redirect",
            "polar-rollout-api",
            "polar-sandbox",
            "polar-spec",
            "polar-tls",
            "polar-trajectory",
        ],
    ),
    Layer {
        name: "polar-agent",
        class: Class::Agent,
        may_use: Allowed::Above,
        // The eBPF object, if ever, only as a build-dependency.
        build_only: &["polar-ebpf"],
        io_allowed: &[],
    },
    Layer {
        may_use: Allowed::Any,
        ..row("polar-tests", Class::Tests, &[])
    },
    row("xtask", Class::Tool, &[]),
];

/// Crates a `pure` crate must not pull in through its normal dependencies.
pub const IO_CRATES: &[&str] = &[
    "tokio",
    "hyper",
    "hyper-util",
    "hyper-rustls",
    "rustls",
    "tokio-rustls",
    "rusqlite",
    "arrow-array",
    "arrow-schema",
    "arrow-buffer",
    "parquet",
    "object_store",
    "nix",
    "aya",
    "caps",
    "polar-io",
];

/// Checked among a `pure` crate's direct dependencies only: crates close to
/// `std` (getrandom, ...) pull it in.
pub const IO_CRATES_DIRECT: &[&str] = &["libc"];

/// External crates only their owners may name as direct (normal or build)
/// dependencies.
#[derive(Clone, Copy, Debug)]
pub struct Owned {
    /// Package names; a trailing `*` matches any suffix (`arrow-*`).
    pub deps: &'static [&'static str],
    pub owners: &'static [&'static str],
    pub why: &'static str,
}

pub const OWNED: &[Owned] = &[
    Owned {
        deps: &["arrow-*", "parquet", "object_store"],
        owners: &["polar-export"],
        why: "Parquet and object storage are the export crate's",
    },
    Owned {
        deps: &["rusqlite"],
        owners: &["polar-rollout"],
        why: "SQLite is the rollout server's database",
    },
    Owned {
        deps: &["aya"],
        owners: &["polar-redirect"],
        why: "loading eBPF programs is the redirect's",
    },
];

/// Crates that must build without nightly, bpf-linker or LLVM...
pub const STABLE_ONLY: &[&str] = &[
    "polar-ids",
    "polar-json",
    "polar-sse",
    "polar-metrics",
    "polar-chat",
    "polar-record",
    "polar-trajectory",
    "polar-spec",
    "polar-rollout-types",
    "polar-io",
    "polar-inference",
    "polar-mock",
    "polar-capture-log",
    "polar-capture",
    "polar-export",
    "polar-evaluate",
    "polar-rollout-api",
    "polar-gateway",
    "polar-rollout",
    "polar-config",
    "polar-tls",
];
/// ...so must not reach these through normal or build dependencies.
pub const EBPF_SIDE: &[&str] = &[
    "polar-agent",
    "polar-redirect",
    "polar-ebpf",
    "aya",
    "aya-build",
];

/// `cargo xtask layers [--write]`.
pub fn run(write: bool) -> Result<()> {
    let out = Cmd::cargo()?
        .args(["metadata", "--format-version", "1"])
        .capture(Duration::from_secs(600))?;
    if !out.status.success() {
        bail!(
            "`cargo metadata --format-version 1` failed ({}): {}",
            out.status,
            out.stderr.trim()
        );
    }
    let ws = Workspace::parse(&out.stdout)?;
    let violations = check(&ws, LAYERS);
    if !violations.is_empty() {
        for v in &violations {
            eprintln!("layers: {v}");
        }
        bail!(
            "{} layering rule(s) broken (the rules: the table in xtask/src/layers.rs)",
            violations.len()
        );
    }
    eprintln!(
        "layers: the {} workspace crates follow the layer rules",
        ws.members.len()
    );
    let path = workspace_root()?.join("ARCHITECTURE.md");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let updated = graph::replace_block(&text, &graph::render(&ws, LAYERS))?;
    if updated == text {
        eprintln!("layers: the crate graph in ARCHITECTURE.md is up to date");
    } else if write {
        std::fs::write(&path, updated).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("layers: wrote the crate graph in ARCHITECTURE.md");
    } else {
        bail!(
            "the crate graph in ARCHITECTURE.md (between {BEGIN} and {END}) is out of date; \
             run `cargo xtask layers --write`"
        );
    }
    Ok(())
}
