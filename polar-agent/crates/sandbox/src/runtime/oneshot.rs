//! One command in the native runtime with the caller's stdio: what
//! `polar sandbox run -- CMD` runs by default. The same sandbox as a
//! harness session on the default runtime spec (bubblewrap with the
//! seccomp filter, a uid leased for the session, the allowlisted
//! read-only view of the node's file system, the session's
//! workspace at `/workspace`, HOME at [`super::native::HOME`] and a
//! private `/tmp` writable, the agent's state directory hidden, the trust
//! files bound), only its stdin, stdout and stderr are the caller's rather
//! than log files, and there are no prepare or post-run steps.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::steps::SandboxDirs;
use super::{Layout, Node, Runtime, RuntimeError, base_env, bundle_targets};
use crate::session::Exec;
use crate::uids::UidLease;
use polar_ids::SessionId;
use polar_spec::runtime::RuntimeSpec;
use polar_tls::TrustFiles;

/// A command ready to run in a session, and the session's directories.
#[derive(Debug)]
pub struct Oneshot {
    /// What the agent execs.
    pub exec: Exec,
    /// The session's directories on the host (kept after the run).
    pub dirs: SandboxDirs,
    /// What must live until the command ended.
    pub guard: RunGuard,
}

/// What must outlive a one-shot command: the session's uid lease, and the
/// read end of bwrap's status pipe (closed early, bwrap would die of
/// `SIGPIPE` writing its status).
#[derive(Debug)]
pub struct RunGuard {
    _uid: UidLease,
    _status: Option<std::fs::File>,
}

/// Leases the session a uid from `node`'s range, makes its directories
/// under `state_dir`, on a disk quota of `disk_bytes` (release them with
/// [`SandboxDirs::release`] once the command ended), and the [`Exec`] that
/// runs `argv` in the native runtime there, with [`base_env`] (the trust
/// variables point at the files bound from `trust`; none are bound
/// without it). Blocks.
pub fn native(
    state_dir: &Path,
    disk_bytes: u64,
    node: &Node,
    trust: Option<&TrustFiles>,
    session: &SessionId,
    argv: &[OsString],
) -> Result<Oneshot, RuntimeError> {
    let spec = RuntimeSpec::default();
    let runtime = Runtime::native(&spec, node)?;
    let uid = node.uids.lease(session)?;
    let user = uid.user();
    let dirs = SandboxDirs::of(state_dir, session);
    dirs.create(user, Some(disk_bytes))?;
    let layout = Layout {
        workspace: dirs.workspace.clone(),
        home: dirs.home.clone(),
        tmp: dirs.tmp.clone(),
        workdir: spec.workdir.clone(),
        trust: trust.cloned(),
        bundle_targets: if trust.is_some() {
            bundle_targets(&runtime, &spec)
        } else {
            Vec::new()
        },
        mounts: Vec::new(),
        read_only: Vec::new(),
        staged: Vec::new(),
        identity: Some(dirs.identity.clone()),
        user,
    };
    let mut full_env = base_env(session, &spec, &[], None);
    if trust.is_none() {
        // Nothing is bound there: a client told to trust a missing file
        // would fail before it connects.
        let unbound = super::trust_in_sandbox().env();
        full_env.retain(|(k, _)| !unbound.iter().any(|(u, _)| u == k));
    }
    let argv: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cmd = runtime.command(&layout, &argv, &full_env)?;
    let mut exec = Exec::new(cmd.argv);
    exec.keep_fds = cmd.keep_fds;
    exec.no_new_privs = runtime.no_new_privs();
    exec.env = full_env;
    exec.clear_env = true;
    exec.user = Some(user);
    exec.cwd = Some(PathBuf::from("/"));
    Ok(Oneshot {
        exec,
        dirs,
        guard: RunGuard {
            _uid: uid,
            _status: cmd.status,
        },
    })
}
