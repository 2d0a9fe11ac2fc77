//! `polar submit TASK_FILE` and `polar status`: the rollout server from the
//! trainer's side. `submit` sends a task (TOML or JSON), prints a progress
//! line whenever the task's counts change, then a table of the samples;
//! it exits 0 when the task has usable samples (a `partial` task says so
//! on stderr), 1 when it has none (the failures grouped on stderr), 2 when
//! `--wait-secs` ran out first.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::CliError;
use polar_rollout::config::TOKEN_ENV;
use polar_rollout::report::{failures_text, progress_line, results_table, status_text};
use polar_rollout_api::{RolloutClient, TaskStatus};

/// Where the server is.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// The rollout server's base URL.
    #[arg(
        long,
        env = "POLAR_ROLLOUT_URL",
        default_value = "http://127.0.0.1:7070"
    )]
    pub server: String,
    /// The trainer token.
    #[arg(long, env = TOKEN_ENV, hide_env_values = true)]
    pub token: Option<String>,
    /// The CA bundle an `https://` server is verified against (default:
    /// the system's roots).
    #[arg(long, env = "POLAR_ROLLOUT_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM chain) to present, with `--key-file`.
    #[arg(long, env = "POLAR_ROLLOUT_CERT_FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's key (mode 0600).
    #[arg(long, env = "POLAR_ROLLOUT_KEY_FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Allow plain `http://` to a host that is not loopback (the token
    /// travels in clear).
    #[arg(long, env = "POLAR_ROLLOUT_ALLOW_PLAIN_HTTP")]
    pub allow_plain_http: bool,
}

impl ServerArgs {
    /// A client of `url` with these TLS settings; plain HTTP beyond
    /// loopback is refused unless allowed.
    fn client_of(&self, url: &str) -> Result<RolloutClient, CliError> {
        polar_rollout_api::tls::check_target(url, self.allow_plain_http, "--allow-plain-http")
            .map_err(CliError::Usage)?;
        let identity = match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => Some(
                polar_io::tls::Identity::load(c, k)
                    .map_err(|e| CliError::Usage(format!("--cert-file/--key-file: {e}")))?,
            ),
            _ => None,
        };
        let tls = polar_io::tls::client_config(self.ca_file.as_deref(), identity.as_ref())
            .map_err(|e| CliError::Usage(format!("--ca-file: {e}")))?;
        Ok(RolloutClient::new(url.to_owned(), self.token.clone()).with_tls(tls))
    }

    fn client(&self) -> Result<RolloutClient, CliError> {
        self.client_of(&self.server)
    }

    /// A failed call as what to do about it: the server not reached (the
    /// URL and where it came from), the token refused (the server's
    /// message names the token it needs), else as the server said.
    fn failure(&self, e: polar_rollout_api::ClientError) -> CliError {
        use polar_rollout_api::ClientError as E;
        match e {
            E::Transport { url, reason } => {
                let hint = if self.server.starts_with("https://")
                    && (reason.contains("InvalidContentType") || reason.contains("corrupt message"))
                {
                    "The server speaks plain HTTP, not HTTPS: use an http:// URL (or give the server [rollout.tls]).".to_owned()
                } else {
                    format!("Is it running and listening at {}?", self.server)
                };
                CliError::Unreachable(format!(
                    "cannot reach the rollout server at {url} ({reason}). {hint} The URL comes from --server or POLAR_ROLLOUT_URL (default http://127.0.0.1:7070)."
                ))
            }
            E::Status {
                status: http::StatusCode::UNAUTHORIZED,
                message,
                ..
            } => CliError::Auth(format!(
                "the rollout server at {} refused the token: {message}. The token comes from --token or {TOKEN_ENV}.",
                self.server
            )),
            other => CliError::RolloutClient(other),
        }
    }
}

/// Arguments of `polar submit`.
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// The task: a TaskRequest as TOML (`.toml`) or JSON.
    pub task_file: PathBuf,
    /// The server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Print the task id and return without waiting.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting after this many seconds (the task goes on).
    #[arg(long)]
    pub wait_secs: Option<u64>,
    /// Polling interval in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub poll_ms: u64,
    /// Print the final results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Reads a task file: TOML when it ends in `.toml`, JSON otherwise.
pub fn load_task_file(path: &Path) -> Result<serde_json::Value, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Io(format!("reading {}", path.display()), e))?;
    parse_task(&text, path.extension().is_some_and(|e| e == "toml"))
        .map_err(|e| CliError::TaskFile(format!("{}: {e}", path.display())))
}

fn parse_task(text: &str, toml: bool) -> Result<serde_json::Value, String> {
    if toml {
        toml::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }
}

fn out(text: &str) -> Result<(), CliError> {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())?;
    o.flush()?;
    Ok(())
}

/// Runs `polar submit`.
pub async fn submit(args: SubmitArgs) -> Result<ExitCode, CliError> {
    let task = load_task_file(&args.task_file)?;
    let c = args.server.client()?;
    let reply = c.submit(&task).await.map_err(|e| args.server.failure(e))?;
    out(&format!(
        "submitted {} ({} samples) to {}\n",
        reply.task_id,
        reply.session_ids.len(),
        c.base()
    ))?;
    if args.no_wait {
        return Ok(ExitCode::SUCCESS);
    }
    let started = Instant::now();
    let mut last = String::new();
    let view = loop {
        let v = c
            .task(&reply.task_id)
            .await
            .map_err(|e| args.server.failure(e))?;
        let line = progress_line(&v);
        if line != last {
            out(&format!(
                "[{:>6.1}s] {line}\n",
                started.elapsed().as_secs_f64()
            ))?;
            last = line;
        }
        if v.status.is_finished() {
            break v;
        }
        if args
            .wait_secs
            .is_some_and(|w| started.elapsed() >= Duration::from_secs(w))
        {
            out("stopped waiting; the task goes on (polar status, GET /v1/tasks/ID)\n")?;
            return Ok(ExitCode::from(2));
        }
        tokio::time::sleep(Duration::from_millis(args.poll_ms.max(10))).await;
    };
    if args.json {
        out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&view).unwrap_or_default()
        ))?;
    } else {
        out(&results_table(&view))?;
    }
    Ok(match view.status {
        TaskStatus::Completed => ExitCode::SUCCESS,
        TaskStatus::Partial => {
            eprintln!(
                "task {} is partial: {} of {} requested samples usable (the others are listed above)",
                view.task_id, view.counts.usable, view.requested
            );
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{}", unusable_summary(&view));
            ExitCode::from(1)
        }
    })
}

/// The one-paragraph reason a task gave nothing to train on.
fn unusable_summary(v: &polar_rollout_api::TaskView) -> String {
    let mut s = format!(
        "task {} ended {}: {} of {} requested samples usable",
        v.task_id,
        v.status.as_str(),
        v.counts.usable,
        v.requested
    );
    if let Some(r) = &v.reason {
        s.push_str(&format!(" ({r})"));
    }
    let groups = failures_text(v);
    if !groups.is_empty() {
        s.push('\n');
        s.push_str(groups.trim_end());
    }
    s
}

/// Arguments of `polar status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Tasks listed (the most recent).
    #[arg(long, default_value_t = 20)]
    pub tasks: usize,
    /// Show a gateway node instead (its base URL, e.g.
    /// `http://10.0.0.5:7071`): its pools, the sessions in each stage,
    /// pause and drain state. `--token` is then the node's accepted token.
    #[arg(long, value_name = "URL")]
    pub node: Option<String>,
}

/// A gateway's `GET /v1/status` as text.
pub fn node_text(v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "node {} at {} (server {}){}{}",
        v["node_id"].as_str().unwrap_or("?"),
        v["address"].as_str().unwrap_or("?"),
        v["server"].as_str().unwrap_or("?"),
        if v["draining"] == true {
            ", draining"
        } else {
            ""
        },
        if v["paused"] == true {
            ", generations paused"
        } else {
            ""
        },
    );
    let p = &v["pools"];
    let _ = writeln!(
        t,
        "pools: init {}, ready buffer {}, running {}, postrun {}; max sessions {}",
        p["init"], p["ready_buffer"], p["running"], p["postrun"], v["max_sessions"]
    );
    let stages = v["by_stage"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let _ = writeln!(
        t,
        "sessions: {stages}; finished {}, reported {}",
        v["finished"], v["reported"]
    );
    if let Some(backends) = v["backends"].as_object().filter(|b| !b.is_empty()) {
        let text: Vec<String> = backends
            .iter()
            .map(|(name, b)| {
                let (healthy, replicas) = (
                    b["healthy"].as_u64().unwrap_or(0),
                    b["replicas"].as_u64().unwrap_or(0),
                );
                let down = if healthy == 0 && replicas > 0 {
                    " (DOWN: the server sends this node no session)"
                } else {
                    ""
                };
                format!("{name} {healthy}/{replicas} replicas healthy{down}")
            })
            .collect();
        let _ = writeln!(t, "backends: {}", text.join(", "));
    }
    for s in v["sessions"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "  {}  task {} sample {} attempt {}  {}  {:.1}s",
            s["session_id"].as_str().unwrap_or("?"),
            s["task_id"].as_str().unwrap_or("?"),
            s["sample_index"],
            s["attempt"],
            s["stage"].as_str().unwrap_or("?"),
            s["age_ms"].as_f64().unwrap_or(0.0) / 1000.0
        );
    }
    t
}

/// Runs `polar status`.
pub async fn status(args: StatusArgs) -> Result<ExitCode, CliError> {
    if let Some(node) = &args.node {
        let c = args.server.client_of(node)?;
        let (code, body) = c.raw(http::Method::GET, "/v1/status", None).await?;
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if !code.is_success() {
            return Err(CliError::Usage(format!(
                "{node}/v1/status: {code}: {}",
                v["error"]["message"].as_str().unwrap_or("no detail")
            )));
        }
        out(&node_text(&v))?;
        return Ok(ExitCode::SUCCESS);
    }
    let c = args.server.client()?;
    let s = c.status().await.map_err(|e| args.server.failure(e))?;
    let mut text = status_text(&s, c.base());
    let list = c.tasks(None).await.map_err(|e| args.server.failure(e))?;
    let skip = list.tasks.len().saturating_sub(args.tasks);
    for t in &list.tasks[skip..] {
        text.push_str("  ");
        text.push_str(&progress_line(t));
        text.push('\n');
    }
    out(&text)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_files_in_toml_and_json() {
        let toml = r#"
task_id = "t1"
instruction = "fix it"
num_samples = 4
timeout_secs = 600
[agent]
harness = "shell"
[builder]
kind = "prefix_merging"
[metadata]
group_id = "g"
"#;
        let v = parse_task(toml, true).unwrap();
        assert_eq!(v["num_samples"], 4);
        assert_eq!(v["builder"]["kind"], "prefix_merging");
        let j = parse_task(&v.to_string(), false).unwrap();
        assert_eq!(v, j);
        assert!(parse_task("task_id = ", true).is_err());
    }
}
