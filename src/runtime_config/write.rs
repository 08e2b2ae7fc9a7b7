//! Putting an edited runtime config in place: atomically (a runtime restarted mid-write reads
//! the old file or the new one, never half), with the mode and owner the file had, and with a
//! backup of the file as it was before gpud first edited it.
//!
//! The backup (`<file>.gpud.bak`) is written once: a later edit keeps it, so it always holds
//! the file before gpud, which is what `--revert` compares with and restores. A revert removes
//! it, so the next edit takes a fresh one.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::Error;
use crate::files::{WriteError, write_atomic_owned};

/// The mode of a config file gpud creates: readable by all, as runtimes' packages install it.
const NEW_FILE_MODE: u32 = 0o644;

/// Where the file's contents before gpud's first edit are kept.
pub fn backup_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".gpud.bak");
    PathBuf::from(name)
}

/// The text of `path`, `None` when it does not exist.
pub fn read(path: &Path) -> Result<Option<String>, Error> {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| Error::Read {
            path: path.to_path_buf(),
            source: std::io::Error::new(ErrorKind::InvalidData, "not UTF-8 text"),
        }),
        // A file under a non-folder cannot exist either; writing it says why.
        Err(err) if matches!(err.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            Ok(None)
        }
        Err(source) => Err(Error::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Replaces `path` (whose text is `original`, `None` when it does not exist) with `contents`,
/// keeping its mode and owner; backs `original` up first unless a backup is already there.
pub fn put(path: &Path, original: Option<&str>, contents: &str) -> Result<(), Error> {
    let (mode, owner) = match fs::metadata(path) {
        Ok(meta) => (
            meta.permissions().mode() & 0o7777,
            Some((meta.uid(), meta.gid())),
        ),
        Err(_) => (NEW_FILE_MODE, None),
    };
    if let Some(folder) = path.parent().filter(|f| !f.as_os_str().is_empty()) {
        fs::create_dir_all(folder).map_err(|source| WriteError {
            path: folder.to_path_buf(),
            step: "create the folder",
            source,
        })?;
    }
    let backup = backup_path(path);
    if let Some(original) = original
        && !backup.exists()
    {
        write_atomic_owned(&backup, original.as_bytes(), mode, owner)?;
    }
    write_atomic_owned(path, contents.as_bytes(), mode, owner)?;
    Ok(())
}

/// Takes a reverted file's text (or its removal) and drops the backup.
pub fn put_reverted(path: &Path, contents: Option<&str>) -> Result<(), Error> {
    match contents {
        Some(text) => put(path, None, text)?,
        None => remove(path, "remove the file gpud created")?,
    }
    remove(&backup_path(path), "remove the backup")
}

fn remove(path: &Path, step: &'static str) -> Result<(), Error> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != ErrorKind::NotFound => Err(WriteError {
            path: path.to_path_buf(),
            step,
            source: err,
        }
        .into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_backup_is_kept_and_the_mode_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, "a = 1\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        put(&path, Some("a = 1\n"), "a = 2\n").unwrap();
        put(&path, Some("a = 2\n"), "a = 3\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a = 3\n");
        assert_eq!(fs::read_to_string(backup_path(&path)).unwrap(), "a = 1\n");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&backup_path(&path)), 0o600);
        put_reverted(&path, Some("a = 1\n")).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a = 1\n");
        assert!(!backup_path(&path).exists());
    }

    #[test]
    fn a_new_file_gets_its_folder_and_no_backup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crio.conf.d/99-gpud.conf");
        put(&path, None, "x = 1\n").unwrap();
        assert!(!backup_path(&path).exists());
        put_reverted(&path, None).unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn a_folder_that_cannot_be_made_is_a_write_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), "").unwrap();
        let err = put(&dir.path().join("file/config.toml"), None, "x").unwrap_err();
        assert!(matches!(err, Error::Write(_)), "{err}");
        assert!(
            err.to_string().contains("cannot create the folder"),
            "{err}"
        );
    }
}
