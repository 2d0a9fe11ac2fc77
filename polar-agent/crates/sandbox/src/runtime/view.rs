//! What a native sandbox sees of the node's file system: an allowlist,
//! never the host's root with holes in it.
//!
//! - the system's programs and libraries: `/usr`, `/bin`, `/sbin`, `/lib`,
//!   `/lib32`, `/lib64`, `/libx32` (the ones the host has; merged-`/usr`
//!   links recreated as links), read-only;
//! - the directories the node's configuration adds (`sandbox.view_dirs`,
//!   e.g. `/opt`), read-only at the same path;
//! - a curated `/etc` ([`ETC`]): name resolution, the CA certificates, the
//!   dynamic loader's cache, the time zone, `alternatives`, `mime.types`,
//!   shells' start-up files; never the node's Polar configuration, `shadow`,
//!   SSH keys or anything else not listed; `passwd` and `group` are the
//!   session's own ([`passwd`], [`group`]), naming its sandbox user;
//! - an empty `/var` holding only `tmp` (a link to `/tmp`).
//!
//! A spec's `rootfs` (a directory the node's policy allows) is an image, not
//! the node's: its top-level entries are shown but for the kernel's and the
//! session's own ([`ROOTFS_SKIPPED`]), with its own `/etc`.
//!
//! Whatever else the sandbox gets (workspace, HOME, `/tmp`, the harness's
//! installation, the spec's mounts) comes from [`super::Layout::binds`].
//! The state directory, where sibling sessions' quota tmpfs are mounted
//! and unmounted, is in no bind source's tree unless a source contains it,
//! which [`View::check`] refuses: a sibling's mount can never be part of
//! a sandbox's bind set, so a sibling ending its session cannot break this
//! sandbox's start.

use std::path::{Path, PathBuf};

use super::{RootEntry, RuntimeError, io};

/// Top-level entries of the host's root every native sandbox gets.
pub const SYSTEM: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Entries of the host's `/etc` bound read-only (those the host has).
pub const ETC: [&str; 36] = [
    "hosts",
    "host.conf",
    "resolv.conf",
    "nsswitch.conf",
    "gai.conf",
    "networks",
    "protocols",
    "services",
    "rpc",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ssl/cert.pem",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/tls/cert.pem",
    "pki/tls/openssl.cnf",
    "pki/ca-trust",
    "crypto-policies",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "alternatives",
    "mime.types",
    "mailcap",
    "magic",
    "os-release",
    "lsb-release",
    "debian_version",
    "locale.alias",
    "bash.bashrc",
    "profile",
    "inputrc",
    "shells",
];

/// Top-level entries of a `rootfs` never shown: the kernel's (made fresh),
/// the session's own (bound from its directories), and the places a host
/// keeps people's and services' files.
pub const ROOTFS_SKIPPED: [&str; 11] = [
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

/// The read-only part of a native sandbox's file system.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Top-level entries shown read-only (directories bound, links
    /// recreated).
    pub root: Vec<RootEntry>,
    /// `(host path, path in the sandbox)` bound read-only under `/etc`
    /// (empty for a rootfs: its `/etc` is one of [`View::root`]).
    pub etc: Vec<(PathBuf, PathBuf)>,
    /// Host directories the node's configuration adds, at the same path.
    pub extra: Vec<PathBuf>,
}

/// The entry `name` of `root` as a [`RootEntry`], if it is there and (for
/// a link) resolves.
fn entry(root: &Path, name: &str) -> Result<Option<RootEntry>, RuntimeError> {
    let path = root.join(name);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("stat", &path)(e)),
    };
    let symlink = if meta.file_type().is_symlink() {
        Some(std::fs::read_link(&path).map_err(io("read link", &path))?)
    } else if meta.is_dir() || meta.is_file() {
        None
    } else {
        return Ok(None);
    };
    Ok(Some(RootEntry {
        name: name.to_owned(),
        source: path,
        symlink,
    }))
}

impl View {
    /// The host's view: [`SYSTEM`], the curated [`ETC`] and `extra` (the
    /// node's `sandbox.view_dirs`; one missing is an error: the operator
    /// named it). Reads the host's root and `/etc`; nothing is written.
    pub fn host(extra: &[PathBuf]) -> Result<Self, RuntimeError> {
        Self::of_root(Path::new("/"), extra)
    }

    /// [`View::host`] with `root` as the host's root (tests).
    pub fn of_root(root: &Path, extra: &[PathBuf]) -> Result<Self, RuntimeError> {
        let mut view = Self::default();
        for name in SYSTEM {
            view.root.extend(entry(root, name)?);
        }
        let etc = root.join("etc");
        for name in ETC {
            let source = etc.join(name);
            // Bound by what it resolves to: a link the host keeps in
            // `/etc` (resolv.conf into /run, localtime into the zone
            // database) shows its file; a dangling one is left out.
            if std::fs::metadata(&source).is_ok() {
                view.etc.push((source, Path::new("/etc").join(name)));
            }
        }
        for d in extra {
            if !std::fs::metadata(d).map_err(io("stat", d))?.is_dir() {
                return Err(io("show", d)(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a directory",
                )));
            }
            view.extra.push(d.clone());
        }
        Ok(view)
    }

    /// A rootfs's view: its top-level entries but [`ROOTFS_SKIPPED`], its
    /// own `/etc` among them.
    pub fn rootfs(root: &Path) -> Result<Self, RuntimeError> {
        let mut view = Self::default();
        for e in super::list_root(root)? {
            if !ROOTFS_SKIPPED.contains(&e.name.as_str()) {
                view.root.push(e);
            }
        }
        Ok(view)
    }

    /// Every host directory whose tree the sandbox is shown read-only.
    pub fn sources(&self) -> impl Iterator<Item = &Path> {
        self.root
            .iter()
            .filter(|e| e.symlink.is_none())
            .map(|e| e.source.as_path())
            .chain(self.etc.iter().map(|(s, _)| s.as_path()))
            .chain(self.extra.iter().map(PathBuf::as_path))
    }

    /// Refuses a view or layout that would show the sandbox more of the
    /// agent's state directory than its session's own directories and the
    /// trust files: a bind source holding `state_dir` (its CA key, every
    /// session's directories: a recursive bind would also copy the
    /// siblings' quota mounts, and a sibling unmounting one while bwrap
    /// copies them fails this sandbox's start), or one inside another
    /// session's directory. Pure.
    pub fn check(&self, layout: &super::Layout, state_dir: &Path) -> Result<(), RuntimeError> {
        let sandboxes = super::steps::sandboxes_dir(state_dir);
        let own = layout.workspace.parent().map(Path::to_path_buf);
        let binds = layout.binds();
        let sources = self
            .sources()
            .map(Path::to_path_buf)
            .chain(binds.iter().map(|b| b.source.clone()))
            .chain(layout.identity.clone());
        for s in sources {
            let why = if state_dir.starts_with(&s) {
                format!(
                    "it holds the agent's state directory {}",
                    state_dir.display()
                )
            } else if s.starts_with(&sandboxes)
                && !own
                    .as_deref()
                    .is_some_and(|o| o != sandboxes && s.starts_with(o))
            {
                "it is another session's directory".to_owned()
            } else {
                continue;
            };
            return Err(RuntimeError::View { path: s, why });
        }
        Ok(())
    }
}

/// The session's `/etc/passwd`: root, `nobody`, and `polar` (the sandbox
/// user, HOME [`super::native::HOME`]). Pure.
pub fn passwd((uid, gid): (u32, u32)) -> String {
    let mut s = String::from("root:x:0:0:root:/root:/bin/sh\n");
    if uid != 65534 {
        s.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    }
    s.push_str(&format!(
        "polar:x:{uid}:{gid}:polar:{}:/bin/sh\n",
        super::native::HOME
    ));
    s
}

/// The session's `/etc/group`: root, `nogroup`, and `polar`. Pure.
pub fn group((_, gid): (u32, u32)) -> String {
    let mut s = String::from("root:x:0:\n");
    if gid != 65534 {
        s.push_str("nogroup:x:65534:\n");
    }
    s.push_str(&format!("polar:x:{gid}:\n"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_view_is_the_allowlist_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        for d in [
            "usr/bin",
            "lib",
            "etc/ssl/certs",
            "etc/polar",
            "etc/ssh",
            "root",
            "home/u",
            "srv",
            "var/lib/polar",
            "opt/x",
        ] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        std::os::unix::fs::symlink("usr/bin", r.join("bin")).unwrap();
        for f in [
            "etc/hosts",
            "etc/shadow",
            "etc/polar/agent.toml",
            "etc/ld.so.cache",
        ] {
            std::fs::write(r.join(f), "x").unwrap();
        }
        std::os::unix::fs::symlink("/nowhere/resolv.conf", r.join("etc/resolv.conf")).unwrap();
        let v = View::of_root(r, &[r.join("opt")]).unwrap();
        let names: Vec<&str> = v.root.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["usr", "bin", "lib"]);
        assert_eq!(v.root[1].symlink.as_deref(), Some(Path::new("usr/bin")));
        let etc: Vec<&Path> = v.etc.iter().map(|(_, t)| t.as_path()).collect();
        assert_eq!(
            etc,
            [
                Path::new("/etc/hosts"),
                Path::new("/etc/ssl/certs"),
                Path::new("/etc/ld.so.cache")
            ]
        );
        assert_eq!(v.extra, [r.join("opt")]);
        assert!(View::of_root(r, &[r.join("missing")]).is_err());
        assert!(!ETC.iter().any(|e| e.contains("shadow")
            || e.contains("polar")
            || e.contains("ssh")
            || e.contains("sudo")));
    }

    #[test]
    fn a_rootfs_shows_its_own_entries_but_the_sessions_and_kernels() {
        let tmp = tempfile::tempdir().unwrap();
        for d in ["usr", "etc", "proc", "tmp", "home", "root", "opt"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        let v = View::rootfs(tmp.path()).unwrap();
        let names: Vec<&str> = v.root.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["etc", "opt", "usr"]);
        assert!(v.etc.is_empty());
    }

    fn layout(state: &str) -> super::super::Layout {
        let s = Path::new(state).join("sandboxes/s1");
        super::super::Layout {
            workspace: s.join("workspace"),
            home: s.join("home"),
            tmp: s.join("tmp"),
            workdir: "/workspace".into(),
            trust: Some(polar_tls::TrustFiles {
                bundle: Path::new(state).join("trust/bundle.pem"),
                ca: Path::new(state).join("trust/polar-ca.pem"),
            }),
            bundle_targets: vec!["/etc/ssl/certs/ca-certificates.crt".into()],
            mounts: vec![],
            read_only: vec!["/work/.polar-cache/harnesses/codex".into()],
            staged: vec![(s.join("ro-0"), "/opt/h".into())],
            identity: Some(s.join("etc")),
            user: (1_500_000_000, 1_500_000_000),
        }
    }

    #[test]
    fn nothing_of_the_state_directory_but_the_sessions_own_is_shown() {
        let state = Path::new("/var/lib/polar");
        let view = View {
            root: vec![RootEntry::dir("/", "usr")],
            etc: vec![],
            extra: vec![],
        };
        let ok = layout("/var/lib/polar");
        view.check(&ok, state).unwrap();
        // A spec mount of /var (a node policy allowing it) would carry the
        // state directory, and every sibling's quota mount, in.
        let mut bad = ok.clone();
        bad.mounts.push(polar_spec::runtime::Mount {
            source: "/var".into(),
            target: "/data".into(),
            read_only: true,
        });
        assert!(matches!(
            view.check(&bad, state),
            Err(RuntimeError::View { .. })
        ));
        // A sibling's directory as a source.
        let mut sib = ok.clone();
        sib.read_only.push(state.join("sandboxes/s2/workspace"));
        let e = view.check(&sib, state).unwrap_err();
        assert!(e.to_string().contains("another session"), "{e}");
        // The sessions' directory itself.
        let mut all = ok.clone();
        all.read_only.push(state.join("sandboxes"));
        assert!(view.check(&all, state).is_err());
        // A shown directory holding the state directory.
        let wide = View {
            extra: vec!["/var/lib".into()],
            ..view.clone()
        };
        assert!(wide.check(&ok, state).is_err());
        let opt = View {
            extra: vec!["/opt".into()],
            ..view.clone()
        };
        assert!(
            opt.check(&layout("/opt/polar"), Path::new("/opt/polar"))
                .is_err()
        );
        opt.check(&ok, state).unwrap();
    }

    #[test]
    fn passwd_and_group_name_the_sessions_user() {
        let p = passwd((200_017, 200_017));
        assert!(p.contains("polar:x:200017:200017:polar:/home/polar:/bin/sh\n"));
        assert!(p.starts_with("root:x:0:0:"));
        assert!(p.contains("nobody:x:65534:"));
        assert_eq!(passwd((65534, 65534)).matches("65534").count(), 2);
        let g = group((200_017, 200_017));
        assert!(g.contains("polar:x:200017:\n"));
        assert!(!p.contains("shadow"));
    }
}
