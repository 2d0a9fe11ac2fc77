//! `polar install` and `polar uninstall` (see [`crate::install`]), and the
//! hidden `polar __manual` that prints the long help of every command, which
//! `cargo xtask dist` ships as the manual.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use super::CliError;
use crate::install::{InstallOptions, UninstallOptions};

/// `polar install`.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallArgs {
    /// Install below this directory instead of `/` (an image being built, a
    /// scratch directory).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// The agent configuration to install as /etc/polar/agent.toml
    /// (validated first; an existing file is kept). Default: the example.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Write the units but do not enable polar-agent.service.
    #[arg(long)]
    pub no_enable: bool,
}

/// `polar uninstall`.
#[derive(Debug, Clone, clap::Args)]
pub struct UninstallArgs {
    /// The directory `polar install --root` used.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Also remove the configuration and the state (CA, session logs).
    #[arg(long)]
    pub purge: bool,
}

fn out(text: &str) -> Result<(), CliError> {
    std::io::stdout()
        .lock()
        .write_all(format!("{text}\n").as_bytes())
        .map_err(CliError::from)
}

/// Runs `polar install`.
pub fn install(args: InstallArgs) -> Result<ExitCode, CliError> {
    let binary = std::env::current_exe()
        .map_err(|e| CliError::Io("finding the running binary".into(), e))?;
    let report = crate::install::install(&InstallOptions {
        root: args.root,
        config: args.config,
        enable: !args.no_enable,
        binary,
    })?;
    out(&report.to_string())?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `polar uninstall`: exit 1 when something that should be gone
/// remains (a cgroup that could not be removed, a program without a live
/// holder, a check that could not be made).
pub fn uninstall(args: UninstallArgs) -> Result<ExitCode, CliError> {
    let report = crate::install::uninstall(&UninstallOptions {
        root: args.root,
        purge: args.purge,
    })?;
    out(&report.to_string())?;
    for l in &report.leftovers {
        if l.is_live() {
            tracing::warn!("{l}");
        } else {
            tracing::error!("{l}");
        }
    }
    Ok(if report.leftovers.iter().all(|l| l.is_live()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The long help of `cmd` and of every visible subcommand, depth first,
/// each under a `polar SUB ...` heading.
pub fn manual(cmd: &mut clap::Command) -> String {
    let mut text = String::new();
    walk(cmd, &mut Vec::new(), &mut text);
    text
}

fn walk(cmd: &mut clap::Command, path: &mut Vec<String>, text: &mut String) {
    path.push(cmd.get_name().to_owned());
    let title = path.join(" ");
    text.push_str(&format!("{title}\n{}\n\n", "=".repeat(title.len())));
    text.push_str(&cmd.render_long_help().to_string());
    text.push_str("\n\n");
    for sub in cmd.get_subcommands_mut() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        walk(sub, path, text);
    }
    path.pop();
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_manual_has_every_visible_command_and_no_hidden_one() {
        let mut cmd = super::super::Cli::command();
        cmd.build();
        let text = super::manual(&mut cmd);
        for heading in [
            "polar\n=====",
            "polar sandbox run\n",
            "polar install\n",
            "polar uninstall\n",
            "polar rollout serve\n",
            "polar config check\n",
        ] {
            assert!(text.contains(heading), "{heading:?} missing");
        }
        assert!(text.contains("--purge"), "long help of uninstall");
        assert!(!text.contains("polar __reap"), "hidden commands stay out");
        assert!(!text.contains("polar __manual"), "hidden commands stay out");
        assert!(!text.contains("polar __unit"), "hidden commands stay out");
    }
}
