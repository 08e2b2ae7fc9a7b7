//! `chmod --mode MODE --path PATH…`: permission bits of files inside the container (device
//! nodes a runtime creates with its own modes). Paths that do not exist are skipped, as
//! NVIDIA's hook does; a symlink as the last component is refused, never followed.

use std::path::PathBuf;

use super::error::HookError;
use super::root::Root;

/// Parses an octal mode (`755`, `0666`) of permission bits only, for clap.
pub fn parse_mode(value: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(value, 8)
        .map_err(|_| format!("'{value}' is not an octal mode such as 755"))?;
    if mode > 0o7777 {
        return Err(format!(
            "'{value}' has bits beyond the permission bits (at most 7777)"
        ));
    }
    Ok(mode)
}

/// Sets `mode` on every path that exists; returns the paths changed.
pub fn apply(root: &Root, mode: u32, paths: &[PathBuf]) -> Result<Vec<PathBuf>, HookError> {
    let mut changed = Vec::new();
    for path in paths {
        if root.chmod(path, mode)? {
            changed.push(path.clone());
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn modes_are_octal_permission_bits() {
        assert_eq!(parse_mode("755"), Ok(0o755));
        assert_eq!(parse_mode("0666"), Ok(0o666));
        assert!(parse_mode("rwx").unwrap_err().contains("octal"));
        assert!(parse_mode("17777").unwrap_err().contains("permission bits"));
    }

    #[test]
    fn missing_paths_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("card0"), "").unwrap();
        let root = Root::open(dir.path()).unwrap();
        let paths = [PathBuf::from("/card0"), PathBuf::from("/card1")];
        assert_eq!(
            apply(&root, 0o640, &paths).unwrap(),
            [PathBuf::from("/card0")]
        );
        let mode = std::fs::metadata(dir.path().join("card0"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
    }
}
