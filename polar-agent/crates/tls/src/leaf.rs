//! Leaf certificates for intercepted connections: one short-lived ECDSA
//! P-256 leaf per SNI host name (DNS SAN) or, for clients that send no SNI,
//! per destination IP address (IP SAN), issued by the [`Ca`] on first use
//! and kept in a bounded least-recently-used cache. The rustls glue that
//! serves these leaves lives in [`super::server`] and is re-exported here.
//!
//! A name outside the CA's name constraints is refused here rather than
//! issued, since every client would reject that leaf anyway.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

use super::ca::Ca;
use polar_wire::peek::normalize_dns_name;

/// Errors of leaf issuance.
#[derive(Debug, thiserror::Error)]
pub enum LeafError {
    /// The requested host is not a valid DNS name.
    #[error("invalid host name {0:?}")]
    InvalidName(String),
    /// The name is outside the CA's name constraints; clients would reject the leaf.
    #[error("{0} is outside the CA's name constraints")]
    OutsideConstraints(LeafSubject),
    /// The CA certificate has expired: rotate it.
    #[error("the CA expired at {not_after}: run `polar ca rotate`")]
    CaExpired { not_after: OffsetDateTime },
    /// The leaf configuration is unusable.
    #[error("invalid leaf configuration: {0}")]
    InvalidConfig(String),
    /// rcgen failed to build the leaf.
    #[error("generating a leaf certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the key or the configuration.
    #[error("rustls: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The name a leaf is issued for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LeafSubject {
    /// A DNS host name, from the SNI (normalised to lower case on issuance).
    Dns(String),
    /// An IP address, for clients that sent no SNI.
    Ip(IpAddr),
}

impl fmt::Display for LeafSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dns(name) => f.write_str(name),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// How leaves are issued and cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafConfig {
    /// Validity from issuance (default 24 h; capped at the CA's expiry).
    pub lifetime: Duration,
    /// How far `not_before` is set in the past, for clock skew (default 5 min).
    pub backdate: Duration,
    /// Most leaves kept; the least recently used is dropped first.
    pub cache_capacity: NonZeroUsize,
}

impl Default for LeafConfig {
    fn default() -> Self {
        Self {
            lifetime: Duration::from_secs(24 * 60 * 60),
            backdate: Duration::from_secs(5 * 60),
            cache_capacity: NonZeroUsize::new(1024).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

struct CacheEntry {
    key: Arc<CertifiedKey>,
    renew_at: Instant,
    last_used: u64,
}

/// A bounded LRU map; eviction scans for the oldest entry, which is cheap
/// at the sizes used (a few hundred hosts) and only happens on insertion.
struct LeafCache {
    entries: HashMap<LeafSubject, CacheEntry>,
    tick: u64,
    capacity: usize,
}

impl LeafCache {
    fn get(&mut self, subject: &LeafSubject, now: Instant) -> Option<Arc<CertifiedKey>> {
        self.tick += 1;
        let entry = self.entries.get_mut(subject)?;
        if now >= entry.renew_at {
            return None;
        }
        entry.last_used = self.tick;
        Some(Arc::clone(&entry.key))
    }

    fn insert(&mut self, subject: LeafSubject, key: Arc<CertifiedKey>, renew_at: Instant) {
        self.tick += 1;
        if !self.entries.contains_key(&subject) && self.entries.len() >= self.capacity {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        let last_used = self.tick;
        self.entries.insert(
            subject,
            CacheEntry {
                key,
                renew_at,
                last_used,
            },
        );
    }
}

/// Issues and caches leaves signed by a [`Ca`]. Shared by all connections.
pub struct LeafIssuer {
    ca: Arc<Ca>,
    config: LeafConfig,
    cache: Mutex<LeafCache>,
}

impl fmt::Debug for LeafIssuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeafIssuer")
            .field("ca", &self.ca)
            .field("config", &self.config)
            .field("cached", &self.cached())
            .finish()
    }
}

impl LeafIssuer {
    /// A leaf issuer for `ca`.
    pub fn new(ca: Arc<Ca>, config: LeafConfig) -> Result<Self, LeafError> {
        if config.lifetime.is_zero() || time::Duration::try_from(config.lifetime).is_err() {
            return Err(LeafError::InvalidConfig(format!(
                "lifetime {:?}",
                config.lifetime
            )));
        }
        if time::Duration::try_from(config.backdate).is_err() {
            return Err(LeafError::InvalidConfig(format!(
                "backdate {:?}",
                config.backdate
            )));
        }
        let cache = LeafCache {
            entries: HashMap::new(),
            tick: 0,
            capacity: config.cache_capacity.get(),
        };
        Ok(Self {
            ca,
            config,
            cache: Mutex::new(cache),
        })
    }

    /// The CA the leaves chain to.
    pub fn ca(&self) -> &Arc<Ca> {
        &self.ca
    }

    /// How many leaves are cached.
    pub fn cached(&self) -> usize {
        self.lock().entries.len()
    }

    /// The leaf for `subject` (chain: leaf, CA), from the cache or freshly
    /// issued when missing or with less than a third of its lifetime left.
    pub fn certified_key(&self, subject: &LeafSubject) -> Result<Arc<CertifiedKey>, LeafError> {
        self.certified_key_at(subject, Instant::now())
    }

    fn certified_key_at(
        &self,
        subject: &LeafSubject,
        now: Instant,
    ) -> Result<Arc<CertifiedKey>, LeafError> {
        let subject = self.check(subject)?;
        if let Some(key) = self.lock().get(&subject, now) {
            return Ok(key);
        }
        // Issued outside the lock: two racing first uses may both issue, which is harmless.
        let (key, renew_in) = issue_leaf(&self.ca, &subject, &self.config)?;
        tracing::debug!(leaf = %subject, "issued leaf certificate");
        self.lock()
            .insert(subject, Arc::clone(&key), now + renew_in);
        Ok(key)
    }

    /// Normalises the subject and checks it against the CA's constraints.
    fn check(&self, subject: &LeafSubject) -> Result<LeafSubject, LeafError> {
        let constraints = self.ca.constraints();
        match subject {
            LeafSubject::Dns(name) => {
                let name =
                    normalize_dns_name(name).ok_or_else(|| LeafError::InvalidName(name.clone()))?;
                if !constraints.permits_dns(&name) {
                    return Err(LeafError::OutsideConstraints(LeafSubject::Dns(name)));
                }
                Ok(LeafSubject::Dns(name))
            }
            LeafSubject::Ip(ip) if !constraints.permits_ip(*ip) => {
                Err(LeafError::OutsideConstraints(subject.clone()))
            }
            LeafSubject::Ip(_) => Ok(subject.clone()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeafCache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Issues a leaf for `subject` without checking the name constraints, and
/// returns it with the time after which it should be renewed.
pub(super) fn issue_leaf(
    ca: &Ca,
    subject: &LeafSubject,
    config: &LeafConfig,
) -> Result<(Arc<CertifiedKey>, Duration), LeafError> {
    let now = OffsetDateTime::now_utc();
    let ca_expiry = ca.not_after();
    if ca_expiry <= now {
        return Err(LeafError::CaExpired {
            not_after: ca_expiry,
        });
    }
    let bad = |what: &str| LeafError::InvalidConfig(what.to_owned());
    let lifetime = time::Duration::try_from(config.lifetime).map_err(|_| bad("lifetime"))?;
    let backdate = time::Duration::try_from(config.backdate).map_err(|_| bad("backdate"))?;
    let not_after = now
        .checked_add(lifetime)
        .map_or(ca_expiry, |t| t.min(ca_expiry));
    let not_before = now.checked_sub(backdate).ok_or_else(|| bad("backdate"))?;

    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![match subject {
        LeafSubject::Dns(name) => SanType::DnsName(name.clone().try_into()?),
        LeafSubject::Ip(ip) => SanType::IpAddress(*ip),
    }];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, subject.to_string());
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.signed_by(&key, ca.issuer())?;

    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signing_key = rustls::crypto::ring::sign::any_ecdsa_type(&der)?;
    let chain = vec![cert.der().clone(), ca.cert_der().clone()];
    let certified = Arc::new(CertifiedKey::new(chain, signing_key));

    // Renew once less than a third of the whole validity period is left.
    let ahead = Duration::try_from(not_after - now).unwrap_or_default();
    let renew_in = ahead.saturating_sub((ahead + config.backdate) / 3);
    Ok((certified, renew_in))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::NameConstraintsSpec;

    pub(crate) fn test_ca(dir: &std::path::Path) -> Arc<Ca> {
        let spec = NameConstraintsSpec {
            dns: vec!["api.anthropic.com".into(), "*.openai.com".into()],
            ip_ranges: vec![("127.0.0.0".parse().unwrap(), 8)],
        };
        Arc::new(Ca::init(dir, &spec).unwrap())
    }

    fn issuer(capacity: usize) -> (tempfile::TempDir, LeafIssuer) {
        let tmp = tempfile::tempdir().unwrap();
        let config = LeafConfig {
            cache_capacity: NonZeroUsize::new(capacity).unwrap(),
            ..LeafConfig::default()
        };
        let issuer = LeafIssuer::new(test_ca(tmp.path()), config).unwrap();
        (tmp, issuer)
    }

    fn dns(name: &str) -> LeafSubject {
        LeafSubject::Dns(name.to_owned())
    }

    #[test]
    fn dns_leaf_is_short_lived_server_cert_chained_to_ca() {
        let (_tmp, issuer) = issuer(8);
        let key = issuer.certified_key(&dns("API.Anthropic.com")).unwrap();
        assert_eq!(key.cert.len(), 2);
        assert_eq!(&key.cert[1], issuer.ca().cert_der());
        let (_, leaf) = x509_parser::parse_x509_certificate(&key.cert[0]).unwrap();
        assert!(!leaf.is_ca());
        let san = leaf.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(names, vec!["DNSName(api.anthropic.com)"]);
        let eku = leaf.extended_key_usage().unwrap().unwrap();
        assert!(eku.value.server_auth);
        let validity = leaf.validity();
        let span = validity.not_after.to_datetime() - validity.not_before.to_datetime();
        assert_eq!(span, time::Duration::hours(24) + time::Duration::minutes(5));
        assert!(key.keys_match().is_ok());
    }

    #[test]
    fn ip_leaf_only_inside_permitted_ranges() {
        let (_tmp, issuer) = issuer(8);
        let key = issuer
            .certified_key(&LeafSubject::Ip("127.0.0.1".parse().unwrap()))
            .unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&key.cert[0]).unwrap();
        let san = leaf.subject_alternative_name().unwrap().unwrap();
        assert_eq!(san.value.general_names.len(), 1);
        for ip in ["10.1.2.3", "::1"] {
            let err = issuer
                .certified_key(&LeafSubject::Ip(ip.parse().unwrap()))
                .unwrap_err();
            assert!(
                matches!(err, LeafError::OutsideConstraints(_)),
                "{ip}: {err}"
            );
        }
    }

    #[test]
    fn names_outside_constraints_or_invalid_are_refused() {
        let (_tmp, issuer) = issuer(8);
        for name in ["example.com", "anthropic.com", "openai.com.evil.net"] {
            let err = issuer.certified_key(&dns(name)).unwrap_err();
            assert!(
                matches!(err, LeafError::OutsideConstraints(_)),
                "{name}: {err}"
            );
        }
        for name in ["", "127.0.0.1", "bad name.openai.com"] {
            let err = issuer.certified_key(&dns(name)).unwrap_err();
            assert!(matches!(err, LeafError::InvalidName(_)), "{name:?}: {err}");
        }
        assert!(issuer.certified_key(&dns("chatgpt.api.openai.com")).is_ok());
        assert_eq!(issuer.cached(), 1);
    }

    #[test]
    fn leaves_are_cached_per_name() {
        let (_tmp, issuer) = issuer(8);
        let a = issuer.certified_key(&dns("api.openai.com")).unwrap();
        let b = issuer.certified_key(&dns("API.OPENAI.COM")).unwrap();
        let c = issuer.certified_key(&dns("files.openai.com")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(issuer.cached(), 2);
    }

    #[test]
    fn cache_evicts_least_recently_used() {
        let (_tmp, issuer) = issuer(2);
        let a = issuer.certified_key(&dns("a.openai.com")).unwrap();
        let b = issuer.certified_key(&dns("b.openai.com")).unwrap();
        // Touch a, so b is the least recently used when c arrives.
        issuer.certified_key(&dns("a.openai.com")).unwrap();
        issuer.certified_key(&dns("c.openai.com")).unwrap();
        assert_eq!(issuer.cached(), 2);
        let a2 = issuer.certified_key(&dns("a.openai.com")).unwrap();
        assert!(Arc::ptr_eq(&a, &a2));
        let b2 = issuer.certified_key(&dns("b.openai.com")).unwrap();
        assert!(!Arc::ptr_eq(&b, &b2));
        assert_eq!(issuer.cached(), 2);
    }

    #[test]
    fn leaf_is_renewed_when_a_third_of_its_lifetime_is_left() {
        let (_tmp, issuer) = issuer(8);
        let subject = dns("api.anthropic.com");
        let start = Instant::now();
        let first = issuer.certified_key_at(&subject, start).unwrap();
        let day = Duration::from_secs(24 * 3600);
        let early = issuer.certified_key_at(&subject, start + day / 2).unwrap();
        assert!(Arc::ptr_eq(&first, &early));
        let late = issuer
            .certified_key_at(&subject, start + day * 7 / 10)
            .unwrap();
        assert!(!Arc::ptr_eq(&first, &late));
        assert_eq!(issuer.cached(), 1);
    }

    #[test]
    fn leaf_lifetime_is_capped_at_ca_expiry() {
        let tmp = tempfile::tempdir().unwrap();
        let spec = NameConstraintsSpec {
            dns: vec!["api.anthropic.com".into()],
            ip_ranges: vec![],
        };
        let options = crate::ca::CaOptions {
            validity: Duration::from_secs(3600),
            ..Default::default()
        };
        let ca = Ca::init_with(tmp.path(), &spec, &options).unwrap();
        let (key, renew_in) =
            issue_leaf(&ca, &dns("api.anthropic.com"), &LeafConfig::default()).unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&key.cert[0]).unwrap();
        assert_eq!(leaf.validity().not_after.to_datetime(), ca.not_after());
        assert!(renew_in < Duration::from_secs(3600));
    }

    #[test]
    fn zero_lifetime_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let config = LeafConfig {
            lifetime: Duration::ZERO,
            ..LeafConfig::default()
        };
        let err = LeafIssuer::new(test_ca(tmp.path()), config).unwrap_err();
        assert!(matches!(err, LeafError::InvalidConfig(_)));
    }
}
