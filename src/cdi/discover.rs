//! Finds the host files a spec refers to: the I/O half of `gpud cdi generate`.
//!
//! Everything is looked up under configurable roots so that a containerised driver
//! (`/run/nvidia/driver`) and the tests' temporary trees work like the host's own `/`:
//!
//! - driver libraries: every `lib*.so.<driver version>` in the usual library folders under the
//!   driver root (the files the driver installs with its exact version, which is what
//!   `nvidia-ctk` mounts); a file reached twice through a merged-`/usr` link counts once;
//! - utilities: `nvidia-smi`, `nvidia-debugdump`, `nvidia-persistenced`,
//!   `nvidia-cuda-mps-control`, `nvidia-cuda-mps-server`, first hit in the usual `bin` folders;
//! - sockets: the persistence daemon's and fabric manager's sockets, the MPS pipe folder;
//! - firmware: `lib/firmware/nvidia/<driver version>/gsp*.bin`;
//! - control nodes under the device root: `/dev/nvidiactl`, `/dev/nvidia-uvm`,
//!   `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset` (existence only);
//! - MIG access capabilities under the proc root:
//!   `driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access` and `…/gi<G>/ci<C>/access`,
//!   each holding a `DeviceFileMinor: <N>` line;
//! - the hook binary, when it is an executable file.
//!
//! Absent things are simply not in the result; only an unreadable or malformed capability file
//! is an error, because the MIG devices it belongs to could not be described.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::host::{HostFiles, HostPath, MigCaps};

/// Library folders searched under the driver root, in order; `/usr` first so that a file
/// reached through a merged-`/usr` link is reported by its canonical path.
pub const LIBRARY_DIRS: &[&str] = &[
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/usr/lib",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib",
];

/// Utilities mounted into containers.
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Folders searched for the utilities, in order.
pub const BINARY_DIRS: &[&str] = &[
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/bin",
    "/sbin",
];

/// Sockets and pipe folders of driver daemons.
pub const IPC_PATHS: &[&str] = &[
    "/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/tmp/nvidia-mps",
];

/// Firmware folders (`<version>` appended), in order.
pub const FIRMWARE_DIRS: &[&str] = &["/lib/firmware/nvidia", "/usr/lib/firmware/nvidia"];

/// Control device nodes, in the order the spec lists them.
pub const CONTROL_DEVICES: &[&str] = &[
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// gpud's own hook: the `nvidia-cdi-hook` link to gpud that `gpud runtime install` (the
/// toolkit step) puts on the host. Preferred when it exists.
pub const GPUD_HOOK_PATH: &str = "/usr/local/nvidia/toolkit/nvidia-cdi-hook";

/// NVIDIA's toolkit's hook, named when gpud's is not installed, so nodes that still have the
/// toolkit keep getting hooks.
pub const NVIDIA_HOOK_PATH: &str = "/usr/bin/nvidia-cdi-hook";

/// The hooks a spec names when no path is given, in order of preference.
pub const DEFAULT_HOOK_PATHS: [&str; 2] = [GPUD_HOOK_PATH, NVIDIA_HOOK_PATH];

/// The hook executables to try: the one asked for, else [`DEFAULT_HOOK_PATHS`].
pub fn hook_candidates(asked: Option<&Path>) -> Vec<PathBuf> {
    match asked {
        Some(path) => vec![path.to_path_buf()],
        None => DEFAULT_HOOK_PATHS.iter().map(PathBuf::from).collect(),
    }
}

/// Where the MIG capability tree lives under the proc root.
pub const CAPABILITIES_DIR: &str = "driver/nvidia/capabilities";

/// Where to look. Every path is the host's; [`HostPaths::host_root`] says where this process
/// sees the host's `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// Where the host's `/` is in this process's view: `/` on the host itself, the mount of the
    /// host's root in a container that sees it elsewhere (the toolkit's `/host`). Files are
    /// read under it; the spec names them as the host sees them, since the runtime reads it
    /// there.
    pub host_root: PathBuf,
    /// Root of the driver installation (`/`, or `/run/nvidia/driver` for a driver container).
    pub driver_root: PathBuf,
    /// Root under which `/dev` is found.
    pub dev_root: PathBuf,
    /// The procfs to read MIG capabilities from (normally `/proc`).
    pub proc_root: PathBuf,
    /// The `nvidia-cdi-hook` executables the spec may name, in order of preference: the
    /// first that is an executable file is named (see [`hook_candidates`]).
    pub hooks: Vec<PathBuf>,
    /// The folder the running NVML library was loaded from, when known: driver images that
    /// keep their libraries outside the usual folders (`/usr/local/nvidia/lib64`,
    /// `/home/kubernetes/bin/nvidia/lib64`) are found through it. Searched after the usual
    /// folders, and only when it lies under the driver root.
    pub nvml_dir: Option<PathBuf>,
}

/// A host file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// A file or folder exists but cannot be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A MIG capability file without a usable `DeviceFileMinor` line.
    #[error("{path}: {why}")]
    Capability { path: PathBuf, why: String },
    /// A path that is not UTF-8 cannot be written into a spec.
    #[error("{path:?}: path is not UTF-8")]
    NotUtf8 { path: PathBuf },
}

/// Looks everything up for a driver of `driver_version` (empty: no versioned files).
pub fn discover(paths: &HostPaths, driver_version: &str) -> Result<HostFiles, DiscoverError> {
    let driver_root = utf8(&paths.driver_root)?;
    let dev_root = utf8(&paths.dev_root)?;
    // What this process reads; the texts above are what the spec names.
    let seen = |path: &Path| paths.seen(path);
    let driver_dir = seen(&paths.driver_root);
    let dev_dir = seen(&paths.dev_root);
    let caps_dir = seen(&paths.proc_root).join(CAPABILITIES_DIR);
    Ok(HostFiles {
        dev_root: dev_root.to_owned(),
        control_devices: CONTROL_DEVICES
            .iter()
            .filter(|dev| exists(&under(&dev_dir, dev)))
            .map(|dev| (*dev).to_owned())
            .collect(),
        libraries: libraries(
            &driver_dir,
            paths.nvml_dir.as_deref(),
            driver_root,
            driver_version,
        )?,
        binaries: binaries(&driver_dir, driver_root),
        ipc: IPC_PATHS
            .iter()
            .filter(|p| exists(&under(&driver_dir, p)))
            .map(|p| HostPath::under(driver_root, p))
            .collect(),
        firmware: firmware(&driver_dir, driver_root, driver_version)?,
        mig_caps: mig_caps(&caps_dir)?,
        hook: paths
            .hooks
            .iter()
            .find(|path| executable(&seen(path)))
            .map(|path| utf8(path).map(str::to_owned))
            .transpose()?,
    })
}

impl HostPaths {
    /// Where this process finds the host's absolute `path`.
    pub fn seen(&self, path: &Path) -> PathBuf {
        match path.strip_prefix("/") {
            Ok(relative) if self.host_root != Path::new("/") => self.host_root.join(relative),
            _ => path.to_path_buf(),
        }
    }
}

fn utf8(path: &Path) -> Result<&str, DiscoverError> {
    path.to_str().ok_or_else(|| DiscoverError::NotUtf8 {
        path: path.to_path_buf(),
    })
}

/// `rel` (absolute) under `root`.
fn under(root: &Path, rel: &str) -> PathBuf {
    root.join(rel.trim_start_matches('/'))
}

fn exists(path: &Path) -> bool {
    fs::metadata(path).is_ok()
}

fn executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

/// Entries of a folder sorted by name; an absent folder has none.
fn sorted_entries(dir: &Path) -> Result<Vec<String>, DiscoverError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        // A path component that is a file, not a folder: nothing there either.
        Err(err) if err.kind() == io::ErrorKind::NotADirectory => return Ok(Vec::new()),
        Err(source) => {
            return Err(DiscoverError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

/// Regular files (links followed) in the folders, matching `wanted`, each file once.
fn files_in(
    root: &Path,
    root_text: &str,
    dirs: impl Iterator<Item = String>,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<HostPath>, DiscoverError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for dir in dirs {
        let on_disk = under(root, &dir);
        for name in sorted_entries(&on_disk)? {
            if !wanted(&name) {
                continue;
            }
            let Ok(meta) = fs::metadata(on_disk.join(&name)) else {
                continue;
            };
            if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
                out.push(HostPath::under(root_text, &format!("{dir}/{name}")));
            }
        }
    }
    Ok(out)
}

/// The driver's libraries under `root` (as read here; `root_text` as the spec names it), plus
/// those in `nvml_dir` (this process's view) when it lies under `root`.
fn libraries(
    root: &Path,
    nvml_dir: Option<&Path>,
    root_text: &str,
    version: &str,
) -> Result<Vec<HostPath>, DiscoverError> {
    if version.is_empty() {
        return Ok(Vec::new());
    }
    let suffix = format!(".so.{version}");
    let nvml_dir = nvml_dir
        .and_then(|dir| dir.strip_prefix(root).ok())
        .and_then(Path::to_str)
        .map(|rel| format!("/{}", rel.trim_start_matches('/')))
        .filter(|dir| !LIBRARY_DIRS.contains(&dir.as_str()));
    files_in(
        root,
        root_text,
        LIBRARY_DIRS.iter().map(|d| (*d).to_owned()).chain(nvml_dir),
        |name| name.starts_with("lib") && name.len() > suffix.len() + 3 && name.ends_with(&suffix),
    )
}

fn firmware(root: &Path, root_text: &str, version: &str) -> Result<Vec<HostPath>, DiscoverError> {
    if version.is_empty() {
        return Ok(Vec::new());
    }
    files_in(
        root,
        root_text,
        FIRMWARE_DIRS.iter().map(|d| format!("{d}/{version}")),
        |name| name.starts_with("gsp") && name.ends_with(".bin"),
    )
}

fn binaries(root: &Path, root_text: &str) -> Vec<HostPath> {
    BINARIES
        .iter()
        .filter_map(|name| {
            BINARY_DIRS.iter().find_map(|dir| {
                let rel = format!("{dir}/{name}");
                executable(&under(root, &rel)).then(|| HostPath::under(root_text, &rel))
            })
        })
        .collect()
}

/// Reads every GPU's MIG access capabilities; no tree means no MIG instances.
pub fn mig_caps(dir: &Path) -> Result<MigCaps, DiscoverError> {
    let mut caps = MigCaps::new(utf8(dir)?);
    for gpu_entry in sorted_entries(dir)? {
        let Some(gpu_minor) = numbered(&gpu_entry, "gpu") else {
            continue;
        };
        let mig_dir = dir.join(&gpu_entry).join("mig");
        for gi_entry in sorted_entries(&mig_dir)? {
            let Some(gi) = numbered(&gi_entry, "gi") else {
                continue;
            };
            let gi_dir = mig_dir.join(&gi_entry);
            if let Some(minor) = read_access(&gi_dir.join("access"))? {
                caps.insert_gpu_instance(gpu_minor, gi, minor);
            }
            for ci_entry in sorted_entries(&gi_dir)? {
                let Some(ci) = numbered(&ci_entry, "ci") else {
                    continue;
                };
                if let Some(minor) = read_access(&gi_dir.join(&ci_entry).join("access"))? {
                    caps.insert_compute_instance(gpu_minor, gi, ci, minor);
                }
            }
        }
    }
    Ok(caps)
}

/// `gpu3` with prefix `gpu` → 3.
fn numbered(name: &str, prefix: &str) -> Option<u32> {
    let digits = name.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The minor in an `access` file; `None` when the file does not exist.
fn read_access(path: &Path) -> Result<Option<u32>, DiscoverError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DiscoverError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    parse_access(&text)
        .map(Some)
        .map_err(|why| DiscoverError::Capability {
            path: path.to_path_buf(),
            why,
        })
}

/// Parses a capability file: `DeviceFileMinor: <N>` among `Key: value` lines.
pub fn parse_access(text: &str) -> Result<u32, String> {
    let value = text
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "DeviceFileMinor").then(|| value.trim())
        })
        .ok_or_else(|| "no DeviceFileMinor line".to_owned())?;
    value
        .parse()
        .map_err(|_| format!("DeviceFileMinor {value:?} is not a minor number"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn touch(root: &Path, rel: &str) {
        let path = under(root, rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, rel).unwrap();
    }

    fn touch_exe(root: &Path, rel: &str) {
        touch(root, rel);
        fs::set_permissions(under(root, rel), fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn paths(root: &Path) -> HostPaths {
        HostPaths {
            host_root: PathBuf::from("/"),
            driver_root: root.to_path_buf(),
            dev_root: root.to_path_buf(),
            proc_root: root.join("proc"),
            hooks: vec![root.join("hook/nvidia-cdi-hook")],
            nvml_dir: None,
        }
    }

    fn containers(found: &[HostPath]) -> Vec<&str> {
        found.iter().map(|p| p.container.as_str()).collect()
    }

    #[test]
    fn access_files_hold_the_minor() {
        assert_eq!(
            parse_access("DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            Ok(12)
        );
        assert_eq!(
            parse_access("DeviceFileMode: 292\n"),
            Err("no DeviceFileMinor line".to_owned())
        );
        assert_eq!(
            parse_access("DeviceFileMinor: x1\n"),
            Err("DeviceFileMinor \"x1\" is not a minor number".to_owned())
        );
    }

    #[test]
    fn the_folder_nvml_was_loaded_from_is_searched_when_under_the_driver_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(root, "/usr/local/nvidia/lib64/libcuda.so.580.159.04");
        touch(root, "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04");
        touch(root, "/usr/lib64/libnvidia-cfg.so.580.159.04");
        let mut paths = paths(root);
        assert_eq!(
            containers(&discover(&paths, "580.159.04").unwrap().libraries),
            ["/usr/lib64/libnvidia-cfg.so.580.159.04"]
        );
        paths.nvml_dir = Some(root.join("usr/local/nvidia/lib64"));
        assert_eq!(
            containers(&discover(&paths, "580.159.04").unwrap().libraries),
            [
                "/usr/lib64/libnvidia-cfg.so.580.159.04",
                "/usr/local/nvidia/lib64/libcuda.so.580.159.04",
                "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04",
            ]
        );
        // Outside the driver root (a test's mock, another driver): not this driver's files.
        let elsewhere = tempfile::tempdir().unwrap();
        touch(elsewhere.path(), "/lib64/libcuda.so.580.159.04");
        paths.nvml_dir = Some(elsewhere.path().join("lib64"));
        assert_eq!(
            containers(&discover(&paths, "580.159.04").unwrap().libraries),
            ["/usr/lib64/libnvidia-cfg.so.580.159.04"]
        );
    }

    #[test]
    fn finds_versioned_libraries_once_through_merged_usr() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for lib in [
            "libcuda.so.570.133.20",
            "libnvidia-ml.so.570.133.20",
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.565.57.01",
            "not-a-lib.so.570.133.20",
            "libnvidia-ml.so.570.133.20.bak",
        ] {
            touch(root, &format!("/usr/lib/x86_64-linux-gnu/{lib}"));
        }
        touch(
            root,
            "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.570.133.20",
        );
        touch(root, "/usr/lib64/libnvidia-cfg.so.570.133.20");
        // Merged /usr: /lib is a link to usr/lib, so the same files appear a second time.
        symlink("usr/lib", root.join("lib")).unwrap();
        let host = discover(&paths(root), "570.133.20").unwrap();
        assert_eq!(
            containers(&host.libraries),
            [
                "/usr/lib64/libnvidia-cfg.so.570.133.20",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.570.133.20",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.133.20",
            ]
        );
        let root_text = root.to_str().unwrap();
        assert_eq!(
            host.libraries[1].host,
            format!("{root_text}/usr/lib/x86_64-linux-gnu/libcuda.so.570.133.20")
        );
        assert!(
            discover(&paths(root), "").unwrap().libraries.is_empty(),
            "no driver version, no versioned files"
        );
    }

    #[test]
    fn finds_binaries_sockets_firmware_control_nodes_and_the_hook() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch_exe(root, "/usr/bin/nvidia-smi");
        touch_exe(root, "/bin/nvidia-smi");
        touch_exe(root, "/usr/sbin/nvidia-persistenced");
        touch(root, "/usr/bin/nvidia-debugdump"); // not executable
        touch(root, "/run/nvidia-persistenced/socket");
        fs::create_dir_all(root.join("tmp/nvidia-mps")).unwrap();
        touch(root, "/lib/firmware/nvidia/570.133.20/gsp_tu10x.bin");
        touch(root, "/lib/firmware/nvidia/570.133.20/gsp_ga10x.bin");
        touch(root, "/lib/firmware/nvidia/570.133.20/README");
        touch(root, "/lib/firmware/nvidia/565.57.01/gsp_ga10x.bin");
        touch(root, "/dev/nvidiactl");
        touch(root, "/dev/nvidia-modeset");
        let host = discover(&paths(root), "570.133.20").unwrap();
        assert_eq!(
            containers(&host.binaries),
            ["/usr/bin/nvidia-smi", "/usr/sbin/nvidia-persistenced"]
        );
        assert_eq!(
            containers(&host.ipc),
            ["/run/nvidia-persistenced/socket", "/tmp/nvidia-mps"]
        );
        assert_eq!(
            containers(&host.firmware),
            [
                "/lib/firmware/nvidia/570.133.20/gsp_ga10x.bin",
                "/lib/firmware/nvidia/570.133.20/gsp_tu10x.bin"
            ]
        );
        assert_eq!(
            host.control_devices,
            ["/dev/nvidiactl", "/dev/nvidia-modeset"]
        );
        assert_eq!(host.hook, None, "no hook binary yet");

        touch(root, "/hook/nvidia-cdi-hook");
        assert_eq!(
            discover(&paths(root), "570.133.20").unwrap().hook,
            None,
            "a hook that cannot run is no hook"
        );
        touch_exe(root, "/hook/nvidia-cdi-hook");
        assert_eq!(
            discover(&paths(root), "570.133.20").unwrap().hook,
            Some(
                root.join("hook/nvidia-cdi-hook")
                    .to_str()
                    .unwrap()
                    .to_owned()
            )
        );
    }

    #[test]
    fn the_first_hook_that_can_run_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let gpud = root.join("toolkit/nvidia-cdi-hook");
        let nvidia = root.join("usr/bin/nvidia-cdi-hook");
        let named = |hooks: Vec<PathBuf>| {
            discover(
                &HostPaths {
                    hooks,
                    ..paths(root)
                },
                "570.133.20",
            )
            .unwrap()
            .hook
        };
        let both = vec![gpud.clone(), nvidia.clone()];
        assert_eq!(named(both.clone()), None, "neither is installed");
        touch_exe(root, "/usr/bin/nvidia-cdi-hook");
        assert_eq!(
            named(both.clone()).as_deref(),
            nvidia.to_str(),
            "NVIDIA's, as the fallback"
        );
        touch_exe(root, "/toolkit/nvidia-cdi-hook");
        assert_eq!(
            named(both).as_deref(),
            gpud.to_str(),
            "gpud's own wins once installed"
        );
        assert_eq!(
            hook_candidates(None),
            [
                PathBuf::from(GPUD_HOOK_PATH),
                PathBuf::from(NVIDIA_HOOK_PATH)
            ]
        );
        assert_eq!(
            hook_candidates(Some(Path::new("/opt/hook"))),
            [PathBuf::from("/opt/hook")],
            "a path asked for is the only one tried"
        );
    }

    #[test]
    fn reads_mig_capabilities_by_gpu_minor_and_instance() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let cap = |rel: &str, minor: u32| {
            let path = root.join("proc/driver/nvidia/capabilities").join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(
                path,
                format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            )
            .unwrap();
        };
        cap("mig/config", 1);
        cap("gpu0/mig/gi1/access", 12);
        cap("gpu0/mig/gi1/ci0/access", 13);
        cap("gpu3/mig/gi8/access", 480);
        cap("gpu3/mig/gi8/ci1/access", 482);
        let caps = discover(&paths(root), "570.133.20").unwrap().mig_caps;
        assert_eq!(caps.gpu_instance(0, 1), Some(12));
        assert_eq!(caps.compute_instance(0, 1, 0), Some(13));
        assert_eq!(caps.gpu_instance(3, 8), Some(480));
        assert_eq!(caps.compute_instance(3, 8, 1), Some(482));
        assert_eq!(caps.gpu_instance(1, 1), None);

        let bad = root.join("proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access");
        fs::write(&bad, "DeviceFileMinor: lots\n").unwrap();
        let err = discover(&paths(root), "570.133.20").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: DeviceFileMinor \"lots\" is not a minor number",
                bad.display()
            )
        );
    }

    #[test]
    fn an_empty_root_finds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let host = discover(&paths(dir.path()), "570.133.20").unwrap();
        assert!(host.libraries.is_empty() && host.binaries.is_empty() && host.ipc.is_empty());
        assert!(host.firmware.is_empty() && host.control_devices.is_empty());
        assert!(host.mig_caps.is_empty() && host.hook.is_none());
    }
}
