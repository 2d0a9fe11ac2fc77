//! The redirect as a library, one agent with several sessions: sessions are
//! told apart (also when they share one listener), the agent's own
//! connections are never redirected, and 100,000 redirected connections
//! leave no stale record in the kernel maps. Root only.
#![cfg_attr(not(feature = "privileged"), allow(dead_code, unused_imports))]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use polar_ids::SessionId;
use polar_io::tasks::Tasks;
use polar_redirect::dns::FakeIps;
use polar_redirect::listener::{AcceptContext, Accepted, Handler, accept_loop};
use polar_redirect::{Redirect, RedirectOptions, SessionCgroup, SessionTarget};
use polar_sandbox::netns::{IsolatedNet, Sockets};
use polar_sandbox::process::{Launch, spawn};
use polar_tests::{json_lines, polar_bin, probe_bin};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the agent saw of one connection: session, original destination,
/// bytes read.
type Seen = (Option<String>, Option<String>, usize);

/// Records who connected where, answers "ok" and closes (first, so the
/// client side keeps no TIME_WAIT).
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<Seen>>,
}

impl Handler for Recorder {
    async fn handle(&self, mut conn: Accepted) {
        let mut buf = [0u8; 256];
        let n = conn.stream.read(&mut buf).await.unwrap_or(0);
        if let Ok(mut seen) = self.seen.lock() {
            seen.push((
                conn.session.map(|s| s.to_string()),
                conn.orig.map(|o| o.to_string()),
                n,
            ));
        }
    }
}

struct Agent {
    redirect: Redirect,
    acceptors: Tasks,
    handlers: Tasks,
    recorder: Arc<Recorder>,
}

impl Agent {
    fn start() -> Result<Self> {
        let redirect = Redirect::start(&RedirectOptions {
            reaper_exe: Some(polar_bin()?),
            sandboxes: None,
        })?;
        Ok(Self {
            redirect,
            acceptors: Tasks::new(),
            handlers: Tasks::new(),
            recorder: Arc::new(Recorder::default()),
        })
    }

    fn serve(&self, sockets: &Sockets, owner: Option<SessionId>) -> Result<()> {
        let ctx = Arc::new(AcceptContext {
            redirect: Some(self.redirect.clone()),
            fake: Arc::new(FakeIps::default()),
            session: owner,
            handler: Arc::clone(&self.recorder),
            handlers: self.handlers.clone(),
        });
        for l in std::iter::once(&sockets.tcp_v4).chain(sockets.tcp_v6.as_ref()) {
            let l = l.try_clone()?;
            l.set_nonblocking(true)?;
            let l = tokio::net::TcpListener::from_std(l)?;
            self.acceptors.spawn(accept_loop(
                l,
                Arc::clone(&ctx),
                self.acceptors.shutdown_token(),
            ));
        }
        Ok(())
    }

    fn session(&self, id: &str, sockets: &Sockets, isolated: bool) -> Result<SessionCgroup> {
        let target = SessionTarget {
            listen_v4: Ipv4Addr::LOCALHOST,
            listen_v6: Ipv6Addr::LOCALHOST,
            tcp_port: sockets.tcp_port(),
            dns_port: sockets.dns_port(),
            local_bypass: isolated,
        };
        Ok(self.redirect.create_session(&id.parse()?, target)?)
    }

    /// Takes in what is queued while the sessions still exist, then ends
    /// them, then lets the handlers finish.
    async fn stop(self, sessions: Vec<SessionCgroup>) -> Result<Vec<Seen>> {
        self.acceptors.drain(Duration::from_secs(5)).await;
        for s in sessions {
            s.end()?;
        }
        let counts = self.redirect.map_counts();
        ensure!(counts.sessions == 0, "sessions left registered: {counts:?}");
        self.handlers.drain(Duration::from_secs(5)).await;
        let seen = self
            .recorder
            .seen
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        self.redirect.shutdown()?;
        Ok(seen)
    }
}

/// Runs the probe in a session and returns its JSON reports.
async fn probe_in(
    session: &SessionCgroup,
    netns: Option<&IsolatedNet>,
    args: &[&str],
) -> Result<Vec<serde_json::Value>> {
    let mut argv: Vec<OsString> = vec![probe_bin()?.into()];
    argv.extend(args.iter().map(OsString::from));
    let dir = session.dir().context("session ended")?;
    let mut child = spawn(Launch {
        argv: &argv,
        cgroup_procs: dir.procs_file()?,
        netns: netns.map(|n| &n.ns),
        env: &[],
        binds: &[],
        stdout: std::process::Stdio::piped(),
        stderr: std::process::Stdio::inherit(),
    })?;
    let mut out = child.stdout.take();
    let status = tokio::time::timeout(Duration::from_secs(300), child.wait()).await??;
    let mut text = Vec::new();
    if let Some(o) = out.as_mut() {
        o.read_to_end(&mut text).await?;
    }
    ensure!(status.success(), "probe failed: {status}");
    Ok(json_lines(&text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn sessions_sharing_one_listener_are_told_apart() -> Result<()> {
    let agent = Agent::start()?;
    let shared = Sockets::bind_loopback()?;
    agent.serve(&shared, None)?;
    let a = agent.session("alpha", &shared, false)?;
    let b = agent.session("beta", &shared, false)?;
    let targets = ["127.10.0.1:443", "[::1]:8443"];
    let mut args = vec!["connect"];
    args.extend(targets);
    let (ra, rb) = tokio::join!(probe_in(&a, None, &args), probe_in(&b, None, &args));
    let (ra, rb) = (ra?, rb?);
    ensure!(
        ra.iter().chain(&rb).all(|r| r["ok"] == true),
        "{ra:?} {rb:?}"
    );
    let seen = agent.stop(vec![a, b]).await?;
    let mut per_session: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (s, o, n) in &seen {
        ensure!(*n > 0, "no bytes: {seen:?}");
        per_session
            .entry(s.clone().unwrap_or_default())
            .or_default()
            .push(o.clone().unwrap_or_default());
    }
    for id in ["alpha", "beta"] {
        let mut got = per_session.remove(id).unwrap_or_default();
        got.sort();
        let mut want: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
        want.sort();
        ensure!(got == want, "{id}: {got:?} from {seen:?}");
    }
    ensure!(per_session.is_empty(), "unexpected: {per_session:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn concurrent_isolated_sessions_are_told_apart() -> Result<()> {
    let agent = Agent::start()?;
    let (na, nb) = (IsolatedNet::create()?, IsolatedNet::create()?);
    agent.serve(&na.sockets, Some("one".parse()?))?;
    agent.serve(&nb.sockets, Some("two".parse()?))?;
    let a = agent.session("one", &na.sockets, true)?;
    let b = agent.session("two", &nb.sockets, true)?;
    let args = ["connect", "127.10.0.1:443", "127.10.0.1:443"];
    let (ra, rb) = tokio::join!(
        probe_in(&a, Some(&na), &args),
        probe_in(&b, Some(&nb), &args)
    );
    let (ra, rb) = (ra?, rb?);
    ensure!(ra.len() == 2 && rb.len() == 2);
    let seen = agent.stop(vec![a, b]).await?;
    for id in ["one", "two"] {
        let n = seen
            .iter()
            .filter(|(s, o, _)| s.as_deref() == Some(id) && o.as_deref() == Some("127.10.0.1:443"))
            .count();
        ensure!(n == 2, "{id}: {seen:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn the_agents_own_connections_are_not_redirected() -> Result<()> {
    let agent = Agent::start()?;
    let shared = Sockets::bind_loopback()?;
    agent.serve(&shared, None)?;
    let session = agent.session("busy", &shared, false)?;
    // A server standing in for an upstream, and the agent (this process,
    // outside the sandbox cgroups) dialling it while a session is active.
    let upstream = tokio::net::TcpListener::bind("127.30.0.1:0").await?;
    let addr: SocketAddr = upstream.local_addr()?;
    let dial = tokio::spawn(async move {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"from the agent").await?;
        anyhow::Ok(s.peer_addr()?)
    });
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(5), upstream.accept()).await??;
    let mut buf = [0u8; 14];
    conn.read_exact(&mut buf).await?;
    ensure!(&buf == b"from the agent");
    ensure!(dial.await?? == addr, "the agent's connection was rewritten");
    let seen = agent.stop(vec![session]).await?;
    ensure!(seen.is_empty(), "the agent's listener saw {seen:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "privileged"), ignore = "needs root: cargo xtask test")]
async fn a_hundred_thousand_connections_leave_no_stale_records() -> Result<()> {
    const N: u64 = 100_000;
    let agent = Agent::start()?;
    let net = IsolatedNet::create()?;
    agent.serve(&net.sockets, Some("many".parse()?))?;
    let session = agent.session("many", &net.sockets, true)?;
    let reports = probe_in(
        &session,
        Some(&net),
        &["loop", "127.10.0.1:443", &N.to_string()],
    )
    .await?;
    ensure!(reports[0]["ok"] == N, "{:?}", reports);
    // Every connection was accepted and looked up; every socket closed.
    let counts = agent.redirect.map_counts();
    ensure!(
        counts.connections == 0,
        "stale connection records: {counts:?}"
    );
    ensure!(counts.sockets == 0, "stale socket records: {counts:?}");
    ensure!(counts.sessions == 1, "{counts:?}");
    let stats = agent.redirect.stats();
    ensure!(stats.tcp_redirected == N, "{stats:?}");
    ensure!(
        stats.sock_record_failed == 0 && stats.conn_record_failed == 0 && stats.record_missing == 0,
        "{stats:?}"
    );
    let seen = agent.stop(vec![session]).await?;
    ensure!(seen.len() as u64 == N, "accepted {}", seen.len());
    ensure!(
        seen.iter().all(|(s, o, _)| s.as_deref() == Some("many") && o.as_deref() == Some("127.10.0.1:443")),
        "a connection without its record"
    );
    Ok(())
}
