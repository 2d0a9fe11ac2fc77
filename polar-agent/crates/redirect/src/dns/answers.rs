//! [`Answers`]: what the node's resolver said a passed name resolves to,
//! so that a pass route relays only to those addresses. The DNS responder
//! records every answer it gives a sandbox from the host's resolver; the
//! proxy looks a name up itself (recording the answer too) when a
//! connection's address is not among the recorded ones, so a name whose
//! answers rotate (round-robin DNS) still holds the address the sandbox
//! was given. Each address is kept for the answer's lifetime (the DNS TTL
//! the responder hands out, at least [`MIN_KEEP`], at most [`MAX_KEEP`]);
//! the table is bounded ([`MAX_NAMES`] names of at most [`MAX_ADDRS`]
//! addresses, the ones closest to expiry dropped first).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest time an answer is kept.
pub const MIN_KEEP: Duration = Duration::from_secs(60);
/// The longest time an answer is kept.
pub const MAX_KEEP: Duration = Duration::from_secs(3600);
/// How many names are remembered.
pub const MAX_NAMES: usize = 4096;
/// How many addresses a name keeps.
pub const MAX_ADDRS: usize = 64;
/// How long a lookup by the proxy may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The recorded answers, by name (lower case, no trailing dot).
#[derive(Debug)]
pub struct Answers {
    keep: Duration,
    table: Mutex<HashMap<String, Vec<(IpAddr, Instant)>>>,
}

impl Answers {
    /// A table whose answers live `ttl_secs` (bounded as above).
    pub fn new(ttl_secs: u32) -> Self {
        Self {
            keep: Duration::from_secs(u64::from(ttl_secs)).clamp(MIN_KEEP, MAX_KEEP),
            table: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(IpAddr, Instant)>>> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that `name` resolved to `ips` at `now`.
    pub fn record(&self, name: &str, ips: &[IpAddr], now: Instant) {
        if ips.is_empty() {
            return;
        }
        let until = now + self.keep;
        let mut t = self.lock();
        if !t.contains_key(name) && t.len() >= MAX_NAMES {
            t.retain(|_, addrs| {
                addrs.retain(|(_, u)| *u > now);
                !addrs.is_empty()
            });
            if t.len() >= MAX_NAMES {
                let soonest = t
                    .iter()
                    .min_by_key(|(_, a)| a.iter().map(|(_, u)| *u).max())
                    .map(|(n, _)| n.clone());
                if let Some(n) = soonest {
                    t.remove(&n);
                }
            }
        }
        let addrs = t.entry(name.to_owned()).or_default();
        addrs.retain(|(_, u)| *u > now);
        for ip in ips {
            let ip = ip.to_canonical();
            match addrs.iter_mut().find(|(a, _)| *a == ip) {
                Some(entry) => entry.1 = until,
                None => addrs.push((ip, until)),
            }
        }
        if addrs.len() > MAX_ADDRS {
            addrs.sort_by_key(|(_, u)| std::cmp::Reverse(*u));
            addrs.truncate(MAX_ADDRS);
        }
    }

    /// Whether `ip` is among the unexpired answers for `name` at `now`.
    pub fn holds(&self, name: &str, ip: IpAddr, now: Instant) -> bool {
        let ip = ip.to_canonical();
        self.lock()
            .get(name)
            .is_some_and(|addrs| addrs.iter().any(|(a, u)| *a == ip && *u > now))
    }

    /// Resolves `name` with the node's resolver (within
    /// [`LOOKUP_TIMEOUT`]) and records the answer.
    pub async fn lookup(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((name, 0)))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "lookup timed out"))??;
        let ips: Vec<IpAddr> = found.map(|a| a.ip().to_canonical()).collect();
        self.record(name, &ips, Instant::now());
        Ok(ips)
    }

    /// Whether `ip` is an address of `name`: recorded, or in a fresh
    /// lookup.
    pub async fn resolves_to(&self, name: &str, ip: IpAddr) -> bool {
        if self.holds(name, ip, Instant::now()) {
            return true;
        }
        match self.lookup(name).await {
            Ok(ips) => ips.contains(&ip.to_canonical()),
            Err(e) => {
                tracing::debug!(%name, error = %e, "pass route name did not resolve");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn answers_are_held_for_their_lifetime() {
        let a = Answers::new(0);
        let t0 = Instant::now();
        a.record("x.example", &[ip("10.0.0.1"), ip("::ffff:10.0.0.2")], t0);
        assert!(a.holds("x.example", ip("10.0.0.1"), t0));
        assert!(a.holds("x.example", ip("10.0.0.2"), t0));
        assert!(a.holds("x.example", ip("::ffff:10.0.0.1"), t0));
        assert!(!a.holds("x.example", ip("10.0.0.3"), t0));
        assert!(!a.holds("y.example", ip("10.0.0.1"), t0));
        // Kept at least MIN_KEEP, then gone.
        assert!(a.holds(
            "x.example",
            ip("10.0.0.1"),
            t0 + MIN_KEEP - Duration::from_secs(1)
        ));
        assert!(!a.holds("x.example", ip("10.0.0.1"), t0 + MIN_KEEP));
        // A rotated answer adds to what is held.
        a.record("x.example", &[ip("10.0.0.3")], t0 + Duration::from_secs(1));
        assert!(a.holds("x.example", ip("10.0.0.1"), t0 + Duration::from_secs(2)));
        assert!(a.holds("x.example", ip("10.0.0.3"), t0 + Duration::from_secs(2)));
        assert_eq!(Answers::new(u32::MAX).keep, MAX_KEEP);
        assert_eq!(Answers::new(300).keep, Duration::from_secs(300));
    }

    #[test]
    fn the_table_is_bounded() {
        let a = Answers::new(60);
        let t0 = Instant::now();
        for i in 0..MAX_NAMES + 10 {
            a.record(
                &format!("n{i}.example"),
                &[ip("10.0.0.1")],
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(a.lock().len(), MAX_NAMES);
        let now = t0 + Duration::from_secs(1);
        assert!(a.holds(&format!("n{}.example", MAX_NAMES + 9), ip("10.0.0.1"), now));
        assert!(!a.holds("n0.example", ip("10.0.0.1"), now));
        let many: Vec<IpAddr> = (0..200u8).map(|i| IpAddr::from([10, 1, 0, i])).collect();
        a.record("many.example", &many, t0);
        assert_eq!(a.lock()["many.example"].len(), MAX_ADDRS);
    }

    #[tokio::test]
    async fn a_lookup_records_what_the_node_resolves() {
        let a = Answers::new(60);
        assert!(a.resolves_to("localhost", ip("127.0.0.1")).await);
        assert!(a.holds("localhost", ip("127.0.0.1"), Instant::now()));
        assert!(!a.resolves_to("localhost", ip("127.10.0.9")).await);
        assert!(!a.resolves_to("no-such-name.invalid", ip("127.0.0.1")).await);
    }
}
