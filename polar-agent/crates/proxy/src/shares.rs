//! Fair shares: what one session may hold of the proxy at once, so that one
//! sandbox can neither starve nor run the node out of memory.
//!
//! - **Connections**: node-wide `proxy.max_connections`, and per session
//!   `proxy.max_session_connections`. A connection over a cap waits up to
//!   `proxy.admission_wait_ms` for a slot, then is closed. The session is
//!   the kernel's (the listener's redirect record); connections of the host
//!   base-URL listener have none at accept and count against the node-wide
//!   cap only (their requests still go through the session caps below).
//! - **Streams** (HTTP/2 streams and HTTP/1 requests in flight, until the
//!   reply's last byte): per session `proxy.max_session_streams`; a request
//!   over it is answered 429 in the API's shape at once.
//! - **Buffered request bodies**, gzip inflation included, counted as the
//!   buffer grows (charged before each allocation, never a reservation of
//!   the declared or maximal size): per session
//!   `proxy.max_session_body_bytes` (429 at once beyond it) and node-wide
//!   `proxy.body_budget_bytes` (waits up to `proxy.admission_wait_ms`, then
//!   503). A body's charge is held until both the pipeline and the reply
//!   are done with it and returned when its last holder drops, however the
//!   request ended (a client gone mid-body included).
//!
//! Every refusal is counted by cap in [`ProxyStats::refused`]. The caps are
//! `tokio::sync::Semaphore`s (byte-weighted for bodies); a session's entry
//! lives while something holds a permit of it and is pruned after.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use polar_config::ProxyConfig;
use polar_ids::SessionId;

use super::ProxyStats;

/// One of the caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// Open connections on the node.
    NodeConnections,
    /// Open connections of one session.
    SessionConnections,
    /// Requests in flight of one session.
    SessionStreams,
    /// Buffered request-body bytes of one session.
    SessionBodyBytes,
    /// Buffered request-body bytes on the node.
    NodeBodyBytes,
}

impl Cap {
    /// Every cap, in the order of [`ProxyStats::refused`].
    pub const ALL: [Cap; 5] = [
        Cap::NodeConnections,
        Cap::SessionConnections,
        Cap::SessionStreams,
        Cap::SessionBodyBytes,
        Cap::NodeBodyBytes,
    ];

    /// The configuration key that sets it.
    pub fn key(self) -> &'static str {
        match self {
            Cap::NodeConnections => "proxy.max_connections",
            Cap::SessionConnections => "proxy.max_session_connections",
            Cap::SessionStreams => "proxy.max_session_streams",
            Cap::SessionBodyBytes => "proxy.max_session_body_bytes",
            Cap::NodeBodyBytes => "proxy.body_budget_bytes",
        }
    }

    /// Its label on the metrics page.
    pub fn label(self) -> &'static str {
        match self {
            Cap::NodeConnections => "node_connections",
            Cap::SessionConnections => "session_connections",
            Cap::SessionStreams => "session_streams",
            Cap::SessionBodyBytes => "session_body_bytes",
            Cap::NodeBodyBytes => "node_body_bytes",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Cap::SessionBodyBytes | Cap::NodeBodyBytes => " bytes",
            _ => "",
        }
    }

    fn why(self) -> &'static str {
        if self.is_session() {
            "this session is over its share; retry when its other requests are done"
        } else {
            "the node is busy; retry later"
        }
    }

    fn index(self) -> usize {
        match self {
            Cap::NodeConnections => 0,
            Cap::SessionConnections => 1,
            Cap::SessionStreams => 2,
            Cap::SessionBodyBytes => 3,
            Cap::NodeBodyBytes => 4,
        }
    }

    /// Whether the session itself is over its own share (429) rather than
    /// the node being full (503).
    pub fn is_session(self) -> bool {
        matches!(
            self,
            Cap::SessionConnections | Cap::SessionStreams | Cap::SessionBodyBytes
        )
    }
}

/// Refusals per cap.
#[derive(Debug, Default)]
pub struct Refusals([AtomicU64; 5]);

impl Refusals {
    /// Refusals for `cap` so far.
    pub fn get(&self, cap: Cap) -> u64 {
        self.0[cap.index()].load(Ordering::Relaxed)
    }

    fn count(&self, cap: Cap) {
        self.0[cap.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// A cap was reached.
#[derive(Debug, Clone, thiserror::Error)]
#[error("over the {key} cap of {limit}{unit}: {why}", key = .cap.key(), unit = .cap.unit(), why = .cap.why())]
pub struct OverCap {
    /// Which one.
    pub cap: Cap,
    /// Its value.
    pub limit: u64,
}

/// The caps' values.
#[derive(Clone, Copy, Debug)]
pub struct ShareLimits {
    /// `proxy.max_connections`.
    pub node_connections: u32,
    /// `proxy.max_session_connections`.
    pub session_connections: u32,
    /// `proxy.max_session_streams`.
    pub session_streams: u32,
    /// `proxy.max_session_body_bytes`.
    pub session_body_bytes: u64,
    /// `proxy.body_budget_bytes`.
    pub body_budget_bytes: u64,
    /// `proxy.admission_wait_ms`.
    pub wait: Duration,
}

impl ShareLimits {
    /// The caps of a validated `[proxy]`.
    pub fn of(p: &ProxyConfig) -> Self {
        Self {
            node_connections: p.max_connections,
            session_connections: p.max_session_connections,
            session_streams: p.max_session_streams,
            session_body_bytes: p.max_session_body_bytes,
            body_budget_bytes: p.body_budget_bytes,
            wait: p.admission_wait,
        }
    }
}

fn permits(n: u64) -> usize {
    usize::try_from(n)
        .unwrap_or(usize::MAX)
        .min(Semaphore::MAX_PERMITS)
}

/// One session's semaphores.
#[derive(Debug)]
struct SessionShare {
    connections: Arc<Semaphore>,
    streams: Arc<Semaphore>,
    body: Arc<Semaphore>,
}

/// The node's caps and every session's share.
#[derive(Debug)]
pub struct Shares {
    limits: ShareLimits,
    connections: Arc<Semaphore>,
    body: Arc<Semaphore>,
    sessions: Mutex<HashMap<Option<SessionId>, Arc<SessionShare>>>,
    stats: Arc<ProxyStats>,
}

/// A connection's place, held for its life.
#[derive(Debug)]
pub struct ConnPermit {
    _node: OwnedSemaphorePermit,
    _session: Option<OwnedSemaphorePermit>,
}

/// A request's place among its session's streams, held until its reply
/// ends.
#[derive(Debug)]
pub struct StreamPermit {
    _permit: OwnedSemaphorePermit,
}

impl Shares {
    /// Shares with `limits`, counting refusals in `stats`.
    pub fn new(limits: ShareLimits, stats: Arc<ProxyStats>) -> Self {
        Self {
            limits,
            connections: Arc::new(Semaphore::new(permits(u64::from(limits.node_connections)))),
            body: Arc::new(Semaphore::new(permits(limits.body_budget_bytes))),
            sessions: Mutex::new(HashMap::new()),
            stats,
        }
    }

    /// The caps in force.
    pub fn limits(&self) -> ShareLimits {
        self.limits
    }

    /// The counters refusals go to.
    pub fn stats(&self) -> &Arc<ProxyStats> {
        &self.stats
    }

    /// Request-body bytes buffered on the node now.
    pub fn body_bytes_in_use(&self) -> u64 {
        let free = self.body.available_permits() as u64;
        (permits(self.limits.body_budget_bytes) as u64).saturating_sub(free)
    }

    fn share(&self, session: Option<&SessionId>) -> Arc<SessionShare> {
        let mut map = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = map.get(&session.cloned()) {
            return Arc::clone(s);
        }
        // Entries nobody holds a permit of are idle: drop them.
        map.retain(|_, s| Arc::strong_count(s) > 1);
        let s = Arc::new(SessionShare {
            connections: Arc::new(Semaphore::new(permits(u64::from(
                self.limits.session_connections,
            )))),
            streams: Arc::new(Semaphore::new(permits(u64::from(
                self.limits.session_streams,
            )))),
            body: Arc::new(Semaphore::new(permits(self.limits.session_body_bytes))),
        });
        map.insert(session.cloned(), Arc::clone(&s));
        s
    }

    fn refuse(&self, cap: Cap) -> OverCap {
        self.stats.refused.count(cap);
        let limit = match cap {
            Cap::NodeConnections => u64::from(self.limits.node_connections),
            Cap::SessionConnections => u64::from(self.limits.session_connections),
            Cap::SessionStreams => u64::from(self.limits.session_streams),
            Cap::SessionBodyBytes => self.limits.session_body_bytes,
            Cap::NodeBodyBytes => self.limits.body_budget_bytes,
        };
        OverCap { cap, limit }
    }

    /// A place for a connection of `session` (`None`: not attributed by
    /// the kernel, node-wide cap only), waiting up to the admission wait
    /// for one.
    pub async fn connection(&self, session: Option<&SessionId>) -> Result<ConnPermit, OverCap> {
        let wait = self.limits.wait;
        let session_permit = match session {
            Some(_) => {
                let share = self.share(session);
                let sem = Arc::clone(&share.connections);
                Some(
                    acquire(sem, 1, wait)
                        .await
                        .ok_or_else(|| self.refuse(Cap::SessionConnections))?,
                )
            }
            None => None,
        };
        let node = acquire(Arc::clone(&self.connections), 1, wait)
            .await
            .ok_or_else(|| self.refuse(Cap::NodeConnections))?;
        Ok(ConnPermit {
            _node: node,
            _session: session_permit,
        })
    }

    /// A place among `session`'s requests in flight, now or never.
    pub fn stream(&self, session: Option<&SessionId>) -> Result<StreamPermit, OverCap> {
        let share = self.share(session);
        Arc::clone(&share.streams)
            .try_acquire_owned()
            .map(|p| StreamPermit { _permit: p })
            .map_err(|_| self.refuse(Cap::SessionStreams))
    }

    /// A new, empty body charge of `session`.
    pub fn body(self: &Arc<Self>, session: Option<&SessionId>) -> BodyCharge {
        let share = self.share(session);
        BodyCharge(Arc::new(ChargeInner {
            session: Arc::clone(&share.body),
            shares: Some(Arc::clone(self)),
            held: Mutex::new(Held::default()),
        }))
    }
}

/// Acquires `n` permits of `sem`, waiting up to `wait`.
async fn acquire(sem: Arc<Semaphore>, n: u32, wait: Duration) -> Option<OwnedSemaphorePermit> {
    match Arc::clone(&sem).try_acquire_many_owned(n) {
        Ok(p) => Some(p),
        Err(TryAcquireError::Closed) => None,
        Err(TryAcquireError::NoPermits) if wait.is_zero() => None,
        Err(TryAcquireError::NoPermits) => tokio::time::timeout(wait, sem.acquire_many_owned(n))
            .await
            .ok()?
            .ok(),
    }
}

#[derive(Debug, Default)]
struct Held {
    session: Option<OwnedSemaphorePermit>,
    node: Option<OwnedSemaphorePermit>,
    bytes: u64,
}

#[derive(Debug)]
struct ChargeInner {
    session: Arc<Semaphore>,
    /// `None`: not counted (a body charge outside the proxy, in tests of a
    /// pipeline stage).
    shares: Option<Arc<Shares>>,
    held: Mutex<Held>,
}

/// The bytes one request buffers (its body, and its inflated body),
/// charged to its session and to the node as they grow and returned when
/// the last clone is dropped.
#[derive(Clone, Debug)]
pub struct BodyCharge(Arc<ChargeInner>);

impl BodyCharge {
    /// A charge that counts nothing (pipeline stages called directly).
    pub fn uncounted() -> Self {
        Self(Arc::new(ChargeInner {
            session: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
            shares: None,
            held: Mutex::new(Held::default()),
        }))
    }

    /// Bytes charged so far.
    pub fn bytes(&self) -> u64 {
        self.held().bytes
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Charges `n` more bytes without waiting (for work on a blocking
    /// path: inflating a body).
    pub fn try_charge(&self, n: usize) -> Result<(), OverCap> {
        let n32 = self.chunk(n)?;
        let s = self.session_permit(n32)?;
        let node = match &self.0.shares {
            Some(shares) => Some(
                Arc::clone(&shares.body)
                    .try_acquire_many_owned(n32)
                    .map_err(|_| shares.refuse(Cap::NodeBodyBytes))?,
            ),
            None => None,
        };
        self.keep(s, node, n);
        Ok(())
    }

    /// Charges `n` more bytes: at once against the session's share, waiting
    /// up to the admission wait for the node's budget.
    pub async fn charge(&self, n: usize) -> Result<(), OverCap> {
        let n32 = self.chunk(n)?;
        let s = self.session_permit(n32)?;
        let node = match &self.0.shares {
            Some(shares) => Some(
                acquire(Arc::clone(&shares.body), n32, shares.limits.wait)
                    .await
                    .ok_or_else(|| shares.refuse(Cap::NodeBodyBytes))?,
            ),
            None => None,
        };
        self.keep(s, node, n);
        Ok(())
    }

    fn chunk(&self, n: usize) -> Result<u32, OverCap> {
        u32::try_from(n).map_err(|_| match &self.0.shares {
            Some(shares) => shares.refuse(Cap::SessionBodyBytes),
            None => OverCap {
                cap: Cap::SessionBodyBytes,
                limit: u64::from(u32::MAX),
            },
        })
    }

    fn session_permit(&self, n: u32) -> Result<OwnedSemaphorePermit, OverCap> {
        Arc::clone(&self.0.session)
            .try_acquire_many_owned(n)
            .map_err(|_| match &self.0.shares {
                Some(shares) => shares.refuse(Cap::SessionBodyBytes),
                None => OverCap {
                    cap: Cap::SessionBodyBytes,
                    limit: Semaphore::MAX_PERMITS as u64,
                },
            })
    }

    fn keep(&self, s: OwnedSemaphorePermit, node: Option<OwnedSemaphorePermit>, n: usize) {
        let mut held = self.held();
        merge(&mut held.session, s);
        if let Some(node) = node {
            merge(&mut held.node, node);
        }
        held.bytes += n as u64;
    }
}

fn merge(into: &mut Option<OwnedSemaphorePermit>, p: OwnedSemaphorePermit) {
    match into {
        Some(held) => held.merge(p),
        None => *into = Some(p),
    }
}

/// A buffer whose growth is charged before each allocation: doubling (so
/// appends stay amortised) up to `limit`, never past it.
#[derive(Debug)]
pub struct ChargedBuf {
    buf: Vec<u8>,
    charge: BodyCharge,
    limit: usize,
}

impl ChargedBuf {
    /// An empty buffer charging `charge`, holding at most `limit` bytes.
    pub fn new(charge: BodyCharge, limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            charge,
            limit,
        }
    }

    /// The capacity to grow to for `more` bytes, or `None` when that is
    /// past the limit.
    fn grow_for(&self, more: usize) -> Option<usize> {
        let needed = self.buf.len().checked_add(more)?;
        if needed > self.limit {
            return None;
        }
        if needed <= self.buf.capacity() {
            return Some(0);
        }
        let target = needed
            .max(self.buf.capacity().saturating_mul(2))
            .max(4096)
            .min(self.limit);
        Some(target - self.buf.capacity())
    }

    /// Appends `data`, charging any growth first and waiting for the node's
    /// budget as [`BodyCharge::charge`] does. `Ok(false)`: over the limit.
    pub async fn extend(&mut self, data: &[u8]) -> Result<bool, OverCap> {
        let Some(grow) = self.grow_for(data.len()) else {
            return Ok(false);
        };
        if grow > 0 {
            self.charge.charge(grow).await?;
            self.buf
                .reserve_exact(grow + self.buf.capacity() - self.buf.len());
        }
        self.buf.extend_from_slice(data);
        Ok(true)
    }

    /// [`ChargedBuf::extend`] without waiting.
    pub fn try_extend(&mut self, data: &[u8]) -> Result<bool, OverCap> {
        let Some(grow) = self.grow_for(data.len()) else {
            return Ok(false);
        };
        if grow > 0 {
            self.charge.try_charge(grow)?;
            self.buf
                .reserve_exact(grow + self.buf.capacity() - self.buf.len());
        }
        self.buf.extend_from_slice(data);
        Ok(true)
    }

    /// The bytes (the charge stays with the [`BodyCharge`]'s holders).
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from(self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(session_body: u64, budget: u64) -> Arc<Shares> {
        Arc::new(Shares::new(
            ShareLimits {
                node_connections: 4,
                session_connections: 2,
                session_streams: 2,
                session_body_bytes: session_body,
                body_budget_bytes: budget,
                wait: Duration::from_millis(50),
            },
            Arc::default(),
        ))
    }

    fn sid(s: &str) -> SessionId {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn body_bytes_are_charged_as_they_grow_and_returned_on_drop() {
        let sh = shares(1 << 20, 1 << 20);
        let a = sid("a");
        let charge = sh.body(Some(&a));
        let mut buf = ChargedBuf::new(charge.clone(), 1 << 20);
        assert!(buf.extend(&[1; 1000]).await.unwrap());
        // Charged for the allocation, not the declared or maximal size.
        assert_eq!(charge.bytes(), 4096);
        assert_eq!(sh.body_bytes_in_use(), 4096);
        assert!(buf.extend(&[1; 5000]).await.unwrap());
        assert_eq!(charge.bytes(), 8192);
        let bytes = buf.into_bytes();
        assert_eq!(bytes.len(), 6000);
        drop(charge);
        assert_eq!(sh.body_bytes_in_use(), 0);
    }

    #[tokio::test]
    async fn the_session_share_refuses_at_once_and_the_node_budget_after_a_wait() {
        let sh = shares(10_000, 12_000);
        let (a, b) = (sid("a"), sid("b"));
        let ca = sh.body(Some(&a));
        ca.charge(9_000).await.unwrap();
        let e = ca.charge(2_000).await.unwrap_err();
        assert_eq!(e.cap, Cap::SessionBodyBytes);
        assert!(
            e.to_string().contains("proxy.max_session_body_bytes"),
            "{e}"
        );
        let cb = sh.body(Some(&b));
        let started = tokio::time::Instant::now();
        let e = cb.charge(5_000).await.unwrap_err();
        assert_eq!(e.cap, Cap::NodeBodyBytes);
        assert!(started.elapsed() >= Duration::from_millis(40));
        assert_eq!(sh.stats.refused.get(Cap::SessionBodyBytes), 1);
        assert_eq!(sh.stats.refused.get(Cap::NodeBodyBytes), 1);
        // The failed charges took nothing; dropping the first frees all.
        assert_eq!(sh.body_bytes_in_use(), 9_000);
        drop(ca);
        cb.charge(5_000).await.unwrap();
        assert_eq!(sh.body_bytes_in_use(), 5_000);
        drop(cb);
        assert_eq!(sh.body_bytes_in_use(), 0);
    }

    #[tokio::test]
    async fn a_waiting_charge_gets_the_budget_freed_meanwhile() {
        let sh = shares(10_000, 10_000);
        let (a, b) = (sid("a"), sid("b"));
        let ca = sh.body(Some(&a));
        ca.charge(8_000).await.unwrap();
        let cb = sh.body(Some(&b));
        let waiting = tokio::spawn(async move { cb.charge(5_000).await.map(|()| cb) });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(ca);
        let cb = waiting.await.unwrap().unwrap();
        assert_eq!(cb.bytes(), 5_000);
    }

    #[tokio::test]
    async fn streams_and_connections_per_session() {
        let sh = shares(1 << 20, 1 << 20);
        let (a, b) = (sid("a"), sid("b"));
        let s1 = sh.stream(Some(&a)).unwrap();
        let _s2 = sh.stream(Some(&a)).unwrap();
        assert_eq!(sh.stream(Some(&a)).unwrap_err().cap, Cap::SessionStreams);
        let _sb = sh.stream(Some(&b)).unwrap();
        drop(s1);
        let _s3 = sh.stream(Some(&a)).unwrap();

        let c1 = sh.connection(Some(&a)).await.unwrap();
        let _c2 = sh.connection(Some(&a)).await.unwrap();
        let e = sh.connection(Some(&a)).await.unwrap_err();
        assert_eq!(e.cap, Cap::SessionConnections);
        // Another session still gets in, up to the node's cap.
        let _c3 = sh.connection(Some(&b)).await.unwrap();
        let _c4 = sh.connection(None).await.unwrap();
        assert_eq!(
            sh.connection(None).await.unwrap_err().cap,
            Cap::NodeConnections
        );
        drop(c1);
        let _c5 = sh.connection(Some(&a)).await.unwrap();
        assert_eq!(sh.stats.refused.get(Cap::SessionConnections), 1);
    }

    #[tokio::test]
    async fn idle_sessions_are_pruned() {
        let sh = shares(1 << 20, 1 << 20);
        for i in 0..100 {
            let s = sid(&format!("s-{i}"));
            drop(sh.stream(Some(&s)).unwrap());
        }
        let held = sh.stream(Some(&sid("kept"))).unwrap();
        assert!(sh.sessions.lock().unwrap().len() <= 2);
        drop(held);
    }

    #[test]
    fn a_buffer_never_grows_past_its_limit() {
        let charge = BodyCharge::uncounted();
        let mut buf = ChargedBuf::new(charge.clone(), 10_000);
        assert!(buf.try_extend(&[0; 6_000]).unwrap());
        assert!(buf.try_extend(&[0; 4_000]).unwrap());
        assert!(!buf.try_extend(&[0; 1]).unwrap());
        assert!(charge.bytes() <= 10_000);
    }
}
