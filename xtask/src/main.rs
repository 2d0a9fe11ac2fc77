//! `cargo xtask`: set-up, build, test and demo commands for the Polar
//! workspace (see the README).
//!
//! This file only parses the command line; each command lives in its own
//! module and every external program runs through [`cmd::Cmd`].
#![forbid(unsafe_code)]

mod background;
mod chat_models;
mod cmd;
mod daemon;
mod dashboard;
mod demo;
mod dist;
mod docker;
mod fuzz;
mod fuzz_coverage;
mod group;
mod harnesses;
mod layers;
mod python;
mod release;
mod setup;
mod slurm;
mod stack;
mod test;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Polar's development commands"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what is missing: Debian packages, nightly + rust-src,
    /// bpf-linker, cargo-deny, the Python client's test environments.
    Setup,
    /// Install the six harness CLIs (versions pinned in harnesses/) into
    /// .polar-cache/harnesses, and the Python harness presets' virtual
    /// environments into .polar-cache/venvs, unless already there.
    Harnesses,
    /// Install the real tokenizers and chat templates polar-template's
    /// differential test renders with (.polar-cache/chat-models) and its
    /// transformers reference environment (.polar-cache/venvs/chat-template).
    ChatModels,
    /// Set up, then build the release `polar` binary.
    Build,
    /// Set up, build the release binary and lay out a self-contained
    /// release (binary, example configs, systemd units, docs, manual, k8s
    /// manifests, the Slurm batch script) in target/dist/, plus its .tar.gz.
    Dist,
    /// Set up, then run formatting, clippy, the layer check, cargo-deny, the
    /// debug build and all tests (privileged ones need root).
    Test(test::TestArgs),
    /// Run the fuzz targets of fuzz/ (cargo fuzz, nightly), each for
    /// `--secs` seconds, from their committed corpora.
    Fuzz(fuzz::FuzzArgs),
    /// Check the crate layering against the table in xtask/src/layers.rs
    /// and that the crate graph in ARCHITECTURE.md is up to date.
    Layers {
        /// Rewrite the crate graph in ARCHITECTURE.md instead of failing
        /// when it is out of date.
        #[arg(long)]
        write: bool,
    },
    /// Set up what the demo needs, build, and run a rollout on loopback: a
    /// small Python agent and Claude Code, in sandboxes, captured by the
    /// agent.
    Demo(demo::DemoArgs),
    /// Run only the dashboard's browser tests (root: they start a gateway)
    /// against `target/debug/polar` (built first); with
    /// `POLAR_DASHBOARD_SCREENSHOTS=docs/dashboard` they refresh the
    /// screenshots docs/DASHBOARD.md shows.
    Dashboard,
    /// Start the tests' Slurm cluster on this machine (two slurmd,
    /// `polar-n1`, `polar-n2`), run a command with `SLURM_CONF` and
    /// `POLAR_TEST_SLURM_CONF` pointing at it, then stop the cluster.
    Slurm {
        /// The command, e.g. `sbatch --wrap hostname` or `sinfo`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// What `cargo xtask test` installs in the background while it builds:
    /// the Python environments, the harness CLIs, the Docker test image and
    /// the browser clients.
    #[command(name = background::SUBCOMMAND, hide = true)]
    TestDownloads {
        /// Only what the unprivileged tests need.
        #[arg(long)]
        unprivileged: bool,
    },
}

fn main() -> ExitCode {
    let task = Cli::parse().task;
    let result = group::forward_interrupts().and_then(|()| match task {
        Task::Setup => setup::run(setup::Scope::All),
        Task::Harnesses => harnesses::run().map(|_| ()),
        Task::ChatModels => chat_models::run().map(|_| ()),
        Task::Build => release::run(),
        Task::Dist => dist::run(),
        Task::Test(args) => test::run(args),
        Task::Fuzz(args) => fuzz::run(args),
        Task::Layers { write } => layers::run(write),
        Task::Demo(args) => demo::run(args),
        Task::Dashboard => dashboard::run_alone(),
        Task::Slurm { command } => slurm::run_with(&command),
        Task::TestDownloads { unprivileged } => background::run(!unprivileged),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
