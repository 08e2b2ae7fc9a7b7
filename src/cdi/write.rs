//! Puts a spec file in place atomically, world-readable.
//!
//! Runtimes rescan the CDI folders at any moment, so a reader must see either the old file or
//! the whole new one: the text goes to a temporary file in the same folder (a name ending in
//! neither `.yaml` nor `.json`, so no scan picks it up), is flushed to disk, made mode 0644
//! (the runtime may run as another user; the umask must not decide) and renamed over the
//! target; the folder is then synced so the rename survives a crash.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of a written spec file.
pub const SPEC_FILE_MODE: u32 = 0o644;

/// A step of writing that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot {step}: {source}")]
pub struct WriteError {
    /// The file or folder involved.
    pub path: PathBuf,
    /// What was being done, e.g. `create the folder`.
    pub step: &'static str,
    /// The system error.
    #[source]
    pub source: io::Error,
}

fn fail(path: &Path, step: &'static str) -> impl FnOnce(io::Error) -> WriteError {
    let path = path.to_path_buf();
    move |source| WriteError { path, step, source }
}

/// Writes `text` to `path` atomically with mode 0644, creating the folder if needed.
pub fn write_atomic(path: &Path, text: &str) -> Result<(), WriteError> {
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| WriteError {
            path: path.to_path_buf(),
            step: "use this path as a file",
            source: io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
        })?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(fail(&dir, "create the folder"))?;
    let temp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = write_then_rename(&temp, path, text);
    if result.is_err() {
        // Best effort: a leftover temporary file is harmless to runtimes but untidy.
        let _ = fs::remove_file(&temp);
    }
    result?;
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(fail(&dir, "sync the folder"))
}

fn write_then_rename(temp: &Path, target: &Path, text: &str) -> Result<(), WriteError> {
    // A stale file from a crashed run with the same pid would make create_new fail.
    let _ = fs::remove_file(temp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(SPEC_FILE_MODE)
        .open(temp)
        .map_err(fail(temp, "create a temporary file"))?;
    file.write_all(text.as_bytes())
        .map_err(fail(temp, "write the temporary file"))?;
    file.set_permissions(fs::Permissions::from_mode(SPEC_FILE_MODE))
        .map_err(fail(temp, "set the mode of the temporary file"))?;
    file.sync_all()
        .map_err(fail(temp, "sync the temporary file"))?;
    drop(file);
    fs::rename(temp, target).map_err(fail(target, "replace the file"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_the_folder_and_writes_world_readable_without_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("run/cdi/nvidia.yaml");
        write_atomic(&target, "first\n").unwrap();
        write_atomic(&target, "second\n").unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "second\n");
        let mode = fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let names: Vec<_> = fs::read_dir(target.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["nvidia.yaml"]);
    }

    #[test]
    fn failure_names_the_path_and_step() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        fs::write(&blocker, "").unwrap();
        let err = write_atomic(&blocker.join("nvidia.yaml"), "x").unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "{}: cannot create the folder: ",
                blocker.display()
            )),
            "{err}"
        );
    }
}
