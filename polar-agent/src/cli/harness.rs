//! `polar sandbox run --harness NAME --instruction TEXT [--runtime FILE]`:
//! one harness session end to end on a runtime (also `--runtime FILE -- CMD`
//! for a custom command). Prints where the session's workspace and capture
//! log are (or the whole outcome as JSON with `--json`); exits with the
//! harness's code, 124 when the budget ran out, 125 when Polar failed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::CliError;
use super::sandbox::SandboxRunArgs;
use polar_harness::{Harness, HarnessChoice, HarnessName, ModeKind, search_dirs};
use polar_ids::SessionId;
use polar_node::agent::AgentParts;
use polar_node::harness::run::{HarnessRun, run as run_harness};
use polar_redirect::{Redirect, RedirectError, RedirectOptions, preflight};
use polar_sandbox::SandboxError;
use polar_sandbox::runtime::plan::StepEnd;
use polar_spec::runtime::RuntimeSpec;

/// The harness options of `polar sandbox run`.
#[derive(Debug, Clone, clap::Args)]
pub struct HarnessArgs {
    /// The harness: a preset, or `custom:NAME` for a `[harness.NAME]` of
    /// the configuration.
    #[arg(long)]
    pub harness: Option<String>,
    /// The task's instruction given to the harness.
    #[arg(long, requires = "harness")]
    pub instruction: Option<String>,
    /// The runtime spec (TOML, or JSON by extension); native by default.
    #[arg(long)]
    pub runtime: Option<PathBuf>,
    /// The session's time budget in seconds; every command gets what is
    /// left of it and is killed when it runs out.
    #[arg(long, default_value_t = 1800)]
    pub budget_secs: u64,
    /// Base-URL mode instead of transparent mode.
    #[arg(long)]
    pub base_url: bool,
    /// Print the outcome as one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn out(text: &str) -> Result<(), CliError> {
    use std::io::Write as _;
    let mut so = std::io::stdout().lock();
    so.write_all(text.as_bytes())?;
    so.flush()?;
    Ok(())
}

/// Runs the harness session the arguments describe.
pub async fn run(args: SandboxRunArgs) -> Result<ExitCode, CliError> {
    let h = &args.harness;
    // Validate everything before anything is created.
    let choice: HarnessChoice = match &h.harness {
        Some(name) => name.parse().map_err(polar_harness::HarnessError::from)?,
        None => HarnessName::Shell.into(),
    };
    let config = args.config.load()?;
    let harness = Harness::resolve(&choice, &config)?;
    let spec = match &h.runtime {
        Some(p) => RuntimeSpec::load(p)?,
        None => RuntimeSpec::default(),
    };
    let command: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let instruction = h.instruction.clone().unwrap_or_default();
    if !harness.is_shell() && instruction.is_empty() {
        return Err(polar_harness::HarnessError::NoInstruction(harness.to_string()).into());
    }
    let install = harness.check_installed(&search_dirs(), Duration::from_secs(30))?;
    let session = args.session.clone().unwrap_or_else(SessionId::random);
    // The runtime's program works (checked again when the session starts).
    polar_sandbox::runtime::Runtime::for_spec(
        &spec,
        &session,
        &polar_sandbox::runtime::Node::of(&config),
    )
    .map_err(polar_harness::HarnessError::from)?;
    preflight::check().map_err(|e| CliError::Sandbox(SandboxError::Redirect(e.into())))?;
    let parts = AgentParts::build(config)?;
    let redirect = Redirect::start(&RedirectOptions {
        reaper_exe: std::env::current_exe().ok(),
        sandboxes: Some(polar_sandbox::runtime::steps::sandboxes_dir(
            &parts.config.agent.state_dir,
        )),
    })
    .map_err(|e| CliError::Sandbox(SandboxError::Redirect(e)))?;
    let stop = CancellationToken::new();
    let signal_stop = stop.clone();
    tokio::spawn(async move {
        polar_sandbox::signals::terminated().await;
        signal_stop.cancel();
    });
    let mode = if h.base_url {
        ModeKind::BaseUrl
    } else {
        harness.default_mode()
    };
    let plan = HarnessRun {
        harness,
        instruction,
        command,
        mode,
        spec,
        budget: Duration::from_secs(h.budget_secs),
        session,
        install,
        // `--task` stamps the session's records and `session.json`, and
        // so the export's task partition.
        info: args.session_info(),
    };
    let result = run_harness(&parts, &redirect, plan, &stop).await;
    tracing::info!(stats = ?redirect.stats(), "redirect counters");
    redirect
        .shutdown()
        .map_err(|e: RedirectError| CliError::Sandbox(SandboxError::Redirect(e)))?;
    let outcome = result?;
    if h.json {
        let line = serde_json::to_string(&outcome)
            .map_err(|e| CliError::Io("encoding the outcome".into(), std::io::Error::other(e)))?;
        out(&format!("{line}\n"))?;
    } else {
        out(&format!(
            "session: {}\nworkspace: {}\ncapture log: {}\n",
            outcome.session,
            outcome.workspace.display(),
            outcome.capture_log.display()
        ))?;
    }
    tracing::info!(session = %outcome.session, capture_log = %outcome.capture_log.display(), "harness session finished");
    let code = match outcome.main().map(|s| &s.end) {
        Some(StepEnd::Exited { code }) => u8::try_from(*code).unwrap_or(1),
        Some(StepEnd::TimedOut) => 124,
        Some(StepEnd::Stopped) => 130,
        _ => 125,
    };
    Ok(ExitCode::from(code))
}
