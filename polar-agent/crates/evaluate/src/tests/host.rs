//! A [`CommandRunner`] for tests: runs the argv as a host process in the
//! workspace, in its own process group, killed at the timeout.

use std::path::PathBuf;
use std::time::Duration;

use super::super::{CommandOutput, CommandRunner, RunError, RunFuture};

/// Runs commands on the host in `cwd`; remembers every argv.
pub struct HostRunner {
    pub cwd: PathBuf,
    pub seen: std::sync::Mutex<Vec<Vec<String>>>,
}

impl HostRunner {
    pub fn new(cwd: impl Into<PathBuf>) -> Self {
        Self {
            cwd: cwd.into(),
            seen: Default::default(),
        }
    }
}

impl CommandRunner for HostRunner {
    fn run<'a>(
        &'a self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        timeout: Duration,
    ) -> RunFuture<'a> {
        Box::pin(async move {
            self.seen.lock().unwrap().push(argv.clone());
            let (program, args) = argv
                .split_first()
                .ok_or_else(|| RunError::runner("empty argv"))?;
            let child = tokio::process::Command::new(program)
                .args(args)
                .envs(env)
                .current_dir(&self.cwd)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| RunError::runner(format!("spawning {program}: {e}")))?;
            let pgid = child.id().map(|id| nix::unistd::Pid::from_raw(id as i32));
            match tokio::time::timeout(timeout, child.wait_with_output()).await {
                Ok(Ok(out)) => Ok(CommandOutput::of_bytes(
                    out.status.code(),
                    &out.stdout,
                    &out.stderr,
                )),
                Ok(Err(e)) => Err(RunError::runner(format!("waiting for {program}: {e}"))),
                Err(_) => {
                    if let Some(pgid) = pgid {
                        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                    }
                    Ok(CommandOutput::of_bytes(None, b"", b""))
                }
            }
        })
    }
}
