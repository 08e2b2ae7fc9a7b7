//! The host layout under `mpsRoot` that the daemons keep: the folders, the shm tmpfs and the
//! markers (paths in `device_plugin::mps`, which both sides share).
//!
//! The shm tmpfs is sized as NVIDIA sizes it: half of `MemTotal`, or `65536k` when that cannot
//! be read. Mounting needs CAP_SYS_ADMIN; `--mps-skip-shm-mount` leaves `<root>/shm` a plain
//! folder for hosts that prepare it otherwise (and for tests, which run unprivileged).

use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};

use crate::device_plugin::mps as paths;
use crate::files;

/// The tmpfs size when `MemTotal` cannot be read.
pub const FALLBACK_SHM_SIZE: &str = "65536k";

/// Why the layout could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("cannot create {}: {source}", .path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot mount the MPS shared-memory tmpfs on {} ({why}); gpud needs CAP_SYS_ADMIN for \
         it (a privileged container), or pass --mps-skip-shm-mount when the folder is \
         prepared otherwise",
        .path.display()
    )]
    Mount { path: PathBuf, why: String },
    #[error("cannot write {}: {source}", .path.display())]
    Marker {
        path: PathBuf,
        #[source]
        source: files::WriteError,
    },
}

fn create(path: &Path) -> Result<(), LayoutError> {
    std::fs::create_dir_all(path).map_err(|source| LayoutError::Create {
        path: path.to_owned(),
        source,
    })
}

/// The tmpfs size option: half of `MemTotal` from `meminfo` (`/proc/meminfo`'s text).
pub fn shm_size(meminfo: Option<&str>) -> String {
    meminfo
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .filter(|kib| *kib > 0)
        .map_or_else(
            || FALLBACK_SHM_SIZE.to_owned(),
            |kib| format!("{}k", kib / 2),
        )
}

/// Whether `path` is a mount point, per `/proc/self/mountinfo`.
fn mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = path.to_string_lossy();
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|mount_point| mount_point == target)
}

/// Creates `<root>` and `<root>/shm`, and mounts the tmpfs on the latter unless it is mounted
/// already or `skip_mount`.
pub fn prepare_root(root: &Path, skip_mount: bool) -> Result<(), LayoutError> {
    let shm = paths::shm_dir(root);
    create(&shm)?;
    if skip_mount {
        tracing::warn!(path = %shm.display(),
            "Not mounting the MPS shared-memory tmpfs (--mps-skip-shm-mount): clients share \
             memory through a plain folder");
        return Ok(());
    }
    if mounted(&shm) {
        return Ok(());
    }
    let size = shm_size(std::fs::read_to_string("/proc/meminfo").ok().as_deref());
    // The mount(2) call itself: gpud's image has no mount binary. relatime is the kernel's
    // default; the flags are NVIDIA's rw,nosuid,nodev,noexec.
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let data = format!("size={size}");
    mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        flags,
        Some(data.as_str()),
    )
    .map_err(|errno| LayoutError::Mount {
        path: shm.clone(),
        why: errno.desc().to_owned(),
    })
}

/// Creates the pipe and log folders of `resource`'s daemon.
pub fn prepare_resource(root: &Path, resource: &str) -> Result<(), LayoutError> {
    create(&paths::pipe_dir(root, resource))?;
    create(&paths::log_dir(root, resource))
}

/// Writes an (empty) marker file.
pub fn mark(path: &Path) -> Result<(), LayoutError> {
    files::write_atomic(path, b"", 0o644).map_err(|source| LayoutError::Marker {
        path: path.to_owned(),
        source,
    })
}

/// Removes a marker; one already gone is fine.
pub fn unmark(path: &Path) {
    if let Err(err) = std::fs::remove_file(path)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %err, "Cannot remove an MPS marker");
    }
}

/// Removes a stopped daemon's traces: its `.started` marker and its log folder, as NVIDIA's
/// daemon does on stop.
pub fn clear_resource(root: &Path, resource: &str) {
    unmark(&paths::started_marker(root, resource));
    let log = paths::log_dir(root, resource);
    if let Err(err) = std::fs::remove_dir_all(&log)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %log.display(), error = %err, "Cannot remove the MPS log folder");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_is_half_of_memory() {
        let meminfo = "MemTotal:       2113456820 kB\nMemFree:        1 kB\n";
        assert_eq!(shm_size(Some(meminfo)), "1056728410k");
        assert_eq!(shm_size(Some("garbage")), "65536k");
        assert_eq!(shm_size(None), "65536k");
    }
}
