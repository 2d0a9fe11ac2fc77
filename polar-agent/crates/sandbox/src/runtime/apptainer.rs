//! The `apptainer` runtime: command lines for rootless Apptainer instances.
//!
//! `apptainer instance start` is exec'd by the agent's child after it joined
//! the session's network namespace and cgroups and dropped to the sandbox
//! user, so the instance (which shares its caller's network namespace: no
//! `--net`) lives in the session's namespace, under its cgroup, without
//! privileges. It runs with `--containall` (own PID and IPC namespaces,
//! clean environment, no host HOME), `--no-privs` (no capabilities, as the
//! docker runtime's `--cap-drop ALL`; the agent's child set `no_new_privs`
//! is not possible here, apptainer's starter may need its setuid helper),
//! a writable overlay directory
//! (`--overlay`, the container's changes kept per session), the workspace,
//! HOME and trust files bound, each as one `--bind S:T[:ro]` argument
//! built by [`super::Bind::apptainer_bind`], which refuses a path holding
//! `:` or `,` (apptainer's separators). Each command runs with `apptainer
//! exec --cleanenv` and the session's environment as `--env`.

use std::ffi::OsString;
use std::path::Path;

use super::{Layout, RuntimeError};
use polar_ids::SessionId;
use polar_spec::runtime::RuntimeSpec;

/// The apptainer program.
pub const APPTAINER: &str = "apptainer";

/// An apptainer runtime for one session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Apptainer {
    /// The image (`.sif`, a sandbox directory, or a `docker://` URI).
    pub image: String,
    /// The instance name, `polar-<session>`.
    pub name: String,
}

impl Apptainer {
    /// The runtime for `spec`.
    pub fn new(spec: &RuntimeSpec, session: &SessionId) -> Self {
        Self {
            image: spec.image.clone().unwrap_or_default(),
            name: format!("polar-{session}"),
        }
    }

    /// `apptainer instance start`; `overlay` is a writable directory. A
    /// bind apptainer could not read as written is an error.
    pub fn start_argv(
        &self,
        layout: &Layout,
        overlay: &Path,
    ) -> Result<Vec<OsString>, RuntimeError> {
        let mut a: Vec<OsString> = [
            APPTAINER,
            "instance",
            "start",
            "--containall",
            "--no-home",
            "--no-privs",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        a.push("--overlay".into());
        a.push(overlay.into());
        for b in layout.binds() {
            a.push("--bind".into());
            a.push(b.apptainer_bind()?);
        }
        if self.image.starts_with('-') {
            return Err(RuntimeError::Command {
                what: "apptainer instance start".into(),
                detail: format!("the image {:?} starts with '-'", self.image),
            });
        }
        a.push(self.image.clone().into());
        a.push(self.name.clone().into());
        Ok(a)
    }

    /// `apptainer exec` in the instance, with exactly `env`.
    pub fn exec_argv(
        &self,
        layout: &Layout,
        argv: &[String],
        env: &[(String, String)],
    ) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![APPTAINER.into(), "exec".into(), "--cleanenv".into()];
        a.push("--pwd".into());
        a.push(layout.workdir.clone().into());
        for (k, v) in env {
            a.push("--env".into());
            a.push(format!("{k}={v}").into());
        }
        a.push(format!("instance://{}", self.name).into());
        a.extend(argv.iter().map(OsString::from));
        a
    }

    /// `apptainer instance stop`.
    pub fn stop_argv(&self) -> Vec<OsString> {
        [APPTAINER, "instance", "stop", &self.name]
            .iter()
            .map(OsString::from)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_tls::TrustFiles;

    fn layout() -> Layout {
        Layout {
            workspace: "/s/ws".into(),
            home: "/s/home".into(),
            tmp: "/s/tmp".into(),
            workdir: "/workspace".into(),
            trust: Some(TrustFiles {
                bundle: "/st/trust/bundle.pem".into(),
                ca: "/st/trust/polar-ca.pem".into(),
            }),
            bundle_targets: vec![],
            mounts: vec![],
            read_only: vec!["/opt/h".into()],
            staged: vec![],
            identity: None,
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
    fn instance_start_exec_stop() {
        let spec = RuntimeSpec::parse("kind = \"apptainer\"\nimage = \"/img/py.sif\"", false, "t")
            .unwrap();
        let ap = Apptainer::new(&spec, &"s-1".parse().unwrap());
        let a = text(&ap.start_argv(&layout(), Path::new("/s/overlay")).unwrap());
        assert!(
            a.starts_with(
                "apptainer instance start --containall --no-home --no-privs --overlay /s/overlay"
            ),
            "{a}"
        );
        assert!(!a.contains("--net"), "{a}");
        assert!(a.contains("--bind /s/ws:/workspace --bind /s/home:/home/polar"));
        assert!(a.contains("--bind /st/trust/polar-ca.pem:/polar/trust/polar-ca.pem:ro"));
        assert!(a.contains("--bind /opt/h:/opt/h:ro"));
        assert!(a.ends_with("/img/py.sif polar-s-1"), "{a}");
        let e = text(&ap.exec_argv(&layout(), &["true".into()], &[("A".into(), "1".into())]));
        assert_eq!(
            e,
            "apptainer exec --cleanenv --pwd /workspace --env A=1 instance://polar-s-1 true"
        );
        assert_eq!(text(&ap.stop_argv()), "apptainer instance stop polar-s-1");
    }

    #[test]
    fn hostile_paths_never_make_an_ambiguous_bind() {
        let spec = RuntimeSpec::parse("kind = \"apptainer\"\nimage = \"/img/py.sif\"", false, "t")
            .unwrap();
        let ap = Apptainer::new(&spec, &"s-1".parse().unwrap());
        let overlay = Path::new("/s/overlay");
        for bad in ["/d:/etc", "/d,/etc:/x", "/d\nx", "/d:ro", "/d "] {
            for (src, dst) in [(bad, "/t"), ("/d", bad)] {
                let mut l = layout();
                l.mounts = vec![polar_spec::runtime::Mount {
                    source: src.into(),
                    target: dst.into(),
                    read_only: true,
                }];
                let e = ap.start_argv(&l, overlay).unwrap_err().to_string();
                assert!(e.contains("cannot mount"), "{src:?} {dst:?}: {e}");
            }
            let mut l = layout();
            l.home = bad.into();
            assert!(ap.start_argv(&l, overlay).is_err(), "{bad:?}");
        }
        // `=` and a leading `-` in a component are literal: one argument.
        let mut l = layout();
        l.mounts = vec![polar_spec::runtime::Mount {
            source: "/d=x/-y".into(),
            target: "/-t".into(),
            read_only: false,
        }];
        let a = ap.start_argv(&l, overlay).unwrap();
        let i = a.iter().position(|s| s == "/d=x/-y:/-t").unwrap();
        assert_eq!(a[i - 1], "--bind");
    }
}
