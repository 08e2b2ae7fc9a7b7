//! One MIG layout change at a time on a node: every create/destroy sequence — the MIG
//! manager's apply, a DRA claim's prepare and unprepare under dynamic MIG, remediation's
//! restore after a reset — holds this lock, so no writer sees another's layout half made.
//!
//! An exclusive `flock` on `mig-layout.lock` in the state directory serialises processes (the
//! DaemonSet's containers share the state hostPath); an in-process mutex serialises the
//! subsystems of one process even without a state directory. A lock goes with its process,
//! even a killed one.

use std::fs::File;
use std::path::Path;

use rustix::fs::{FlockOperation, flock};
use tokio::sync::{Mutex, MutexGuard};
use tracing::info;

/// The lock file's name in the state directory.
pub const FILE_NAME: &str = "mig-layout.lock";

/// Serialises this process's writers.
static IN_PROCESS: Mutex<()> = Mutex::const_new(());

/// The lock, held until dropped.
#[derive(Debug)]
pub struct LayoutLock {
    _file: Option<File>,
    _in_process: MutexGuard<'static, ()>,
}

/// Waits for the node's MIG layout lock for `what` (a change by whom, for the log); `dir` is
/// the state directory (`None`: this process only). Says in the log when it has to wait.
pub async fn lock(dir: Option<&Path>, what: &str) -> Result<LayoutLock, String> {
    let in_process = match IN_PROCESS.try_lock() {
        Ok(guard) => guard,
        Err(_) => {
            info!(
                change = what,
                "Waiting for another MIG layout change to finish"
            );
            IN_PROCESS.lock().await
        }
    };
    let Some(dir) = dir else {
        return Ok(LayoutLock {
            _file: None,
            _in_process: in_process,
        });
    };
    let path = dir.join(FILE_NAME);
    let file = open(dir, &path)?;
    if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
        info!(change = what, lock = %path.display(), "Waiting for another MIG layout change to finish");
        let waited = tokio::task::spawn_blocking(move || {
            flock(&file, FlockOperation::LockExclusive).map(|()| file)
        })
        .await
        .map_err(|e| format!("{}: waiting for the lock failed: {e}", path.display()))?;
        let file = waited.map_err(|e| format!("{}: cannot lock: {e}", path.display()))?;
        return Ok(LayoutLock {
            _file: Some(file),
            _in_process: in_process,
        });
    }
    Ok(LayoutLock {
        _file: Some(file),
        _in_process: in_process,
    })
}

fn open(dir: &Path, path: &Path) -> Result<File, String> {
    super::layout::make_dir(dir)?;
    super::layout::open_lock_file(path)
        .map_err(|e| format!("{}: cannot open the MIG layout lock: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_symlink_in_place_of_the_lock_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, dir.path().join(FILE_NAME)).unwrap();
        let err = lock(Some(dir.path()), "the test").await.unwrap_err();
        assert!(err.contains("cannot open the MIG layout lock"), "{err}");
        assert!(!elsewhere.exists());
    }

    #[tokio::test]
    async fn a_second_change_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock(Some(dir.path()), "first").await.unwrap();
        let other = File::open(dir.path().join(FILE_NAME)).unwrap();
        assert!(flock(&other, FlockOperation::NonBlockingLockExclusive).is_err());
        let second = crate::logging::spawn({
            let dir = dir.path().to_owned();
            async move { lock(Some(&dir), "second").await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert!(!second.is_finished());
        drop(first);
        second.await.unwrap().unwrap();
        assert!(flock(&other, FlockOperation::NonBlockingLockExclusive).is_ok());
    }
}
