//! Objects in S3-compatible storage, never visible half-written: a small
//! file is sent in one PUT when it is complete; a file that outgrows one
//! part becomes a multipart upload, which the store makes visible only when
//! it is completed (and which is aborted on failure). Memory per open
//! object: at most one part plus the parts in flight. And the other way:
//! [`ObjectReader`] reads one object whole, never more than a bound (the
//! dashboard's view of an S3 export).

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, ObjectStore, ObjectStoreExt as _, PutPayload, RetryConfig, WriteMultipart,
};

use super::dest::S3Options;
use super::error::ExportError;

/// Size of one multipart part (S3's minimum is 5 MiB, except the last).
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts uploaded at once.
const PARTS_IN_FLIGHT: usize = 2;

/// An object being written.
pub struct ObjectFile {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    pending: Vec<Bytes>,
    pending_len: usize,
    upload: Option<WriteMultipart>,
}

impl std::fmt::Debug for ObjectFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectFile")
            .field("path", &self.path)
            .field("pending_len", &self.pending_len)
            .field("multipart", &self.upload.is_some())
            .finish()
    }
}

impl ObjectFile {
    /// Starts object `path` (nothing is sent yet).
    pub fn create(store: Arc<dyn ObjectStore>, path: ObjectPath) -> Self {
        Self {
            store,
            path,
            pending: Vec::new(),
            pending_len: 0,
            upload: None,
        }
    }

    /// Appends `data`.
    pub async fn write(&mut self, data: Vec<u8>) -> Result<(), ExportError> {
        if data.is_empty() {
            return Ok(());
        }
        let data = Bytes::from(data);
        if let Some(upload) = &mut self.upload {
            upload
                .wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(|e| ExportError::store("uploading a part of", &self.path, e))?;
            upload.put(data);
            return Ok(());
        }
        self.pending_len += data.len();
        self.pending.push(data);
        if self.pending_len >= PART_SIZE {
            let upload =
                self.store.put_multipart(&self.path).await.map_err(|e| {
                    ExportError::store("starting a multipart upload of", &self.path, e)
                })?;
            let mut upload = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
            for chunk in self.pending.drain(..) {
                upload.put(chunk);
            }
            self.pending_len = 0;
            self.upload = Some(upload);
        }
        Ok(())
    }

    /// Makes the object visible, whole.
    pub async fn commit(mut self) -> Result<(), ExportError> {
        match self.upload.take() {
            Some(upload) => {
                upload
                    .finish()
                    .await
                    .map_err(|e| ExportError::store("completing the upload of", &self.path, e))?;
            }
            None => {
                let payload: PutPayload = self.pending.drain(..).collect();
                self.store
                    .put(&self.path, payload)
                    .await
                    .map_err(|e| ExportError::store("putting", &self.path, e))?;
            }
        }
        Ok(())
    }

    /// Gives up: a started multipart upload is aborted (an unfinished one
    /// is never visible either way).
    pub async fn abort(mut self) {
        if let Some(upload) = self.upload.take()
            && let Err(e) = upload.abort().await
        {
            tracing::warn!(object = %self.path, error = %e, "could not abort a multipart upload");
        }
    }
}

/// Retries of a read: two, within 10 seconds (object_store's default is
/// ten within three minutes, right for an export nobody waits on).
fn read_retry() -> RetryConfig {
    RetryConfig {
        max_retries: 2,
        retry_timeout: std::time::Duration::from_secs(10),
        ..RetryConfig::default()
    }
}

/// What a bounded read found.
#[derive(Debug)]
pub enum BoundedRead {
    /// The whole object.
    Whole(Bytes),
    /// No such object.
    NotFound,
    /// The object is larger than the bound (its size, or at least the
    /// bytes seen): nothing more is read.
    TooLarge(u64),
}

/// Reads objects of one bucket whole and bounded: a HEAD first (an object
/// over the bound is refused unread), then a GET of that same version (by
/// its ETag) that stops as soon as more than the bound has arrived.
#[derive(Clone)]
pub struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    bucket: String,
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectReader")
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

impl ObjectReader {
    /// A reader of S3 bucket `bucket`, configured as [`S3Options::store`]
    /// (nothing is sent yet). Someone waits on the answer: a failing store
    /// is retried briefly (`read_retry`), not for the export's minutes.
    pub fn s3(bucket: &str, s3: &S3Options) -> Result<Self, ExportError> {
        let store = s3
            .builder(bucket)
            .with_retry(read_retry())
            .build()
            .map_err(|e| ExportError::Destination {
                destination: format!("s3://{bucket}"),
                why: e.to_string(),
            })?;
        Ok(Self {
            store: Arc::new(store),
            bucket: bucket.to_owned(),
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Reads object `key` if it holds at most `max` bytes.
    pub async fn read(&self, key: &str, max: u64) -> Result<BoundedRead, ExportError> {
        let location = format!("s3://{}/{key}", self.bucket);
        let path = ObjectPath::parse(key).map_err(|e| ExportError::Destination {
            destination: location.clone(),
            why: e.to_string(),
        })?;
        let meta = match self.store.head(&path).await {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => return Ok(BoundedRead::NotFound),
            Err(e) => return Err(ExportError::store("HEAD", &location, e)),
        };
        if meta.size > max {
            return Ok(BoundedRead::TooLarge(meta.size));
        }
        let options = GetOptions {
            if_match: meta.e_tag,
            ..GetOptions::default()
        };
        let got = match self.store.get_opts(&path, options).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(BoundedRead::NotFound),
            Err(e) => return Err(ExportError::store("GET", &location, e)),
        };
        let mut stream = got.into_stream();
        let mut buf = Vec::with_capacity(usize::try_from(meta.size).unwrap_or(0));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ExportError::store("GET", &location, e))?;
            let seen = (buf.len() + chunk.len()) as u64;
            if seen > max {
                return Ok(BoundedRead::TooLarge(seen));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(BoundedRead::Whole(Bytes::from(buf)))
    }
}
