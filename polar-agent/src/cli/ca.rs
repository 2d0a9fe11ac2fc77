//! `polar ca init | show | export | rotate`: Polar's CA in the agent's state
//! directory, name-constrained to what the routing rules intercept.

use std::io::Write as _;
use std::path::PathBuf;

use clap::Subcommand;

use super::{CliError, ConfigArgs};
use polar_node::agent::{ca_options, constraints_for};
use polar_tls::Ca;

/// `polar ca ...`
#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create the CA (refuses to overwrite one: use `rotate`).
    Init(ConfigArgs),
    /// Print the CA's subject, fingerprint, validity and name constraints.
    Show(ConfigArgs),
    /// Write the CA certificate (PEM) to stdout or a file.
    Export {
        /// The configuration.
        #[command(flatten)]
        config: ConfigArgs,
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Replace the CA with a new one for the current routing rules; the old
    /// certificate stays in the sandboxes' bundle while sessions drain.
    Rotate(ConfigArgs),
}

/// Runs a `polar ca` command.
pub fn run(cmd: CaCommand) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match cmd {
        CaCommand::Init(args) => {
            let config = args.load()?;
            let ca = Ca::init_with(
                &config.agent.state_dir,
                &constraints_for(&config),
                &ca_options(&config),
            )?;
            write!(out, "{}", ca.summary())?;
        }
        CaCommand::Show(args) => {
            let config = args.load()?;
            write!(out, "{}", Ca::load(&config.agent.state_dir)?.summary())?;
        }
        CaCommand::Export { config, out: file } => {
            let config = config.load()?;
            let ca = Ca::load(&config.agent.state_dir)?;
            match file {
                Some(path) => std::fs::write(&path, ca.cert_pem())
                    .map_err(|e| CliError::Io(path.display().to_string(), e))?,
                None => out.write_all(ca.cert_pem().as_bytes())?,
            }
        }
        CaCommand::Rotate(args) => {
            let config = args.load()?;
            let ca = Ca::rotate(
                &config.agent.state_dir,
                &constraints_for(&config),
                &ca_options(&config),
            )?;
            write!(out, "{}", ca.summary())?;
        }
    }
    Ok(())
}
