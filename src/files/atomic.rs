//! Replacing a file that other programs read at any moment (NFD's features file, CDI specs):
//! they must see the old file or the whole new one, and never a temporary file left behind.
//!
//! The contents go to a hidden temporary file in the same folder (a rename is atomic only
//! within one filesystem), named `.<name>.<pid>.<n>.tmp` so no scanner that looks for
//! features files or `*.yaml`/`*.json` specs picks it up. It is flushed to disk, given its mode
//! explicitly (creating it with a mode only narrows it by the umask) and renamed over the
//! target; the folder is then synced so the rename survives a crash.
//!
//! Temporaries never outlive a failure: a failed step removes its own, and every write first
//! removes those of other processes (a writer killed mid-write, e.g. by `kill -9`, cannot clean
//! up; its successor does, on its first write at start).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A step of writing that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot {step}: {source}")]
pub struct WriteError {
    /// The file or folder involved.
    pub path: PathBuf,
    /// What was being done, e.g. `create a temporary file`.
    pub step: &'static str,
    /// The system error.
    #[source]
    pub source: io::Error,
}

fn fail(path: &Path, step: &'static str) -> impl FnOnce(io::Error) -> WriteError {
    let path = path.to_path_buf();
    move |source| WriteError { path, step, source }
}

/// Makes temporary names unique within the process (the pid makes them unique across).
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Replaces `path` with `contents` atomically, with permission bits `mode`. The folder must
/// exist.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), WriteError> {
    write_atomic_owned(path, contents, mode, None)
}

/// [`write_atomic`], the new file owned by `owner` (uid, gid) when given: an edited system
/// file keeps the owner it had, whoever runs the edit.
pub fn write_atomic_owned(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), WriteError> {
    remove_stale_temporaries(path);
    write_atomic_beside_others(path, contents, mode, owner)
}

/// [`write_atomic_owned`] without removing other processes' temporaries: for a writer that
/// shares the folder with other runs of itself and removes leftovers only while it holds a
/// lock that keeps every other run out (`gpud runtime configure`).
pub fn write_atomic_beside_others(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), WriteError> {
    let name = file_name(path)?;
    let dir = folder(path);
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let temp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let written = write_then_rename(&temp, path, contents, mode, owner);
    if written.is_err() {
        let _ = fs::remove_file(&temp);
        return written;
    }
    // Failing to sync a folder (some filesystems refuse) does not make the write less atomic.
    if let Ok(dir) = File::open(&dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

fn write_then_rename(
    temp: &Path,
    target: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), WriteError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(temp)
        .map_err(fail(temp, "create a temporary file"))?;
    file.write_all(contents)
        .map_err(fail(temp, "write the temporary file"))?;
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(fail(temp, "set the mode of the temporary file"))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
            .map_err(fail(temp, "set the owner of the temporary file"))?;
    }
    file.sync_all()
        .map_err(fail(temp, "sync the temporary file"))?;
    drop(file);
    fs::rename(temp, target).map_err(fail(target, "replace the file"))
}

/// Removes the temporaries that other processes left next to `path` (this process's own are
/// in flight or already gone); returns how many. Errors are ignored: a leftover that cannot
/// be removed now is tried again on the next write.
pub fn remove_stale_temporaries(path: &Path) -> usize {
    let Ok(name) = file_name(path) else {
        return 0;
    };
    let Ok(entries) = fs::read_dir(folder(path)) else {
        return 0;
    };
    let prefix = format!(".{name}.");
    let own = std::process::id().to_string();
    entries
        .flatten()
        .filter(|entry| {
            let entry_name = entry.file_name();
            let Some(middle) = entry_name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|n| n.strip_suffix(".tmp"))
            else {
                return false;
            };
            // `<pid>.<n>`, both decimal: nothing else in the folder matches by accident.
            match middle.split_once('.') {
                Some((pid, n)) if is_decimal(pid) && is_decimal(n) => pid != own,
                _ => false,
            }
        })
        .filter(|entry| fs::remove_file(entry.path()).is_ok())
        .count()
}

fn is_decimal(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

fn file_name(path: &Path) -> Result<String, WriteError> {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| WriteError {
            path: path.to_path_buf(),
            step: "use this path as a file",
            source: io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
        })
}

fn folder(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_with_the_mode_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gfd");
        write_atomic(&path, b"a=1\n", 0o644).unwrap();
        write_atomic(&path, b"a=2\n", 0o644).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a=2\n");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o644
        );
        assert_eq!(names(dir.path()), ["gfd"]);
    }

    /// What a writer killed mid-write leaves behind is removed by the next write; the files
    /// of this process and unrelated hidden files are kept.
    #[test]
    fn temporaries_of_a_killed_writer_are_removed_by_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gfd");
        for stale in [".gfd.1.0.tmp", ".gfd.4242.17.tmp"] {
            fs::write(dir.path().join(stale), "half").unwrap();
        }
        for kept in [".gfd.x.1.tmp", ".other.1.0.tmp", ".gfd.tmp", "gfd.1.0.tmp"] {
            fs::write(dir.path().join(kept), "").unwrap();
        }
        write_atomic(&path, b"a=1\n", 0o644).unwrap();
        assert_eq!(
            names(dir.path()),
            [
                ".gfd.tmp",
                ".gfd.x.1.tmp",
                ".other.1.0.tmp",
                "gfd",
                "gfd.1.0.tmp"
            ]
        );
        assert_eq!(remove_stale_temporaries(&path), 0);
    }

    #[test]
    fn every_failure_path_removes_its_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // The folder is missing: nothing is created.
        assert!(write_atomic(&dir.path().join("missing/gfd"), b"x", 0o644).is_err());
        assert!(names(dir.path()).is_empty());
        // The rename fails (the target is a non-empty folder): the temporary goes.
        let target = dir.path().join("gfd");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), "").unwrap();
        let err = write_atomic(&target, b"x", 0o644).unwrap_err();
        assert_eq!(err.step, "replace the file");
        assert_eq!(names(dir.path()), ["gfd"]);
    }

    /// A reader racing the writer only ever sees one of the complete versions.
    #[test]
    fn concurrent_reader_never_sees_a_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gfd");
        // Large enough that a non-atomic write would be observed half done.
        let a = "nvidia.com/gpu.product=A\n".repeat(4000);
        let b = "nvidia.com/gpu.product=B\n".repeat(3000);
        write_atomic(&path, a.as_bytes(), 0o644).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (path, a, b, done) = (path.clone(), a.clone(), b.clone(), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut reads = 0u32;
                while !done.load(Ordering::Relaxed) {
                    let seen = fs::read_to_string(&path).unwrap();
                    assert!(
                        seen == a || seen == b,
                        "partial file of {} bytes",
                        seen.len()
                    );
                    reads += 1;
                }
                reads
            })
        };
        for i in 0..300 {
            let text = if i % 2 == 0 { &b } else { &a };
            write_atomic(&path, text.as_bytes(), 0o644).unwrap();
        }
        done.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }
}
