//! `polar slurm run` and `polar slurm node`: Polar's control plane inside a
//! Slurm job, for the life of the job (the job directory's layout and the
//! configuration composition are [`crate::slurm`]).
//!
//! `polar slurm run [OPTIONS] -- CMD...`, in the job's batch script (on
//! the first node), checks the operator's files and asks Slurm for the
//! nodes, their addresses and `KillWait` before anything is made; then it
//! makes the job directory (0700) with fresh tokens and a cluster CA of
//! the job's own (certificates for the server and each node, the CA's key
//! deleted once they are issued), serves the rollout server on the batch
//! node over HTTPS with mutual TLS, starts one gateway per node with
//! `srun` (`polar slurm node`), waits until every node registered, and runs
//! CMD with the server's URL, a trainer token and the CA in its
//! environment. When CMD ends, or the job is cancelled or reaches its time
//! limit (SIGTERM from Slurm), CMD is stopped, the gateways get SIGTERM and
//! drain within a time below `KillWait` (their sessions finish or go back
//! to the server), the server stops, and the keys and tokens are removed
//! (first, as soon as CMD is done), then the job directory (kept, without
//! them, when CMD failed or was stopped, when Polar failed, or when
//! `--keep` asks). The exit code is CMD's.
//!
//! `polar slurm node --job-dir DIR` is the gateway of one node: its
//! identity is Slurm's node name (`SLURMD_NODENAME`), its configuration is
//! the operator's with the job's `[gateway]` keys, its state directory
//! `<agent.state_dir>/slurm/<job id>/<node>` is removed after a clean stop.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use polar_rollout::{RolloutConfig, RolloutServer};
use polar_rollout_api::RolloutClient;

use super::CliError;
use crate::slurm::compose::{self, NodeSide, ServerSide};
use crate::slurm::{self, Job, JobDir, SlurmError, scontrol};

/// `polar slurm ...`
#[derive(Debug, clap::Subcommand)]
pub enum SlurmCommand {
    /// In a job's batch script: start the job's rollout server and one
    /// gateway per allocated node, run CMD against them, tear all down
    /// with the job.
    Run(RunArgs),
    /// One node's gateway of a job (`polar slurm run` starts it with srun).
    Node(NodeArgs),
}

/// Arguments of `polar slurm run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The nodes' agent configuration (backends, routes, `[sandbox]`, and
    /// `[gateway]` tuning with `export` on shared storage); the job sets
    /// each node's identity, server, tokens, TLS and state directory.
    #[arg(long, env = "POLAR_AGENT_CONFIG")]
    pub agent_config: PathBuf,
    /// A file with `[rollout]` tuning for the job's server (retries,
    /// retention, policy); the job sets its address, tokens and TLS.
    #[arg(long, env = "POLAR_ROLLOUT_CONFIG")]
    pub rollout_config: Option<PathBuf>,
    /// Where job directories are made (`<dir>/<job id>/`): storage that
    /// every node of the job sees [default: $HOME/.polar/slurm].
    #[arg(long, env = "POLAR_SLURM_DIR")]
    pub dir: Option<PathBuf>,
    /// The rollout server's port on the batch node (0: any free port).
    #[arg(long, env = "POLAR_SLURM_PORT", default_value_t = 7070)]
    pub port: u16,
    /// The port each gateway listens on (0: any free port, advertised to
    /// the server).
    #[arg(long, env = "POLAR_SLURM_GATEWAY_PORT", default_value_t = 7071)]
    pub gateway_port: u16,
    /// How long the gateways have to register before the job fails.
    #[arg(long, default_value_t = 180)]
    pub start_timeout_secs: u64,
    /// Keep the job directory (database, logs, certificates; never the keys
    /// or tokens) after a job that went well.
    #[arg(long)]
    pub keep: bool,
    /// The command run against the job's rollout server (a trainer, `polar
    /// submit`...).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Arguments of `polar slurm node`.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// The job directory `polar slurm run` made.
    #[arg(long)]
    pub job_dir: PathBuf,
}

/// The gateway's environment overrides: never taken from a job's
/// environment (the node's identity is Slurm's).
const GATEWAY_ENV: [&str; 4] = [
    polar_node::gateway::config::TOKEN_ENV,
    polar_node::gateway::config::NODE_ID_ENV,
    polar_node::gateway::config::ADVERTISE_ENV,
    polar_node::gateway::config::LISTEN_ENV,
];

/// How long the certificates of a job are valid.
const JOB_CERT_VALIDITY: Duration = Duration::from_secs(30 * 86_400);

/// Beyond the drain: how long the gateways' step may take to end after
/// SIGTERM before it is killed.
const STOP_MARGIN: Duration = Duration::from_secs(15);

fn job_env(name: &'static str) -> Result<String, SlurmError> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or(SlurmError::NotInJob(name))
}

fn read_operator_file(path: &Path) -> Result<String, SlurmError> {
    std::fs::read_to_string(path).map_err(SlurmError::io("reading", path))
}

fn config_error(path: &Path) -> impl FnOnce(String) -> SlurmError + '_ {
    move |reason| SlurmError::Config {
        path: path.to_owned(),
        reason,
    }
}

/// Runs a `polar slurm` command.
pub async fn run(cmd: SlurmCommand) -> Result<ExitCode, CliError> {
    match cmd {
        SlurmCommand::Run(args) => job(args).await,
        SlurmCommand::Node(args) => node(args).await,
    }
}

/// `polar slurm run`.
async fn job(args: RunArgs) -> Result<ExitCode, CliError> {
    let mut signals = polar_sandbox::signals::Terminated::install();
    // Everything checked before anything is made.
    let job_id = job_env("SLURM_JOB_ID")?;
    if !is_slurm_number(&job_id) {
        return Err(SlurmError::ControlPlane(format!(
            "SLURM_JOB_ID {job_id:?} is not a job number"
        ))
        .into());
    }
    let nodelist = job_env("SLURM_JOB_NODELIST")?;
    let here = job_env("SLURMD_NODENAME")?;
    let agent_text = read_operator_file(&args.agent_config)?;
    compose::check_node_config(&agent_text).map_err(config_error(&args.agent_config))?;
    polar_config::Config::from_toml_str(&agent_text)?;
    let rollout_text = args
        .rollout_config
        .as_deref()
        .map(read_operator_file)
        .transpose()?;
    let nodes = scontrol::job_nodes(&nodelist).await?;
    let batch = nodes
        .iter()
        .find(|n| n.name == here)
        .cloned()
        .ok_or_else(|| {
            SlurmError::ControlPlane(format!(
                "this node ({here}) is not among the job's nodes ({nodelist})"
            ))
        })?;
    let drain_secs = compose::drain_secs(scontrol::kill_wait().await?);
    let root = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .ok_or(SlurmError::NotInJob("HOME"))?
            .join(".polar/slurm"),
    };
    // A requeued job keeps its id: each run of it gets its own directory.
    let name = match std::env::var("SLURM_RESTART_COUNT")
        .ok()
        .filter(|c| c != "0" && is_slurm_number(c))
    {
        Some(restart) => format!("{job_id}.{restart}"),
        None => job_id.clone(),
    };
    let dir = JobDir::new(root.join(name));
    // The server's settings compose (the operator's `[rollout]` checked)
    // before anything is made.
    let server_side = ServerSide {
        listen: std::net::SocketAddr::new(batch.addr, args.port),
        database: dir.root.join("rollout.sqlite"),
        trainer_token_file: dir.trainer_token(),
        gateway_token_file: dir.gateway_token(),
        node_token_dir: dir.node_tokens(),
        cert_file: dir.identity(SERVER_NAME).0,
        key_file: dir.identity(SERVER_NAME).1,
        ca_file: dir.ca_cert(),
    };
    let text =
        compose::rollout_config(rollout_text.as_deref(), &server_side).map_err(config_error(
            args.rollout_config
                .as_deref()
                .unwrap_or(Path::new("[rollout]")),
        ))?;
    dir.create()?;
    let mut teardown = TearDown {
        dir: dir.clone(),
        keep: true,
    };

    // The job's secrets and settings.
    let trainer_token = slurm::fresh_token();
    slurm::write_private(&dir.trainer_token(), trainer_token.as_bytes())?;
    let gateway_token = slurm::fresh_token();
    slurm::write_private(&dir.gateway_token(), gateway_token.as_bytes())?;
    for n in &nodes {
        let token = slurm::fresh_token();
        slurm::write_private(&dir.node_tokens().join(&n.name), token.as_bytes())?;
    }
    issue_certificates(&dir, &batch, &nodes)?;
    slurm::write_private(&dir.base_agent_config(), agent_text.as_bytes())?;
    slurm::write_private(&dir.rollout_config(), text.as_bytes())?;
    let mut cfg = RolloutConfig::load(&dir.rollout_config())?;
    cfg.finish_tokens(None, None)?;
    let server = RolloutServer::start(cfg).await?;
    let server_url = format!(
        "https://{}",
        std::net::SocketAddr::new(batch.addr, server.local_addr().port())
    );
    let job = Job {
        job_id,
        nodes,
        server_url: server_url.clone(),
        gateway_port: args.gateway_port,
        drain_secs,
    };
    dir.write_job(&job)?;
    tracing::info!(job = %job.job_id, server = %server_url, dir = %dir.root.display(), nodes = job.nodes.len(), "the job's rollout server is up; starting the gateways");

    let tls = polar_io::tls::client_config(Some(&dir.ca_cert()), None)
        .map_err(|e| SlurmError::ControlPlane(format!("the job's CA: {e}")))?;
    let client = RolloutClient::new(server_url.clone(), Some(trainer_token.clone())).with_tls(tls);
    let mut gateways = start_gateways(&dir, &job)?;
    let (root, ca) = (
        dir.root.display().to_string(),
        dir.ca_cert().display().to_string(),
    );
    let env = [
        ("POLAR_ROLLOUT_URL", server_url.as_str()),
        (polar_rollout::config::TOKEN_ENV, trainer_token.as_str()),
        ("POLAR_ROLLOUT_CA_FILE", ca.as_str()),
        // What the Python client's pause and resume present to the nodes.
        ("POLAR_GATEWAY_TOKEN", gateway_token.as_str()),
        ("POLAR_SLURM_JOB_DIR", root.as_str()),
    ];
    let outcome = async {
        let timeout = Duration::from_secs(args.start_timeout_secs);
        wait_registered(&client, &job, &dir, &mut gateways, timeout, &mut signals).await?;
        run_command(&args.command, &env, &mut gateways, &dir, &job, &mut signals).await
    }
    .await;
    // Nothing reads the keys and tokens again (the server and the gateways
    // read them at start), and Slurm's SIGKILL may come before the end of
    // the tear-down: they go first.
    dir.remove_secrets();
    stop_gateways(&mut gateways, &job).await;
    server.shutdown().await;
    // The directory (logs, database) stays for the operator unless all
    // went well.
    teardown.keep = args.keep || !matches!(outcome, Ok(Ended::Finished(0)));
    drop(teardown);
    match outcome? {
        Ended::Finished(code) | Ended::Stopped(code) => Ok(ExitCode::from(code)),
    }
}

/// How the job's command ended, with its exit code.
enum Ended {
    /// On its own.
    Finished(u8),
    /// Stopped because the job is ending (cancelled, out of time).
    Stopped(u8),
}

/// A job id or count as Slurm writes them (digits), safe as a path
/// component.
fn is_slurm_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The server's certificate name.
const SERVER_NAME: &str = "rollout";

/// The job's cluster CA, a certificate for the server (the batch node's
/// name and address) and one per node; then the CA's key is deleted.
fn issue_certificates(
    dir: &JobDir,
    batch: &slurm::JobNode,
    nodes: &[slurm::JobNode],
) -> Result<(), CliError> {
    use polar_io::tls::ca::{ClusterCa, IssueRequest, KEY_FILE};
    let ca = ClusterCa::init(&dir.tls(), JOB_CERT_VALIDITY)?;
    let issue = |name: &str, dns: &str, ip| {
        ca.issue(
            &IssueRequest {
                name: name.to_owned(),
                dns: vec![dns.to_owned()],
                ips: vec![ip],
                validity: JOB_CERT_VALIDITY,
            },
            &dir.tls(),
        )
    };
    issue(SERVER_NAME, &batch.name, batch.addr)?;
    for n in nodes {
        issue(&n.name, &n.name, n.addr)?;
    }
    let key = dir.tls().join(KEY_FILE);
    std::fs::remove_file(&key).map_err(SlurmError::io("removing", &key))?;
    Ok(())
}

/// Removes the job's secrets and directory when dropped.
struct TearDown {
    dir: JobDir,
    keep: bool,
}

impl Drop for TearDown {
    fn drop(&mut self) {
        self.dir.tear_down(self.keep);
    }
}

/// `srun` of `polar slurm node` on every node of the job.
fn start_gateways(dir: &JobDir, job: &Job) -> Result<tokio::process::Child, SlurmError> {
    let exe = std::env::current_exe().map_err(SlurmError::io("finding", Path::new("polar")))?;
    let mut cmd = tokio::process::Command::new("srun");
    cmd.args(["--overlap", "--ntasks-per-node=1", "--kill-on-bad-exit=0"])
        .arg(format!("--job-name={GATEWAYS_STEP}"))
        .arg(format!("--nodes={}", job.nodes.len()))
        .arg(format!("--ntasks={}", job.nodes.len()))
        // By task rank: `%N` is the host's name, not the Slurm node's, where
        // several slurmd share a host.
        .arg(format!("--output={}/gateway-%t.log", dir.nodes().display()))
        .arg(exe)
        .args(["slurm", "node", "--job-dir"])
        .arg(&dir.root)
        .stdin(std::process::Stdio::null());
    for var in GATEWAY_ENV {
        cmd.env_remove(var);
    }
    cmd.spawn().map_err(|e| SlurmError::Command {
        command: "srun polar slurm node".into(),
        reason: format!("cannot run it: {e}"),
    })
}

/// The tail of each node's log, for an error.
fn node_logs(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return String::new();
    };
    let mut out = String::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_some_and(|x| x == "log")
            && let Ok(text) = std::fs::read_to_string(&path)
        {
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "\n--- {} ---\n{}",
                path.display(),
                lines[lines.len().saturating_sub(20)..].join("\n")
            ));
        }
    }
    out
}

/// Waits until every node of the job is registered with the server.
async fn wait_registered(
    client: &RolloutClient,
    job: &Job,
    dir: &JobDir,
    gateways: &mut tokio::process::Child,
    timeout: Duration,
    signals: &mut polar_sandbox::signals::Terminated,
) -> Result<(), CliError> {
    let until = Instant::now() + timeout;
    loop {
        if let Ok(list) = client.nodes().await {
            let missing: Vec<_> = job
                .nodes
                .iter()
                .filter(|n| !list.nodes.iter().any(|v| v.node_id == n.name))
                .map(|n| n.name.as_str())
                .collect();
            if missing.is_empty() {
                tracing::info!(
                    nodes = job.nodes.len(),
                    "every gateway of the job registered"
                );
                return Ok(());
            }
            if Instant::now() > until {
                return Err(SlurmError::ControlPlane(format!(
                    "nodes {missing:?} did not register within {timeout:?}{}",
                    node_logs(&dir.nodes())
                ))
                .into());
            }
        }
        tokio::select! {
            status = gateways.wait() => {
                return Err(SlurmError::ControlPlane(format!(
                    "the gateways' step ended before they registered ({}){}",
                    status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
                    node_logs(&dir.nodes())
                ))
                .into());
            }
            sig = signals.recv() => {
                return Err(SlurmError::ControlPlane(format!("signal {sig} while the gateways started")).into());
            }
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// Runs the job's command to its end, or until the job is stopped (its
/// directory then kept for the operator) or its gateways are gone (an
/// error).
async fn run_command(
    command: &[String],
    env: &[(&str, &str)],
    gateways: &mut tokio::process::Child,
    dir: &JobDir,
    job: &Job,
    signals: &mut polar_sandbox::signals::Terminated,
) -> Result<Ended, CliError> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| CliError::Usage("no command given".into()))?;
    let mut child = tokio::process::Command::new(program)
        .args(rest)
        .envs(env.iter().copied())
        .spawn()
        .map_err(|e| SlurmError::Command {
            command: program.clone(),
            reason: format!("cannot run it: {e}"),
        })?;
    // Why the command is stopped: a signal (the job is ending), or its
    // gateways are gone (an error).
    let gone = tokio::select! {
        status = child.wait() => {
            let status = status.map_err(|e| CliError::Io(format!("waiting for {program}"), e))?;
            return Ok(Ended::Finished(super::exit_code(status)));
        }
        sig = signals.recv() => {
            // SIGKILL follows within KillWait: the secrets go first.
            dir.remove_secrets();
            tracing::warn!(signal = sig, command = %program, "the job is ending: its secrets removed, stopping its command");
            None
        }
        status = gateways.wait() => Some(format!(
            "the gateways' step ended while {program} ran ({})",
            status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())
        )),
    };
    if let Some(why) = &gone {
        tracing::error!(reason = %why, "stopping the job's command");
    }
    let status = stop_child(&mut child, Duration::from_secs(job.drain_secs)).await;
    match (gone, status) {
        (Some(why), _) => Err(SlurmError::ControlPlane(why).into()),
        (None, status) => Ok(Ended::Stopped(status.map_or(125, super::exit_code))),
    }
}

/// SIGTERM, then SIGKILL after `grace`; the exit status when known.
async fn stop_child(
    child: &mut tokio::process::Child,
    grace: Duration,
) -> Option<std::process::ExitStatus> {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            let _ = child.kill().await;
            child.wait().await.ok()
        }
    }
}

/// The gateways' step's name.
const GATEWAYS_STEP: &str = "polar-gateways";

/// Stops the gateways' step: SIGTERM to every node's gateway (`scancel
/// --signal=TERM JOB.STEP`; a SIGTERM to srun would make it kill the step
/// outright), which drains within the job's drain time; the step is
/// killed when it outlasts that.
async fn stop_gateways(gateways: &mut tokio::process::Child, job: &Job) {
    if let Ok(Some(_)) = gateways.try_wait() {
        return;
    }
    let signalled = match scontrol::step_named(&job.job_id, GATEWAYS_STEP).await {
        Ok(Some(step)) => scontrol::signal_step(&step, "TERM").await.map(|()| step),
        Ok(None) => Err(SlurmError::ControlPlane(format!(
            "no step named {GATEWAYS_STEP} in job {}",
            job.job_id
        ))),
        Err(e) => Err(e),
    };
    // When the job is being cancelled the step cannot be signalled, but
    // Slurm itself sent SIGTERM to every task: they drain all the same.
    match &signalled {
        Ok(step) => tracing::info!(%step, "the job's gateways are draining"),
        Err(e) => {
            tracing::warn!(error = %e, "the gateways' step could not be signalled; waiting for it")
        }
    }
    let grace = Duration::from_secs(job.drain_secs) + STOP_MARGIN;
    let ended = tokio::time::timeout(grace, gateways.wait()).await.ok();
    match ended {
        Some(Ok(s)) if s.success() => tracing::info!("the job's gateways stopped"),
        Some(s) => tracing::warn!(status = ?s, "the job's gateways' step did not end cleanly"),
        None => {
            let _ = gateways.kill().await;
            tracing::warn!("the job's gateways' step was killed");
        }
    }
}

/// `polar slurm node`.
async fn node(args: NodeArgs) -> Result<ExitCode, CliError> {
    let name = job_env("SLURMD_NODENAME")?;
    if let Some(var) = GATEWAY_ENV.iter().find(|v| std::env::var_os(v).is_some()) {
        return Err(CliError::Usage(format!(
            "{var} is set: under `polar slurm` a node's identity is the job's, never the environment's"
        )));
    }
    let dir = JobDir::new(args.job_dir);
    let job = dir.read_job()?;
    let me = job
        .nodes
        .iter()
        .find(|n| n.name == name)
        .ok_or_else(|| SlurmError::ControlPlane(format!("node {name} is not in this job")))?;
    let base_path = dir.base_agent_config();
    let base = read_operator_file(&base_path)?;
    let state_root = compose::operator_state_dir(&base)
        .map_err(config_error(&base_path))?
        .unwrap_or_else(|| polar_config::Config::default().agent.state_dir);
    let state = state_root.join("slurm").join(&job.job_id).join(&name);
    // The sandbox user must pass through the directories above the node's
    // state (its trust bundle is bound from there), as through the state
    // root of a node outside Slurm; none may be listed.
    if let Some(parent) = state.parent() {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(parent)
            .map_err(SlurmError::io("creating", parent))?;
    }
    let (cert_file, key_file) = dir.identity(&name);
    let side = NodeSide {
        state_dir: state.clone(),
        server_url: job.server_url.clone(),
        node_id: name.clone(),
        listen: std::net::SocketAddr::new(me.addr, job.gateway_port),
        token_file: dir.node_tokens().join(&name),
        accept_token_file: dir.gateway_token(),
        drain_secs: job.drain_secs,
        cert_file,
        key_file,
        ca_file: dir.ca_cert(),
    };
    let text = compose::node_config(&base, &side).map_err(config_error(&base_path))?;
    let path = dir.node_config(&name);
    if let Some(parent) = path.parent() {
        slurm::make_private_dir(parent)?;
    }
    slurm::write_private(&path, text.as_bytes())?;
    let code = super::agent::run(super::agent::AgentArgs {
        config: super::ConfigArgs {
            config: Some(path),
            state_dir: None,
        },
    })
    .await?;
    // The node's state for this job goes with it, unless something is
    // still mounted below it (then it is left for the operator).
    let removed = tokio::task::spawn_blocking(move || {
        remove_state(&state)?;
        // The job's directory of this host's nodes, once the last is gone.
        if let Some(parent) = state.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        Ok::<(), String>(())
    })
    .await;
    if let Ok(Err(e)) = removed {
        tracing::warn!(error = %e, "the node's state directory for this job was left");
    }
    Ok(code)
}

/// Removes a node's job state directory, refusing one with a mount below.
fn remove_state(state: &Path) -> Result<(), String> {
    let mounts = polar_sandbox::runtime::quota::mounts_below(state).map_err(|e| e.to_string())?;
    if let Some(m) = mounts.first() {
        return Err(format!("{} is still mounted", m.display()));
    }
    match std::fs::remove_dir_all(state) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("{}: {e}", state.display())),
    }
}
