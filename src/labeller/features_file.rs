//! Sink 1: the NFD features file (`key=value` per line), written atomically.
//!
//! nfd-worker reads every file in its `features.d/` directory whenever it likes, so it must
//! never see a half-written file nor a leftover temporary: [`crate::files::write_atomic`]
//! replaces it in one step. The file is mode 0644: nfd-worker may run as another user.

use std::fs;
use std::path::Path;

use super::labels::Labels;
use crate::files::WriteError;

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

/// Replaces `path` with `contents` atomically (mode 0644). Readers see the old file or the new
/// one, never a mix; temporaries of an earlier, killed run are removed.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), WriteError> {
    crate::files::write_atomic(path, contents, FEATURES_FILE_MODE)
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
}
