//! The TLS settings of the control plane's servers and clients, one shape
//! for `[rollout.tls]` and `[gateway.tls]` (docs/CONFIG.md):
//!
//! ```toml
//! [rollout.tls]
//! cert_file = "/etc/polar/tls/rollout.crt"  # serve HTTPS: the chain, leaf first
//! key_file = "/etc/polar/tls/rollout.key"   # its key (mode 0600)
//! ca_file = "/etc/polar/tls/ca.crt"         # verify the peers this side calls
//! client_ca_file = "/etc/polar/tls/ca.crt"  # ask callers for certificates of this CA
//! allow_plain_http = false                  # plain HTTP beyond loopback (opt-in)
//! ```
//!
//! The rule both servers apply before binding: plain HTTP (no
//! `cert_file`) only on a loopback listen address, and calls over plain
//! HTTP only to loopback hosts, unless `allow_plain_http = true` says
//! otherwise ([`TlsSettings::check_listen`], [`TlsSettings::check_target`]).
//! The files are read at start (a bad one stops the start naming its key),
//! so a certificate renewed on disk takes effect at the next start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use polar_io::tls::{Identity, TlsError};
use polar_spec::{KeyError, KeyPath};

/// `[*.tls]` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// The certificate chain served (PEM, leaf first).
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM, mode 0600).
    pub key_file: Option<PathBuf>,
    /// The CA bundle peers are verified against.
    pub ca_file: Option<PathBuf>,
    /// The CA bundle callers' certificates are verified against.
    pub client_ca_file: Option<PathBuf>,
    /// Plain HTTP beyond loopback.
    pub allow_plain_http: Option<bool>,
}

/// The checked settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// Where the settings are in the file (`rollout.tls`), for messages.
    pub table: String,
    /// The served certificate chain and its key (`None`: plain HTTP).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The CA bundle peers are verified against (`None`: the system's).
    pub ca_file: Option<PathBuf>,
    /// Callers' certificates are asked for and verified against this.
    pub client_ca_file: Option<PathBuf>,
    /// Plain HTTP beyond loopback is allowed.
    pub allow_plain_http: bool,
}

/// The rustls configurations the settings make, read once at start.
#[derive(Clone, Debug)]
pub struct TlsConfigs {
    /// The server side (`None`: plain HTTP).
    pub server: Option<Arc<rustls::ServerConfig>>,
    /// The client side: the CA bundle and the identity (the served
    /// certificate, presented when a peer asks for one).
    pub client: rustls::ClientConfig,
    /// Callers are asked for certificates of `client_ca_file` (each
    /// server's routes say who must present one).
    pub client_certs: bool,
}

fn rebase(path: PathBuf, base: Option<&Path>) -> PathBuf {
    match base {
        Some(b) if path.is_relative() => b.join(path),
        _ => path,
    }
}

impl TlsSettings {
    /// Plain HTTP on loopback, the system's roots for `https://`.
    pub fn plain(table: &str) -> Self {
        Self {
            table: table.to_owned(),
            ..Self::default()
        }
    }

    fn err(&self, key: &str, reason: impl Into<String>) -> KeyError {
        KeyError::new(KeyPath::dotted(&self.table).key(key), reason)
    }

    /// Checks `raw` (the table at `table`); relative paths are taken from
    /// `base` (the config file's directory).
    pub fn from_raw(raw: &RawTls, table: &str, base: Option<&Path>) -> Result<Self, KeyError> {
        let mut s = Self::plain(table);
        let file = |p: &Option<PathBuf>| p.clone().map(|p| rebase(p, base));
        s.identity = match (file(&raw.cert_file), file(&raw.key_file)) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => return Err(s.err("key_file", "missing: cert_file needs its key")),
            (None, Some(_)) => {
                return Err(s.err("cert_file", "missing: key_file needs its certificate"));
            }
        };
        s.ca_file = file(&raw.ca_file);
        s.client_ca_file = file(&raw.client_ca_file);
        if s.client_ca_file.is_some() && s.identity.is_none() {
            return Err(s.err(
                "client_ca_file",
                "client certificates need TLS: set cert_file and key_file",
            ));
        }
        s.allow_plain_http = raw.allow_plain_http.unwrap_or(false);
        Ok(s)
    }

    /// Reads the files into the rustls configurations; an error names the
    /// key of the file at fault.
    pub fn configs(&self) -> Result<TlsConfigs, KeyError> {
        let at = |key: &'static str| move |e: TlsError| self.err(key, e.to_string());
        let identity = match &self.identity {
            Some((cert, key)) => Some(Identity::load(cert, key).map_err(at("cert_file"))?),
            None => None,
        };
        let server = match &identity {
            Some(id) => Some(Arc::new(
                polar_io::tls::server_config(id, self.client_ca_file.as_deref())
                    .map_err(at("client_ca_file"))?,
            )),
            None => None,
        };
        let client = polar_io::tls::client_config(self.ca_file.as_deref(), identity.as_ref())
            .map_err(at("ca_file"))?;
        Ok(TlsConfigs {
            server,
            client,
            client_certs: self.client_ca_file.is_some(),
        })
    }

    /// Whether the server side is HTTPS.
    pub fn serves_https(&self) -> bool {
        self.identity.is_some()
    }

    /// The listen rule: plain HTTP only on loopback, unless opted in.
    /// `key` names the listen setting in messages.
    pub fn check_listen(&self, key: &str, addr: SocketAddr) -> Result<(), KeyError> {
        if self.serves_https() || self.allow_plain_http || addr.ip().is_loopback() {
            return Ok(());
        }
        Err(KeyError::new(
            KeyPath::dotted(key),
            format!(
                "{addr} is not a loopback address and {t} has no cert_file: plain HTTP \
                 beyond loopback is refused (set {t}.cert_file and {t}.key_file to serve \
                 HTTPS, or {t}.allow_plain_http = true to accept the risk)",
                t = self.table
            ),
        ))
    }

    /// The target rule: a plain `http://` URL only to a loopback host,
    /// unless opted in; the error is the reason alone.
    pub fn check_target(&self, url: &str) -> Result<(), String> {
        check_target(url, self.allow_plain_http, &self.table)
    }
}

/// [`TlsSettings::check_target`] for callers without settings (the CLI):
/// `allow` is their opt-in, `how` names it.
pub fn check_target(url: &str, allow: bool, how: &str) -> Result<(), String> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Ok(());
    };
    if allow {
        return Ok(());
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if authority.starts_with('[') {
        authority.split_once(']').map_or(authority, |(h, _)| h)
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    if polar_io::tls::is_loopback_host(host) {
        return Ok(());
    }
    Err(format!(
        "{url} is plain HTTP to a host that is not loopback: use https:// \
         (or allow plain HTTP explicitly: {how})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Result<TlsSettings, KeyError> {
        let raw: RawTls = toml::from_str(text).unwrap();
        TlsSettings::from_raw(&raw, "rollout.tls", Some(Path::new("/etc/polar")))
    }

    #[test]
    fn plain_http_is_for_loopback_unless_opted_in() {
        let plain = settings("").unwrap();
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        plain
            .check_listen("rollout.listen", addr("127.0.0.1:7070"))
            .unwrap();
        plain
            .check_listen("rollout.listen", addr("[::1]:7070"))
            .unwrap();
        let e = plain
            .check_listen("rollout.listen", addr("0.0.0.0:7070"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("rollout.listen: 0.0.0.0:7070 is not a loopback address"),
            "{e}"
        );
        assert!(e.contains("rollout.tls.allow_plain_http = true"), "{e}");
        let open = settings("allow_plain_http = true").unwrap();
        open.check_listen("rollout.listen", addr("10.0.0.1:7070"))
            .unwrap();
        let tls = settings("cert_file = \"s.crt\"\nkey_file = \"s.key\"").unwrap();
        tls.check_listen("rollout.listen", addr("10.0.0.1:7070"))
            .unwrap();
        assert_eq!(
            tls.identity,
            Some(("/etc/polar/s.crt".into(), "/etc/polar/s.key".into()))
        );

        for ok in [
            "https://10.0.0.1:7071",
            "http://127.0.0.1:7071/x",
            "http://localhost:1",
            "http://[::1]:7071",
            "http://user@127.0.0.2",
        ] {
            plain.check_target(ok).unwrap();
        }
        for bad in [
            "http://10.0.0.1:7071",
            "http://example.com",
            "http://[fe80::1]:80/",
        ] {
            let e = plain.check_target(bad).unwrap_err();
            assert!(
                e.contains("plain HTTP to a host that is not loopback"),
                "{e}"
            );
            open.check_target(bad).unwrap();
        }
    }

    #[test]
    fn pairs_and_dependencies_name_the_key() {
        for (text, want) in [
            ("cert_file = \"a\"", "rollout.tls.key_file: missing"),
            ("key_file = \"a\"", "rollout.tls.cert_file: missing"),
            (
                "client_ca_file = \"ca\"",
                "rollout.tls.client_ca_file: client certificates need TLS",
            ),
        ] {
            let e = settings(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text}: {e}");
        }
        let missing = settings("cert_file = \"/nope.crt\"\nkey_file = \"/nope.key\"").unwrap();
        let e = missing.configs().unwrap_err().to_string();
        assert!(e.starts_with("rollout.tls.cert_file: /nope.crt"), "{e}");
        assert!(toml::from_str::<RawTls>("colour = 1").is_err());
    }
}
