//! The host layout under `mpsRoot` that the daemons keep: the shm tmpfs ([`crate::cuda_mps::shm`])
//! and the markers (paths in [`crate::cuda_mps::layout`], which both sides share). Each daemon's pipe
//! and log folders are created by its start ([`crate::cuda_mps::server`]).

use std::path::{Path, PathBuf};

use crate::cuda_mps::layout as paths;
use crate::cuda_mps::shm::{self, ShmError};
use crate::files;

/// Why the layout could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    Shm(#[from] ShmError),
    #[error("cannot write {}: {source}", .path.display())]
    Marker {
        path: PathBuf,
        #[source]
        source: files::WriteError,
    },
}

/// Creates `<root>` and `<root>/shm`, and mounts the tmpfs on the latter unless it is mounted
/// already or `skip_mount`.
pub fn prepare_root(root: &Path, skip_mount: bool) -> Result<(), LayoutError> {
    Ok(shm::prepare(&paths::shm_dir(root), skip_mount)?)
}

/// Writes an (empty) marker file.
pub fn mark(path: &Path) -> Result<(), LayoutError> {
    files::write_atomic(path, b"", 0o644).map_err(|source| LayoutError::Marker {
        path: path.to_owned(),
        source,
    })
}

/// Removes a marker; one already gone is fine.
pub fn unmark(path: &Path) {
    if let Err(err) = std::fs::remove_file(path)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %err, "Cannot remove an MPS marker");
    }
}

/// Removes a stopped daemon's traces: its `.started` marker and its log folder, as NVIDIA's
/// daemon does on stop.
pub fn clear_resource(root: &Path, resource: &str) {
    unmark(&paths::started_marker(root, resource));
    let log = paths::log_dir(root, resource);
    if let Err(err) = std::fs::remove_dir_all(&log)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %log.display(), error = %err, "Cannot remove the MPS log folder");
    }
}
