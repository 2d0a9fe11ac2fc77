//! The `docker` and `apptainer` runtimes against their real engines (root
//! only). Neither engine runs on the project's CI machines: each test checks
//! for its engine (`docker info`, `apptainer --version`) and, without it,
//! prints why it did not run and passes. Their command lines are
//! unit-tested in `polar-agent` (`runtime::docker`, `runtime::apptainer`).
//!
//! Images: `POLAR_TEST_DOCKER_IMAGE` (default `debian:bookworm-slim`) and
//! `POLAR_TEST_APPTAINER_IMAGE` (default `docker://debian:bookworm-slim`),
//! which must be available to the engine without a network.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::process::{Command, Stdio};

use anyhow::{Result, ensure};
use polar_tests::{sandbox_tempdir, session_run, write_config};

fn engine_works(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run_in(kind: &str, image: &str) -> Result<()> {
    let tmp = sandbox_tempdir()?;
    let cfg = write_config(tmp.path(), "")?.display().to_string();
    let spec = tmp.path().join("rt.toml");
    std::fs::write(
        &spec,
        format!(
            "kind = \"{kind}\"\nimage = \"{image}\"\n[limits]\npids = 128\n\
             [[prepare]]\nrun = \"echo prepared > prepared.txt\"\n"
        ),
    )?;
    let run = session_run(
        &[
            "--config",
            &cfg,
            "--runtime",
            &spec.display().to_string(),
            "--budget-secs",
            "120",
        ],
        &[
            "sh",
            "-c",
            "test -f prepared.txt && id -u > uid.txt && echo $POLAR_SESSION > session.txt",
        ],
    )?;
    ensure!(
        run.code() == Some(0),
        "{kind}: {}\n{}",
        run.finished.stderr(),
        run.main_logs()
    );
    let ws = run.workspace();
    ensure!(std::fs::read_to_string(ws.join("uid.txt"))?.trim() == "65534");
    ensure!(
        std::fs::read_to_string(ws.join("session.txt"))?.trim()
            == run.outcome["session"].as_str().unwrap_or_default()
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn docker_runtime_runs_steps_in_a_container() -> Result<()> {
    if !engine_works("docker", "info") {
        eprintln!(
            "skipped: `docker info` fails here (no Docker engine); the docker command lines are unit-tested"
        );
        return Ok(());
    }
    let image = std::env::var("POLAR_TEST_DOCKER_IMAGE")
        .unwrap_or_else(|_| "debian:bookworm-slim".to_owned());
    run_in("docker", &image)
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn apptainer_runtime_runs_steps_in_an_instance() -> Result<()> {
    if !engine_works("apptainer", "--version") {
        eprintln!(
            "skipped: `apptainer --version` fails here (no Apptainer); the apptainer command lines are unit-tested"
        );
        return Ok(());
    }
    let image = std::env::var("POLAR_TEST_APPTAINER_IMAGE")
        .unwrap_or_else(|_| "docker://debian:bookworm-slim".to_owned());
    run_in("apptainer", &image)
}
