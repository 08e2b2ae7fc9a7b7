//! Reading a file gpud is told about (config files, the counters CSV, the kubeconfig, state
//! kept by another process such as the DRA checkpoint) with limits checked before any parsing:
//!
//! - **regular files only, opened without blocking**: a FIFO would hang its reader forever (and
//!   gpud reads its config while signals wait), a device such as `/dev/zero` never ends; both
//!   are refused at once, naming the path and what it is;
//! - **a size cap** (a huge file is a wrong path or an attack, and parsing it would cost memory
//!   and time), checked on the size the file claims and again on what is read;
//! - for YAML, **a nesting bound** (see [`super::nesting`]).
//!
//! NVIDIA's config file, gpud's own, the exporter's counters file, mig-parted's files, the
//! kubeconfig, the DRA checkpoint and the MIG reconciler's state all come through here.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::nesting::{MAX_NESTING, nesting_beyond};

/// Largest config file read: generous for NVIDIA's and mig-parted's files (a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// A config file refused before parsing.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file cannot be opened or read, or is not UTF-8.
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The path is not a regular file (a FIFO, a device, a directory, a socket).
    #[error(
        "{path}: is {kind}, not a regular file; refused without reading (name the file itself)"
    )]
    NotRegular { path: PathBuf, kind: &'static str },
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error(
        "{path}: {size} bytes is over the {limit}-byte limit for this file; refused \
         without parsing (check that the path names the intended file)"
    )]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    /// The YAML nests deeper than [`MAX_NESTING`] levels.
    #[error(
        "{path}: line {line}: nested {depth} levels deep, over the limit of {limit}; refused \
         without parsing"
    )]
    TooDeep {
        path: PathBuf,
        line: usize,
        depth: usize,
        limit: usize,
    },
}

impl ReadError {
    /// Whether the file does not exist (for state files, where that means "nothing yet").
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Opens `path` for reading if it is a regular file, without ever blocking: `O_NONBLOCK` makes
/// opening a FIFO return at once (a FIFO with no writer would otherwise block `open` itself),
/// and the type is checked on the opened file, so a symlink to a device is caught too.
pub fn open_regular(path: &Path) -> Result<std::fs::File, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(io)?;
    let kind = file.metadata().map_err(io)?.file_type();
    let what = if kind.is_file() {
        return Ok(file);
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    Err(ReadError::NotRegular {
        path: path.to_path_buf(),
        kind: what,
    })
}

/// Reads a regular file of at most `limit` bytes.
pub fn read_bytes(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let too_large = |size| ReadError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit,
    };
    let file = open_regular(path)?;
    // The size a regular file claims is checked first; reading at most one byte past the
    // limit also bounds a file that grows while it is read.
    let claimed = file.metadata().map_err(io)?.len();
    if claimed > limit {
        return Err(too_large(claimed));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(claimed).unwrap_or(0));
    file.take(limit + 1).read_to_end(&mut bytes).map_err(io)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > limit {
        return Err(too_large(read));
    }
    Ok(bytes)
}

/// Reads a text config file (any format) of at most [`MAX_CONFIG_BYTES`].
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    let bytes = read_bytes(path, MAX_CONFIG_BYTES)?;
    String::from_utf8(bytes).map_err(|err| ReadError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, err),
    })
}

/// Reads YAML text from standard input (`-f -`), with the same size and nesting limits; `what`
/// names it in errors. Standard input is a pipe the user chose, so it may block.
pub fn read_stdin_yaml(what: &Path) -> Result<String, ReadError> {
    let io = |source| ReadError::Io {
        path: what.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > MAX_CONFIG_BYTES {
        return Err(ReadError::TooLarge {
            path: what.to_path_buf(),
            size: read,
            limit: MAX_CONFIG_BYTES,
        });
    }
    let text = String::from_utf8(bytes)
        .map_err(|err| io(std::io::Error::new(std::io::ErrorKind::InvalidData, err)))?;
    check_nesting(what, &text)?;
    Ok(text)
}

/// Reads a YAML (or JSON) config file: [`read_text`], then the nesting bound.
pub fn read_yaml(path: &Path) -> Result<String, ReadError> {
    let text = read_text(path)?;
    check_nesting(path, &text)?;
    Ok(text)
}

/// The nesting bound alone, for YAML text that did not come from a file read here.
pub fn check_nesting(path: &Path, text: &str) -> Result<(), ReadError> {
    match nesting_beyond(text, MAX_NESTING) {
        Some((line, depth)) => Err(ReadError::TooDeep {
            path: path.to_path_buf(),
            line,
            depth,
            limit: MAX_NESTING,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_file_over_the_limit_is_refused_naming_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, vec![b'a'; 5 * 1024 * 1024]).unwrap();
        let err = read_yaml(&path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: 5242880 bytes is over the 1048576-byte limit for this file; refused \
                 without parsing (check that the path names the intended file)",
                path.display()
            )
        );
        std::fs::write(&path, vec![b'a'; 1024 * 1024]).unwrap();
        assert_eq!(read_text(&path).unwrap().len(), 1024 * 1024);
    }

    #[test]
    fn deep_nesting_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            format!("version: v1\nflags: {}", "[".repeat(200_000)),
        )
        .unwrap();
        let started = Instant::now();
        let err = read_yaml(&path).unwrap_err();
        println!("200 KB of brackets refused in {:?}", started.elapsed());
        assert_eq!(
            err.to_string(),
            format!(
                "{}: line 2: nested 65 levels deep, over the limit of 64; refused without parsing",
                path.display()
            )
        );
        // Text files other than YAML get the size limit only.
        assert!(read_text(&path).is_ok());
    }

    #[test]
    fn missing_and_non_utf8_files_are_read_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.yaml");
        let err = read_yaml(&path).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("{}: cannot read: ", path.display())),
            "{err}"
        );
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(matches!(read_yaml(&path), Err(ReadError::Io { .. })));
    }

    #[test]
    fn fifos_devices_and_folders_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config.fifo");
        nix::unistd::mkfifo(
            &fifo,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .unwrap();
        // No writer: a blocking open would never return.
        let err = read_text(&fifo).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: is a FIFO, not a regular file; refused without reading (name the file itself)",
                fifo.display()
            )
        );
        let zero = dir.path().join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(matches!(
            read_bytes(&zero, 10),
            Err(ReadError::NotRegular {
                kind: "a character device",
                ..
            })
        ));
        assert!(matches!(
            read_text(dir.path()),
            Err(ReadError::NotRegular {
                kind: "a directory",
                ..
            })
        ));
        assert!(
            read_text(&dir.path().join("absent"))
                .unwrap_err()
                .is_not_found()
        );
        assert!(!read_text(&fifo).unwrap_err().is_not_found());
    }
}
