//! Reading a config file with limits checked before any parsing: a size cap (a huge file is a
//! wrong path or an attack, and parsing it would cost memory and time) and, for YAML, a
//! nesting bound (see [`super::nesting`]). NVIDIA's config file, gpud's own, the exporter's
//! counters file and mig-parted's files all come through here.

use std::io::Read;
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
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error(
        "{path}: {size} bytes is over the {limit}-byte limit for a config file; refused \
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

/// Reads a text config file (any format) of at most [`MAX_CONFIG_BYTES`].
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let too_large = |size| ReadError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit: MAX_CONFIG_BYTES,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // The size a regular file claims is checked first; reading at most one byte past the
    // limit also bounds files whose size is not known up front (pipes, procfs).
    let claimed = file.metadata().map_err(io)?.len();
    if claimed > MAX_CONFIG_BYTES {
        return Err(too_large(claimed));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(claimed).unwrap_or(0));
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > MAX_CONFIG_BYTES {
        return Err(too_large(read));
    }
    String::from_utf8(bytes)
        .map_err(|err| io(std::io::Error::new(std::io::ErrorKind::InvalidData, err)))
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
                "{}: 5242880 bytes is over the 1048576-byte limit for a config file; refused \
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
}
