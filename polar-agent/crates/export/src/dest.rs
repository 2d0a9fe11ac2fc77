//! Export destinations: a local directory or an S3-compatible bucket, parsed
//! from one string (`/path`, `s3://bucket/prefix`), and the [`Sink`] that
//! writes one file atomically to either.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};

use super::error::ExportError;
use super::local::{self, LocalFile};
use super::object::ObjectFile;
use super::partition::FileKey;

/// Connection options of an S3-compatible store. Credentials not given
/// here come from the standard `AWS_*` environment variables
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
/// `AWS_REGION`, `AWS_ENDPOINT_URL`, ...).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Options {
    /// Endpoint URL of a non-AWS store (MinIO, Ceph, a test server), e.g.
    /// `http://127.0.0.1:9000`. Requests use path-style addressing.
    pub endpoint: Option<String>,
    /// Region (default: from the environment, else `us-east-1`).
    pub region: Option<String>,
    /// Allow plain HTTP. Implied for an endpoint on a loopback address.
    pub allow_http: bool,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Session token.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "***"),
            )
            .field("session_token", &self.session_token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl S3Options {
    /// A client of `bucket` with these options; what they leave out comes
    /// from the `AWS_*` environment. Nothing is sent: a bad option or
    /// environment value is an error here, an unreachable store only at
    /// the first request.
    pub fn store(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
        Ok(Arc::new(self.builder(bucket).build()?))
    }

    /// The builder behind [`S3Options::store`], for a client with other
    /// retry settings.
    pub(crate) fn builder(&self, bucket: &str) -> AmazonS3Builder {
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = &self.endpoint {
            b = b.with_endpoint(endpoint);
            if is_loopback_http(endpoint) {
                b = b.with_allow_http(true);
            }
        }
        if self.allow_http {
            b = b.with_allow_http(true);
        }
        if let Some(r) = &self.region {
            b = b.with_region(r);
        }
        if let Some(k) = &self.access_key_id {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = &self.secret_access_key {
            b = b.with_secret_access_key(k);
        }
        if let Some(t) = &self.session_token {
            b = b.with_token(t);
        }
        b
    }
}

/// Whether `url` is `http://` to a loopback host.
fn is_loopback_http(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    polar_io::tls::is_loopback_host(host)
}

/// Where exported files go.
#[derive(Clone)]
pub enum Destination {
    /// A local (or network-mounted) directory.
    Local {
        /// The root directory.
        root: PathBuf,
    },
    /// An object store.
    Object {
        /// The store.
        store: Arc<dyn ObjectStore>,
        /// The key prefix (may be empty).
        prefix: String,
        /// The destination as given, for messages.
        url: String,
    },
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_string())
    }
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local { root } => write!(f, "{}", root.display()),
            Self::Object { url, .. } => f.write_str(url),
        }
    }
}

impl Destination {
    /// Parses `s3://bucket/prefix` (with `s3`) or a local directory.
    pub fn parse(spec: &str, s3: &S3Options) -> Result<Self, ExportError> {
        let bad = |why: &str| ExportError::Destination {
            destination: spec.to_owned(),
            why: why.to_owned(),
        };
        let Some(rest) = spec.strip_prefix("s3://") else {
            if spec.contains("://") {
                return Err(bad("only local directories and s3:// URLs are supported"));
            }
            if spec.is_empty() {
                return Err(bad("empty path"));
            }
            return Ok(Self::Local {
                root: PathBuf::from(spec),
            });
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket name"));
        }
        let prefix = prefix.trim_matches('/').to_owned();
        if !prefix.is_empty() {
            ObjectPath::parse(&prefix).map_err(|e| bad(&e.to_string()))?;
        }
        let store = s3.store(bucket).map_err(|e| bad(&e.to_string()))?;
        Ok(Self::Object {
            store,
            prefix,
            url: spec.to_owned(),
        })
    }

    /// An object-store destination over an existing store (tests, other
    /// backends).
    pub fn object(store: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        let prefix = prefix.trim_matches('/').to_owned();
        Self::Object {
            url: format!("{store}/{prefix}"),
            store,
            prefix,
        }
    }
}

/// Opens files at a destination, cleaning stale temporaries of each local
/// partition directory the first time it is used.
#[derive(Debug)]
pub struct Store {
    dest: Destination,
    stale_after: Duration,
    cleaned: Mutex<HashSet<String>>,
}

impl Store {
    /// A store writing to `dest`; local temporaries older than
    /// `stale_after` are taken for crash leftovers and removed.
    pub fn new(dest: Destination, stale_after: Duration) -> Self {
        Self {
            dest,
            stale_after,
            cleaned: Mutex::new(HashSet::new()),
        }
    }

    /// The destination.
    pub fn destination(&self) -> &Destination {
        &self.dest
    }

    /// Where `key` ends up, as shown to people (path or URL).
    pub fn location(&self, key: &FileKey) -> String {
        match &self.dest {
            Destination::Local { root } => root
                .join(&key.partition)
                .join(&key.file)
                .display()
                .to_string(),
            Destination::Object { url, .. } => {
                format!("{}/{}", url.trim_end_matches('/'), key.relative())
            }
        }
    }

    /// Starts writing the file `key`.
    pub async fn create(&self, key: &FileKey) -> Result<Sink, ExportError> {
        match &self.dest {
            Destination::Local { root } => {
                let dir = root.join(&key.partition);
                // Every writer makes sure the directory exists: a second
                // writer of a new partition must not race ahead of the
                // first one's creating it.
                local::create_dir(dir.clone()).await?;
                let first = self
                    .cleaned
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(key.partition.clone());
                if first {
                    // Fresh temporaries of concurrent writers are not
                    // stale: only leftovers of earlier runs are removed.
                    let (d, age) = (dir.clone(), self.stale_after);
                    tokio::task::spawn_blocking(move || local::clean_stale_temps(&d, age))
                        .await
                        .map_err(|_| ExportError::Join("cleanup"))??;
                }
                Ok(Sink::Local(LocalFile::create(dir.join(&key.file)).await?))
            }
            Destination::Object { store, prefix, .. } => {
                let key = match prefix.as_str() {
                    "" => key.relative(),
                    p => format!("{p}/{}", key.relative()),
                };
                let path = ObjectPath::parse(&key).map_err(|e| ExportError::Destination {
                    destination: self.dest.to_string(),
                    why: e.to_string(),
                })?;
                Ok(Sink::Object(ObjectFile::create(Arc::clone(store), path)))
            }
        }
    }
}

/// One file being written; invisible until [`Sink::commit`].
#[derive(Debug)]
pub enum Sink {
    /// A local temporary file.
    Local(LocalFile),
    /// An object upload.
    Object(ObjectFile),
}

impl Sink {
    /// Appends `data`.
    pub async fn write(&mut self, data: Vec<u8>) -> Result<(), ExportError> {
        match self {
            Self::Local(f) => f.write(data).await,
            Self::Object(o) => o.write(data).await,
        }
    }

    /// Starts publishing the file in the background (the fsyncs on the
    /// blocking pool, the upload on the runtime); the handle tells how it
    /// ended.
    pub fn start_commit(self) -> tokio::task::JoinHandle<Result<(), ExportError>> {
        match self {
            Self::Local(f) => tokio::task::spawn_blocking(move || f.commit_blocking()),
            Self::Object(o) => tokio::spawn(o.commit()),
        }
    }

    /// Gives the file up; nothing becomes visible.
    pub async fn abort(self) {
        match self {
            Self::Local(f) => drop(f),
            Self::Object(o) => o.abort().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_http_endpoints_are_recognised() {
        assert!(is_loopback_http("http://127.0.0.1:9000"));
        assert!(is_loopback_http("http://localhost:9000/"));
        assert!(is_loopback_http("http://[::1]:9000"));
        assert!(is_loopback_http("http://127.10.0.1"));
        assert!(!is_loopback_http("https://127.0.0.1:9000"));
        assert!(!is_loopback_http("http://10.0.0.1:9000"));
        assert!(!is_loopback_http("http://s3.example.com"));
    }

    #[test]
    fn destinations_parse() {
        let s3 = S3Options {
            endpoint: Some("http://127.0.0.1:1".into()),
            region: Some("us-east-1".into()),
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
            ..S3Options::default()
        };
        assert!(matches!(
            Destination::parse("/tmp/x", &s3),
            Ok(Destination::Local { .. })
        ));
        match Destination::parse("s3://bucket/a/b/", &s3) {
            Ok(Destination::Object { prefix, .. }) => assert_eq!(prefix, "a/b"),
            other => panic!("{other:?}"),
        }
        assert!(Destination::parse("s3:///x", &s3).is_err());
        assert!(Destination::parse("gs://b/x", &s3).is_err());
        assert!(!format!("{s3:?}").contains("\"s\""), "secret leaked");
    }
}
