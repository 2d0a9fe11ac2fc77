//! An S3-compatible server for the tests: moto (from PyPI) on a free
//! loopback port, started with a bounded wait and killed by its pid when
//! the guard is dropped.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use anyhow::{Context as _, Result, bail, ensure};
use futures_util::TryStreamExt as _;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;

/// The test credentials and region moto accepts.
pub const KEY: &str = "testing";
/// See [`KEY`].
pub const REGION: &str = "us-east-1";

/// Longest wait for the server to answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running moto server.
pub struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Installs moto if needed and starts it on 127.0.0.1.
    pub fn start() -> Result<Self> {
        crate::python::ensure(&["moto", "flask", "flask_cors"], &["moto[server]"])?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting moto")?;
        let mut moto = Self { child, port };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if moto
                .request("GET", "/")?
                .is_some_and(|s| s.starts_with("HTTP/1.1 200"))
            {
                return Ok(moto);
            }
            if let Some(status) = moto.child.try_wait()? {
                bail!("moto exited at start ({status})");
            }
            if Instant::now() > deadline {
                bail!("moto did not answer on 127.0.0.1:{port} within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends a bodiless request; the status line, or `None` when nothing
    /// listens yet.
    fn request(&self, method: &str, path: &str) -> Result<Option<String>> {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return Ok(None);
        };
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        Ok(reply.lines().next().map(str::to_owned))
    }

    /// Creates a bucket (moto accepts unsigned requests).
    pub fn create_bucket(&self, bucket: &str) -> Result<()> {
        let status = self.request("PUT", &format!("/{bucket}"))?;
        match status {
            Some(s) if s.starts_with("HTTP/1.1 200") => Ok(()),
            other => bail!("creating bucket {bucket}: {other:?}"),
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// A client of `bucket` on this server.
    pub fn client(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>> {
        Ok(Arc::new(
            AmazonS3Builder::new()
                .with_endpoint(self.endpoint())
                .with_allow_http(true)
                .with_bucket_name(bucket)
                .with_region(REGION)
                .with_access_key_id(KEY)
                .with_secret_access_key(KEY)
                .build()?,
        ))
    }

    /// `polar export` of the fixture's state directory to `out` (an
    /// `s3://` URL on this server), both formats, credentials from the
    /// environment; its summary, after checking it exported the fixture's
    /// six sessions.
    pub fn export_fixture(&self, out: &str) -> Result<serde_json::Value> {
        let state = tempfile::tempdir()?;
        crate::fixture::write_state_dir(state.path())?;
        let state_arg = state.path().display().to_string();
        let endpoint = self.endpoint();
        let args = [
            "--state-dir",
            state_arg.as_str(),
            "--out",
            out,
            "--s3-endpoint",
            endpoint.as_str(),
            "--format",
            "both",
        ];
        let env = [
            ("AWS_ACCESS_KEY_ID", KEY),
            ("AWS_SECRET_ACCESS_KEY", KEY),
            ("AWS_REGION", REGION),
        ];
        let summary = tokio::task::block_in_place(|| crate::fixture::polar_export(&args, &env))?;
        ensure!(summary["sessions"] == 6, "{summary}");
        Ok(summary)
    }
}

/// The names of the objects in `store`, sorted.
pub async fn list(store: &Arc<dyn ObjectStore>) -> Result<Vec<String>> {
    let mut names: Vec<String> = store
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await?;
    names.sort();
    Ok(names)
}
