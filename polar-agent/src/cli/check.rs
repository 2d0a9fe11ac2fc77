//! `polar config check FILE`: the file checked exactly as each command that
//! reads it checks it before it starts anything, and which commands those
//! are. The node's tables (`[agent]`, `[proxy]`, `[[route]]`,
//! `[[backend]]`, ...) are what `polar proxy`, `polar sandbox run` and
//! `polar agent` read; a `[gateway]` table is checked as `polar agent`
//! checks it ([`super::agent::check`]: token and TLS files read, the
//! policy's roots against the node's secrets, the export destination, the
//! session uids); a `[rollout]` table as `polar rollout serve` checks it
//! ([`super::rollout::ServeArgs::load`], then [`polar_rollout::preflight`]),
//! with the tokens the environment would give the server
//! (`POLAR_ROLLOUT_TOKEN`, `POLAR_ROLLOUT_NODE_TOKEN`).

use std::fmt::Write as _;
use std::path::Path;

use polar_rollout::config::{NODE_TOKEN_ENV, TOKEN_ENV};

use super::rollout::ServeArgs;
use super::{CliError, ConfigArgs};

/// The commands whose checks the node's tables pass.
const NODE_COMMANDS: &str = "polar proxy, polar sandbox run";

/// Checks `file` for every command that reads it; the report to print.
pub fn check(file: &Path) -> Result<String, CliError> {
    let refused = |command: &'static str| {
        move |error: CliError| CliError::NotValidFor {
            file: file.display().to_string(),
            command,
            error: Box::new(error),
        }
    };
    let summary = polar_config::check_file(file)
        .map_err(CliError::from)
        .map_err(refused(NODE_COMMANDS))?;
    let tables = tables(file).map_err(refused(NODE_COMMANDS))?;
    let mut report = format!("{summary}");
    if !report.ends_with('\n') {
        report.push('\n');
    }
    let mut commands = vec![NODE_COMMANDS];
    if tables.contains_key("gateway") {
        let args = ConfigArgs {
            config: Some(file.to_owned()),
            state_dir: None,
        };
        let checked = super::agent::check(&args, file).map_err(refused("polar agent"))?;
        let gw = &checked.gw;
        let _ = writeln!(
            report,
            "gateway: node {} of {}, up to {} sessions at once, exporting to {}",
            gw.node_id, gw.server, gw.max_sessions, checked.export
        );
        commands.push("polar agent");
    }
    if tables.contains_key("rollout") {
        let args = ServeArgs {
            config: Some(file.to_owned()),
            listen: None,
            database: None,
            token: std::env::var(TOKEN_ENV).ok(),
            node_token: std::env::var(NODE_TOKEN_ENV).ok(),
        };
        let mut cfg = args.load().map_err(refused("polar rollout serve"))?;
        polar_rollout::preflight(&mut cfg)
            .map_err(CliError::from)
            .map_err(refused("polar rollout serve"))?;
        let _ = writeln!(
            report,
            "rollout: listening on {}, database {}, {} trainer token(s), {} node token(s)",
            cfg.listen,
            cfg.database.display(),
            cfg.tokens.len(),
            cfg.node_tokens.len()
        );
        commands.push("polar rollout serve");
    }
    if !tables.contains_key("gateway") {
        report.push_str("polar agent: not for it (no [gateway] table)\n");
    }
    if !tables.contains_key("rollout") {
        report.push_str("polar rollout serve: not for it (no [rollout] table)\n");
    }
    let _ = writeln!(report, "checked as: {}", commands.join(", "));
    Ok(report)
}

/// The file's top-level tables (it parsed as the node's configuration, so
/// it is TOML).
fn tables(file: &Path) -> Result<toml::Table, CliError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::Io(format!("reading {}", file.display()), e))?;
    toml::from_str(&text).map_err(|e| CliError::Usage(format!("{}: {e}", file.display())))
}
