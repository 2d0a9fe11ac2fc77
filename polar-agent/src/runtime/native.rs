//! The `native` runtime: bubblewrap (`bwrap`) on the host.
//!
//! The agent's child joins the session's network namespace and cgroups,
//! drops to the sandbox user (uid/gid 65534 by default) and execs `bwrap`,
//! which (through an unprivileged user namespace) builds the sandbox:
//!
//! - its own mount, PID, IPC, UTS and cgroup namespaces (`--unshare-user
//!   --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup`), never
//!   its own network namespace: it stays in the one the agent made, where
//!   the agent's listener and DNS live; `--die-with-parent`,
//!   `--new-session`;
//! - no user namespaces of its own (`--disable-userns`: the nested user
//!   namespace is the door to most kernel attack surface for an
//!   unprivileged process), and the seccomp filter of
//!   [`crate::sandbox::seccomp`] (`--add-seccomp-fd`, loaded by bwrap
//!   last, right before it execs the command); bwrap itself sets
//!   `no_new_privs`, and the agent's child sets it before exec too;
//! - a fresh root holding each top-level entry of the host's root (or of
//!   the spec's `rootfs`) read-only, except the ones in [`HIDDEN`], which
//!   are not there at all (`/run` is an empty read-only tmpfs; `/tmp` is
//!   the session's `tmp/`, on its disk quota);
//! - `/proc` of its own PID namespace, a minimal read-only `/dev` whose
//!   `/dev/shm` is the session's `tmp/` too, and an empty
//!   read-only `/sys` (the host's shows its devices, cgroups and kernel
//!   tunables; none of the harness CLIs needs it);
//! - the agent's state directory (CA key, other sessions' data) hidden
//!   under an empty read-only tmpfs;
//! - Polar's CA bundle bound read-only at [`TRUST_DIR`] and over the
//!   distribution bundle paths;
//! - the writable workspace at the spec's `workdir` (default
//!   `/workspace`) and the writable HOME at [`HOME`];
//! - the spec's mounts and the harness's read-only directories;
//! - the new root itself remounted read-only.
//!
//! The sandbox user owns nothing of the host: root-owned files it can see
//! are read-only to it, and files readable only by their owner are not
//! readable.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{Layout, RootEntry};

/// Top-level entries of the host root the sandbox never sees.
pub const HIDDEN: [&str; 11] = [
    "proc",
    "dev",
    "sys",
    "tmp",
    "run",
    "home",
    "root",
    "mnt",
    "media",
    "lost+found",
    "workspace",
];

/// Where the trust files appear in every sandbox.
pub const TRUST_DIR: &str = "/polar/trust";
/// The sandbox's HOME.
pub const HOME: &str = "/home/polar";

/// The bwrap program.
pub const BWRAP: &str = "bwrap";

fn os(s: impl Into<OsString>) -> OsString {
    s.into()
}

fn push(argv: &mut Vec<OsString>, items: &[&dyn AsRefOs]) {
    argv.extend(items.iter().map(|i| i.as_os()));
}

/// Things that become one bwrap argument.
trait AsRefOs {
    fn as_os(&self) -> OsString;
}

impl AsRefOs for &str {
    fn as_os(&self) -> OsString {
        OsString::from(*self)
    }
}

impl AsRefOs for &Path {
    fn as_os(&self) -> OsString {
        self.as_os_str().to_owned()
    }
}

impl AsRefOs for PathBuf {
    fn as_os(&self) -> OsString {
        self.as_os_str().to_owned()
    }
}

/// The bwrap command line that runs `argv` in the sandbox `layout`
/// describes. `root` lists the entries of the root to show (the host's or
/// the rootfs's, from [`super::list_root`]). bwrap runs as the sandbox
/// user, so every bind source's parent directories must let it pass
/// (`o+x`; [`super::steps::SandboxDirs::create`] sees to the state
/// directory). `seccomp_fds` are the descriptors bwrap reads the filter's
/// programs from (inherited by it; [`crate::sandbox::seccomp::memfds`]).
/// Pure: no file is touched.
pub fn bwrap_argv(
    layout: &Layout,
    root: &[RootEntry],
    seccomp_fds: &[i32],
    argv: &[String],
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec![os(BWRAP)];
    for flag in [
        "--unshare-user",
        "--disable-userns",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--die-with-parent",
        "--new-session",
    ] {
        a.push(os(flag));
    }
    for fd in seccomp_fds {
        a.push(os("--add-seccomp-fd"));
        a.push(os(fd.to_string()));
    }
    push(&mut a, &[&"--hostname", &"polar"]);
    for e in root {
        if HIDDEN.contains(&e.name.as_str()) {
            continue;
        }
        let dest = Path::new("/").join(&e.name);
        match &e.symlink {
            Some(target) => push(&mut a, &[&"--symlink", target, &dest]),
            None => push(&mut a, &[&"--ro-bind", &e.source, &dest]),
        }
    }
    push(
        &mut a,
        &[&"--proc", &"/proc", &"--dev", &"/dev", &"--dir", &"/sys"],
    );
    // Nothing writable outside the session's disk quota: `/tmp` is bound
    // from the session's `tmp/` with the workspace, and so is `/dev/shm`
    // (POSIX shared memory and semaphores are files there); bwrap's own
    // tmpfs mounts (`/dev`, `/run`, the hiding ones) are read-only.
    push(
        &mut a,
        &[
            &"--bind",
            &layout.tmp,
            &"/dev/shm",
            &"--remount-ro",
            &"/dev",
        ],
    );
    push(&mut a, &[&"--tmpfs", &"/run", &"--remount-ro", &"/run"]);
    // The hiding tmpfs mounts read-only at once: one below `/tmp` (a state
    // directory there) is covered by the `/tmp` bind next, and no bind is
    // ever made below one.
    for h in &layout.hide {
        push(&mut a, &[&"--tmpfs", h, &"--remount-ro", h]);
    }
    for b in layout.binds() {
        let flag = if b.read_only { "--ro-bind" } else { "--bind" };
        push(&mut a, &[&flag, &b.source, &b.target]);
    }
    // The new root itself (a tmpfs holding the mount points) read-only too.
    push(&mut a, &[&"--remount-ro", &"/"]);
    push(&mut a, &[&"--chdir", &layout.workdir]);
    a.push(os("--"));
    a.extend(argv.iter().map(OsString::from));
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::TrustFiles;
    use polar_spec::runtime::Mount;

    fn layout() -> Layout {
        Layout {
            workspace: "/state/sandboxes/s1/workspace".into(),
            home: "/state/sandboxes/s1/home".into(),
            tmp: "/state/sandboxes/s1/tmp".into(),
            workdir: "/workspace".into(),
            trust: Some(TrustFiles {
                bundle: "/state/trust/bundle.pem".into(),
                ca: "/state/trust/polar-ca.pem".into(),
            }),
            bundle_targets: vec!["/etc/ssl/certs/ca-certificates.crt".into()],
            hide: vec!["/state".into()],
            mounts: vec![Mount {
                source: "/data".into(),
                target: "/data".into(),
                read_only: false,
            }],
            read_only: vec!["/opt/harnesses".into()],
            staged: vec![],
            user: (65534, 65534),
        }
    }

    fn text(a: &[OsString]) -> String {
        a.iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn builds_the_sandbox_from_the_host_root() {
        let root = vec![
            RootEntry::dir("/", "usr"),
            RootEntry::dir("/", "etc"),
            RootEntry::dir("/", "tmp"),
            RootEntry::dir("/", "root"),
            RootEntry::dir("/", "sys"),
            RootEntry {
                name: "bin".into(),
                source: "/bin".into(),
                symlink: Some("usr/bin".into()),
            },
        ];
        let a = text(&bwrap_argv(
            &layout(),
            &root,
            &[7, 9],
            &["codex".into(), "exec".into()],
        ));
        assert!(
            a.starts_with(
                "bwrap --unshare-user --disable-userns --unshare-pid --unshare-ipc \
                 --unshare-uts --unshare-cgroup --die-with-parent --new-session \
                 --add-seccomp-fd 7 --add-seccomp-fd 9 "
            ),
            "{a}"
        );
        assert!(!a.contains("/sys /sys"), "{a}");
        assert!(a.contains("--proc /proc --dev /dev --dir /sys"), "{a}");
        assert!(!a.contains("--unshare-net"), "{a}");
        assert!(a.contains("--die-with-parent"));
        assert!(a.contains("--ro-bind /usr /usr --ro-bind /etc /etc --symlink usr/bin /bin"));
        assert!(!a.contains("/root"), "{a}");
        assert!(!a.contains("--ro-bind /tmp"), "{a}");
        assert!(a.contains(
            "--dev /dev --dir /sys --bind /state/sandboxes/s1/tmp /dev/shm --remount-ro /dev \
             --tmpfs /run --remount-ro /run --tmpfs /state --remount-ro /state"
        ));
        assert!(!a.contains("--tmpfs /tmp"), "{a}");
        assert!(
            a.contains(
                "--ro-bind /state/trust/bundle.pem /polar/trust/bundle.pem \
             --ro-bind /state/trust/polar-ca.pem /polar/trust/polar-ca.pem \
             --ro-bind /state/trust/bundle.pem /etc/ssl/certs/ca-certificates.crt \
             --bind /state/sandboxes/s1/workspace /workspace \
             --bind /state/sandboxes/s1/home /home/polar \
             --bind /state/sandboxes/s1/tmp /tmp --bind /data /data \
             --ro-bind /opt/harnesses /opt/harnesses"
            ),
            "{a}"
        );
        assert!(
            a.ends_with("--remount-ro / --chdir /workspace -- codex exec"),
            "{a}"
        );
        // The state dir is hidden before the trust files are bound back.
        let hide = a.find("--tmpfs /state").unwrap_or(usize::MAX);
        let trust = a.find("/polar/trust/bundle.pem").unwrap_or(0);
        assert!(hide < trust);
    }
}
