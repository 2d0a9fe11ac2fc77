//! `polar agent` whose node token the rollout server refuses, through the
//! real binaries (root only: the agent attaches its eBPF programs before it
//! registers): a `polar rollout serve` process on loopback and a `polar
//! agent` with a wrong `gateway.token`. The agent says at once that the
//! server refused this node's token for its node id (with the server's
//! word on the token the endpoint needs), exits with the authentication
//! code 4, and does not retry or linger (it used to wait 10 s for its
//! cleanup guardian, which waited for it in turn).
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use polar_tests::{polar_bin, sandbox_tempdir};

const NODE: &str = "gw-auth";

/// A `polar rollout serve` process, stopped (by its pid) when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `polar rollout serve` on a free loopback port taking `token` for
/// [`NODE`]; returns it with its URL once it accepts connections.
fn serve(dir: &Path, node_token: &str) -> Result<(Server, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = dir.join("rollout.toml");
    std::fs::write(
        &config,
        format!(
            "[rollout]\nlisten = \"127.0.0.1:{port}\"\ndatabase = \"{db}\"\n\
             gateway_token = \"agent-auth-gateway-token\"\ntokens = [\"agent-auth-trainer-token\"]\n\
             [rollout.node_tokens]\n{NODE} = \"{node_token}\"\n",
            db = dir.join("rollout.sqlite").display(),
        ),
    )?;
    let log = dir.join("rollout.log");
    let child = Command::new(polar_bin()?)
        .args(["rollout", "serve", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let mut server = Server(child);
    let until = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = server.0.try_wait()? {
            bail!(
                "polar rollout serve exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        ensure!(Instant::now() < until, "polar rollout serve did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((server, format!("http://127.0.0.1:{port}")))
}

#[test]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
fn a_refused_node_token_is_an_auth_error_naming_the_node_at_once() -> Result<()> {
    let dir = sandbox_tempdir()?;
    let (_server, url) = serve(dir.path(), "agent-auth-node-token")?;
    let state = dir.path().join("state");
    std::fs::create_dir(&state)?;
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    // Nothing answers the backend's replica: the node would register as
    // backend_down, which does not stop it.
    let replica = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = \"{state}\"\n\n[[backend]]\nname = \"local\"\n\
             dialect = \"vllm\"\nreplicas = [\"http://{replica}\"]\nserved_model = \"default\"\n\n\
             [gateway]\nserver = \"{url}\"\nnode_id = \"{NODE}\"\nlisten = \"{listen}\"\n\
             token = \"agent-auth-wrong-token\"\naccept_tokens = [\"agent-auth-gateway-token\"]\n\
             export = \"{export}\"\n",
            state = state.display(),
            export = dir.path().join("out").display(),
        ),
    )?;
    let started = Instant::now();
    let out = Command::new(polar_bin()?)
        .args(["agent", "--config"])
        .arg(&config)
        .env_remove("POLAR_GATEWAY_TOKEN")
        .stdin(Stdio::null())
        .output()
        .context("running polar agent")?;
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(4),
        "exit {:?}: {stderr}",
        out.status
    );
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    ensure!(errors.len() == 1, "one error expected: {stderr}");
    ensure!(
        errors[0].ends_with(&format!(
            "the rollout server {url} refused this node's token for node `{NODE}`: this endpoint \
             needs the node's own token (rollout.node_tokens); the token presented is not a token \
             this server accepts. The token comes from gateway.token, token_file, token_dir or \
             POLAR_GATEWAY_TOKEN; the server takes the one in its rollout.node_tokens.{NODE}."
        )),
        "{}",
        errors[0]
    );
    ensure!(
        !stderr.contains("retrying"),
        "a 401 is not retried: {stderr}"
    );
    // Not a speed target: the refused start used to wait out the cleanup
    // guardian's 10 s deadline by construction; now nothing waits.
    ensure!(
        took < Duration::from_secs(8),
        "polar agent took {took:?} to give up: {stderr}"
    );
    Ok(())
}
