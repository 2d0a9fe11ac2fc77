//! Objects in S3-compatible storage, never visible half-written: a small
//! file is sent in one PUT when it is complete; a file that outgrows one
//! part becomes a multipart upload, which the store makes visible only when
//! it is completed (and which is aborted on failure). Memory per open
//! object: at most one part plus the parts in flight.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload, WriteMultipart};

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
