//! Sink 1: the NFD features file (`key=value` per line), written atomically.
//!
//! nfd-worker reads every file in its `features.d/` directory whenever it likes, so it must
//! never see a half-written file: the labels go to a temporary file in the same directory
//! (a rename is only atomic within one filesystem), which is flushed to disk and then renamed
//! over the target; the directory is synced so the rename survives a crash. The file is made
//! mode 0644 explicitly: creating it with that mode only narrows it by the umask.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::labels::Labels;

/// Renders labels as NFD's local-source format: one `key=value` line each, sorted by key.
pub fn render(labels: &Labels) -> String {
    let mut text = String::with_capacity(labels.len() * 48);
    for (key, value) in labels {
        text.push_str(key);
        text.push('=');
        text.push_str(value);
        text.push('\n');
    }
    text
}

/// Mode of the features file: nfd-worker may run as another user.
pub const FEATURES_FILE_MODE: u32 = 0o644;

/// Makes temporary names unique within the process (the pid makes them unique across).
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// The temporary file next to `path`: `.<name>.<pid>.<n>.tmp` (hidden, so nfd-worker's
/// directory scan never picks it up as a features file).
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "features".into(), |n| n.to_string_lossy().into_owned());
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// Replaces `path` with `contents` atomically (mode 0644). Readers see the old file or the new
/// one, never a mix.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let temp = temp_path(path);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FEATURES_FILE_MODE)
            .open(&temp)?;
        file.write_all(contents)?;
        file.set_permissions(fs::Permissions::from_mode(FEATURES_FILE_MODE))?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
        return result;
    }
    // Persist the rename itself; failing to sync a directory (some filesystems refuse) does
    // not make the write less atomic.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(dir) = fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Removes the features file, as GFD does on a clean exit; a missing file is fine.
pub fn remove(path: &Path) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    #[test]
    fn renders_sorted_lines() {
        let labels: Labels = [("b/x", "2"), ("a/y", ""), ("a/x", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(render(&labels), "a/x=1\na/y=\nb/x=2\n");
        assert_eq!(render(&Labels::new()), "");
    }

    #[test]
    fn writes_replaces_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gfd");
        write_atomic(&path, b"a=1\n").unwrap();
        write_atomic(&path, b"a=2\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a=2\n");
        let mode = fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o644
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("gfd")]);
        remove(&path).unwrap();
        remove(&path).unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn missing_directory_is_an_error_without_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/gfd");
        assert!(write_atomic(&path, b"a=1\n").is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// A reader racing the writer only ever sees one of the complete versions.
    #[test]
    fn concurrent_reader_never_sees_a_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gfd");
        // Large enough that a non-atomic write would be observed half done.
        let a = "nvidia.com/gpu.product=A\n".repeat(4000);
        let b = "nvidia.com/gpu.product=B\n".repeat(3000);
        write_atomic(&path, a.as_bytes()).unwrap();
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
            write_atomic(
                &path,
                if i % 2 == 0 {
                    b.as_bytes()
                } else {
                    a.as_bytes()
                },
            )
            .unwrap();
        }
        done.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }
}
