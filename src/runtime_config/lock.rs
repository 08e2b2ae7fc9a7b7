//! One `gpud runtime configure` at a time per folder: an exclusive `flock` on the config's
//! folder, held from the read to the last write (the config, its backup, gpud's record) and
//! the restart, so two runs never both read the old file and each write their own edit over
//! the other's. Locking the folder rather than the file survives the rename that replaces the
//! file, and leaves no lock file behind. The lock goes with the process, even a killed one.

use std::fs::File;
use std::path::Path;

use rustix::fs::{FlockOperation, flock};

use super::Error;
use crate::files::WriteError;

/// The folder's lock, held until dropped.
#[derive(Debug)]
pub struct FolderLock {
    _folder: File,
}

/// Waits for the exclusive lock on the folder of `path` (which must exist).
pub fn lock_folder_of(path: &Path) -> Result<FolderLock, Error> {
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    let failed = |source: std::io::Error| {
        Error::Write(WriteError {
            path: folder.to_path_buf(),
            step: "lock the folder against another gpud runtime configure",
            source,
        })
    };
    let file = File::open(folder).map_err(failed)?;
    flock(&file, FlockOperation::LockExclusive).map_err(|errno| failed(errno.into()))?;
    Ok(FolderLock { _folder: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let first = lock_folder_of(&path).unwrap();
        let other = File::open(dir.path()).unwrap();
        assert!(flock(&other, FlockOperation::NonBlockingLockExclusive).is_err());
        drop(first);
        assert!(flock(&other, FlockOperation::NonBlockingLockExclusive).is_ok());
    }
}
