//! The stack `cargo xtask demo` and the dashboard's browser tests run on
//! loopback, from one `polar` binary: the mock inference server (with its
//! vocabulary written as `tokenizer.json` for the dashboard's token text),
//! a rollout server and one gateway node, each a [`Daemon`] logging into
//! the stack's directory, stopped gracefully in the reverse order.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use crate::cmd::Cmd;
use crate::daemon::{Daemon, LISTEN_WAIT, listening};

/// The mock's vocabulary, in the stack's directory (the configuration's
/// `[rollout.dashboard] tokenizer`).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The logs of the mock, the server and the gateway, in the stack's
/// directory.
pub const LOGS: [(&str, &str); 3] = [
    ("mock inference server", "mock-backend.log"),
    ("rollout server", "rollout-server.log"),
    ("gateway", "gateway.log"),
];

/// The three daemons, running.
pub struct Stack {
    mock: Daemon,
    server: Daemon,
    gateway: Daemon,
}

impl Stack {
    /// Writes the mock's `tokenizer.json` into `dir`, then starts the mock
    /// on `ports[0]` and, with `config` (which names `ports[1]` and
    /// `ports[2]`), the rollout server and the gateway, each waited for
    /// until it listens. `harness_dir`: where the gateway finds the
    /// harness CLIs (`POLAR_HARNESS_DIR`).
    pub fn start(
        polar: &Path,
        dir: &Path,
        config: &Path,
        [mock_port, server_port, gateway_port]: [u16; 3],
        harness_dir: Option<&Path>,
    ) -> Result<Self> {
        Cmd::new(polar)?
            .args(["mock-backend", "--write-tokenizer"])
            .arg(dir.join(TOKENIZER_FILE))
            .run()?;
        let [mock_log, server_log, gateway_log] = LOGS.map(|(what, log)| (what, dir.join(log)));
        let mock = Daemon::start(
            mock_log.0,
            Cmd::new(polar)?
                .args(["mock-backend", "--listen"])
                .arg(format!("127.0.0.1:{mock_port}"))
                .args(["--served-model", "default"]),
            &mock_log.1,
            LISTEN_WAIT,
            listening(mock_port),
        )?;
        let server = Daemon::start(
            server_log.0,
            Cmd::new(polar)?
                .args(["rollout", "serve", "--config"])
                .arg(config),
            &server_log.1,
            LISTEN_WAIT,
            listening(server_port),
        )?;
        let mut gateway = Cmd::new(polar)?.args(["agent", "--config"]).arg(config);
        if let Some(prefix) = harness_dir {
            gateway = gateway.env("POLAR_HARNESS_DIR", prefix);
        }
        let gateway = Daemon::start(
            gateway_log.0,
            gateway,
            &gateway_log.1,
            LISTEN_WAIT,
            listening(gateway_port),
        )?;
        Ok(Self {
            mock,
            server,
            gateway,
        })
    }

    /// Stops the gateway (it drains and detaches its eBPF programs), then
    /// the server, then the mock.
    pub fn stop(mut self) {
        self.gateway.stop(Duration::from_secs(30));
        self.server.stop(Duration::from_secs(10));
        self.mock.stop(Duration::from_secs(5));
    }
}
