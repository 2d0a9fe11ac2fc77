//! `polar config check --probe` through the real binary: a backend whose
//! replica answers (the mock inference server, on loopback) and one whose
//! only replica listens nowhere; each replica named with what it answered,
//! the dead backend named, exit 1.

use std::process::Command;

use anyhow::{Result, ensure};
use polar_mock::{self as mock, MockConfig};
use polar_tests::{polar_bin, write_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_names_each_replica_and_the_backend_without_one() -> Result<()> {
    let live = mock::start(MockConfig {
        served_model: "default".into(),
        ..MockConfig::default()
    })
    .await?;
    // A port nothing listens on once the listener is dropped.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let dir = tempfile::tempdir()?;
    let body = format!(
        r#"[[backend]]
name = "policy"
dialect = "vllm"
replicas = ["http://{live}"]
served_model = "default"

[[backend]]
name = "judge"
dialect = "vllm"
replicas = ["http://{dead}"]
served_model = "default"
connect_timeout_ms = 500
"#,
        live = live.addr
    );
    let file = write_config(dir.path(), &body)?;
    let out = Command::new(polar_bin()?)
        .args(["config", "check", "--probe", &file.display().to_string()])
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.code() == Some(1),
        "exit {:?}: {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let probe: Vec<&str> = stdout.lines().filter(|l| l.starts_with("probe:")).collect();
    ensure!(
        probe
            == [
                format!("probe: backend policy replica http://{}: GET /health answered", live.addr).as_str(),
                format!("probe: backend judge replica http://{dead}: GET /health did not answer 2xx within 2500 ms (not running, wrong address, or not a model server)").as_str(),
                "probe: backend judge has no healthy replica: a node with this file registers but gets no session until one answers",
            ],
        "{stdout}"
    );
    // Without --probe nothing is asked: valid, exit 0.
    let out = Command::new(polar_bin()?)
        .args(["config", "check", &file.display().to_string()])
        .output()?;
    ensure!(out.status.success(), "{out:?}");
    ensure!(
        !String::from_utf8_lossy(&out.stdout).contains("probe:"),
        "{out:?}"
    );
    Ok(())
}
