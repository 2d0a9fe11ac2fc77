//! The HOME and tmp of one evaluation: directories made fresh for it, which
//! the sandbox never saw, so that nothing the harness left in its HOME or
//! `/tmp` (an interpreter's start-up hook, a user site, a git or npm
//! configuration) reaches the evaluator's commands, also with `fresh =
//! true` (a fresh sandbox shares the session's directories).
//!
//! They are made by the agent (as root, beneath the session's directory:
//! nothing planted is followed) under the session's tmp directory, at
//! `.polar-eval-<random>/` (root's, mode 0711, so the sandbox user cannot
//! rename or replace it in the sticky tmp), with `home/` and `tmp/` owned by
//! the sandbox user; they count against the session's disk quota and go
//! with its directories. A name the sandbox took already is never reused.
//!
//! How a command sees them ([`EvalDirs::isolate`]): the native runtime
//! binds them at HOME and `/tmp` in place of the session's (each command is
//! a new bubblewrap); the container runtimes, whose binds were made when
//! the container started, get `HOME` and `TMPDIR` pointing at them through
//! the session's `/tmp`. Every command also gets
//! [`polar_evaluate::isolation::env`], whose `PYTHONPATH` is the
//! evaluation's Python directory: `python/` beside `home/` and `tmp/`,
//! root's and read-only to the sandbox user, holding only Polar's
//! `sitecustomize.py` (the workspace goes last on Python's path); the
//! native runtime binds it read-only at [`PYTHON_DIR`], containers see it
//! through the session's `/tmp`.
//!
//! The judge's base ([`polar_evaluate::base`]): the pack of the base's
//! snapshot that the record step wrote in its own tmp, before the harness
//! ran, is copied by [`keep_base`] to `polar-base/pack/` at the top of the
//! session's directory (root's, files read-only; on the session's quota,
//! in no bind: no sandbox sees it there). Each evaluation made after gets
//! it hard-linked into `base/pack/` beside its `python/` (root's, the same
//! read-only inodes) and named in `POLAR_DIFF_BASE_OBJECTS`: bound
//! read-only at [`BASE_DIR`] natively, through the session's `/tmp` in
//! containers.

use std::path::{Path, PathBuf};

use super::steps::SandboxDirs;
use super::{Layout, Runtime, RuntimeError, io, native};
use polar_evaluate::base::OBJECTS_VAR;
use polar_io::beneath::Dir;

/// Where the native runtime shows the evaluation's Python directory.
pub const PYTHON_DIR: &str = "/polar/eval-python";
/// Where the native runtime shows the evaluation's copy of the judge's
/// base objects.
pub const BASE_DIR: &str = "/polar/eval-base";
/// The node's copy of the judge's base pack, under the session's
/// directory (an object directory: `polar-base/pack/pack-<hash>.*`).
const KEPT_BASE: &str = "polar-base";
/// The most a kept pack may take (two files, each at most this).
const MAX_PACK_BYTES: u64 = 4 << 30;

/// How many names are tried before giving up (each is 64 random bits: a
/// name already there means the sandbox guessed it, or a bug).
const TRIES: usize = 4;

/// One evaluation's own HOME and tmp, on the host and in the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvalDirs {
    /// The host directory of HOME.
    pub home: PathBuf,
    /// The host directory of tmp.
    pub tmp: PathBuf,
    /// The host directory of the evaluation's `sitecustomize.py`.
    pub python: PathBuf,
    /// The host object directory holding the judge's base pack, when the
    /// session kept one ([`keep_base`]).
    pub base: Option<PathBuf>,
    /// Their parent as the sandbox sees it through the session's `/tmp`
    /// (`/tmp/.polar-eval-<random>`).
    pub in_sandbox: PathBuf,
}

impl EvalDirs {
    /// Makes them under `dirs`' tmp, HOME and tmp owned by `user`. Blocks.
    pub fn make(dirs: &SandboxDirs, user: (u32, u32)) -> Result<Self, RuntimeError> {
        let root = Dir::open_root(&dirs.root).map_err(io("open", &dirs.root))?;
        let tmp = root
            .open_dir(Path::new("tmp"))
            .map_err(io("open", &dirs.tmp))?;
        for _ in 0..TRIES {
            let name = format!(".polar-eval-{:016x}", rand::random::<u64>());
            let path = dirs.tmp.join(&name);
            match tmp.stat_at(name.as_ref()) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Ok(_) => {
                    tracing::warn!(session = %dirs.session, path = %path.display(), "an evaluation directory's name was taken in the sandbox's tmp; another is drawn");
                    continue;
                }
                Err(e) => return Err(io("stat", &path)(e)),
            }
            let mut replaced = Vec::new();
            let parent = tmp
                .make_dirs(Path::new(&name), (0, 0), &mut replaced)
                .map_err(io("create", &path))?;
            parent
                .set_mode_and_owner(0o711, (0, 0))
                .map_err(io("chmod", &path))?;
            // Made just now by root: nothing of the sandbox's is in it.
            for sub in ["home", "tmp"] {
                let d = parent
                    .make_dirs(Path::new(sub), (0, 0), &mut replaced)
                    .map_err(io("create", &path.join(sub)))?;
                d.set_mode_and_owner(0o700, user)
                    .map_err(io("chmod", &path.join(sub)))?;
            }
            let python = parent
                .make_dirs(Path::new("python"), (0, 0), &mut replaced)
                .map_err(io("create", &path.join("python")))?;
            python
                .set_mode_and_owner(0o755, (0, 0))
                .map_err(io("chmod", &path.join("python")))?;
            let site = Path::new(polar_evaluate::isolation::SITECUSTOMIZE_NAME);
            python
                .create_file(site.as_os_str(), 0o644, (0, 0), site, &mut replaced)
                .and_then(|mut f| {
                    std::io::Write::write_all(
                        &mut f,
                        polar_evaluate::isolation::SITECUSTOMIZE.as_bytes(),
                    )
                })
                .map_err(io("write", &path.join("python").join(site)))?;
            let base = link_base(&root, &parent, &mut replaced)
                .map_err(io("link", &path.join("base")))?
                .then(|| path.join("base"));
            if !replaced.is_empty() {
                return Err(io("create", &path)(std::io::Error::other(
                    "the sandbox planted entries in a new evaluation directory",
                )));
            }
            return Ok(Self {
                home: path.join("home"),
                tmp: path.join("tmp"),
                python: path.join("python"),
                base,
                in_sandbox: Path::new("/tmp").join(name),
            });
        }
        Err(io("create", &dirs.tmp)(std::io::Error::other(
            "every evaluation directory name drawn was taken",
        )))
    }

    /// The layout an evaluator command runs with on `runtime`, and the
    /// variables it gets on top of the runtime's (HOME and tmp as it sees
    /// them, [`polar_evaluate::isolation::env`]).
    pub fn isolate(&self, layout: &Layout, runtime: &Runtime) -> (Layout, Vec<(String, String)>) {
        match runtime {
            Runtime::Native { .. } => {
                let mut staged = layout.staged.clone();
                staged.push((self.python.clone(), PathBuf::from(PYTHON_DIR)));
                if let Some(base) = &self.base {
                    staged.push((base.clone(), PathBuf::from(BASE_DIR)));
                }
                let layout = Layout {
                    home: self.home.clone(),
                    tmp: self.tmp.clone(),
                    staged,
                    ..layout.clone()
                };
                let mut env = vec![
                    ("HOME".to_owned(), native::HOME.to_owned()),
                    ("TMPDIR".to_owned(), "/tmp".to_owned()),
                ];
                env.extend(polar_evaluate::isolation::env("/tmp", PYTHON_DIR));
                if self.base.is_some() {
                    env.push((OBJECTS_VAR.to_owned(), BASE_DIR.to_owned()));
                }
                (layout, env)
            }
            Runtime::Docker(_) | Runtime::Apptainer(_) => {
                let home = self.in_sandbox.join("home").display().to_string();
                let tmp = self.in_sandbox.join("tmp").display().to_string();
                let mut env = vec![
                    ("HOME".to_owned(), home),
                    ("TMPDIR".to_owned(), tmp.clone()),
                ];
                let python = self.in_sandbox.join("python").display().to_string();
                env.extend(polar_evaluate::isolation::env(&tmp, &python));
                if self.base.is_some() {
                    let base = self.in_sandbox.join("base").display().to_string();
                    env.push((OBJECTS_VAR.to_owned(), base));
                }
                (layout.clone(), env)
            }
        }
    }
}

fn bad(path: &Path, why: String) -> RuntimeError {
    io("keep", path)(std::io::Error::new(std::io::ErrorKind::InvalidData, why))
}

/// Links the session's kept base pack (if any) into the new evaluation
/// directory `eval` as `base/pack/`; whether there was one.
fn link_base(root: &Dir, eval: &Dir, replaced: &mut Vec<PathBuf>) -> std::io::Result<bool> {
    let kept = match root.open_dir(&Path::new(KEPT_BASE).join("pack")) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let pack = eval.make_dirs(Path::new("base/pack"), (0, 0), replaced)?;
    for name in kept.names()? {
        let at = Path::new("base/pack").join(&name);
        kept.link_into(&name, &pack, &name, &at, replaced)?;
    }
    Ok(true)
}

/// Keeps the judge's base pack that the record step `record` wrote (at
/// [`polar_evaluate::base::PACK_DIR`] in its tmp): copied, read beneath
/// the session's directory without following a symlink, to the session's
/// own `polar-base/pack/` (root's, files 0444), then removed from the
/// record's tmp. Only `pack-<hex>.pack`, its `.idx` and its `.rev` are
/// taken; anything else there, a missing index or a file over 4 GiB is an
/// error and nothing is kept (the judge then reads the workspace's store).
/// Blocks.
pub fn keep_base(dirs: &SandboxDirs, record: &EvalDirs) -> Result<(), RuntimeError> {
    let root = Dir::open_root(&dirs.root).map_err(io("open", &dirs.root))?;
    let record_tmp = record
        .tmp
        .strip_prefix(&dirs.root)
        .map_err(|_| bad(&record.tmp, "not in the session's directory".into()))?;
    let kept = copy_base(&root, dirs, record_tmp);
    if kept.is_err() {
        // Nothing half-copied stays for an evaluation to read.
        root.remove(KEPT_BASE.as_ref())
            .map_err(io("remove", &dirs.root.join(KEPT_BASE)))?;
    }
    let record_dir = polar_evaluate::base::RECORD_DIR;
    root.open_dir(record_tmp)
        .and_then(|tmp| tmp.remove(record_dir.as_ref()))
        .map_err(io("remove", &record.tmp.join(record_dir)))?;
    kept
}

fn copy_base(root: &Dir, dirs: &SandboxDirs, record_tmp: &Path) -> Result<(), RuntimeError> {
    let from_rel = record_tmp.join(polar_evaluate::base::PACK_DIR);
    let from_path = dirs.root.join(&from_rel);
    let from = root.open_dir(&from_rel).map_err(io("open", &from_path))?;
    let names: Vec<String> = from
        .names()
        .map_err(io("list", &from_path))?
        .into_iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    let unexpected = || bad(&from_path, format!("unexpected files {names:?}"));
    let stem = names
        .iter()
        .find_map(|n| n.strip_suffix(".pack"))
        .filter(|stem| {
            let hex = stem.strip_prefix("pack-").unwrap_or_default();
            matches!(hex.len(), 40 | 64) && hex.bytes().all(|b| b.is_ascii_hexdigit())
        })
        .ok_or_else(unexpected)?
        .to_owned();
    // The pack, its index and (newer git) its reverse index; nothing else.
    let files: Vec<String> = ["pack", "idx", "rev"]
        .iter()
        .map(|ext| format!("{stem}.{ext}"))
        .filter(|f| names.contains(f))
        .collect();
    if files.len() != names.len() || !names.contains(&format!("{stem}.idx")) {
        return Err(unexpected());
    }
    root.remove(KEPT_BASE.as_ref())
        .map_err(io("remove", &dirs.root.join(KEPT_BASE)))?;
    let mut replaced = Vec::new();
    let to_path = dirs.root.join(KEPT_BASE).join("pack");
    let to = root
        .make_dirs(&Path::new(KEPT_BASE).join("pack"), (0, 0), &mut replaced)
        .map_err(io("create", &to_path))?;
    for name in &files {
        let src = from_path.join(name);
        let mut f = from
            .open_file(name.as_ref())
            .map_err(io("open", &src))?
            .ok_or_else(|| bad(&src, "not a regular file".into()))?;
        let len = f.metadata().map_err(io("stat", &src))?.len();
        if len > MAX_PACK_BYTES {
            return Err(bad(&src, format!("{len} bytes, over {MAX_PACK_BYTES}")));
        }
        let dst = to_path.join(name);
        let mut out = to
            .create_file(name.as_ref(), 0o444, (0, 0), &dst, &mut replaced)
            .map_err(io("create", &dst))?;
        let copied = std::io::copy(&mut std::io::Read::take(&mut f, len), &mut out)
            .map_err(io("copy", &dst))?;
        if copied != len {
            return Err(bad(
                &src,
                format!("changed while copied ({copied} of {len} bytes)"),
            ));
        }
    }
    Ok(())
}

/// The runtime spec's own `PYTHONPATH`, if it sets one, after the
/// evaluation's Python directory in `env` (which would replace it): the
/// task's paths stay, after Polar's `sitecustomize.py`.
pub fn keep_spec_pythonpath(env: &mut [(String, String)], spec: &polar_spec::runtime::RuntimeSpec) {
    let Some(task) = spec.environment.get("PYTHONPATH").filter(|p| !p.is_empty()) else {
        return;
    };
    for (k, v) in env.iter_mut() {
        if k == "PYTHONPATH" {
            *v = format!("{v}:{task}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn dirs(state: &Path) -> SandboxDirs {
        let d = SandboxDirs::of(state, &"s-eval".parse().unwrap());
        d.create((65534, 65534), None).unwrap();
        d
    }

    /// The session's own layout, as a runtime starts it.
    fn session_layout(d: &SandboxDirs) -> Layout {
        Layout {
            workspace: d.workspace.clone(),
            home: d.home.clone(),
            tmp: d.tmp.clone(),
            workdir: PathBuf::from("/workspace"),
            trust: None,
            bundle_targets: Vec::new(),
            mounts: Vec::new(),
            read_only: Vec::new(),
            staged: Vec::new(),
            identity: None,
            user: (65534, 65534),
        }
    }

    fn native_runtime(state: &Path) -> Runtime {
        Runtime::Native {
            view: crate::runtime::view::View::default(),
            state_dir: state.to_owned(),
        }
    }

    /// A container runtime, whose binds were made when it started.
    fn container_runtime() -> Runtime {
        let spec = polar_spec::runtime::RuntimeSpec::default();
        Runtime::Apptainer(super::super::apptainer::Apptainer::new(
            &spec,
            &"s-eval".parse().unwrap(),
        ))
    }

    #[test]
    fn each_evaluation_gets_fresh_directories_apart_from_the_sessions() {
        let state = tempfile::tempdir().unwrap();
        let d = dirs(state.path());
        std::fs::write(d.home.join(".bashrc"), "planted").unwrap();
        let a = EvalDirs::make(&d, (65534, 65534)).unwrap();
        let b = EvalDirs::make(&d, (65534, 65534)).unwrap();
        assert_ne!(a, b);
        for e in [&a, &b] {
            assert!(e.home.starts_with(&d.tmp) && e.tmp.starts_with(&d.tmp));
            assert_eq!(std::fs::read_dir(&e.home).unwrap().count(), 0);
            let parent = std::fs::metadata(e.home.parent().unwrap()).unwrap();
            assert_eq!((parent.uid(), parent.mode() & 0o7777), (0, 0o711));
            for sub in [&e.home, &e.tmp] {
                let m = std::fs::metadata(sub).unwrap();
                assert_eq!((m.uid(), m.mode() & 0o7777), (65534, 0o700));
            }
            let name = e.home.parent().unwrap().file_name().unwrap();
            assert_eq!(e.in_sandbox, Path::new("/tmp").join(name));
            // The Python directory is root's, read-only to the sandbox.
            let m = std::fs::metadata(&e.python).unwrap();
            assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o755));
            let site = e.python.join(polar_evaluate::isolation::SITECUSTOMIZE_NAME);
            let m = std::fs::metadata(&site).unwrap();
            assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o644));
            assert_eq!(
                std::fs::read_to_string(&site).unwrap(),
                polar_evaluate::isolation::SITECUSTOMIZE
            );
        }
    }

    #[test]
    fn the_native_runtime_binds_them_and_containers_point_at_them() {
        let state = tempfile::tempdir().unwrap();
        let d = dirs(state.path());
        let e = EvalDirs::make(&d, (65534, 65534)).unwrap();
        let layout = session_layout(&d);
        let native = native_runtime(state.path());
        let (l, env) = e.isolate(&layout, &native);
        let binds = l.binds();
        let at = |target: &str| {
            binds
                .iter()
                .find(|b| b.target == Path::new(target))
                .map(|b| b.source.clone())
        };
        assert_eq!(at(native::HOME), Some(e.home.clone()));
        assert_eq!(at("/tmp"), Some(e.tmp.clone()));
        assert_eq!(at("/workspace"), Some(d.workspace.clone()));
        assert_eq!(at(PYTHON_DIR), Some(e.python.clone()));
        assert!(
            binds
                .iter()
                .any(|b| b.target == Path::new(PYTHON_DIR) && b.read_only)
        );
        let get = |env: &[(String, String)], k: &str| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        };
        assert_eq!(get(&env, "HOME").as_deref(), Some(native::HOME));
        assert_eq!(get(&env, "PYTHONNOUSERSITE").as_deref(), Some("1"));
        assert_eq!(get(&env, "PYTHONPATH").as_deref(), Some(PYTHON_DIR));
        // A spec's own PYTHONPATH follows the evaluation's directory.
        let mut with = env.clone();
        let mut spec = polar_spec::runtime::RuntimeSpec::default();
        keep_spec_pythonpath(&mut with, &spec);
        assert_eq!(with, env);
        spec.environment
            .insert("PYTHONPATH".into(), "/workspace/src".into());
        keep_spec_pythonpath(&mut with, &spec);
        assert_eq!(
            get(&with, "PYTHONPATH"),
            Some(format!("{PYTHON_DIR}:/workspace/src"))
        );
        assert_eq!(
            get(&env, "PYTHONPYCACHEPREFIX").as_deref(),
            Some("/tmp/.pycache")
        );

        // A container's binds were made at its start: its commands are
        // pointed at the directories through the session's /tmp.
        let container = container_runtime();
        let (l, env) = e.isolate(&layout, &container);
        assert_eq!(l, layout);
        let home = e.in_sandbox.join("home").display().to_string();
        let tmp = e.in_sandbox.join("tmp").display().to_string();
        assert!(home.starts_with("/tmp/.polar-eval-"), "{home}");
        assert_eq!(get(&env, "HOME"), Some(home));
        assert_eq!(get(&env, "TMPDIR"), Some(tmp.clone()));
        assert_eq!(
            get(&env, "PYTHONPATH"),
            Some(e.in_sandbox.join("python").display().to_string())
        );
        assert_eq!(
            get(&env, "PYTHONPYCACHEPREFIX"),
            Some(format!("{tmp}/.pycache"))
        );
    }

    /// A record step's directories holding `files` (name, contents) where
    /// the record script writes the base's pack.
    fn recorded(d: &SandboxDirs, files: &[(&str, &str)]) -> EvalDirs {
        let record = EvalDirs::make(d, (65534, 65534)).unwrap();
        let pack = record.tmp.join(polar_evaluate::base::PACK_DIR);
        std::fs::create_dir_all(&pack).unwrap();
        for (name, text) in files {
            std::fs::write(pack.join(name), text).unwrap();
        }
        record
    }

    #[test]
    fn the_base_pack_is_kept_out_of_reach_and_linked_read_only_into_each_evaluation() {
        let state = tempfile::tempdir().unwrap();
        let d = dirs(state.path());
        let stem = format!("pack-{}", "ab".repeat(20));
        let (pack, idx) = (format!("{stem}.pack"), format!("{stem}.idx"));
        let record = recorded(&d, &[(&pack, "PACK"), (&idx, "IDX")]);
        keep_base(&d, &record).unwrap();
        // Gone from the record's tmp, kept root's and read-only.
        assert!(!record.tmp.join(polar_evaluate::base::RECORD_DIR).exists());
        let kept = d.root.join(KEPT_BASE).join("pack");
        for (name, text) in [(&pack, "PACK"), (&idx, "IDX")] {
            let m = std::fs::symlink_metadata(kept.join(name)).unwrap();
            assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o444));
            assert_eq!(std::fs::read_to_string(kept.join(name)).unwrap(), text);
        }
        let e = EvalDirs::make(&d, (65534, 65534)).unwrap();
        let base = e.base.clone().expect("the evaluation gets the base");
        assert_eq!(base, e.home.parent().unwrap().join("base"));
        let m = std::fs::metadata(&base).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o755));
        for name in [&pack, &idx] {
            let (a, b) = (
                std::fs::metadata(kept.join(name)).unwrap(),
                std::fs::metadata(base.join("pack").join(name)).unwrap(),
            );
            assert_eq!(a.ino(), b.ino());
        }
        let native = native_runtime(state.path());
        let layout = session_layout(&d);
        let (l, env) = e.isolate(&layout, &native);
        assert!(
            l.binds()
                .iter()
                .any(|b| b.target == Path::new(BASE_DIR) && b.source == base && b.read_only)
        );
        assert!(env.contains(&(OBJECTS_VAR.to_owned(), BASE_DIR.to_owned())));
        let container = container_runtime();
        let (_, env) = e.isolate(&layout, &container);
        let seen = e.in_sandbox.join("base").display().to_string();
        assert!(env.contains(&(OBJECTS_VAR.to_owned(), seen)));
    }

    #[test]
    fn a_record_with_anything_but_one_pack_keeps_nothing() {
        let state = tempfile::tempdir().unwrap();
        let d = dirs(state.path());
        let stem = format!("pack-{}", "cd".repeat(20));
        let (pack, idx) = (format!("{stem}.pack"), format!("{stem}.idx"));
        for files in [
            vec![(pack.as_str(), "PACK")],
            vec![
                (pack.as_str(), "PACK"),
                (idx.as_str(), "IDX"),
                ("extra", "x"),
            ],
            vec![("pack-xyz.pack", "PACK"), ("pack-xyz.idx", "IDX")],
        ] {
            let record = recorded(&d, &files);
            assert!(keep_base(&d, &record).is_err(), "{files:?}");
            assert!(!d.root.join(KEPT_BASE).exists(), "{files:?}");
            assert_eq!(EvalDirs::make(&d, (65534, 65534)).unwrap().base, None);
        }
        // A symlink in place of the pack is not followed.
        let record = recorded(&d, &[(&idx, "IDX")]);
        let outside = state.path().join("outside");
        std::fs::write(&outside, "host").unwrap();
        std::os::unix::fs::symlink(
            &outside,
            record.tmp.join(polar_evaluate::base::PACK_DIR).join(&pack),
        )
        .unwrap();
        assert!(keep_base(&d, &record).is_err());
        assert!(!d.root.join(KEPT_BASE).exists());
    }
}
