//! `polar config check` runs exactly the checks of the commands a file is
//! for: the shipped examples and every refusal case are fed to the check and
//! to the command itself (`polar rollout serve`, `polar agent`, which refuse
//! before they bind or create anything), and both say the same; a file the
//! check passes names the commands it was checked as.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context as _, Result, ensure};
use polar_tests::polar_bin;

const TRAINER: &str = "3f9c1e7a5b2d4c6e8f0a1b3c5d7e9f11";
const NODE: &str = "8e1d3c5b7a9f0e2d4c6b8a0f1e3d5c7b";
const GATEWAY: &str = "5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b";

fn polar(args: &[&str]) -> Result<Output> {
    Command::new(polar_bin()?)
        .args(args)
        .env_remove("POLAR_ROLLOUT_TOKEN")
        .env_remove("POLAR_ROLLOUT_NODE_TOKEN")
        .env_remove("POLAR_CONFIG")
        .env("NO_COLOR", "1")
        .output()
        .context("running polar")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A file in a fresh directory (its state directory inside it, so that
/// nothing the agent would create can land elsewhere).
fn file(dir: &Path, name: &str, toml: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    let state = dir.join("state");
    std::fs::write(
        &path,
        format!("[agent]\nstate_dir = \"{}\"\n\n{toml}", state.display()),
    )?;
    Ok(path)
}

/// `polar config check` refuses `path` for `command`, and the command
/// itself refuses it with the same reason, which holds `expect`.
fn both_refuse(path: &Path, command: &str, run: &[&str], expect: &str) -> Result<()> {
    let file = path.display().to_string();
    let check = polar(&["config", "check", &file])?;
    let said = text(&check);
    ensure!(
        !check.status.success(),
        "config check passed {file}: {said}"
    );
    let marker = format!("not valid for {command}: ");
    let reason = said
        .split_once(&marker)
        .map(|(_, r)| r.trim().to_owned())
        .with_context(|| format!("no {marker:?} in: {said}"))?;
    ensure!(reason.contains(expect), "expected {expect:?} in: {said}");
    let mut argv: Vec<&str> = run.to_vec();
    argv.extend(["--config", &file]);
    let direct = polar(&argv)?;
    let direct_said = text(&direct);
    ensure!(
        !direct.status.success(),
        "{command} accepted {file}: {direct_said}"
    );
    ensure!(
        direct_said.contains(&reason),
        "{command} refused {file} otherwise: {direct_said}\n(config check: {reason})"
    );
    Ok(())
}

fn rollout(extra: &str) -> String {
    format!("[rollout]\nlisten = \"127.0.0.1:0\"\ntokens = [\"{TRAINER}\"]\n{extra}")
}

#[test]
fn the_shipped_examples_are_checked_as_their_commands_check_them() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let node = root.join("config/polar.example.toml");
    let out = polar(&["config", "check", &node.display().to_string()])?;
    let said = text(&out);
    ensure!(out.status.success(), "{said}");
    ensure!(
        said.contains("checked as: polar proxy, polar sandbox run\n"),
        "{said}"
    );
    ensure!(
        said.contains("polar agent: not for it (no [gateway] table)"),
        "{said}"
    );
    // The rollout example holds the docs' example tokens: the server refuses
    // them, so the check does too.
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("rollout.db").display().to_string();
    both_refuse(
        &root.join("config/rollout.example.toml"),
        "polar rollout serve",
        &[
            "rollout",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database",
            &db,
        ],
        "example token from the docs",
    )
}

#[test]
fn rollout_refusals_are_the_server_s() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("rollout.db").display().to_string();
    let serve = [
        "rollout",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--database",
        &db,
    ];
    let cases = [
        (
            "list-form node tokens",
            rollout(&format!(
                "node_tokens = [\"{NODE}\"]\ngateway_token = \"{GATEWAY}\"\n"
            )),
            "rollout.node_tokens",
        ),
        (
            "no gateway token",
            rollout(&format!("[rollout.node_tokens]\nn1 = \"{NODE}\"\n")),
            "gateway_token",
        ),
        (
            "a token for two roles",
            rollout(&format!(
                "gateway_token = \"{TRAINER}\"\n[rollout.node_tokens]\nn1 = \"{NODE}\"\n"
            )),
            "gateway_token",
        ),
        (
            "no node token",
            rollout(&format!("gateway_token = \"{GATEWAY}\"\n")),
            "node_tokens",
        ),
    ];
    for (i, (what, toml, expect)) in cases.iter().enumerate() {
        let path = file(dir.path(), &format!("rollout-{i}.toml"), toml)?;
        both_refuse(&path, "polar rollout serve", &serve, expect)
            .with_context(|| what.to_string())?;
    }
    // The same file with its identities complete is checked as the server's.
    let path = file(
        dir.path(),
        "rollout-ok.toml",
        &rollout(&format!(
            "gateway_token = \"{GATEWAY}\"\n[rollout.node_tokens]\nn1 = \"{NODE}\"\n"
        )),
    )?;
    let out = polar(&["config", "check", &path.display().to_string()])?;
    let said = text(&out);
    ensure!(out.status.success(), "{said}");
    ensure!(
        said.contains("checked as: polar proxy, polar sandbox run, polar rollout serve\n"),
        "{said}"
    );
    ensure!(
        said.contains("1 trainer token(s), 1 node token(s)"),
        "{said}"
    );
    Ok(())
}

#[test]
fn gateway_refusals_are_the_agent_s() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let gateway = |extra: &str| {
        format!(
            "[gateway]\nserver = \"http://127.0.0.1:9\"\nnode_id = \"n1\"\ntoken = \"{NODE}\"\n\
             accept_tokens = [\"{GATEWAY}\"]\n{extra}"
        )
    };
    let state = dir.path().join("state").display().to_string();
    let cases = [
        (
            "a weak node token",
            format!(
                "[gateway]\nserver = \"http://127.0.0.1:9\"\nnode_id = \"n1\"\ntoken = \"short\"\n\
                 accept_tokens = [\"{GATEWAY}\"]\n"
            ),
            "gateway.token",
        ),
        (
            "an upload root holding the state directory",
            gateway(&format!("[gateway.policy]\nupload_roots = [\"{state}\"]\n")),
            "upload_roots",
        ),
        ("an unknown key", gateway("zz_unknown = 1\n"), "zz_unknown"),
    ];
    for (i, (what, toml, expect)) in cases.iter().enumerate() {
        let path = file(dir.path(), &format!("gateway-{i}.toml"), toml)?;
        both_refuse(&path, "polar agent", &["agent"], expect).with_context(|| what.to_string())?;
    }
    let path = file(dir.path(), "gateway-ok.toml", &gateway(""))?;
    let out = polar(&["config", "check", &path.display().to_string()])?;
    let said = text(&out);
    ensure!(out.status.success(), "{said}");
    ensure!(
        said.contains("checked as: polar proxy, polar sandbox run, polar agent\n"),
        "{said}"
    );
    ensure!(
        said.contains("gateway: node n1 of http://127.0.0.1:9"),
        "{said}"
    );
    Ok(())
}
