//! `disable-device-node-modification`: programs in the container must not have the driver's
//! user-space libraries create or change `/dev/nvidia*` nodes. The libraries read
//! `ModifyDeviceFiles` from `/proc/driver/nvidia/params`; when the host's says `1`, the
//! container's `/proc/driver/nvidia/params` gets a copy that says `0`, bind-mounted over it
//! read-only, as NVIDIA's hook does.
//!
//! The copy lives on a small tmpfs mounted at `/run/gpud-cdi-hook/<pid>` inside the root. Every
//! mount target is a descriptor opened inside the root (its `/proc/self/fd` name), so no
//! symlink in the image moves a mount onto the host. The mounts are only made in the
//! container's own mount namespace, where runtimes run `createContainer` hooks: a hook that
//! finds itself in the host's (that of pid 1) changes nothing and says so, since its mounts
//! would pile up on the host.

use std::io::Write;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use rustix::fs::{FileType, Mode, OFlags};

use super::error::HookError;
use super::root::{Root, fd_path};

/// The driver's parameters on the host, and where the container sees them.
pub const PARAMS: &str = "/proc/driver/nvidia/params";

/// The folder of the tmpfs holding the container's copy.
const SCRATCH: &str = "/run/gpud-cdi-hook";

/// What the hook did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Params {
    /// The host has no NVIDIA driver parameters (no driver loaded).
    NoDriver,
    /// The host's parameters already forbid device node changes.
    AlreadyOff,
    /// The container's parameters now say `ModifyDeviceFiles: 0`.
    Masked,
    /// The hook runs in the host's mount namespace: nothing was mounted.
    HostNamespace,
}

/// The host's parameters with `ModifyDeviceFiles: 1` turned to `0`, or `None` when they do
/// not allow modification to begin with.
pub fn masked(params: &str) -> Option<String> {
    let mut changed = false;
    let mut out = String::with_capacity(params.len());
    for line in params.lines() {
        match line {
            "ModifyDeviceFiles: 1" => {
                changed = true;
                out.push_str("ModifyDeviceFiles: 0");
            }
            "ModifyDeviceFiles: 0" => return None,
            other => out.push_str(other),
        }
        out.push('\n');
    }
    changed.then_some(out)
}

/// Whether this process shares pid 1's mount namespace (`None`: cannot tell).
fn in_host_mount_namespace() -> Option<bool> {
    let own = rustix::fs::stat("/proc/self/ns/mnt").ok()?;
    let init = rustix::fs::stat("/proc/1/ns/mnt").ok()?;
    Some((own.st_dev, own.st_ino) == (init.st_dev, init.st_ino))
}

/// Masks the container's driver parameters when the host's (`host_params`) allow device node
/// changes.
pub fn disable(root: &Root, host_params: &Path) -> Result<Params, HookError> {
    let text = match std::fs::read_to_string(host_params) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Params::NoDriver),
        Err(source) => {
            return Err(HookError::ReadParams {
                path: host_params.to_owned(),
                source,
            });
        }
    };
    let Some(contents) = masked(&text) else {
        return Ok(Params::AlreadyOff);
    };
    if in_host_mount_namespace() == Some(true) {
        return Ok(Params::HostNamespace);
    }
    mount_over(root, contents.as_bytes())?;
    Ok(Params::Masked)
}

/// Mounts a read-only file holding `contents` over the container's [`PARAMS`].
fn mount_over(root: &Root, contents: &[u8]) -> Result<(), HookError> {
    let mount_error = |op: &'static str, path: &Path, err: nix::Error| HookError::Mount {
        op,
        path: path.display().to_string(),
        root: root.path().to_owned(),
        source: err.into(),
    };
    let target_path = Path::new(PARAMS);
    let target = root.open_path(target_path)?;
    let stat = rustix::fs::fstat(&target).map_err(|err| HookError::InRoot {
        op: "inspect",
        path: PARAMS.to_owned(),
        root: root.path().to_owned(),
        source: err.into(),
    })?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(HookError::Refused {
            op: "mount over",
            path: PARAMS.to_owned(),
            root: root.path().to_owned(),
            why: "it is not a regular file",
        });
    }

    let scratch_path = PathBuf::from(format!("{SCRATCH}/{}", std::process::id()));
    let scratch = root.mkdir_all(&scratch_path)?;
    let size = format!("size={},mode=0755", contents.len().max(4096));
    mount(
        Some("tmpfs"),
        fd_path(&scratch).as_str(),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(size.as_str()),
    )
    .map_err(|err| mount_error("mount a tmpfs on", &scratch_path, err))?;
    // Opened again, the folder is the new tmpfs's root.
    let tmpfs = root.open_dir(&scratch_path)?;
    let copy_path = scratch_path.join("params");
    let copy = rustix::fs::openat(
        &tmpfs,
        "params",
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o444),
    )
    .map_err(|err| HookError::InRoot {
        op: "create",
        path: copy_path.display().to_string(),
        root: root.path().to_owned(),
        source: err.into(),
    })?;
    let mut file = std::fs::File::from(copy);
    file.write_all(contents)
        .map_err(|source| HookError::InRoot {
            op: "write",
            path: copy_path.display().to_string(),
            root: root.path().to_owned(),
            source,
        })?;
    let copy = root.open_path(&copy_path)?;

    mount(
        Some(fd_path(&copy).as_str()),
        fd_path(&target).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|err| mount_error("bind-mount the masked copy over", target_path, err))?;
    // A bind mount takes no flags: read-only comes with a remount of the new mount, which a
    // fresh lookup of the path reaches (the old descriptor names the file beneath it).
    let mounted = root.open_path(target_path)?;
    mount(
        None::<&str>,
        fd_path(&mounted).as_str(),
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|err| mount_error("make read-only", target_path, err))?;
    mount(
        None::<&str>,
        fd_path(&mounted).as_str(),
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|err| mount_error("make private", target_path, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS_ON: &str =
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n";

    #[test]
    fn modify_device_files_is_turned_off() {
        assert_eq!(
            masked(PARAMS_ON).as_deref(),
            Some("ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\nDeviceFileUID: 0\n")
        );
        assert_eq!(masked("ModifyDeviceFiles: 0\nDeviceFileUID: 0\n"), None);
        assert_eq!(masked("DeviceFileUID: 0\n"), None);
    }

    #[test]
    fn no_driver_or_already_off_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        let missing = dir.path().join("no-params");
        assert_eq!(disable(&root, &missing).unwrap(), Params::NoDriver);
        let off = dir.path().join("params");
        std::fs::write(&off, "ModifyDeviceFiles: 0\n").unwrap();
        assert_eq!(disable(&root, &off).unwrap(), Params::AlreadyOff);
        assert!(!dir.path().join("run").exists());
    }
}
