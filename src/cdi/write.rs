//! Puts a spec file in place atomically, world-readable.
//!
//! Runtimes rescan the CDI folders at any moment, so a reader must see either the old file or
//! the whole new one: [`crate::files::write_atomic`] replaces it in one step through a hidden
//! temporary (a name ending in neither `.yaml` nor `.json`, so no scan picks it up), mode 0644
//! (the runtime may run as another user; the umask must not decide).

use std::fs;
use std::path::{Path, PathBuf};

pub use crate::files::WriteError;

/// Mode of a written spec file.
pub const SPEC_FILE_MODE: u32 = 0o644;

/// Writes `text` to `path` atomically with mode 0644, creating the folder if needed.
pub fn write_atomic(path: &Path, text: &str) -> Result<(), WriteError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(|source| WriteError {
        path: dir.clone(),
        step: "create the folder",
        source,
    })?;
    crate::files::write_atomic(path, text.as_bytes(), SPEC_FILE_MODE)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

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
