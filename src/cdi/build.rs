//! Builds a CDI spec from a snapshot of the node's GPUs and the files found on the host: the
//! pure core behind `gpud cdi generate`, reused by the device plugin for its own spec.
//!
//! Devices, in this order: every GPU (once per name strategy), every MIG device (likewise),
//! then `all`. A GPU needs its `/dev/nvidia<minor>` node; a MIG device needs its parent's node
//! plus the `/dev/nvidia-caps/nvidia-cap<N>` nodes of its GPU instance and compute instance.
//! `all` carries the union of every device's nodes. Everything that is the same for any device
//! (control nodes, driver libraries, utilities, sockets, firmware, environment, hooks) goes
//! into the spec-wide `containerEdits` once.

use std::collections::BTreeSet;

use super::host::{HostFiles, HostPath};
use super::kind::Kind;
use super::names::{self, NameStrategy};
use super::spec::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec};
use super::version;
use crate::inventory::Snapshot;
use crate::inventory::model::{Gpu, MigDevice};

/// Name of the device that stands for every device of the spec.
pub const ALL_DEVICE: &str = "all";

/// Options every mount gets: read-only, no setuid or device files, a recursive private bind.
pub const MOUNT_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];

/// The OCI hook point gpud's hooks run at.
pub const HOOK_POINT: &str = "createContainer";

/// The environment every hook gets (keeps the hook's own logging off).
pub const HOOK_ENV: &str = "NVIDIA_CTK_DEBUG=false";

/// Seconds a runtime lets each hook run: above `update-ldcache`'s own 20 s deadline for
/// ldconfig, so the hook's one-line error is what a failed start reports; a hook that hangs
/// for any other reason still ends the container's start instead of holding it forever.
pub const HOOK_TIMEOUT_SECS: u32 = 30;

/// The hooks of `nvidia-cdi-hook`, as named by `--disable-hook`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum HookName {
    /// Every hook.
    All,
    /// The `libcuda.so` development link next to `libcuda.so.1`.
    CreateSymlinks,
    /// Lets a newer CUDA forward-compatibility library in the image take over.
    EnableCudaCompat,
    /// Adds the mounted library folders to the container's linker cache.
    UpdateLdcache,
    /// Stops CUDA in the container from creating device nodes.
    DisableDeviceNodeModification,
    /// Accepted for compatibility; gpud never writes this hook (`nvidia-ctk` leaves it off
    /// by default too).
    Chmod,
}

impl HookName {
    /// The subcommand of `nvidia-cdi-hook`.
    pub fn as_str(self) -> &'static str {
        match self {
            HookName::All => "all",
            HookName::CreateSymlinks => "create-symlinks",
            HookName::EnableCudaCompat => "enable-cuda-compat",
            HookName::UpdateLdcache => "update-ldcache",
            HookName::DisableDeviceNodeModification => "disable-device-node-modification",
            HookName::Chmod => "chmod",
        }
    }
}

/// What kind of spec to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `vendor/class`: `nvidia.com/gpu` for `gpud cdi generate`,
    /// `k8s.device-plugin.nvidia.com/gpu` for the device plugin's own spec.
    pub kind: Kind,
    /// How devices are named; empty means index and UUID.
    pub name_strategies: Vec<NameStrategy>,
    /// Whether to add the `all` device.
    pub all_device: bool,
    /// Hooks not to write (`HookName::All` drops every hook).
    pub disabled_hooks: BTreeSet<HookName>,
    /// `ldconfig` for the `update-ldcache` hook to run, when not its own default.
    pub ldconfig_path: Option<String>,
}

impl Default for Options {
    /// What `nvidia-ctk cdi generate` does without flags: `nvidia.com/gpu`, devices by index
    /// and UUID, an `all` device, every hook.
    fn default() -> Self {
        Options {
            kind: Kind::default(),
            name_strategies: Vec::new(),
            all_device: true,
            disabled_hooks: BTreeSet::new(),
            ldconfig_path: None,
        }
    }
}

impl Options {
    fn hook_enabled(&self, hook: HookName) -> bool {
        !self.disabled_hooks.contains(&HookName::All) && !self.disabled_hooks.contains(&hook)
    }
}

/// Why a spec cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A MIG device whose GPU instance has no capability minor on the host.
    #[error(
        "MIG device {device} ({uuid}): no access capability for GPU instance {gi}: {file} was not found or not readable"
    )]
    MissingGpuInstanceCap {
        device: String,
        uuid: String,
        gi: u32,
        file: String,
    },
    /// A MIG device whose compute instance has no capability minor on the host.
    #[error(
        "MIG device {device} ({uuid}): no access capability for compute instance {ci} of GPU instance {gi}: {file} was not found or not readable"
    )]
    MissingComputeInstanceCap {
        device: String,
        uuid: String,
        gi: u32,
        ci: u32,
        file: String,
    },
}

/// A built spec and what was left out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// The spec, `cdiVersion` set to the minimum its content needs.
    pub spec: Spec,
    /// One line per device left out (a GPU already lost at discovery has no identity or
    /// device node to describe).
    pub skipped: Vec<String>,
}

/// Builds the spec for `snapshot`, with the files found on the host and the requested kind,
/// names, `all` device and hooks.
///
/// Deterministic: the same inputs give the same spec, byte for byte once rendered. Fails only
/// when a MIG device exists whose capability minors are not in `host.mig_caps` (a spec
/// without them would hand out a MIG device that cannot be opened).
///
/// ```
/// use gpud::cdi::{Kind, NameStrategy, Options, HostFiles, build};
/// # fn demo(snapshot: &gpud::inventory::Snapshot) -> Result<(), Box<dyn std::error::Error>> {
/// let options = Options {
///     kind: Kind::parse("k8s.device-plugin.nvidia.com/gpu")?,
///     name_strategies: vec![NameStrategy::Uuid],
///     all_device: false,
///     ..Options::default()
/// };
/// let generated = build(snapshot, &HostFiles::default(), &options)?;
/// assert_eq!(generated.spec.kind, "k8s.device-plugin.nvidia.com/gpu");
/// # Ok(()) }
/// ```
pub fn build(
    snapshot: &Snapshot,
    host: &HostFiles,
    options: &Options,
) -> Result<Generated, BuildError> {
    let strategies = names::effective(&options.name_strategies);
    let mut devices = Vec::new();
    let mut skipped = Vec::new();
    let mut every_node: Vec<DeviceNode> = Vec::new();

    let usable: Vec<(&Gpu, u32)> = snapshot
        .gpus
        .iter()
        .filter_map(|gpu| match gpu.minor_number {
            Some(minor) if !gpu.uuid.is_empty() => Some((gpu, minor)),
            _ => {
                skipped.push(format!(
                    "GPU {}: no UUID or minor number (lost when the node was read)",
                    gpu.index
                ));
                None
            }
        })
        .collect();

    for (gpu, minor) in &usable {
        let nodes = vec![gpu_node(host, *minor)];
        push_devices(
            &mut devices,
            &mut every_node,
            strategies.iter().map(|s| s.gpu(gpu)),
            nodes,
        );
    }
    for (gpu, minor) in &usable {
        for mig in &gpu.mig.devices {
            if mig.uuid.is_empty() {
                skipped.push(format!(
                    "MIG device {}:{}: no UUID (lost when the node was read)",
                    gpu.index, mig.index
                ));
                continue;
            }
            let nodes = mig_nodes(host, gpu, *minor, mig)?;
            push_devices(
                &mut devices,
                &mut every_node,
                strategies.iter().map(|s| s.mig(gpu, mig)),
                nodes,
            );
        }
    }
    // The schema rejects a device without edits, so a node without devices gets no `all`.
    if options.all_device && !every_node.is_empty() {
        devices.push(Device {
            name: ALL_DEVICE.to_owned(),
            container_edits: ContainerEdits {
                device_nodes: every_node,
                ..ContainerEdits::default()
            },
        });
    }

    let mut spec = Spec {
        cdi_version: String::new(),
        kind: options.kind.to_string(),
        devices,
        container_edits: common_edits(snapshot, host, options),
    };
    spec.cdi_version = version::minimum(&spec).to_string();
    Ok(Generated { spec, skipped })
}

/// Adds one device per name, all with `nodes`, and remembers the nodes for `all`.
fn push_devices(
    devices: &mut Vec<Device>,
    every_node: &mut Vec<DeviceNode>,
    names: impl Iterator<Item = String>,
    nodes: Vec<DeviceNode>,
) {
    for name in names {
        devices.push(Device {
            name,
            container_edits: ContainerEdits {
                device_nodes: nodes.clone(),
                ..ContainerEdits::default()
            },
        });
    }
    for node in nodes {
        if !every_node.iter().any(|seen| seen.path == node.path) {
            every_node.push(node);
        }
    }
}

fn node(host: &HostFiles, path: String) -> DeviceNode {
    let host_path = host.device_host_path(&path);
    DeviceNode::from_host(path, host_path)
}

fn gpu_node(host: &HostFiles, minor: u32) -> DeviceNode {
    node(host, format!("/dev/nvidia{minor}"))
}

fn cap_node(host: &HostFiles, cap_minor: u32) -> DeviceNode {
    node(host, format!("/dev/nvidia-caps/nvidia-cap{cap_minor}"))
}

/// The parent GPU's node and the two capability nodes of a MIG device.
fn mig_nodes(
    host: &HostFiles,
    parent: &Gpu,
    minor: u32,
    mig: &MigDevice,
) -> Result<Vec<DeviceNode>, BuildError> {
    let (gi, ci) = (mig.gpu_instance_id, mig.compute_instance_id);
    let device = || format!("{}:{}", parent.index, mig.index);
    let caps = &host.mig_caps;
    let gi_minor =
        caps.gpu_instance(minor, gi)
            .ok_or_else(|| BuildError::MissingGpuInstanceCap {
                device: device(),
                uuid: mig.uuid.clone(),
                gi,
                file: caps.gpu_instance_file(minor, gi),
            })?;
    let ci_minor = caps.compute_instance(minor, gi, ci).ok_or_else(|| {
        BuildError::MissingComputeInstanceCap {
            device: device(),
            uuid: mig.uuid.clone(),
            gi,
            ci,
            file: caps.compute_instance_file(minor, gi, ci),
        }
    })?;
    Ok(vec![
        gpu_node(host, minor),
        cap_node(host, gi_minor),
        cap_node(host, ci_minor),
    ])
}

/// Edits shared by every device.
fn common_edits(snapshot: &Snapshot, host: &HostFiles, options: &Options) -> ContainerEdits {
    let libcuda = host.libcuda();
    let mut env = vec!["NVIDIA_VISIBLE_DEVICES=void".to_owned()];
    if let Some(lib) = libcuda {
        env.push(format!("NVIDIA_CTK_LIBCUDA_DIR={}", lib.container_dir()));
    }
    let device_nodes = host
        .control_devices
        .iter()
        .map(|path| node(host, path.clone()))
        .collect();
    let mounts = host
        .libraries
        .iter()
        .chain(&host.binaries)
        .chain(&host.ipc)
        .chain(&host.firmware)
        .map(mount)
        .collect();
    ContainerEdits {
        env,
        device_nodes,
        hooks: hooks(&snapshot.node.driver_version, host, options),
        mounts,
    }
}

fn mount(path: &HostPath) -> Mount {
    Mount {
        host_path: path.host.clone(),
        container_path: path.container.clone(),
        options: MOUNT_OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
        mount_type: None,
    }
}

/// The `nvidia-cdi-hook` invocations, only when the hook exists on the host: a spec naming a
/// missing hook makes every container that asks for a GPU fail to start.
fn hooks(driver_version: &str, host: &HostFiles, options: &Options) -> Vec<Hook> {
    let Some(path) = host.hook.as_deref() else {
        return Vec::new();
    };
    let hook = |args: Vec<String>| Hook {
        hook_name: HOOK_POINT.to_owned(),
        path: path.to_owned(),
        args: std::iter::once("nvidia-cdi-hook".to_owned())
            .chain(args)
            .collect(),
        env: vec![HOOK_ENV.to_owned()],
        timeout: Some(HOOK_TIMEOUT_SECS),
    };
    let mut out = Vec::new();
    if let Some(lib) = host.libcuda()
        && options.hook_enabled(HookName::CreateSymlinks)
    {
        out.push(hook(vec![
            HookName::CreateSymlinks.as_str().to_owned(),
            "--link".to_owned(),
            format!("libcuda.so.1::{}/libcuda.so", lib.container_dir()),
        ]));
    }
    if !driver_version.is_empty() && options.hook_enabled(HookName::EnableCudaCompat) {
        out.push(hook(vec![
            HookName::EnableCudaCompat.as_str().to_owned(),
            format!("--host-driver-version={driver_version}"),
        ]));
    }
    if !host.libraries.is_empty() && options.hook_enabled(HookName::UpdateLdcache) {
        let mut args = vec![HookName::UpdateLdcache.as_str().to_owned()];
        if let Some(ldconfig) = &options.ldconfig_path {
            args.extend(["--ldconfig-path".to_owned(), ldconfig.clone()]);
        }
        let mut folders: Vec<&str> = Vec::new();
        for lib in &host.libraries {
            let dir = lib.container_dir();
            if !folders.contains(&dir) {
                folders.push(dir);
            }
        }
        for folder in folders {
            args.extend(["--folder".to_owned(), folder.to_owned()]);
        }
        out.push(hook(args));
    }
    if options.hook_enabled(HookName::DisableDeviceNodeModification) {
        out.push(hook(vec![
            HookName::DisableDeviceNodeModification.as_str().to_owned(),
        ]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::host::MigCaps;
    use crate::inventory::model::Pci;
    use crate::inventory::test_support::{self, snapshot};

    fn gpu(index: u32, minor: Option<u32>, uuid: &str, migs: Vec<MigDevice>) -> Gpu {
        let base = test_support::gpu(index, uuid, "NVIDIA A100-SXM4-80GB", 81920);
        test_support::with_migs(
            Gpu {
                minor_number: minor,
                device_node: minor.map(|m| format!("/dev/nvidia{m}")),
                pci: Pci {
                    bus_id: crate::inventory::PciBusId::unknown(),
                    ..base.pci.clone()
                },
                ..base
            },
            migs,
        )
    }

    fn mig(index: u32, gi: u32, ci: u32, uuid: &str) -> MigDevice {
        test_support::mig(index, uuid, gi, ci)
    }

    fn names(spec: &Spec) -> Vec<&str> {
        spec.devices.iter().map(|d| d.name.as_str()).collect()
    }

    fn paths(edits: &ContainerEdits) -> Vec<&str> {
        edits.device_nodes.iter().map(|n| n.path.as_str()).collect()
    }

    fn caps() -> MigCaps {
        let mut caps = MigCaps::new("/proc/driver/nvidia/capabilities");
        caps.insert_gpu_instance(1, 7, 66);
        caps.insert_compute_instance(1, 7, 0, 67);
        caps
    }

    #[test]
    fn every_name_strategy_names_gpus_and_mig_devices() {
        let snap = snapshot(vec![
            gpu(0, Some(0), "GPU-aaaa", vec![]),
            gpu(1, Some(1), "GPU-bbbb", vec![mig(0, 7, 0, "MIG-cccc")]),
        ]);
        let host = HostFiles {
            mig_caps: caps(),
            ..HostFiles::default()
        };
        let options = Options {
            name_strategies: vec![
                NameStrategy::TypeIndex,
                NameStrategy::Index,
                NameStrategy::Uuid,
            ],
            ..Options::default()
        };
        let spec = build(&snap, &host, &options).unwrap().spec;
        assert_eq!(
            names(&spec),
            [
                "gpu0", "0", "GPU-aaaa", "gpu1", "1", "GPU-bbbb", "mig1:0", "1:0", "MIG-cccc",
                "all"
            ]
        );
        assert_eq!(spec.cdi_version, "0.5.0");
        assert_eq!(spec.kind, "nvidia.com/gpu");
    }

    #[test]
    fn mig_device_gets_parent_and_both_capability_nodes_and_all_gets_the_union() {
        let snap = snapshot(vec![
            gpu(0, Some(0), "GPU-aaaa", vec![]),
            gpu(1, Some(1), "GPU-bbbb", vec![mig(0, 7, 0, "MIG-cccc")]),
        ]);
        let host = HostFiles {
            mig_caps: caps(),
            ..HostFiles::default()
        };
        let spec = build(&snap, &host, &Options::default()).unwrap().spec;
        let by_name = |n: &str| {
            &spec
                .devices
                .iter()
                .find(|d| d.name == n)
                .unwrap()
                .container_edits
        };
        assert_eq!(paths(by_name("0")), ["/dev/nvidia0"]);
        assert_eq!(
            paths(by_name("1:0")),
            [
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap66",
                "/dev/nvidia-caps/nvidia-cap67"
            ]
        );
        assert_eq!(by_name("MIG-cccc"), by_name("1:0"));
        assert_eq!(
            paths(by_name("all")),
            [
                "/dev/nvidia0",
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap66",
                "/dev/nvidia-caps/nvidia-cap67"
            ]
        );
    }

    #[test]
    fn missing_capability_names_the_device_and_the_file() {
        let snap = snapshot(vec![gpu(
            2,
            Some(5),
            "GPU-bbbb",
            vec![mig(3, 7, 0, "MIG-cccc")],
        )]);
        let err = build(&snap, &HostFiles::default(), &Options::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "MIG device 2:3 (MIG-cccc): no access capability for GPU instance 7: \
             /gpu5/mig/gi7/access was not found or not readable"
        );
        let mut host = HostFiles {
            mig_caps: MigCaps::new("/p"),
            ..HostFiles::default()
        };
        host.mig_caps.insert_gpu_instance(5, 7, 66);
        let err = build(&snap, &host, &Options::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "MIG device 2:3 (MIG-cccc): no access capability for compute instance 0 of GPU \
             instance 7: /p/gpu5/mig/gi7/ci0/access was not found or not readable"
        );
    }

    #[test]
    fn lost_gpus_are_skipped_and_reported() {
        let snap = snapshot(vec![
            gpu(0, None, "", vec![]),
            gpu(1, Some(1), "GPU-bbbb", vec![]),
        ]);
        let generated = build(&snap, &HostFiles::default(), &Options::default()).unwrap();
        assert_eq!(names(&generated.spec), ["1", "GPU-bbbb", "all"]);
        assert_eq!(
            generated.skipped,
            ["GPU 0: no UUID or minor number (lost when the node was read)"]
        );
    }

    #[test]
    fn no_all_device_without_devices_or_when_not_asked() {
        let empty = build(
            &snapshot(vec![]),
            &HostFiles::default(),
            &Options::default(),
        )
        .unwrap()
        .spec;
        assert!(empty.devices.is_empty());
        let snap = snapshot(vec![gpu(0, Some(0), "GPU-aaaa", vec![])]);
        let options = Options {
            all_device: false,
            name_strategies: vec![NameStrategy::Uuid],
            ..Options::default()
        };
        let spec = build(&snap, &HostFiles::default(), &options).unwrap().spec;
        assert_eq!(names(&spec), ["GPU-aaaa"]);
        // Only letters in names and no host paths: the base version.
        assert_eq!(spec.cdi_version, "0.3.0");
    }

    fn driver_host(root: &str) -> HostFiles {
        let lib = |name: &str| HostPath::under(root, &format!("/usr/lib64/{name}"));
        HostFiles {
            dev_root: root.into(),
            control_devices: vec!["/dev/nvidiactl".into(), "/dev/nvidia-uvm".into()],
            libraries: vec![
                lib("libcuda.so.570.133.20"),
                lib("libnvidia-ml.so.570.133.20"),
                HostPath::under(root, "/usr/lib64/vdpau/libvdpau_nvidia.so.570.133.20"),
            ],
            binaries: vec![HostPath::under(root, "/usr/bin/nvidia-smi")],
            ipc: vec![HostPath::under(root, "/run/nvidia-persistenced/socket")],
            firmware: vec![HostPath::under(
                root,
                "/lib/firmware/nvidia/570.133.20/gsp_ga10x.bin",
            )],
            mig_caps: MigCaps::default(),
            hook: Some("/usr/bin/nvidia-cdi-hook".into()),
        }
    }

    #[test]
    fn common_edits_mount_driver_files_and_add_hooks_in_order() {
        let snap = snapshot(vec![gpu(0, Some(0), "GPU-aaaa", vec![])]);
        let host = driver_host("/run/nvidia/driver");
        let options = Options {
            ldconfig_path: Some("/sbin/ldconfig".into()),
            ..Options::default()
        };
        let spec = build(&snap, &host, &options).unwrap().spec;
        let common = &spec.container_edits;
        assert_eq!(
            common.env,
            [
                "NVIDIA_VISIBLE_DEVICES=void",
                "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64"
            ]
        );
        assert_eq!(
            common.device_nodes[0],
            DeviceNode::from_host(
                "/dev/nvidiactl".into(),
                Some("/run/nvidia/driver/dev/nvidiactl".into())
            )
        );
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0]
                .host_path
                .as_deref(),
            Some("/run/nvidia/driver/dev/nvidia0")
        );
        let mounted: Vec<(&str, &str)> = common
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect();
        assert_eq!(
            mounted,
            [
                (
                    "/run/nvidia/driver/usr/lib64/libcuda.so.570.133.20",
                    "/usr/lib64/libcuda.so.570.133.20"
                ),
                (
                    "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.570.133.20",
                    "/usr/lib64/libnvidia-ml.so.570.133.20"
                ),
                (
                    "/run/nvidia/driver/usr/lib64/vdpau/libvdpau_nvidia.so.570.133.20",
                    "/usr/lib64/vdpau/libvdpau_nvidia.so.570.133.20"
                ),
                (
                    "/run/nvidia/driver/usr/bin/nvidia-smi",
                    "/usr/bin/nvidia-smi"
                ),
                (
                    "/run/nvidia/driver/run/nvidia-persistenced/socket",
                    "/run/nvidia-persistenced/socket"
                ),
                (
                    "/run/nvidia/driver/lib/firmware/nvidia/570.133.20/gsp_ga10x.bin",
                    "/lib/firmware/nvidia/570.133.20/gsp_ga10x.bin"
                ),
            ]
        );
        assert!(
            common
                .mounts
                .iter()
                .all(|m| m.options == ["ro", "nosuid", "nodev", "rbind", "rprivate"])
        );
        let args: Vec<Vec<&str>> = common
            .hooks
            .iter()
            .map(|h| h.args.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            args,
            [
                vec![
                    "nvidia-cdi-hook",
                    "create-symlinks",
                    "--link",
                    "libcuda.so.1::/usr/lib64/libcuda.so"
                ],
                vec![
                    "nvidia-cdi-hook",
                    "enable-cuda-compat",
                    "--host-driver-version=570.133.20"
                ],
                vec![
                    "nvidia-cdi-hook",
                    "update-ldcache",
                    "--ldconfig-path",
                    "/sbin/ldconfig",
                    "--folder",
                    "/usr/lib64",
                    "--folder",
                    "/usr/lib64/vdpau"
                ],
                vec!["nvidia-cdi-hook", "disable-device-node-modification"],
            ]
        );
        for hook in &common.hooks {
            assert_eq!(hook.hook_name, "createContainer");
            assert_eq!(hook.path, "/usr/bin/nvidia-cdi-hook");
            assert_eq!(hook.env, ["NVIDIA_CTK_DEBUG=false"]);
        }
    }

    #[test]
    fn hooks_can_be_disabled_one_by_one_or_all_and_need_the_binary() {
        let snap = snapshot(vec![gpu(0, Some(0), "GPU-aaaa", vec![])]);
        let host = driver_host("/");
        let subcommands = |options: &Options, host: &HostFiles| -> Vec<String> {
            build(&snap, host, options)
                .unwrap()
                .spec
                .container_edits
                .hooks
                .iter()
                .map(|h| h.args[1].clone())
                .collect()
        };
        let options = Options {
            disabled_hooks: [HookName::CreateSymlinks, HookName::UpdateLdcache].into(),
            ..Options::default()
        };
        assert_eq!(
            subcommands(&options, &host),
            ["enable-cuda-compat", "disable-device-node-modification"]
        );
        let options = Options {
            disabled_hooks: [HookName::All].into(),
            ..Options::default()
        };
        assert!(subcommands(&options, &host).is_empty());
        let without_binary = HostFiles {
            hook: None,
            ..host.clone()
        };
        assert!(subcommands(&Options::default(), &without_binary).is_empty());
        // No driver libraries: nothing to link or cache, the other hooks stay.
        let no_libs = HostFiles {
            libraries: vec![],
            ..host
        };
        assert_eq!(
            subcommands(&Options::default(), &no_libs),
            ["enable-cuda-compat", "disable-device-node-modification"]
        );
    }
}
