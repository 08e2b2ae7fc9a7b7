//! Reading and putting back a runtime's config, the one path containerd's, CRI-O's and
//! Docker's files all take:
//!
//! - **bounded reads**: a regular file of at most [`MAX_CONFIG_BYTES`], opened without
//!   blocking, so a FIFO or `/dev/zero` named by mistake is refused at once and a huge file is
//!   refused before it is parsed;
//! - **atomic writes**: a temporary file in the same folder, synced, renamed over the file, with
//!   the mode and owner the file had. The temporary's name carries this process's id and a
//!   sequence number (`.<name>.<pid>.<n>.tmp`); only a run that holds the folder's lock
//!   ([`super::lock`]) removes leftovers, so no run ever deletes another's file in flight;
//! - **a backup** (`<file>.gpud.bak`) of the file as it was before gpud first changed it,
//!   written once and never overwritten.
//!
//! Every path here is the resolved file ([`super::resolve`]), never a symlink to it.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::Error;
use crate::files::{
    ReadError, WriteError, read_bytes, remove_stale_temporaries, write_atomic_beside_others,
};

/// The largest runtime config gpud reads (real ones are a few KiB; containerd's full default
/// dump is under 20 KiB).
pub const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// The mode of a config file gpud creates: readable by all, as runtimes' packages install it.
const NEW_FILE_MODE: u32 = 0o644;

/// `path` with `suffix` appended to its file name.
pub fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Where the file's contents before gpud's first edit are kept.
pub fn backup_path(path: &Path) -> PathBuf {
    beside(path, ".gpud.bak")
}

/// The text of `path`, `None` when it does not exist; a file that is not regular, over
/// [`MAX_CONFIG_BYTES`] or not UTF-8 is refused without reading it all.
pub fn read(path: &Path) -> Result<Option<String>, Error> {
    match read_bytes(path, MAX_CONFIG_BYTES) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| Error::Read {
            path: path.to_path_buf(),
            source: std::io::Error::new(ErrorKind::InvalidData, "not UTF-8 text"),
        }),
        // A file under a non-folder cannot exist either; writing it says why.
        Err(ReadError::Io { source, .. })
            if matches!(
                source.kind(),
                ErrorKind::NotFound | ErrorKind::NotADirectory
            ) =>
        {
            Ok(None)
        }
        Err(ReadError::Io { path, source }) => Err(Error::Read { path, source }),
        Err(other) => Err(Error::Unfit(other)),
    }
}

/// Creates the folder of `path` when missing.
pub fn make_folder(path: &Path) -> Result<(), Error> {
    if let Some(folder) = path.parent().filter(|f| !f.as_os_str().is_empty()) {
        fs::create_dir_all(folder).map_err(|source| WriteError {
            path: folder.to_path_buf(),
            step: "create the folder",
            source,
        })?;
    }
    Ok(())
}

/// Replaces `path` (whose text is `original`, `None` when it does not exist) with `contents`,
/// keeping its mode and owner; backs `original` up to `backup` first unless a backup is
/// already there. The caller holds the folder's lock.
pub fn put(
    path: &Path,
    backup: &Path,
    original: Option<&str>,
    contents: &str,
) -> Result<(), Error> {
    let (mode, owner) = mode_and_owner(path);
    make_folder(path)?;
    // `symlink_metadata`: anything at the backup's name, even a dangling link, is a backup
    // made before and is never replaced.
    if let Some(original) = original
        && fs::symlink_metadata(backup).is_err()
    {
        make_folder(backup)?;
        replace(backup, original.as_bytes(), mode, owner)?;
    }
    replace(path, contents.as_bytes(), mode, owner)
}

/// Writes a file gpud keeps for itself beside the config (its record), mode 0600.
pub fn put_own(path: &Path, contents: &str) -> Result<(), Error> {
    replace(path, contents.as_bytes(), 0o600, None)
}

/// The mode and owner `path` has, or a new file's.
fn mode_and_owner(path: &Path) -> (u32, Option<(u32, u32)>) {
    match fs::metadata(path) {
        Ok(meta) => (
            meta.permissions().mode() & 0o7777,
            Some((meta.uid(), meta.gid())),
        ),
        Err(_) => (NEW_FILE_MODE, None),
    }
}

/// Removes `path` if it is there.
pub fn remove(path: &Path, step: &'static str) -> Result<(), Error> {
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

/// A file to remove later through its folder's descriptor: after a restart that entered the
/// host's root (chroot), the path as this process first saw it no longer leads there.
#[derive(Debug)]
pub struct LaterRemoval {
    folder: File,
    name: std::ffi::OsString,
    path: PathBuf,
}

impl LaterRemoval {
    /// Opens the folder of `path` now.
    pub fn of(path: &Path) -> Result<LaterRemoval, Error> {
        let folder = match path.parent() {
            Some(folder) if !folder.as_os_str().is_empty() => folder,
            _ => Path::new("."),
        };
        let file = File::open(folder).map_err(|source| WriteError {
            path: folder.to_path_buf(),
            step: "open the folder",
            source,
        })?;
        Ok(LaterRemoval {
            folder: file,
            name: path.file_name().map(ToOwned::to_owned).unwrap_or_default(),
            path: path.to_path_buf(),
        })
    }

    /// Removes the file if it is there.
    pub fn remove(self, step: &'static str) -> Result<(), Error> {
        match rustix::fs::unlinkat(
            &self.folder,
            self.name.as_os_str(),
            rustix::fs::AtFlags::empty(),
        ) {
            Err(errno) if errno != rustix::io::Errno::NOENT => Err(WriteError {
                path: self.path,
                step,
                source: errno.into(),
            }
            .into()),
            _ => Ok(()),
        }
    }
}

/// Replaces `path` with `contents` atomically, through a temporary file of this process that
/// no other run removes ([`crate::files::write_atomic_beside_others`]).
fn replace(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), Error> {
    Ok(write_atomic_beside_others(path, contents, mode, owner)?)
}

/// Removes the temporaries runs killed mid-write left beside `path`. Only a run holding the
/// folder's lock calls this: every other writer waits for that lock, so none is in flight.
pub fn remove_leftovers(path: &Path) {
    remove_stale_temporaries(path);
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
        let backup = backup_path(&path);
        put(&path, &backup, Some("a = 1\n"), "a = 2\n").unwrap();
        put(&path, &backup, Some("a = 2\n"), "a = 3\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a = 3\n");
        assert_eq!(fs::read_to_string(backup_path(&path)).unwrap(), "a = 1\n");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&backup_path(&path)), 0o600);
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "no temporary left");
    }

    #[test]
    fn a_new_file_gets_its_folder_and_no_backup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crio.conf.d/99-gpud.conf");
        put(&path, &backup_path(&path), None, "x = 1\n").unwrap();
        assert!(!backup_path(&path).exists());
    }

    #[test]
    fn a_folder_that_cannot_be_made_is_a_write_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), "").unwrap();
        let path = dir.path().join("file/config.toml");
        let err = put(&path, &backup_path(&path), None, "x").unwrap_err();
        assert!(matches!(err, Error::Write(_)), "{err}");
        assert!(
            err.to_string().contains("cannot create the folder"),
            "{err}"
        );
    }

    #[test]
    fn only_gpuds_leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        for name in [".config.toml.12.0.tmp", ".config.toml.bak.tmp", "x"] {
            fs::write(dir.path().join(name), "").unwrap();
        }
        remove_leftovers(&path);
        assert!(!dir.path().join(".config.toml.12.0.tmp").exists());
        assert!(dir.path().join(".config.toml.bak.tmp").exists());
        assert!(dir.path().join("x").exists());
    }

    #[test]
    fn a_fifo_and_a_device_are_refused_without_reading() {
        let err = read(Path::new("/dev/zero")).unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
        assert!(err.is_data());
    }
}
