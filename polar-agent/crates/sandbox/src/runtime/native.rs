//! The `native` runtime: bubblewrap (`bwrap`) on the host.
//!
//! The agent's child joins the session's network namespace and cgroups,
//! drops to the session's sandbox user (its leased uid, gid the same:
//! [`crate::uids`]) and execs `bwrap`, which (through an
//! unprivileged user namespace) builds the sandbox:
//!
//! - its own mount, PID, IPC, UTS and cgroup namespaces (`--unshare-user
//!   --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup`), never
//!   its own network namespace: it stays in the one the agent made, where
//!   the agent's listener and DNS live; `--die-with-parent`,
//!   `--new-session`;
//! - no user namespaces of its own (`--disable-userns`: the nested user
//!   namespace is the door to most kernel attack surface for an
//!   unprivileged process), and the seccomp filter of
//!   [`crate::seccomp`] (`--add-seccomp-fd`, loaded by bwrap
//!   last, right before it execs the command); bwrap itself sets
//!   `no_new_privs`, and the agent's child sets it before exec too;
//! - a fresh, empty root holding only the allowlisted [`View`]: the
//!   system's directories read-only, a curated `/etc` with the session's
//!   own `passwd` and `group`, the node's `sandbox.view_dirs` (or the
//!   spec's `rootfs`), an empty `/var` with `/var/tmp` pointing at `/tmp`;
//!   `/run` is an empty read-only tmpfs; `/tmp` is the session's `tmp/`, on its disk
//!   quota;
//! - `/proc` of its own PID namespace, a minimal read-only `/dev` whose
//!   `/dev/shm` is the session's `tmp/` too, and an empty read-only `/sys`
//!   (the host's shows its devices, cgroups and kernel tunables; none of
//!   the harness CLIs needs it);
//! - nothing of the agent's state directory but the session's own
//!   directories and the trust files ([`View::check`] refuses a view or
//!   layout showing more);
//! - Polar's CA bundle bound read-only at [`TRUST_DIR`] and over the
//!   distribution bundle paths;
//! - the writable workspace at the spec's `workdir` (default
//!   `/workspace`) and the writable HOME at [`HOME`];
//! - the spec's mounts and the harness's read-only directories;
//! - the new root itself remounted read-only.
//!
//! bwrap reports on a status pipe (`--json-status-fd`) the command's exit
//! once it has been started; a bwrap that exits without that report never
//! started the command ([`started`]): a start failure, the node's fault.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::Layout;
use super::view::View;

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

impl AsRefOs for String {
    fn as_os(&self) -> OsString {
        OsString::from(self)
    }
}

/// The bwrap command line that runs `argv` in the sandbox `layout`
/// describes, showing `view` of the node's file system. bwrap runs as the
/// sandbox user, so every bind source's parent directories must let it
/// pass (`o+x`; [`super::steps::SandboxDirs::create`] sees to the state
/// directory). `seccomp_fds` are the descriptors bwrap reads the filter's
/// programs from (inherited by it; [`crate::seccomp::memfds`]);
/// `status_fd` the write end of its status pipe ([`status_pipe`]).
/// Pure: no file is touched.
pub fn bwrap_argv(
    layout: &Layout,
    view: &View,
    seccomp_fds: &[i32],
    status_fd: i32,
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
    push(
        &mut a,
        &[
            &"--json-status-fd",
            &status_fd.to_string(),
            &"--hostname",
            &"polar",
        ],
    );
    for e in &view.root {
        let dest = Path::new("/").join(&e.name);
        match &e.symlink {
            Some(target) => push(&mut a, &[&"--symlink", target, &dest]),
            None => push(&mut a, &[&"--ro-bind", &e.source, &dest]),
        }
    }
    for (source, target) in &view.etc {
        push(&mut a, &[&"--ro-bind", source, target]);
    }
    if let Some(dir) = &layout.identity {
        for name in ["passwd", "group"] {
            let target = Path::new("/etc").join(name);
            push(&mut a, &[&"--ro-bind", &dir.join(name), &target]);
        }
    }
    for d in &view.extra {
        push(&mut a, &[&"--ro-bind", d, d]);
    }
    push(
        &mut a,
        &[&"--proc", &"/proc", &"--dev", &"/dev", &"--dir", &"/sys"],
    );
    // Nothing writable outside the session's disk quota: `/tmp` is bound
    // from the session's `tmp/` with the workspace, and so is `/dev/shm`
    // (POSIX shared memory and semaphores are files there); bwrap's own
    // tmpfs mounts (`/dev`, `/run`) are read-only.
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
    if !view.root.iter().any(|e| e.name == "var") {
        push(
            &mut a,
            &[&"--dir", &"/var", &"--symlink", &"../tmp", &"/var/tmp"],
        );
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

/// bwrap's status pipe: `(read end, write end)`, both close-on-exec (the
/// write end is handed to bwrap alone, through the exec's kept
/// descriptors; bwrap does not pass it to the command).
pub fn status_pipe() -> std::io::Result<(std::fs::File, OwnedFd)> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    // Only the agent's end is non-blocking: bwrap writes whole lines.
    fcntl(&r, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(std::io::Error::from)?;
    Ok((std::fs::File::from(r), w))
}

/// Whether bwrap started the command, from what it wrote on its status
/// pipe once it exited: `{ "exit-code": N }` comes only after the command
/// was exec'd. Pure.
pub fn started(status: &str) -> bool {
    status.lines().any(|l| {
        serde_json::from_str::<serde_json::Value>(l)
            .ok()
            .is_some_and(|v| v.get("exit-code").is_some_and(serde_json::Value::is_i64))
    })
}

/// Reads what bwrap wrote on its status pipe (the read end of
/// [`status_pipe`]), once it exited: non-blocking, at most 64 KiB.
pub fn read_status(pipe: &mut std::fs::File) -> String {
    use std::io::Read as _;
    let mut buf = Vec::new();
    let mut chunk = [0_u8; 4096];
    while buf.len() < 64 << 10 {
        match pipe.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RootEntry;
    use polar_spec::runtime::Mount;
    use polar_tls::TrustFiles;

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
            mounts: vec![Mount {
                source: "/data".into(),
                target: "/data".into(),
                read_only: false,
            }],
            read_only: vec!["/opt/harnesses".into()],
            staged: vec![],
            identity: Some("/state/sandboxes/s1/etc".into()),
            user: (1_500_000_007, 1_500_000_007),
        }
    }

    fn view() -> View {
        View {
            root: vec![
                RootEntry::dir("/", "usr"),
                RootEntry {
                    name: "bin".into(),
                    source: "/bin".into(),
                    symlink: Some("usr/bin".into()),
                },
            ],
            etc: vec![
                ("/etc/hosts".into(), "/etc/hosts".into()),
                ("/etc/ssl/certs".into(), "/etc/ssl/certs".into()),
            ],
            extra: vec![],
        }
    }

    fn text(a: &[OsString]) -> String {
        a.iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn builds_the_sandbox_from_the_allowlisted_view() {
        let a = text(&bwrap_argv(
            &layout(),
            &view(),
            &[7, 9],
            11,
            &["codex".into(), "exec".into()],
        ));
        assert!(
            a.starts_with(
                "bwrap --unshare-user --disable-userns --unshare-pid --unshare-ipc \
                 --unshare-uts --unshare-cgroup --die-with-parent --new-session \
                 --add-seccomp-fd 7 --add-seccomp-fd 9 --json-status-fd 11 "
            ),
            "{a}"
        );
        assert!(a.contains("--proc /proc --dev /dev --dir /sys"), "{a}");
        assert!(!a.contains("--unshare-net"), "{a}");
        assert!(a.contains("--die-with-parent"));
        assert!(
            a.contains(
                "--ro-bind /usr /usr --symlink usr/bin /bin \
                 --ro-bind /etc/hosts /etc/hosts --ro-bind /etc/ssl/certs /etc/ssl/certs \
                 --ro-bind /state/sandboxes/s1/etc/passwd /etc/passwd \
                 --ro-bind /state/sandboxes/s1/etc/group /etc/group"
            ),
            "{a}"
        );
        // Nothing of the host's root but the view: no /etc as a whole, no
        // /root, /home, /var/lib, /srv, no state directory.
        for absent in [
            "--ro-bind /etc /etc",
            "/root",
            "/srv",
            "/var/lib",
            "--tmpfs /state",
            "--ro-bind / ",
        ] {
            assert!(!a.contains(absent), "{absent} in {a}");
        }
        assert!(
            a.contains(
                "--dev /dev --dir /sys --bind /state/sandboxes/s1/tmp /dev/shm --remount-ro /dev \
                 --tmpfs /run --remount-ro /run --dir /var --symlink ../tmp /var/tmp"
            ),
            "{a}"
        );
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
        // The curated /etc comes before the trust bundle bound over it.
        let etc = a
            .find("/etc/ssl/certs /etc/ssl/certs")
            .unwrap_or(usize::MAX);
        let bundle = a.find("/etc/ssl/certs/ca-certificates.crt").unwrap_or(0);
        assert!(etc < bundle);
    }

    #[test]
    fn a_rootfs_keeps_its_own_var_and_etc() {
        let v = View {
            root: vec![
                RootEntry::dir("/srv/rootfs", "etc"),
                RootEntry::dir("/srv/rootfs", "var"),
            ],
            etc: vec![],
            extra: vec![],
        };
        let a = text(&bwrap_argv(&layout(), &v, &[], 3, &["true".into()]));
        assert!(a.contains("--ro-bind /srv/rootfs/etc /etc --ro-bind /srv/rootfs/var /var"));
        assert!(!a.contains("--dir /var"), "{a}");
    }

    #[test]
    fn a_command_is_started_only_when_bwrap_reported_its_exit() {
        assert!(started(
            "{ \"child-pid\": 5, \"mnt-namespace\": 4 }\n{ \"exit-code\": 3 }\n"
        ));
        assert!(!started("{ \"child-pid\": 5, \"mnt-namespace\": 4 }\n"));
        assert!(!started(""));
        assert!(!started("exit-code\n{\"exit-code\": \"0\"}"));
    }

    #[test]
    fn the_status_pipe_reads_what_was_written_without_blocking() {
        use std::io::Write as _;
        let (mut r, w) = status_pipe().unwrap();
        assert_eq!(read_status(&mut r), "");
        let mut w = std::fs::File::from(w);
        w.write_all(b"{ \"exit-code\": 0 }\n").unwrap();
        drop(w);
        assert!(started(&read_status(&mut r)));
    }
}
