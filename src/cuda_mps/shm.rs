//! The shared-memory tmpfs MPS clients mount as `/dev/shm`, sized as NVIDIA sizes it: half of
//! `MemTotal`, or `65536k` when that cannot be read.
//!
//! Mounting needs CAP_SYS_ADMIN; `--mps-skip-shm-mount` leaves the folder a plain folder for
//! hosts that prepare it otherwise (and for tests, which run unprivileged).

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// The tmpfs size when `MemTotal` cannot be read.
pub const FALLBACK_SHM_SIZE: &str = "65536k";

/// Why the shm folder could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
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

/// Creates `shm` and mounts the tmpfs on it unless it is mounted already or `skip_mount`.
pub fn prepare(shm: &Path, skip_mount: bool) -> Result<(), ShmError> {
    std::fs::create_dir_all(shm).map_err(|source| ShmError::Create {
        path: shm.to_owned(),
        source,
    })?;
    if skip_mount {
        tracing::warn!(path = %shm.display(),
            "Not mounting the MPS shared-memory tmpfs (--mps-skip-shm-mount): clients share \
             memory through a plain folder");
        return Ok(());
    }
    if mounted(shm) {
        return Ok(());
    }
    let size = shm_size(std::fs::read_to_string("/proc/meminfo").ok().as_deref());
    // The mount(2) call itself: gpud's image has no mount binary. relatime is the kernel's
    // default; the flags are NVIDIA's rw,nosuid,nodev,noexec.
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let data = format!("size={size}");
    mount(
        Some("tmpfs"),
        shm,
        Some("tmpfs"),
        flags,
        Some(data.as_str()),
    )
    .map_err(|errno| ShmError::Mount {
        path: shm.to_owned(),
        why: errno.desc().to_owned(),
    })
}

/// Unmounts the tmpfs on `shm` if one is mounted there (lazily: a client still holding it
/// keeps its memory until it exits); failures are logged.
pub fn release(shm: &Path) {
    if mounted(shm)
        && let Err(errno) = umount2(shm, MntFlags::MNT_DETACH)
    {
        tracing::warn!(path = %shm.display(), error = %errno.desc(),
            "Cannot unmount the MPS shared-memory tmpfs");
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
