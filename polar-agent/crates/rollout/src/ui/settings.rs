//! `[rollout.dashboard]`: what the dashboard may read besides the server's
//! own state, and the tokenizer it shows token text with. The exported trajectory files a sample names
//! (`result.trajectory_uri`, written by a gateway) are read only beneath
//! `export_roots` (local directories) and `s3_roots` (`s3://bucket/prefix`,
//! with the store's `[rollout.dashboard.s3]` settings and the server's own
//! `AWS_*` credentials), which the operator sets; nothing a task spec, a
//! gateway or a sandbox says widens them. `tokenizer` is the operator's
//! Hugging Face `tokenizer.json` of the policy being trained: checked here
//! (an absolute path), loaded by [`DashboardSettings::load_tokenizer`] when
//! the server starts, before anything is bound or opened (a missing or
//! broken file stops the start), and used to show each token's text
//! (`token_text`).

use std::path::{Component, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use polar_export::S3Options;
use polar_export::object::ObjectReader;
use polar_spec::{KeyError, KeyPath};

use super::token_text::TokenText;

/// The largest exported file read by default (256 MiB).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 << 20;

/// `[rollout.dashboard]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDashboard {
    /// Directories the exported files may be read beneath (absolute).
    pub export_roots: Option<Vec<PathBuf>>,
    /// The largest exported file read.
    pub max_file_bytes: Option<u64>,
    /// `s3://bucket/prefix` URLs the exported objects may be read beneath.
    pub s3_roots: Option<Vec<String>>,
    /// The S3-compatible store of `s3_roots`.
    pub s3: Option<RawDashboardS3>,
    /// The policy's Hugging Face `tokenizer.json` (absolute).
    pub tokenizer: Option<PathBuf>,
}

/// `[rollout.dashboard.s3]` as written: where the store is, never
/// credentials (those come from the server's `AWS_*` environment).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDashboardS3 {
    /// Endpoint URL of a non-AWS store.
    pub endpoint: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Plain HTTP (implied for a loopback endpoint).
    pub allow_http: Option<bool>,
}

/// One of `s3_roots`, checked, with its bucket's client.
#[derive(Debug, Clone)]
pub struct S3Root {
    /// The bucket.
    pub bucket: String,
    /// The key prefix (no leading or trailing `/`; empty: the whole
    /// bucket).
    pub prefix: String,
    /// Reads the bucket.
    pub reader: ObjectReader,
}

impl PartialEq for S3Root {
    fn eq(&self, other: &Self) -> bool {
        // The client is made from the bucket and the settings' `s3`.
        (&self.bucket, &self.prefix) == (&other.bucket, &other.prefix)
    }
}

impl Eq for S3Root {}

/// The dashboard's settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DashboardSettings {
    /// Directories the exported files may be read beneath (absolute, no
    /// `.` or `..`); empty: the dashboard shows no trajectory.
    pub export_roots: Vec<PathBuf>,
    /// The largest exported file read.
    pub max_file_bytes: u64,
    /// Buckets and key prefixes the exported objects may be read beneath;
    /// empty: no `s3://` export is read.
    pub s3_roots: Vec<S3Root>,
    /// The store of `s3_roots` (from the file: no credentials, the
    /// environment's).
    pub s3: S3Options,
    /// The policy's `tokenizer.json` (absolute); none: ids only.
    pub tokenizer_file: Option<PathBuf>,
    /// `tokenizer_file`, loaded ([`DashboardSettings::load_tokenizer`]).
    pub tokenizer: Option<Arc<TokenText>>,
}

impl Default for DashboardSettings {
    fn default() -> Self {
        Self {
            export_roots: Vec::new(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            s3_roots: Vec::new(),
            s3: S3Options::default(),
            tokenizer_file: None,
            tokenizer: None,
        }
    }
}

impl DashboardSettings {
    /// Checks the raw settings; an error's key is below the dashboard's table.
    pub fn from_raw(raw: &RawDashboard) -> Result<Self, KeyError> {
        let mut out = Self::default();
        for (i, root) in raw.export_roots.iter().flatten().enumerate() {
            let key = || KeyPath::root().key("export_roots").index(i);
            if !root.is_absolute() {
                return Err(KeyError::new(
                    key(),
                    format!("{}: must be absolute", root.display()),
                ));
            }
            if root
                .components()
                .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
            {
                return Err(KeyError::new(
                    key(),
                    format!("{}: no `.` or `..`", root.display()),
                ));
            }
            out.export_roots.push(root.clone());
        }
        if let Some(n) = raw.max_file_bytes {
            if n < 1024 {
                return Err(KeyError::new(
                    KeyPath::root().key("max_file_bytes"),
                    "must be at least 1024",
                ));
            }
            out.max_file_bytes = n;
        }
        if let Some(s3) = &raw.s3 {
            if let Some(e) = &s3.endpoint {
                if !(e.starts_with("http://") || e.starts_with("https://")) {
                    return Err(KeyError::new(
                        KeyPath::root().key("s3").key("endpoint"),
                        format!("{e}: not an http:// or https:// URL"),
                    ));
                }
                out.s3.endpoint = Some(e.clone());
            }
            if let Some(r) = &s3.region {
                if r.is_empty() {
                    return Err(KeyError::new(
                        KeyPath::root().key("s3").key("region"),
                        "empty",
                    ));
                }
                out.s3.region = Some(r.clone());
            }
            out.s3.allow_http = s3.allow_http.unwrap_or(false);
        }
        if let Some(path) = &raw.tokenizer {
            if !path.is_absolute() {
                return Err(KeyError::new(
                    KeyPath::root().key("tokenizer"),
                    format!("{}: must be absolute", path.display()),
                ));
            }
            out.tokenizer_file = Some(path.clone());
        }
        let s3 = out.s3.clone();
        out.set_s3_roots(raw.s3_roots.as_deref().unwrap_or_default(), s3)?;
        Ok(out)
    }

    /// Loads `tokenizer_file` (once; blocks: reads and parses it). An
    /// error's key is below the dashboard's table.
    pub fn load_tokenizer(&mut self) -> Result<(), KeyError> {
        if let (Some(path), None) = (&self.tokenizer_file, &self.tokenizer) {
            let loaded = TokenText::load(path)
                .map_err(|e| KeyError::new(KeyPath::root().key("tokenizer"), e.to_string()))?;
            self.tokenizer = Some(Arc::new(loaded));
        }
        Ok(())
    }

    /// Sets `s3_roots` (`s3://bucket/prefix` each) and their store's
    /// options. The configuration file gives no credentials (the
    /// environment does); a program embedding the server may. An error's
    /// key is below the dashboard's table.
    pub fn set_s3_roots(&mut self, roots: &[String], s3: S3Options) -> Result<(), KeyError> {
        let mut checked = Vec::with_capacity(roots.len());
        for (i, root) in roots.iter().enumerate() {
            let key = || KeyPath::root().key("s3_roots").index(i);
            let Some(rest) = root.strip_prefix("s3://") else {
                return Err(KeyError::new(
                    key(),
                    format!("{root}: not an s3://bucket/prefix URL"),
                ));
            };
            let (bucket, prefix) = super::exports::split_s3(rest.trim_end_matches('/'), true)
                .map_err(|why| KeyError::new(key(), format!("{root}: {why}")))?;
            let reader =
                ObjectReader::s3(bucket, &s3).map_err(|e| KeyError::new(key(), e.to_string()))?;
            checked.push(S3Root {
                bucket: bucket.to_owned(),
                prefix: prefix.to_owned(),
                reader,
            });
        }
        self.s3_roots = checked;
        self.s3 = s3;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_are_absolute_and_plain() {
        let raw = |roots: &[&str]| RawDashboard {
            export_roots: Some(roots.iter().map(PathBuf::from).collect()),
            ..RawDashboard::default()
        };
        let ok = DashboardSettings::from_raw(&raw(&["/srv/a", "/mnt/b/"])).unwrap();
        assert_eq!(ok.export_roots.len(), 2);
        assert_eq!(ok.max_file_bytes, DEFAULT_MAX_FILE_BYTES);
        let e = DashboardSettings::from_raw(&raw(&["/srv/a", "rel"])).unwrap_err();
        assert_eq!(e.key.to_string(), "export_roots[1]");
        let e = DashboardSettings::from_raw(&raw(&["/srv/../etc"])).unwrap_err();
        assert!(e.reason.contains("no `.` or `..`"), "{e:?}");
        let e = DashboardSettings::from_raw(&RawDashboard {
            max_file_bytes: Some(10),
            ..RawDashboard::default()
        })
        .unwrap_err();
        assert_eq!(e.key.to_string(), "max_file_bytes");
    }

    #[test]
    fn s3_roots_are_buckets_and_plain_prefixes() {
        let raw = |roots: &[&str]| RawDashboard {
            s3_roots: Some(roots.iter().map(|r| (*r).to_owned()).collect()),
            s3: Some(RawDashboardS3 {
                endpoint: Some("http://127.0.0.1:9000".into()),
                region: Some("us-east-1".into()),
                allow_http: None,
            }),
            ..RawDashboard::default()
        };
        let ok = DashboardSettings::from_raw(&raw(&["s3://rollouts/runs/", "s3://other"])).unwrap();
        let roots: Vec<_> = ok
            .s3_roots
            .iter()
            .map(|r| (r.bucket.as_str(), r.prefix.as_str(), r.reader.bucket()))
            .collect();
        assert_eq!(
            roots,
            [("rollouts", "runs", "rollouts"), ("other", "", "other")]
        );
        assert_eq!(ok.s3.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(ok.s3.access_key_id, None);
        for (bad, why) in [
            ("/srv/x", "not an s3://bucket/prefix URL"),
            ("s3://", "bucket"),
            ("s3://Rollouts/x", "bucket"),
            ("s3://rollouts/a/../b", "`..`"),
            ("s3://rollouts/a//b", "empty segment"),
        ] {
            let e = DashboardSettings::from_raw(&raw(&["s3://ok-bucket", bad])).unwrap_err();
            assert_eq!(e.key.to_string(), "s3_roots[1]", "{bad}");
            assert!(e.reason.contains(why), "{bad}: {e:?}");
        }
        let mut r = raw(&["s3://rollouts"]);
        if let Some(s3) = &mut r.s3 {
            s3.endpoint = Some("127.0.0.1:9000".into());
        }
        assert_eq!(
            DashboardSettings::from_raw(&r).unwrap_err().key.to_string(),
            "s3.endpoint"
        );
    }
}
