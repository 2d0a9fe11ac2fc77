//! The Python presets' virtual environments (mini-swe-agent, Aider,
//! OpenHands, Hermes; `.polar-cache/venvs/<venv>`, made by `cargo xtask
//! harnesses`): the installed version, read from the distribution's
//! metadata by the environment's own interpreter, and the Python
//! installation the environment was made from, which the sandbox must see
//! read-only beside it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::HarnessError;

/// `DIST VERSION` as the interpreter beside `binary` (its environment's
/// `bin/python`) reads it from the distribution's metadata: a check that
/// neither starts the harness nor writes anything (mini-swe-agent has no
/// `--version`, and its `--help` makes its configuration directory).
pub fn installed_version(
    binary: &Path,
    dist: &str,
    timeout: Duration,
) -> Result<String, HarnessError> {
    // The environment's interpreter: beside the binary as found (which may
    // itself be the environment's `bin/python`, a link out of it), else
    // beside the file it links to.
    let real = std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_owned());
    let in_venv = |p: &Path| {
        p.parent()
            .and_then(Path::parent)
            .is_some_and(|v| v.join("pyvenv.cfg").is_file())
    };
    let script = [binary, real.as_path()]
        .into_iter()
        .find(|p| in_venv(p))
        .unwrap_or(real.as_path());
    let python = script.with_file_name("python");
    if !python.is_file() {
        return Err(HarnessError::Broken {
            binary: binary.to_owned(),
            why: format!(
                "no Python interpreter beside it ({}): not a virtual environment's script",
                python.display()
            ),
        });
    }
    let code = format!("import importlib.metadata as m; print({dist:?}, m.version({dist:?}))");
    super::first_line_of(&python, &["-c".to_owned(), code], timeout)
}

/// The prefix of the Python installation the virtual environment `venv`
/// was made from (the parent of `home` in its `pyvenv.cfg`), which its
/// `bin/python` links into and the sandbox must see too; `None` for the
/// system's own (`/usr`, `/usr/local`: always visible, and never to be
/// bound into a container's root).
pub fn python_prefix(venv: &Path) -> Option<PathBuf> {
    let cfg = std::fs::read_to_string(venv.join("pyvenv.cfg")).ok()?;
    let home = cfg.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "home").then(|| PathBuf::from(v.trim()))
    })?;
    let prefix = std::fs::canonicalize(home.parent()?).ok()?;
    let system = ["/", "/usr", "/usr/local"].map(Path::new);
    (!system.contains(&prefix.as_path())).then_some(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_venv_needs_its_python_installation_unless_it_is_the_systems() {
        let tmp = tempfile::tempdir().unwrap();
        let prefix = tmp.path().join("py/3.11");
        std::fs::create_dir_all(prefix.join("bin")).unwrap();
        let venv = tmp.path().join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        let cfg = |home: &Path| format!("home = {}\nversion = 3.11.7\n", home.display());
        std::fs::write(venv.join("pyvenv.cfg"), cfg(&prefix.join("bin"))).unwrap();
        assert_eq!(python_prefix(&venv), Some(prefix.canonicalize().unwrap()));
        std::fs::write(venv.join("pyvenv.cfg"), cfg(Path::new("/usr/bin"))).unwrap();
        assert_eq!(python_prefix(&venv), None);
        // The whole environment and that installation are read-only in
        // the sandbox, found through the script or a link to it.
        std::fs::write(venv.join("pyvenv.cfg"), cfg(&prefix.join("bin"))).unwrap();
        let script = venv.join("bin/mini");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let elsewhere = tmp.path().join("path");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&script, elsewhere.join("mini")).unwrap();
        let venv = venv.canonicalize().unwrap();
        let i = crate::install_at(script, "x".into());
        assert_eq!(
            i.read_only,
            vec![prefix.canonicalize().unwrap(), venv.clone()]
        );
        let i = crate::install_at(elsewhere.join("mini"), "x".into());
        assert!(i.read_only.contains(&venv), "{:?}", i.read_only);
        // No interpreter beside it: not an environment's script.
        let e = installed_version(&elsewhere.join("mini"), "x", Duration::from_secs(5));
        assert!(e.unwrap_err().to_string().contains("no Python interpreter"));
    }
}
