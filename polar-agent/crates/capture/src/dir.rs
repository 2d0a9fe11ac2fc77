//! Making a directory's entries durable: the one `fsync` of a directory the
//! store, the journal's owners and the replay call after creating, renaming
//! or removing in it.

use std::fs::File;
use std::path::Path;

use polar_capture_log::LogError;

/// Makes a directory entry durable (after creating or renaming in it).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LogError::io("syncing directory", dir, e))
}
