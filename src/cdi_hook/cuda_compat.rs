//! `enable-cuda-compat --host-driver-version=V`: an image that ships CUDA's forward
//! compatibility libraries (`/usr/local/cuda/compat/libcuda.so.<version>`) newer than the host's
//! driver gets that folder in its linker config ahead of everything else, so its programs load
//! the compat libcuda; with an older or equal compat library, or none, nothing changes.
//!
//! As NVIDIA's hook: only when the image uses a linker cache, and only with exactly one compat
//! libcuda; the versions' majors are compared (as numbers, where NVIDIA's compares strings).
//! The `update-ldcache` hook that runs after this one rebuilds the cache.

use std::path::Path;

use super::error::HookError;
use super::ldcache::{CONF_DIR, conf_lines, uses_linker_cache};
use super::root::Root;

/// The image's folder of CUDA compat libraries.
pub const COMPAT_DIR: &str = "/usr/local/cuda/compat";

/// The drop-in naming it: `00-compat` sorts before every other file, NVIDIA's and gpud's
/// `00-nvcr-*` included.
pub const CONF_NAME: &str = "00-compat-gpud.conf";

/// What `enable-cuda-compat` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compat {
    /// The compat folder was added; the compat driver major.
    Enabled(u32),
    /// A compat libcuda that is not newer than the host driver.
    NotNewer(u32),
    /// No compat libcuda (or not exactly one), or no linker cache in the image.
    Absent,
}

/// The major of a driver version (`550` of `550.54.15`).
pub fn major(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// The compat driver's version from a library name (`libcuda.so.570.86.10`), only for names
/// with at least MAJOR.MINOR, as NVIDIA's `libcuda.so.*.*`.
fn compat_version(name: &str) -> Option<&str> {
    let version = name.strip_prefix("libcuda.so.")?;
    version.contains('.').then_some(version)
}

/// Adds [`COMPAT_DIR`] to the linker config when its libcuda is newer than `host_major`.
pub fn enable(root: &Root, host_major: u32) -> Result<Compat, HookError> {
    if !uses_linker_cache(root) {
        return Ok(Compat::Absent);
    }
    let Some(names) = root.list(Path::new(COMPAT_DIR))? else {
        return Ok(Compat::Absent);
    };
    let versions: Vec<&str> = names
        .iter()
        .filter_map(|name| name.to_str())
        .filter_map(compat_version)
        .collect();
    let [version] = versions.as_slice() else {
        return Ok(Compat::Absent);
    };
    let Some(compat_major) = major(version) else {
        return Ok(Compat::Absent);
    };
    if compat_major <= host_major {
        return Ok(Compat::NotNewer(compat_major));
    }
    root.write_file(
        Path::new(CONF_DIR),
        CONF_NAME,
        conf_lines(&[COMPAT_DIR]).as_bytes(),
    )?;
    Ok(Compat::Enabled(compat_major))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(compat: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/ld.so.cache"), "").unwrap();
        std::fs::create_dir_all(dir.path().join("usr/local/cuda/compat")).unwrap();
        for name in compat {
            std::fs::write(dir.path().join("usr/local/cuda/compat").join(name), "").unwrap();
        }
        dir
    }

    #[test]
    fn majors_compare_as_numbers() {
        assert_eq!(major("550.54.15"), Some(550));
        assert_eq!(major("99"), Some(99));
        assert_eq!(major("x"), None);
        // NVIDIA compares strings, where "1000" < "550"; gpud does not.
        let dir = image(&["libcuda.so.1000.1", "libcuda.so.1"]);
        let root = Root::open(dir.path()).unwrap();
        assert_eq!(enable(&root, 550).unwrap(), Compat::Enabled(1000));
    }

    #[test]
    fn a_newer_compat_libcuda_goes_first_in_the_linker_config() {
        let dir = image(&[
            "libcuda.so.570.86.10",
            "libcuda.so.1",
            "libnvidia-ptxjitcompiler.so.1",
        ]);
        let root = Root::open(dir.path()).unwrap();
        assert_eq!(enable(&root, 550).unwrap(), Compat::Enabled(570));
        let conf = dir.path().join("etc/ld.so.conf.d").join(CONF_NAME);
        assert_eq!(
            std::fs::read_to_string(conf).unwrap(),
            "/usr/local/cuda/compat\n"
        );
        assert!(CONF_NAME < super::super::ldcache::CONF_NAME);
    }

    #[test]
    fn older_equal_or_absent_changes_nothing() {
        for (libs, host, expected) in [
            (&["libcuda.so.550.54.15"][..], 550, Compat::NotNewer(550)),
            (&["libcuda.so.535.1"][..], 550, Compat::NotNewer(535)),
            (&[][..], 550, Compat::Absent),
            (
                &["libcuda.so.570.1", "libcuda.so.575.1"][..],
                550,
                Compat::Absent,
            ),
        ] {
            let dir = image(libs);
            let root = Root::open(dir.path()).unwrap();
            assert_eq!(enable(&root, host).unwrap(), expected, "{libs:?}");
            assert!(!dir.path().join("etc/ld.so.conf.d").exists());
        }
    }
}
