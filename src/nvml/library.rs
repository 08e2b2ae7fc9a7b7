//! Finding and initialising `libnvidia-ml.so.1`.
//!
//! gpud never links NVML: it opens the library at run time, so the same binary starts on a node
//! without a driver and says so in one line. The search order is the explicit path
//! (`--nvml-lib` / `GPUD_NVML_LIB`) alone when given — a wrong explicit path must fail loudly
//! rather than silently pick another driver — else the dynamic linker's search
//! (`libnvidia-ml.so.1`), else the roots where driver containers and cloud images install it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;

use super::NvmlError;

/// The library's SONAME, resolved by the dynamic linker's usual search.
pub const SONAME: &str = "libnvidia-ml.so.1";

/// Where driver containers (GPU Operator: `/run/nvidia/driver`), the container toolkit's
/// injection (the distribution's library folder), and cloud images (GKE:
/// `/home/kubernetes/bin/nvidia`) put NVML. The library folders are listed as well as left to
/// the dynamic linker because an image without `/etc/ld.so.cache` (gpud's own, `FROM scratch`)
/// does not search every one of them.
const DRIVER_ROOT_CANDIDATES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/run/nvidia/driver/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "/run/nvidia/driver/lib64/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "/home/kubernetes/bin/nvidia/lib64/libnvidia-ml.so.1",
];

/// The paths to try, in order.
pub fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    match explicit {
        Some(path) => vec![path.to_path_buf()],
        None => std::iter::once(SONAME)
            .chain(DRIVER_ROOT_CANDIDATES.iter().copied())
            .map(PathBuf::from)
            .collect(),
    }
}

/// Opens and initialises the first candidate that works.
///
/// Returns the live library and the path that worked; on failure, every path with its reason.
pub fn open(explicit: Option<&Path>) -> Result<(Nvml, PathBuf), NvmlError> {
    let mut attempts = Vec::new();
    for path in candidates(explicit) {
        // A driver-root candidate that does not exist is skipped quietly: listing six
        // "No such file" lines would hide the one failure that matters.
        if path.is_absolute() && explicit.is_none() && !path.exists() {
            attempts.push((path, super::error::NOT_PRESENT.to_owned()));
            continue;
        }
        match Nvml::builder()
            .lib_path(OsStr::new(path.as_os_str()))
            .init()
        {
            Ok(nvml) => return Ok((nvml, path)),
            Err(err) => {
                let why = describe(&err, &path);
                attempts.push((path, why));
            }
        }
    }
    Err(NvmlError::Unavailable {
        attempts,
        explicit: explicit.is_some(),
    })
}

/// The folder the loaded NVML library's file lies in, read from this process's memory map
/// (a library found by its SONAME could come from anywhere the dynamic linker looks).
pub fn loaded_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    loaded_dir_in(&maps)
}

/// [`loaded_dir`] over the text of a `/proc/<pid>/maps` file.
fn loaded_dir_in(maps: &str) -> Option<PathBuf> {
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(Path::new)
        .find(|path| {
            path.file_name()
                .and_then(OsStr::to_str)
                .is_some_and(|name| name.starts_with("libnvidia-ml.so"))
        })
        .and_then(Path::parent)
        .map(Path::to_path_buf)
}

/// A short description of a load or init failure, without the path (the message names it).
fn describe(err: &nvml_wrapper::error::NvmlError, path: &Path) -> String {
    use nvml_wrapper::error::NvmlError as E;
    match err {
        // The loader's message starts with the path it was given ("PATH: cannot open …").
        E::LibloadingError(e) => {
            let text = e.to_string();
            let prefix = format!("{}: ", path.display());
            text.strip_prefix(&prefix)
                .map_or_else(|| text.clone(), str::to_owned)
        }
        E::DriverNotLoaded => "NVML_ERROR_DRIVER_NOT_LOADED: the NVIDIA kernel driver is not loaded".to_owned(),
        E::NoPermission => "NVML_ERROR_NO_PERMISSION: no permission to open the GPU device nodes".to_owned(),
        E::LibRmVersionMismatch => {
            "NVML_ERROR_LIB_RM_VERSION_MISMATCH: the user-space library and the kernel driver differ".to_owned()
        }
        other => format!("nvmlInit failed: {other}"),
    }
}

/// The version in the NVRM line of `/proc/driver/nvidia/version`'s text, and whether it is
/// the open kernel module.
pub fn nvrm_version(text: &str) -> Option<(String, bool)> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let version = line.split_whitespace().find(|w| {
        w.split('.').count() >= 2
            && w.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    })?;
    Some((version.to_owned(), line.contains("Open Kernel Module")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_dir_is_the_folder_of_the_mapped_library() {
        let maps = "\
7f1c2a000000-7f1c2a021000 r--p 00000000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2b000000-7f1c2b200000 r-xp 00000000 00:2a 99 /usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04
7ffd6f3e0000-7ffd6f401000 rw-p 00000000 00:00 0 [stack]
";
        assert_eq!(
            loaded_dir_in(maps),
            Some(PathBuf::from("/usr/local/nvidia/lib64"))
        );
        assert_eq!(
            loaded_dir_in("7ffd6f3e0000-7ffd6f401000 rw-p 00000000 00:00 0 [stack]\n"),
            None
        );
    }

    #[test]
    fn explicit_path_is_the_only_candidate() {
        let path = Path::new("/opt/x/libnvidia-ml.so.1");
        assert_eq!(candidates(Some(path)), vec![path.to_path_buf()]);
    }

    #[test]
    fn default_search_starts_with_the_soname() {
        let list = candidates(None);
        assert_eq!(list[0], PathBuf::from(SONAME));
        assert!(list.iter().any(|p| p.starts_with("/run/nvidia/driver")));
    }

    #[test]
    fn missing_explicit_library_names_the_path() {
        let err = open(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
        let text = err.to_string();
        assert_eq!(
            text,
            "cannot initialise NVML: /nonexistent/libnvidia-ml.so.1: cannot open shared object \
             file: No such file or directory\n\
             gpud: check the path given with --nvml-lib (GPUD_NVML_LIB), or leave it out to \
             search the usual places"
        );
    }
}
