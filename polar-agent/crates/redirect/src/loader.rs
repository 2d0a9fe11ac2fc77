//! Loading Polar's embedded eBPF object and attaching its programs to the
//! agent's cgroup. Programs are attached with BPF links held by this process
//! and never pinned, so they detach when the agent exits, however it exits.

use std::fs::File;
use std::path::Path;

use aya::programs::{CgroupAttachMode, Program};
use aya::{Ebpf, EbpfLoader};

/// The eBPF object built from `polar-ebpf` by `build.rs`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/polar-ebpf"));

/// The kernel hook of each program, for error messages.
const HOOKS: &[(&str, &str)] = &[
    ("polar_connect4", "cgroup/connect4"),
    ("polar_connect6", "cgroup/connect6"),
    ("polar_sendmsg4", "cgroup/sendmsg4"),
    ("polar_sendmsg6", "cgroup/sendmsg6"),
    ("polar_recvmsg4", "cgroup/recvmsg4"),
    ("polar_recvmsg6", "cgroup/recvmsg6"),
    ("polar_getpeername4", "cgroup/getpeername4"),
    ("polar_getpeername6", "cgroup/getpeername6"),
    ("polar_sock_ops", "sockops"),
    ("polar_sock_release", "cgroup/sock_release"),
];

/// Errors of loading and attaching.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The object could not be parsed or its maps created.
    #[error("loading the eBPF object failed: {0}")]
    Object(#[source] aya::EbpfError),
    /// A program the agent needs is missing from the object (a build problem).
    #[error("the embedded eBPF object has no program {0}; rebuild with `cargo xtask build`")]
    MissingProgram(&'static str),
    /// The verifier refused a program, or the kernel lacks its type.
    #[error("the kernel refused the {hook} program: {source}")]
    Load {
        /// The hook.
        hook: &'static str,
        /// The cause (with the verifier log).
        #[source]
        source: aya::programs::ProgramError,
    },
    /// Attaching failed, usually a kernel without the hook.
    #[error(
        "attaching the {hook} program to {cgroup} failed: {source} \
         (this kernel may lack the {hook} hook: Polar needs Linux 5.15 or later with CONFIG_CGROUP_BPF)"
    )]
    Attach {
        /// The hook.
        hook: &'static str,
        /// The cgroup.
        cgroup: String,
        /// The cause.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// The cgroup directory could not be opened.
    #[error("opening cgroup {0}: {1}")]
    Cgroup(String, #[source] std::io::Error),
    /// The kernel's list of loaded programs could not be read.
    #[error("{0}")]
    List(#[source] aya::programs::ProgramError),
}

/// The BPF programs loaded in the kernel (by any process) whose names start
/// with `prefix`, as (program id, name); programs without a readable name are
/// left out.
pub fn loaded_programs_named(prefix: &str) -> Result<Vec<(u32, String)>, LoadError> {
    let mut found = Vec::new();
    for info in aya::programs::loaded_programs() {
        let info = info.map_err(LoadError::List)?;
        let Some(name) = info.name_as_str() else {
            continue;
        };
        if name.starts_with(prefix) {
            found.push((info.id(), name.to_owned()));
        }
    }
    Ok(found)
}

/// The hex SHA-256 of the embedded object, logged at load.
pub fn object_sha256() -> String {
    ring::digest::digest(&ring::digest::SHA256, OBJECT)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Loads the object with the session cgroup level baked in and attaches every
/// program to `cgroup`. The returned `Ebpf` owns the links: dropping it
/// detaches everything.
pub fn load_and_attach(cgroup: &Path, session_level: u32) -> Result<Ebpf, LoadError> {
    let mut ebpf = EbpfLoader::new()
        .override_global(polar_common::GLOBAL_SESSION_LEVEL, &session_level, true)
        .load(OBJECT)
        .map_err(LoadError::Object)?;
    let dir = File::open(cgroup).map_err(|e| LoadError::Cgroup(cgroup.display().to_string(), e))?;
    for &(name, hook) in HOOKS {
        let prog = ebpf
            .program_mut(name)
            .ok_or(LoadError::MissingProgram(name))?;
        let load = |source| LoadError::Load { hook, source };
        let attach = |source| LoadError::Attach {
            hook,
            cgroup: cgroup.display().to_string(),
            source,
        };
        // Links are always multi-attach; flags must be 0 (`Single`).
        let mode = CgroupAttachMode::Single;
        match prog {
            Program::CgroupSockAddr(p) => {
                p.load().map_err(load)?;
                p.attach(&dir, mode).map_err(attach)?;
            }
            Program::SockOps(p) => {
                p.load().map_err(load)?;
                p.attach(&dir, mode).map_err(attach)?;
            }
            Program::CgroupSock(p) => {
                p.load().map_err(load)?;
                p.attach(&dir, mode).map_err(attach)?;
            }
            _ => return Err(LoadError::MissingProgram(name)),
        }
    }
    tracing::info!(
        object_sha256 = %object_sha256(),
        cgroup = %cgroup.display(),
        programs = HOOKS.len(),
        "eBPF programs attached"
    );
    Ok(ebpf)
}
