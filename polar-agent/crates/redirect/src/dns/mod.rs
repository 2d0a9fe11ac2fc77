//! The agent's DNS responder for sandboxes. Every DNS packet a sandbox sends
//! is steered here by the eBPF programs, so no sandbox needs real DNS. Names
//! the policy intercepts get a stable fake address from a loopback range (the
//! agent maps it back to the name when the connection arrives); names the
//! policy passes are resolved with the host's resolver (and the answers
//! recorded in [`Answers`], which bind pass routes to their names); others
//! get NXDOMAIN.

pub mod answers;

pub use answers::Answers;
pub use polar_wire::dns as wire;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use wire::{Rcode, Records};

/// What to do with a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Answer with a fake address the agent maps back to the name.
    Fake,
    /// Resolve with the host's resolver.
    Host,
    /// Say the name does not exist.
    NxDomain,
}

/// Decides per name; the routing rules implement it.
pub trait DnsPolicy: Send + Sync + 'static {
    /// The resolution of `name` (lower-case, no trailing dot).
    fn decide(&self, name: &str) -> Resolution;
}

/// A policy that intercepts every name.
pub struct InterceptAll;

impl DnsPolicy for InterceptAll {
    fn decide(&self, _name: &str) -> Resolution {
        Resolution::Fake
    }
}

/// The table of fake addresses: a name keeps its address while the table has
/// room; when the range is used up the oldest assignment is reused.
pub struct FakeIps {
    base: u32,
    size: u32,
    table: Mutex<FakeTable>,
}

#[derive(Default)]
struct FakeTable {
    by_name: HashMap<String, Ipv4Addr>,
    by_ip: HashMap<Ipv4Addr, String>,
    next: u32,
}

impl FakeIps {
    /// A table over `base/prefix` (the network and broadcast addresses are
    /// never handed out).
    pub fn new(base: Ipv4Addr, prefix: u8) -> Self {
        let prefix = prefix.min(30);
        let size = 1u32 << (32 - u32::from(prefix));
        let base = u32::from(base) & !(size - 1);
        Self {
            base,
            size,
            table: Mutex::new(FakeTable::default()),
        }
    }

    /// The address of `name`, assigned on first use.
    pub fn assign(&self, name: &str) -> Ipv4Addr {
        let mut t = self
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(ip) = t.by_name.get(name) {
            return *ip;
        }
        let usable = self.size - 2;
        let ip = Ipv4Addr::from(self.base + 1 + t.next % usable);
        t.next = t.next.wrapping_add(1);
        if let Some(old) = t.by_ip.insert(ip, name.to_owned()) {
            t.by_name.remove(&old);
        }
        t.by_name.insert(name.to_owned(), ip);
        ip
    }

    /// The name a fake address stands for.
    pub fn name_of(&self, ip: IpAddr) -> Option<String> {
        let IpAddr::V4(v4) = ip else {
            return ip_v6_mapped(ip).and_then(|v4| self.name_of(IpAddr::V4(v4)));
        };
        let t = self
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        t.by_ip.get(&v4).cloned()
    }
}

fn ip_v6_mapped(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
        IpAddr::V4(_) => None,
    }
}

impl Default for FakeIps {
    fn default() -> Self {
        Self::new(Ipv4Addr::new(127, 100, 0, 0), 16)
    }
}

/// Answers DNS questions per a policy.
pub struct Resolver {
    fake: Arc<FakeIps>,
    policy: Arc<dyn DnsPolicy>,
    ttl: u32,
    answers: Option<Arc<Answers>>,
}

impl Resolver {
    /// A resolver over a fake-address table and a policy.
    pub fn new(fake: Arc<FakeIps>, policy: Arc<dyn DnsPolicy>, ttl: u32) -> Self {
        Self {
            fake,
            policy,
            ttl,
            answers: None,
        }
    }

    /// Records every answer from the host's resolver in `answers` (the
    /// proxy's, which binds pass routes to them).
    pub fn recording(mut self, answers: Arc<Answers>) -> Self {
        self.answers = Some(answers);
        self
    }

    /// The fake-address table.
    pub fn fake_ips(&self) -> &Arc<FakeIps> {
        &self.fake
    }

    /// The response to one DNS message, `None` when nothing should be sent.
    pub async fn answer(&self, msg: &[u8]) -> Option<Vec<u8>> {
        let Some(q) = wire::parse_query(msg) else {
            return wire::formerr(msg);
        };
        let (rcode, records) = match self.policy.decide(&q.name) {
            Resolution::Fake => (Rcode::NoError, Records::V4(vec![self.fake.assign(&q.name)])),
            Resolution::NxDomain => (Rcode::NxDomain, Records::None),
            Resolution::Host => {
                let (rcode, records) = host_lookup(&q.name, q.qtype).await;
                if let Some(answers) = &self.answers {
                    let ips: Vec<IpAddr> = match &records {
                        Records::V4(v4) => v4.iter().map(|a| IpAddr::V4(*a)).collect(),
                        Records::V6(v6) => v6.iter().map(|a| IpAddr::V6(*a)).collect(),
                        Records::None => Vec::new(),
                    };
                    answers.record(&q.name, &ips, std::time::Instant::now());
                }
                (rcode, records)
            }
        };
        tracing::debug!(name = %q.name, qtype = q.qtype, ?rcode, "dns answer");
        Some(wire::build_response(&q, rcode, &records, self.ttl))
    }
}

async fn host_lookup(name: &str, qtype: u16) -> (Rcode, Records) {
    match tokio::net::lookup_host((name, 0)).await {
        Ok(addrs) => {
            let ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
            let records = if qtype == wire::TYPE_AAAA {
                Records::V6(
                    ips.iter()
                        .filter_map(|ip| match ip {
                            IpAddr::V6(v6) => Some(*v6),
                            IpAddr::V4(_) => None,
                        })
                        .collect(),
                )
            } else {
                Records::V4(
                    ips.iter()
                        .filter_map(|ip| match ip {
                            IpAddr::V4(v4) => Some(*v4),
                            IpAddr::V6(_) => None,
                        })
                        .collect(),
                )
            };
            (Rcode::NoError, records)
        }
        Err(_) => (Rcode::NxDomain, Records::None),
    }
}

/// Serves DNS on `sock` until `shutdown` fires.
pub async fn serve(sock: UdpSocket, resolver: Arc<Resolver>, shutdown: CancellationToken) {
    let mut buf = vec![0u8; 1500];
    loop {
        let (n, from) = tokio::select! {
            () = shutdown.cancelled() => return,
            r = sock.recv_from(&mut buf) => match r {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "dns receive failed");
                    continue;
                }
            },
        };
        if let Some(reply) = resolver.answer(&buf[..n]).await
            && let Err(e) = sock.send_to(&reply, from).await
        {
            tracing::debug!(error = %e, %from, "dns reply failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_addresses_are_stable_and_map_back() {
        let f = FakeIps::new(Ipv4Addr::new(127, 100, 0, 0), 16);
        let a = f.assign("api.anthropic.com");
        let b = f.assign("api.openai.com");
        assert_ne!(a, b);
        assert_eq!(f.assign("api.anthropic.com"), a);
        assert_eq!(a.octets()[..2], [127, 100]);
        assert_eq!(
            f.name_of(IpAddr::V4(a)).as_deref(),
            Some("api.anthropic.com")
        );
        let mapped = IpAddr::V6(a.to_ipv6_mapped());
        assert_eq!(f.name_of(mapped).as_deref(), Some("api.anthropic.com"));
    }

    #[test]
    fn a_full_range_reuses_the_oldest() {
        let f = FakeIps::new(Ipv4Addr::new(127, 100, 0, 0), 30);
        let a = f.assign("a");
        let _b = f.assign("b");
        let c = f.assign("c");
        assert_eq!(a, c, "a /30 has two usable addresses");
        assert_eq!(f.name_of(IpAddr::V4(a)).as_deref(), Some("c"));
        assert_ne!(f.assign("a"), c);
    }

    /// A DNS question for `name` (type A).
    fn query(name: &str) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            m.push(label.len() as u8);
            m.extend_from_slice(label.as_bytes());
        }
        m.push(0);
        m.extend_from_slice(&wire::TYPE_A.to_be_bytes());
        m.extend_from_slice(&1u16.to_be_bytes());
        m
    }

    /// Resolves every name with the host's resolver.
    struct ResolveAll;

    impl DnsPolicy for ResolveAll {
        fn decide(&self, _name: &str) -> Resolution {
            Resolution::Host
        }
    }

    #[tokio::test]
    async fn answers_from_the_host_resolver_are_recorded_for_pass_routes() {
        let answers = Arc::new(Answers::new(60));
        let r = Resolver::new(Arc::new(FakeIps::default()), Arc::new(ResolveAll), 60)
            .recording(Arc::clone(&answers));
        assert!(r.answer(&query("localhost")).await.is_some());
        let now = std::time::Instant::now();
        assert!(answers.holds("localhost", IpAddr::V4(Ipv4Addr::LOCALHOST), now));
        // Fake answers (model hosts) are not the name's addresses.
        let fake = Resolver::new(Arc::new(FakeIps::default()), Arc::new(InterceptAll), 60)
            .recording(Arc::clone(&answers));
        assert!(fake.answer(&query("api.example")).await.is_some());
        let ip = fake.fake_ips().assign("api.example");
        assert!(!answers.holds("api.example", IpAddr::V4(ip), now));
    }
}
