//! Support for Polar's end-to-end tests: finding the `polar` and
//! `polar-probe` binaries, running `polar sandbox run` and reading its JSON
//! log events, and looking at the kernel (BPF programs, cgroups, network
//! namespaces) to check that nothing is left behind; loopback servers for
//! the proxy tests ([`servers`]); the real harness CLIs' sessions against
//! the mock backend, with their checks ([`harness`]).
#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

pub mod chains;
pub mod docker;
pub mod harness;
pub mod proxy;
pub mod servers;

/// The directory of the build's binaries (`target/<profile>`), found from the
/// running test executable (`target/<profile>/deps/NAME-HASH`).
pub fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let deps = exe.parent().context("test executable has no directory")?;
    let dir = if deps.ends_with("deps") {
        deps.parent().context("no profile directory")?
    } else {
        deps
    };
    Ok(dir.to_owned())
}

/// The `polar` binary; `cargo xtask test` builds it before the tests.
pub fn polar_bin() -> Result<PathBuf> {
    let p = bin_dir()?.join("polar");
    if !p.exists() {
        bail!(
            "{} is missing: build it with `cargo build --bin polar` (cargo xtask test does)",
            p.display()
        );
    }
    Ok(p)
}

/// The `polar-probe` test client.
pub fn probe_bin() -> Result<PathBuf> {
    let p = bin_dir()?.join("polar-probe");
    if !p.exists() {
        bail!("{} is missing: build the polar-tests binaries", p.display());
    }
    Ok(p)
}

/// The JSON lines of a text, skipping anything that is not JSON.
pub fn json_lines(text: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A finished `polar sandbox run`.
#[derive(Debug)]
pub struct Finished {
    /// The raw output.
    pub output: Output,
    /// The agent's log events (JSON lines on stderr).
    pub events: Vec<Value>,
    /// What the sandboxed command printed as JSON lines on stdout.
    pub reports: Vec<Value>,
}

impl Finished {
    /// Events with the given message.
    pub fn events(&self, message: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["message"] == message)
            .collect()
    }

    /// The stderr as text (for assertion messages).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
}

/// Runs `polar --log-format json sandbox run ARGS -- CMD` to the end.
pub fn sandbox_run(args: &[&str], cmd: &[&str]) -> Result<Finished> {
    sandbox_run_env(args, cmd, &[])
}

/// [`sandbox_run`] with more environment for `polar`.
pub fn sandbox_run_env(args: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> Result<Finished> {
    let output = Command::new(polar_bin()?)
        .envs(env.iter().copied())
        .args(["--log-format", "json", "sandbox", "run"])
        .args(args)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .output()
        .context("running polar")?;
    Ok(Finished {
        events: json_lines(&output.stderr),
        reports: json_lines(&output.stdout),
        output,
    })
}

/// A `polar sandbox run` running in the background, its log read line by
/// line. Killed on drop.
pub struct Running {
    /// The agent process.
    pub child: Child,
    lines: std::sync::mpsc::Receiver<Value>,
    /// Events seen so far.
    pub events: Vec<Value>,
}

impl Running {
    /// Starts `polar --log-format json sandbox run ARGS -- CMD`.
    pub fn start(args: &[&str], cmd: &[&str]) -> Result<Self> {
        let mut child = Command::new(polar_bin()?)
            .args(["--log-format", "json", "sandbox", "run"])
            .args(args)
            .arg("--")
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting polar")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            lines: rx,
            events: Vec::new(),
        })
    }

    /// Waits (bounded) for an event with this message and returns it.
    pub fn wait_for(&mut self, message: &str, timeout: Duration) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self.lines.recv_timeout(left).with_context(|| {
                format!(
                    "no {message:?} event within {timeout:?}; got {:?}",
                    self.events
                )
            })?;
            self.events.push(ev.clone());
            if ev["message"] == message {
                return Ok(ev);
            }
        }
    }

    /// The agent's pid.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    /// Sends a signal to the agent (by its pid).
    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig)?;
        Ok(())
    }

    /// Waits (bounded) for the agent to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("polar did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ids of the BPF programs a process holds open (the `prog_id:` lines of its
/// file descriptors' fdinfo: programs and links both show one).
pub fn bpf_programs_of(pid: i32) -> Result<BTreeSet<u64>> {
    let mut ids = BTreeSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        for line in text.lines() {
            if let Some(id) = line.strip_prefix("prog_id:")
                && let Ok(id) = id.trim().parse()
            {
                ids.insert(id);
            }
        }
    }
    Ok(ids)
}

/// Whether a BPF program with this id still exists.
pub fn bpf_program_exists(id: u64) -> Result<bool> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .output()?;
    Ok(out.status.success())
}

/// The network namespace inode of a process.
pub fn netns_of(pid: i32) -> Result<String> {
    Ok(std::fs::read_link(format!("/proc/{pid}/ns/net"))?
        .to_string_lossy()
        .into_owned())
}

/// A network namespace held open, so that it stays the one its inode
/// number names: the kernel gives a freed namespace's number to the next
/// namespace made, and the suite's tests make them side by side, so a
/// number read once may name another test's sandbox a moment later.
pub struct Netns {
    /// `net:[INODE]`, as `netns_of` prints it.
    pub id: String,
    _held: std::fs::File,
}

impl Netns {
    /// The network namespace `pid` is in now, held.
    pub fn of(pid: i32) -> Result<Self> {
        use std::os::fd::AsRawFd as _;
        let held = std::fs::File::open(format!("/proc/{pid}/ns/net"))
            .with_context(|| format!("network namespace of {pid}"))?;
        // What was opened, not what the process is in by now.
        let id = std::fs::read_link(format!("/proc/self/fd/{}", held.as_raw_fd()))?
            .to_string_lossy()
            .into_owned();
        Ok(Self { id, _held: held })
    }

    /// The namespace named `id`, held through a process in it now.
    pub fn find(id: &str) -> Result<Self> {
        for pid in pids_in_netns(id) {
            if let Ok(ns) = Self::of(pid)
                && ns.id == id
            {
                return Ok(ns);
            }
        }
        bail!("no process is in {id}")
    }

    /// The processes in this namespace.
    pub fn processes(&self) -> Vec<i32> {
        pids_in_netns(&self.id)
    }
}

/// Processes whose network namespace is `ns` (as `netns_of` prints it).
fn pids_in_netns(ns: &str) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| netns_of(*pid).is_ok_and(|n| n == ns))
        .collect()
}

/// Polls `f` until it is true or `timeout` passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The cgroup v2 mount point (from /proc/self/mountinfo).
pub fn cgroup2_mount() -> Result<PathBuf> {
    polar_redirect::Cgroup2Mount::find()
        .map(|m| m.mount_point)
        .map_err(Into::into)
}

/// A temporary directory the sandbox user may pass through (`0711`):
/// bubblewrap binds the session's directories from below it as that user.
pub fn sandbox_tempdir() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )?;
    Ok(dir)
}

/// Where `cargo xtask harnesses` installed the harness CLIs:
/// `POLAR_HARNESS_DIR`, else `.polar-cache/harnesses` in the workspace.
pub fn harness_dir() -> PathBuf {
    std::env::var_os("POLAR_HARNESS_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../.polar-cache/harnesses"),
        PathBuf::from,
    )
}

/// Writes a Polar configuration with `state_dir` under `dir` and `body`
/// after it (routes, backends), and creates its CA (so that sandboxes
/// started in parallel share one). Returns the file.
pub fn write_config(dir: &Path, body: &str) -> Result<PathBuf> {
    let path = dir.join("polar.toml");
    std::fs::write(
        &path,
        format!(
            "[agent]\nstate_dir = \"{}\"\n\n{body}",
            dir.join("state").display()
        ),
    )?;
    let out = Command::new(polar_bin()?)
        .args(["ca", "init", "--config"])
        .arg(&path)
        .output()?;
    if !out.status.success() {
        bail!("polar ca init: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(path)
}

/// A configuration (in a fresh directory, returned with it) whose native
/// sandboxes are also shown the directory of the built binaries
/// (`sandbox.view_dirs`), so that `polar-probe` runs in them: the sandbox's
/// view is an allowlist, which holds nothing of the build tree otherwise.
pub fn probe_config() -> Result<(tempfile::TempDir, String)> {
    let dir = sandbox_tempdir()?;
    let cfg = write_config(
        dir.path(),
        &format!("[sandbox]\nview_dirs = [\"{}\"]\n", bin_dir()?.display()),
    )?;
    Ok((dir, cfg.display().to_string()))
}

/// Writes `text` to `dir/name` (a runtime spec, a script) and returns the
/// path as a command-line argument.
pub fn write_file(dir: &Path, name: &str, text: &str) -> Result<String> {
    let p = dir.join(name);
    std::fs::write(&p, text)?;
    Ok(p.display().to_string())
}

/// The SHA-256 of a file, in hex: what tests compare before and after a
/// hostile sandbox ran, to show a host file is unchanged.
pub fn sha256(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    let d = ring::digest::digest(&ring::digest::SHA256, &bytes);
    Ok(d.as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

/// A finished `polar sandbox run --json ...` of a runtime or harness
/// session: its outcome (the JSON it printed) and exit code.
#[derive(Debug)]
pub struct SessionRun {
    /// The whole run.
    pub finished: Finished,
    /// The outcome object (`Value::Null` when none was printed).
    pub outcome: Value,
}

impl SessionRun {
    /// The exit code of `polar`.
    pub fn code(&self) -> Option<i32> {
        self.finished.output.status.code()
    }

    /// Fails unless `polar` exited 0, with its exit code and the main
    /// step's logs ([`SessionRun::main_logs`]).
    pub fn succeeded(&self) -> Result<()> {
        ensure!(
            self.code() == Some(0),
            "exit {:?}\n{}",
            self.code(),
            self.main_logs()
        );
        Ok(())
    }

    /// The workspace on the host.
    pub fn workspace(&self) -> PathBuf {
        PathBuf::from(self.outcome["workspace"].as_str().unwrap_or_default())
    }

    /// The harness's (main step's) stdout and stderr, for messages; when
    /// no step ran (Polar failed first: exit 125), the tail of `polar`'s
    /// own stderr.
    pub fn main_logs(&self) -> String {
        let mut text = String::new();
        for step in self.outcome["steps"].as_array().into_iter().flatten() {
            for log in step["logs"].as_array().into_iter().flatten() {
                if let Some(p) = log.as_str() {
                    let body = std::fs::read_to_string(p).unwrap_or_default();
                    let tail: String = body
                        .chars()
                        .rev()
                        .take(3000)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    text.push_str(&format!("--- {p}:\n{tail}\n"));
                }
            }
        }
        if text.is_empty() {
            let err = self.finished.stderr();
            let tail = err.lines().rev().take(20).collect::<Vec<_>>();
            text = format!(
                "--- polar's stderr:\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        text
    }
}

/// Runs `polar --log-format json sandbox run --json ARGS -- CMD`.
pub fn session_run(args: &[&str], cmd: &[&str]) -> Result<SessionRun> {
    session_run_env(args, cmd, &[])
}

/// [`session_run`] with more environment for `polar`.
pub fn session_run_env(args: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> Result<SessionRun> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let finished = sandbox_run_env(&all, cmd, env)?;
    let outcome = finished
        .reports
        .iter()
        .find(|v| v.get("steps").is_some())
        .cloned()
        .unwrap_or(Value::Null);
    Ok(SessionRun { finished, outcome })
}

/// Pids of processes whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
        })
        .filter(|pid| alive(*pid))
        .collect()
}
