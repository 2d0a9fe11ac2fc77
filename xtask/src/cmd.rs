//! Running external programs for the xtask commands.
//!
//! Every command runs from the workspace root with `~/.cargo/bin` on `PATH`
//! (so tools that `cargo install` just put there are found), and every
//! failure names the exact command line and how it ended.

use std::{
    env,
    ffi::{OsStr, OsString},
    io::Read,
    os::unix::fs::MetadataExt as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

/// The workspace root: the directory above this crate.
pub fn workspace_root() -> Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("xtask's manifest directory has no parent"))
}

/// Whether this process runs with effective user id 0.
///
/// `/proc/self` belongs to the effective user of the process reading it.
pub fn is_root() -> Result<bool> {
    let meta = std::fs::metadata("/proc/self").context("cannot read /proc/self")?;
    Ok(meta.uid() == 0)
}

/// The `bin` directory `cargo install` writes to.
pub fn cargo_bin_dir() -> Option<PathBuf> {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
        .map(|home| home.join("bin"))
}

/// `PATH` for child processes: ours, with cargo's `bin` directory in front if
/// it is not there yet.
fn child_path() -> OsString {
    let current = env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = env::split_paths(&current).collect();
    if let Some(bin) = cargo_bin_dir()
        && !dirs.contains(&bin)
    {
        dirs.insert(0, bin);
    }
    env::join_paths(dirs).unwrap_or(current)
}

/// Whether `key` is one of the variables `cargo run` (or rustup's proxy in
/// front of it) sets for the program it runs, which a cargo started from a
/// shell does not have: `CARGO`, the package's and the target's
/// (`CARGO_PKG_*`, `CARGO_MANIFEST_*`, `CARGO_CRATE_NAME`, ...), the
/// toolchain's and the library path. The user's own settings
/// (`CARGO_HOME`, `CARGO_TARGET_DIR`, `CARGO_PROFILE_*`, ...) stay.
fn set_by_cargo_run(key: &str) -> bool {
    matches!(
        key,
        "CARGO"
            | "CARGO_CRATE_NAME"
            | "CARGO_BIN_NAME"
            | "CARGO_PRIMARY_PACKAGE"
            | "CARGO_RUSTC_CURRENT_DIR"
            | "RUSTUP_TOOLCHAIN"
            | "RUSTC"
            | "RUSTDOC"
            | "LD_LIBRARY_PATH"
    ) || key.starts_with("CARGO_PKG_")
        || key.starts_with("CARGO_MANIFEST_")
}

/// What a finished command printed, and how it ended.
pub struct Captured {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A command to run from the workspace root.
pub struct Cmd {
    inner: Command,
    shown: String,
}

impl Cmd {
    pub fn new(program: impl AsRef<OsStr>) -> Result<Self> {
        let program = program.as_ref();
        let mut inner = Command::new(program);
        inner
            .current_dir(workspace_root()?)
            .env("PATH", child_path());
        Ok(Self {
            inner,
            shown: quote(program),
        })
    }

    /// `cargo`, with the environment a shell would give it: without the
    /// variables `cargo run` set for xtask ([`set_by_cargo_run`]). Build
    /// scripts such as ring's ask to rerun when `CARGO_PKG_NAME` or
    /// `CARGO_MANIFEST_DIR` change, and cargo reads them from its own
    /// environment: left in, they made every build xtask started and every
    /// build from a shell rebuild ring, rustls and the agent for each other.
    pub fn cargo() -> Result<Self> {
        let mut cmd = Self::new("cargo")?;
        for (key, _) in env::vars_os() {
            if let Some(key) = key.to_str()
                && set_by_cargo_run(key)
            {
                cmd.inner.env_remove(key);
            }
        }
        Ok(cmd)
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.shown.push(' ');
        self.shown.push_str(&quote(arg.as_ref()));
        self.inner.arg(arg);
        self
    }

    pub fn args<I, S>(self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        args.into_iter().fold(self, Self::arg)
    }

    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.inner.env(key, value);
        self
    }

    /// Runs the command in a process group of its own, whose id is its
    /// pid, so that it can be stopped with everything it started.
    pub fn own_process_group(mut self) -> Self {
        self.inner.process_group(0);
        self
    }

    /// The command line as it could be typed into a shell.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Runs the command with our terminal; fails unless it exits with 0.
    pub fn run(mut self) -> Result<()> {
        let status = self
            .inner
            .status()
            .with_context(|| format!("could not start `{}`", self.shown))?;
        if !status.success() {
            bail!("`{}` failed ({status})", self.shown);
        }
        Ok(())
    }

    /// Runs the command quietly and returns its standard output if it
    /// started and exited with 0; `None` otherwise. For checks such as
    /// "is this tool installed?".
    pub fn probe(mut self) -> Option<String> {
        let output = self.inner.stdin(Stdio::null()).output().ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Starts the command in the background with its standard input closed,
    /// its standard output discarded and its standard error written to
    /// `log`; the caller waits for it (or stops it).
    pub fn spawn(mut self, log: &Path) -> Result<Child> {
        let file = std::fs::File::create(log)
            .with_context(|| format!("could not create {}", log.display()))?;
        self.inner
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .with_context(|| format!("could not start `{}`", self.shown))
    }

    /// Runs the command with its output captured, stopping it if it has not
    /// finished after `timeout`. Its exit status is returned, not judged.
    pub fn capture(mut self, timeout: Duration) -> Result<Captured> {
        let mut child = self
            .inner
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start `{}`", self.shown))?;
        // Both pipes are drained at once so a chatty child never blocks.
        let stdout = child
            .stdout
            .take()
            .map(|pipe| thread::spawn(|| drain(pipe)));
        let stderr = child
            .stderr
            .take()
            .map(|pipe| thread::spawn(|| drain(pipe)));
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                // Best effort: the error below is what matters.
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "`{}` did not finish within {} s and was stopped",
                    self.shown,
                    timeout.as_secs()
                );
            }
            thread::sleep(Duration::from_millis(100));
        };
        let join = |reader: Option<thread::JoinHandle<String>>| {
            reader
                .map(|r| r.join().unwrap_or_default())
                .unwrap_or_default()
        };
        Ok(Captured {
            status,
            stdout: join(stdout),
            stderr: join(stderr),
        })
    }
}

/// Reads a pipe to its end; bytes that are not UTF-8 are replaced.
fn drain(mut pipe: impl Read) -> String {
    let mut bytes = Vec::new();
    // A read error ends the capture early; what was read is still shown.
    let _ = pipe.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Quotes a word for display if a shell would otherwise split or expand it.
fn quote(word: &OsStr) -> String {
    let word = word.to_string_lossy();
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.into_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_children_see_a_shell_s_environment() {
        for key in [
            "CARGO",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_CRATE_NAME",
            "RUSTUP_TOOLCHAIN",
        ] {
            assert!(set_by_cargo_run(key), "{key}");
        }
        for key in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_PROFILE_RELEASE_LTO",
            "PATH",
        ] {
            assert!(!set_by_cargo_run(key), "{key}");
        }
    }

    #[test]
    fn quotes_only_what_a_shell_would_change() {
        assert_eq!(quote(OsStr::new("--release")), "--release");
        assert_eq!(quote(OsStr::new("~0.13")), "'~0.13'");
        assert_eq!(quote(OsStr::new("${Status}")), "'${Status}'");
        assert_eq!(quote(OsStr::new("it's")), r"'it'\''s'");
        assert_eq!(quote(OsStr::new("")), "''");
    }

    #[test]
    fn captures_both_streams_and_the_status() -> Result<()> {
        let run = Cmd::new("sh")?
            .args(["-c", "echo out; echo err >&2; exit 3"])
            .capture(Duration::from_secs(30))?;
        assert_eq!(run.status.code(), Some(3));
        assert_eq!(run.stdout, "out\n");
        assert_eq!(run.stderr, "err\n");
        Ok(())
    }

    #[test]
    fn stops_a_command_that_overruns() -> Result<()> {
        let started = Instant::now();
        let run = Cmd::new("sleep")?
            .arg("30")
            .capture(Duration::from_millis(200));
        assert!(run.is_err());
        assert!(started.elapsed() < Duration::from_secs(10));
        Ok(())
    }

    #[test]
    fn shows_the_command_line() -> Result<()> {
        let cmd = Cmd::new("cargo")?.args(["install", "x", "--version", "~1"]);
        assert_eq!(cmd.shown(), "cargo install x --version '~1'");
        Ok(())
    }
}
