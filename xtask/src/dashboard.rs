//! The dashboard's browser tests (a step of `cargo xtask test`, with root):
//! Debian's `chromium` driven by playwright-core's Node client, then
//! Debian's `firefox-esr` driven by puppeteer-core over WebDriver BiDi
//! (both browsers installed by the set-up; both clients pinned in
//! `tests/dashboard/package.json` and its lock file, installed under
//! `.polar-cache/dashboard-tests/`; `npx playwright install` is never used
//! and puppeteer downloads nothing: the browsers are the system's;
//! `tests/dashboard/driver.mjs` puts both behind one page interface, so
//! the checks are written once), against a stack
//! like the demo's on loopback: the mock inference server, a rollout
//! server with a viewer token, `[rollout.dashboard] export_roots` and the
//! mock's own vocabulary as its `tokenizer` (`polar mock-backend
//! --write-tokenizer`, so that the viewer shows token text), and one
//! gateway node, all from `target/debug/polar`. The script,
//! `tests/dashboard/dashboard.test.mjs`, says what it checks; it writes
//! its screenshots to `target/polar-dashboard/screenshots/` (or the
//! directory in `POLAR_DASHBOARD_SCREENSHOTS`, such as `docs/dashboard`
//! to refresh the ones docs/DASHBOARD.md shows; the first browser's) and
//! its measurements, per browser, to
//! `target/polar-dashboard/measurements.json`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::cmd::{Cmd, workspace_root};
use crate::daemon::{free_ports, tail};
use crate::harnesses::{Install, node_and_npm};
use crate::stack::{LOGS, Stack, TOKENIZER_FILE};

const TRAINER_TOKEN: &str = "dash-trainer-token";
const VIEWER_TOKEN: &str = "dash-viewer-token";
const NODE_TOKEN: &str = "dash-node-token";
const FAKE_NODE_TOKEN: &str = "dash-fake-node-token";
const GATEWAY_TOKEN: &str = "dash-gateway-token";
const NODE_ID: &str = "dash-node";
/// A node the script plays itself, to hand the server a result naming a
/// 200,000-token trace it wrote.
const FAKE_NODE_ID: &str = "dash-fake-node";
/// The system's browsers (Debian's `chromium` and `firefox-esr`), in the
/// order the test runs them (the first takes the screenshots).
const BROWSERS: [(&str, &str); 2] = [
    ("chromium", "/usr/bin/chromium"),
    ("firefox", "/usr/bin/firefox-esr"),
];
/// The Debian packages of [`BROWSERS`].
const BROWSER_PACKAGES: [&str; 2] = ["chromium", "firefox-esr"];
/// playwright-core and puppeteer-core 24 run on Node 20 and later.
const NODE_MAJOR: u32 = 20;

/// Installs playwright-core and puppeteer-core from the pinned manifest
/// and lock file (once:
/// a stamp makes a second run a no-op); returns its `node_modules`.
pub fn install() -> Result<PathBuf> {
    let root = workspace_root()?;
    let src = root.join("tests/dashboard");
    let read = |name: &str| {
        std::fs::read_to_string(src.join(name))
            .with_context(|| format!("reading tests/dashboard/{name}"))
    };
    let inst = Install {
        what: "playwright-core and puppeteer-core",
        dir: root.join(".polar-cache/dashboard-tests"),
        manifest: read("package.json")?,
        lock: read("package-lock.json")?,
        binaries: &["playwright-core"],
    };
    if !inst.is_current() {
        node_and_npm(NODE_MAJOR)?;
        inst.npm_install()?;
    }
    Ok(inst.dir.join("node_modules"))
}

/// `cargo xtask dashboard`: the browsers, the debug build, then [`run`].
pub fn run_alone() -> Result<()> {
    if !crate::cmd::is_root()? {
        anyhow::bail!("the dashboard's browser tests start a gateway, which needs root");
    }
    crate::setup::apt_packages(&BROWSER_PACKAGES)?;
    Cmd::cargo()?.args(["build", "--bin", "polar"]).run()?;
    run()
}

/// Starts the stack, runs the browser tests, stops the stack.
pub fn run() -> Result<()> {
    let modules = install()?;
    let root = workspace_root()?;
    let polar = root.join("target/debug/polar");
    let dir = root.join("target/polar-dashboard");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // The sandboxes' user traverses it to the agent's trust bundle.
    set_mode(&dir, 0o711)?;
    let ports = free_ports()?;
    let config = dir.join("polar.toml");
    std::fs::write(&config, config_text(&dir, &root, ports))?;
    let [mock_port, server_port, _] = ports;
    let stack = Stack::start(&polar, &dir, &config, ports, None)?;
    let shots = match std::env::var_os("POLAR_DASHBOARD_SCREENSHOTS") {
        Some(d) => root.join(d),
        None => dir.join("screenshots"),
    };
    std::fs::create_dir_all(&shots)?;
    let mut test = Cmd::new("node")?;
    test = test
        .arg(root.join("tests/dashboard/dashboard.test.mjs"))
        .env("POLAR_DASHBOARD_MODULES", &modules)
        .env("POLAR_BROWSERS", BROWSERS.map(|(kind, _)| kind).join(","));
    for (kind, path) in BROWSERS {
        test = test.env(&format!("POLAR_{}", kind.to_uppercase()), path);
    }
    let result = test
        .env("POLAR_SERVER", format!("http://127.0.0.1:{server_port}"))
        .env("POLAR_MOCK", format!("http://127.0.0.1:{mock_port}"))
        .env("POLAR_TRAINER_TOKEN", TRAINER_TOKEN)
        .env("POLAR_VIEWER_TOKEN", VIEWER_TOKEN)
        .env("POLAR_NODE_ID", NODE_ID)
        .env("POLAR_FAKE_NODE_ID", FAKE_NODE_ID)
        .env("POLAR_FAKE_NODE_TOKEN", FAKE_NODE_TOKEN)
        .env("POLAR_EXPORT_DIR", dir.join("trajectories"))
        .env("POLAR_MINI_AGENT", root.join("examples/mini_agent.py"))
        .env("POLAR_SCREENSHOTS", &shots)
        .env("POLAR_MEASUREMENTS", dir.join("measurements.json"))
        .env("POLAR_WORK_DIR", &dir)
        .run();
    stack.stop();
    if result.is_err() {
        for (what, log) in &LOGS[1..] {
            eprintln!(
                "--- {what} log (last lines) ---\n{}",
                tail(&dir.join(log), 30)
            );
        }
    }
    result.context("the dashboard's browser tests failed")
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

fn config_text(dir: &Path, root: &Path, [mock, server, gateway]: [u16; 3]) -> String {
    format!(
        r#"# Written by `cargo xtask test` for the dashboard's browser tests.
[agent]
state_dir = "{state}"

[[backend]]
name = "local"
dialect = "vllm"
replicas = ["http://127.0.0.1:{mock}"]
served_model = "default"

[rollout]
listen = "127.0.0.1:{server}"
database = "{db}"
tokens = ["{TRAINER_TOKEN}"]
viewer_tokens = ["{VIEWER_TOKEN}"]
gateway_token = "{GATEWAY_TOKEN}"
heartbeat_interval_ms = 500

[rollout.node_tokens]
{NODE_ID} = "{NODE_TOKEN}"
{FAKE_NODE_ID} = "{FAKE_NODE_TOKEN}"

[rollout.dashboard]
export_roots = ["{traj}"]
tokenizer = "{tokenizer}"

[gateway]
server = "http://127.0.0.1:{server}"
node_id = "{NODE_ID}"
listen = "127.0.0.1:{gateway}"
token = "{NODE_TOKEN}"
accept_tokens = ["{GATEWAY_TOKEN}"]
heartbeat_interval_ms = 500
running_workers = 2
ready_buffer = 2
export = "{traj}"
formats = ["parquet", "jsonl"]
drain_timeout_secs = 20

[gateway.policy]
upload_roots = ["{examples}"]
"#,
        examples = root.join("examples").display(),
        state = dir.join("state").display(),
        db = dir.join("rollout.sqlite").display(),
        traj = dir.join("trajectories").display(),
        tokenizer = dir.join(TOKENIZER_FILE).display(),
    )
}
