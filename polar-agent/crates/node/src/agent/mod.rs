//! The assembled agent: from a validated configuration to the parts that
//! serve sandbox sessions — the CA (loaded, or created on first start) and
//! the sandboxes' trust files, the interception proxy with its pipeline (the
//! capture stage, which forwards routes without a backend), the capture
//! store and the session registry, the DNS resolver following the routing
//! rules, and the base-URL listener's session directory.
//! Everything here happens after the configuration was validated and before
//! any sandbox starts; the state directory is checked first
//! ([`state_dir`]). The routing rules stay replaceable ([`reload`]).

mod reload;
pub(crate) mod state_dir;

pub use reload::ReloadSummary;
pub use state_dir::{StateDirError, check_state_dir};

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use polar_capture::{CaptureStore, SessionRegistry};
use polar_config::{Config, HostPattern, LiveRules};
use polar_io::tasks::Tasks;
use polar_proxy::Proxy;
use polar_proxy::base_url::SessionDirectory;
use polar_proxy::capture::{Capture, CaptureError};
use polar_proxy::pipeline::ModelPipeline;
use polar_redirect::dns::{DnsPolicy, FakeIps, Resolution, Resolver};
use polar_tls::{
    BundleError, Ca, CaError, CaOptions, LeafConfig, LeafError, LeafIssuer, NameConstraintsSpec,
    ServerConfigFactory, TrustFiles, write_trust_files,
};

/// Errors assembling the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The CA could not be loaded or created.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// The CA does not cover what the routing rules intercept.
    #[error(
        "the CA in {dir} is not constrained to {missing}, which the routing rules intercept; \
         run `polar ca rotate` with this configuration to issue a CA that covers it"
    )]
    CaTooNarrow {
        /// The state directory.
        dir: String,
        /// The first pattern not covered.
        missing: String,
    },
    /// The trust files could not be written.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The TLS server side could not be set up.
    #[error(transparent)]
    Leaf(#[from] LeafError),
    /// The pipeline could not be set up.
    #[error(transparent)]
    Pipeline(#[from] CaptureError),
    /// The capture journal could not be replayed into the session logs.
    #[error("replaying the capture journal: {0}")]
    CaptureJournal(#[from] polar_capture::LogError),
    /// The state directory is unsafe to use.
    #[error(transparent)]
    StateDir(#[from] StateDirError),
    /// The sandboxes' uid range holds the node's users or is too small.
    #[error(transparent)]
    Uids(#[from] polar_sandbox::uids::UidError),
    /// A reload changed the backends, which are read only at start.
    #[error(
        "reload refused: the [[backend]] list changed, and backends are set up only at start; \
         the old routing rules stay in force (restart the agent to change backends)"
    )]
    BackendsChanged,
}

/// The name constraints the CA needs for these rules: the intercepted
/// names, the fake DNS range and IP-literal model routes (for clients that
/// send no SNI). With nothing intercepted, the CA is constrained to the
/// reserved `invalid.` domain, so it can sign nothing real.
pub fn constraints_for(config: &Config) -> NameConstraintsSpec {
    let mut dns = Vec::new();
    let mut ip_ranges = vec![(
        IpAddr::V4(config.dns.fake_range.network()),
        config.dns.fake_range.prefix(),
    )];
    for p in config.rules.intercepted_hosts() {
        match p {
            HostPattern::Ip(ip) => ip_ranges.push((*ip, if ip.is_ipv4() { 32 } else { 128 })),
            other => dns.push(other.to_string()),
        }
    }
    if dns.is_empty() {
        dns.push("invalid".into());
    }
    NameConstraintsSpec { dns, ip_ranges }
}

/// Loads the CA from the state directory, creating it on first start, and
/// checks that it covers the routing rules. A key file readable by others
/// is refused (by [`Ca::load`]).
pub fn load_or_init_ca(config: &Config) -> Result<Ca, AgentError> {
    let dir = &config.agent.state_dir;
    check_state_dir(dir)?;
    let wanted = constraints_for(config);
    let ca = match Ca::load(dir) {
        Ok(ca) => ca,
        Err(CaError::NotInitialized { .. }) => {
            tracing::info!(dir = %dir.display(), "no CA yet; creating one");
            Ca::init_with(dir, &wanted, &ca_options(config))?
        }
        Err(e) => return Err(e.into()),
    };
    check_covers(&ca, &wanted, dir)?;
    Ok(ca)
}

/// CA options from the configuration.
pub fn ca_options(config: &Config) -> CaOptions {
    CaOptions {
        validity: Duration::from_secs(u64::from(config.ca.validity_days) * 86_400),
        ..CaOptions::default()
    }
}

fn check_covers(ca: &Ca, wanted: &NameConstraintsSpec, dir: &Path) -> Result<(), AgentError> {
    let have = ca.constraints();
    let too_narrow = |missing: String| AgentError::CaTooNarrow {
        dir: dir.display().to_string(),
        missing,
    };
    for name in &wanted.dns {
        let base = name.strip_prefix("*.").unwrap_or(name);
        if !have.permits_dns(base) {
            return Err(too_narrow(name.clone()));
        }
    }
    for (ip, prefix) in &wanted.ip_ranges {
        if !have.permits_ip(*ip) {
            return Err(too_narrow(format!("{ip}/{prefix}")));
        }
    }
    Ok(())
}

/// The routing rules in force as the DNS resolver's policy.
pub struct RulesDns(pub LiveRules);

impl DnsPolicy for RulesDns {
    fn decide(&self, name: &str) -> Resolution {
        match self.0.current().dns_answer(name) {
            polar_config::DnsDecision::Fake => Resolution::Fake,
            polar_config::DnsDecision::Resolve => Resolution::Host,
            polar_config::DnsDecision::NxDomain => Resolution::NxDomain,
        }
    }
}

/// The parts that serve sessions.
pub struct AgentParts {
    /// The configuration the agent started with (its rules may since have
    /// been replaced: see `rules`).
    pub config: Arc<Config>,
    /// The routing rules in force, shared by the proxy, the DNS resolver and
    /// the base-URL listener; replaced by [`AgentParts::reload`].
    pub rules: LiveRules,
    /// The CA (its name constraints bound what a reload may intercept).
    pub ca: Arc<Ca>,
    /// The interception proxy.
    pub proxy: Arc<Proxy>,
    /// The DNS resolver.
    pub resolver: Arc<Resolver>,
    /// The sandboxes' trust files.
    pub trust: TrustFiles,
    /// Sessions the base-URL listener accepts.
    pub sessions: Arc<SessionDirectory>,
    /// Sessions' task ids and metadata (filled by whoever starts a session).
    pub registry: Arc<SessionRegistry>,
    /// The capture stage, when it is the pipeline.
    pub capture: Option<Arc<Capture>>,
    /// The tasks serving streamed replies (drain them before exiting).
    pub tasks: Tasks,
}

impl AgentParts {
    /// Builds the parts with the capture stage, its records as durable as
    /// `agent.capture_durability` says.
    pub fn build(config: Config) -> Result<Self, AgentError> {
        let tasks = Tasks::new();
        let registry = Arc::new(SessionRegistry::new());
        // Before anything reads the logs: what a crash or a power loss
        // took from them is put back from the journal (in a state
        // directory found safe to use).
        check_state_dir(&config.agent.state_dir)?;
        // Every sandbox runs as a uid of this range: none may be the node's.
        polar_sandbox::uids::RangeCheck::check_node(&config.sandbox.uids, 1)?;
        let (store, replayed) = CaptureStore::open(
            &config.agent.state_dir,
            config.agent.capture_durability,
            config.agent.capture_journal_bytes,
            Arc::clone(&registry),
        )?;
        if replayed.restored > 0 {
            tracing::warn!(
                lines = replayed.restored,
                "capture logs: lines lost by a crash or a power loss restored from the journal"
            );
        }
        let store = Arc::new(store);
        let capture = Arc::new(Capture::from_config(&config, store, tasks.clone())?);
        let pipeline: Arc<dyn ModelPipeline> = Arc::clone(&capture) as Arc<dyn ModelPipeline>;
        let mut parts = Self::with_pipeline(config, pipeline)?;
        parts.registry = registry;
        parts.capture = Some(capture);
        parts.tasks = tasks;
        Ok(parts)
    }

    /// Builds the parts around a given pipeline (no capture stage).
    pub fn with_pipeline(
        config: Config,
        pipeline: Arc<dyn ModelPipeline>,
    ) -> Result<Self, AgentError> {
        let ca = load_or_init_ca(&config)?;
        let trust = write_trust_files(&config.agent.state_dir, &ca)?;
        // Disk quotas of sessions whose agent died: released, their files
        // kept (start-up, before any session).
        polar_sandbox::runtime::quota::reclaim_stale(
            &polar_sandbox::runtime::steps::sandboxes_dir(&config.agent.state_dir),
        );
        let leaf = LeafConfig {
            lifetime: Duration::from_secs(u64::from(config.ca.leaf_validity_hours) * 3600),
            cache_capacity: std::num::NonZeroUsize::new(config.ca.leaf_cache_size)
                .unwrap_or(LeafConfig::default().cache_capacity),
            ..LeafConfig::default()
        };
        let ca = Arc::new(ca);
        let issuer = Arc::new(LeafIssuer::new(Arc::clone(&ca), leaf)?);
        let factory = ServerConfigFactory::new(issuer, &[b"h2", b"http/1.1"])?;
        let rules = LiveRules::new(config.rules.clone());
        let proxy = Arc::new(Proxy::with_rules(&config, rules.clone(), factory, pipeline));
        let fake = Arc::new(FakeIps::new(
            config.dns.fake_range.network(),
            config.dns.fake_range.prefix(),
        ));
        let resolver = Arc::new(
            Resolver::new(fake, Arc::new(RulesDns(rules.clone())), config.dns.ttl_secs)
                .recording(Arc::clone(proxy.answers())),
        );
        Ok(Self {
            config: Arc::new(config),
            rules,
            ca,
            proxy,
            resolver,
            trust,
            sessions: Arc::new(SessionDirectory::default()),
            registry: Arc::new(SessionRegistry::new()),
            capture: None,
            tasks: Tasks::new(),
        })
    }
}

impl AgentParts {
    /// Starts the base-URL listener when the configuration has
    /// `proxy.base_url_listen`; returns its address.
    pub async fn serve_base_url(&self) -> std::io::Result<Option<std::net::SocketAddr>> {
        match self.config.proxy.base_url_listen {
            Some(addr) => self.serve_base_url_on(addr).await.map(Some),
            None => Ok(None),
        }
    }

    /// Starts a base-URL listener on `addr` (port 0 picks one); returns the
    /// bound address.
    pub async fn serve_base_url_on(
        &self,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<std::net::SocketAddr> {
        let l = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("binding the base-URL listener {addr}: {e}"),
            )
        })?;
        polar_sandbox::netns::deep_backlog(&l)?;
        let local = l.local_addr()?;
        tracing::info!(%local, "base-URL mode listening");
        self.tasks.spawn(polar_proxy::base_url::serve(
            l,
            Arc::clone(&self.sessions),
            self.rules.clone(),
            self.proxy.pipeline(),
            self.proxy.limits(),
            Arc::clone(self.proxy.shares()),
            Arc::clone(&self.proxy.stats),
            self.tasks.clone(),
        ));
        Ok(local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polar_redirect::dns::wire;

    fn query(name: &str) -> Vec<u8> {
        let mut m = vec![0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in name.split('.') {
            m.push(l.len() as u8);
            m.extend_from_slice(l.as_bytes());
        }
        m.extend_from_slice(&[0, 0, 1, 0, 1]);
        m
    }

    #[tokio::test]
    async fn dns_follows_the_routing_rules() {
        let config = Config::from_toml_str(
            r#"
[[route]]
host = "api.anthropic.com"
action = "model"
upstream = "http://127.0.0.1:8000"
[[route]]
host = "localhost"
action = "pass"
"#,
        )
        .unwrap();
        let fake = Arc::new(FakeIps::new(
            config.dns.fake_range.network(),
            config.dns.fake_range.prefix(),
        ));
        let r = Resolver::new(fake, Arc::new(RulesDns(config.rules.clone().into())), 5);
        let answer = |name: &str| {
            let r = &r;
            let q = query(name);
            async move { r.answer(&q).await.unwrap() }
        };
        // Model host: a fake address from the range.
        let a = answer("api.anthropic.com").await;
        assert_eq!(a[3] & 0xf, 0);
        assert_eq!(&a[a.len() - 4..a.len() - 2], &[127, 100]);
        // Pass host: the host's resolver's answer.
        let a = answer("localhost").await;
        assert_eq!(a[3] & 0xf, 0);
        assert_eq!(&a[a.len() - 4..], &[127, 0, 0, 1]);
        // Everything else under the deny default: NXDOMAIN.
        let a = answer("example.com").await;
        assert_eq!(a[3] & 0xf, wire::Rcode::NxDomain as u8);
    }

    #[test]
    fn constraints_cover_the_intercepted_hosts_and_the_fake_range() {
        let config = Config::default();
        let spec = constraints_for(&config).normalized().unwrap();
        assert!(spec.permits_dns("api.anthropic.com"));
        assert!(!spec.permits_dns("example.com"));
        assert!(spec.permits_ip("127.100.0.9".parse().unwrap()));
        assert!(!spec.permits_ip("10.0.0.1".parse().unwrap()));
        let empty = Config::from_toml_str("route = []").unwrap();
        assert_eq!(constraints_for(&empty).dns, vec!["invalid".to_owned()]);
    }
}
