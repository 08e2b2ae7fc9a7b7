//! Enumeration: reads the node's GPUs, MIG devices and interconnect from NVML into a
//! [`Snapshot`].
//!
//! Only node-wide failures (no driver version, no device count) are errors. Anything a single
//! GPU refuses is recorded on that GPU: `NVML_ERROR_GPU_IS_LOST` from any call makes it
//! unhealthy, `NOT_SUPPORTED` leaves the field `None`. Every call here blocks on the driver, so
//! async callers run discovery on a blocking thread.

use std::collections::HashMap;
use std::path::Path;
use std::time::SystemTime;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml as Lib;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError as E;
use nvml_wrapper::struct_wrappers::device::ProfileInfo;
use nvml_wrapper_sys::bindings::{
    NVML_GPU_INSTANCE_PROFILE_COUNT, NVML_NVLINK_MAX_LINKS, nvmlAffinityScope_t,
};
use tracing::debug;

use super::NvmlError;
use super::probe::Probe;
use super::raw::{self, RemoteKind};
use crate::inventory::PciBusId;
use crate::inventory::health::Health;
use crate::inventory::mig_profile;
use crate::inventory::model::{
    Fabric, FabricState, Gpu, Mig, MigDevice, MigEngines, Node, NvLink, NvLinkRemote, PairLink,
    Pci, PcieLevel, Placement, Snapshot, family_for,
};

/// Node facts discovery takes from outside NVML.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// The node name to report (`NODE_NAME`), else the kernel host name is read.
    pub node_name: Option<String>,
    /// File holding the DMI product name (GFD's `machineTypeFile`).
    pub machine_type_file: Option<std::path::PathBuf>,
}

/// Default DMI product-name file, as GFD reads it.
pub const DEFAULT_MACHINE_TYPE_FILE: &str = "/sys/class/dmi/id/product_name";

/// `NVML_AFFINITY_SCOPE_NODE`: memory affinity as a set of NUMA nodes.
const AFFINITY_SCOPE_NODE: nvmlAffinityScope_t = 0;

/// Reads the whole node.
pub fn discover(lib: &Lib, facts: &NodeFacts) -> Result<Snapshot, NvmlError> {
    let now = SystemTime::now();
    let node = read_node(lib, facts)?;
    let count = lib.device_count().map_err(|source| NvmlError::Call {
        call: "nvmlDeviceGetCount_v2",
        source,
    })?;

    let mut gpus = Vec::with_capacity(count as usize);
    let mut handles = Vec::with_capacity(count as usize);
    for index in 0..count {
        match lib.device_by_index(index) {
            Ok(device) => {
                let gpu = read_gpu(lib, &device, index, now);
                handles.push(gpu.health.is_healthy().then_some(device));
                gpus.push(gpu);
            }
            Err(err) => {
                debug!(index, error = %crate::logging::error_chain(&err), "GPU handle unavailable");
                gpus.push(unreachable_gpu(index, &err, now));
                handles.push(None);
            }
        }
    }

    let bus_to_index: HashMap<PciBusId, u32> = gpus
        .iter()
        .filter(|gpu| !gpu.pci.bus_id.is_unknown())
        .map(|gpu| (gpu.pci.bus_id.clone(), gpu.index))
        .collect();
    let mut lost_later = Vec::new();
    for (gpu, handle) in gpus.iter_mut().zip(&handles) {
        if let Some(device) = handle {
            let (links, lost) = read_nvlinks(lib, device, &bus_to_index);
            gpu.nvlinks = links;
            if lost {
                lost_later.push(gpu.index);
            }
        }
    }
    let topology = read_topology(lib, &gpus, &handles, &mut lost_later);
    // A GPU can fall off the bus in the middle of a scan: whatever phase noticed it, the GPU
    // is reported lost, not half-read and healthy.
    for gpu in gpus
        .iter_mut()
        .filter(|gpu| lost_later.contains(&gpu.index))
    {
        if gpu.health.is_healthy() {
            gpu.health = Health::lost(now);
            for mig in &mut gpu.mig.devices {
                mig.health = gpu.health.clone();
            }
        }
    }

    Ok(Snapshot {
        node,
        gpus,
        topology,
    })
}

fn read_node(lib: &Lib, facts: &NodeFacts) -> Result<Node, NvmlError> {
    let driver_version = lib.sys_driver_version().map_err(|source| NvmlError::Call {
        call: "nvmlSystemGetDriverVersion",
        source,
    })?;
    let cuda_driver_version = lib
        .sys_cuda_driver_version()
        .ok()
        .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
    let machine_type_file = facts
        .machine_type_file
        .as_deref()
        .unwrap_or(Path::new(DEFAULT_MACHINE_TYPE_FILE));
    Ok(Node {
        hostname: facts.node_name.clone().unwrap_or_else(kernel_hostname),
        driver_version,
        cuda_driver_version,
        nvml_version: lib.sys_nvml_version().ok(),
        machine_type: std::fs::read_to_string(machine_type_file)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty()),
    })
}

fn kernel_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn read_gpu(lib: &Lib, device: &Device<'_>, index: u32, now: SystemTime) -> Gpu {
    let mut probe = Probe::default();
    let uuid = probe.required("UUID", device.uuid());
    let name = probe.required("name", device.name());
    let memory = probe.optional(device.memory_info());
    let pci = probe.optional(device.pci_info());
    let minor_number = probe.optional(device.minor_number());
    let serial = probe.optional(device.serial());
    let brand = probe
        .optional(device.brand())
        .map(|b| format!("{b:?}").to_ascii_lowercase());
    let architecture = probe
        .optional(device.architecture())
        .map(|a| a.to_string().to_ascii_lowercase());
    let capability = probe.optional(device.cuda_compute_capability());
    let numa_node = probe.optional(read_numa_node(device)).flatten();
    let power_limit_watts = probe
        .optional(device.enforced_power_limit())
        .map(|mw| f64::from(mw) / 1000.0);
    let mig_mode = probe.optional(device.mig_mode());
    let fabric = probe
        .optional(raw::gpu_fabric_info(lib, device))
        .and_then(fabric_from);
    let total_bytes = memory.as_ref().map_or(0, |m| m.total);

    let mig = match mig_mode {
        Some(mode) => Mig {
            capable: true,
            enabled: mode.current == 1,
            pending_enabled: mode.pending == 1,
            reconfiguring: false,
            devices: if mode.current == 1 {
                read_mig_devices(lib, device, total_bytes, &mut probe)
            } else {
                Vec::new()
            },
        },
        None => Mig {
            capable: false,
            enabled: false,
            pending_enabled: false,
            reconfiguring: false,
            devices: Vec::new(),
        },
    };

    let health = probe.health(now);
    let mut gpu = Gpu {
        index,
        minor_number,
        device_node: minor_number.map(|m| format!("/dev/nvidia{m}")),
        uuid,
        serial,
        name,
        brand,
        architecture,
        family: capability
            .as_ref()
            .map(|c| family_for(c.major, c.minor).to_owned()),
        compute_capability: capability.map(|c| format!("{}.{}", c.major, c.minor)),
        memory_mib: total_bytes >> 20,
        pci: pci
            .map(|p| Pci {
                bus_id: PciBusId::from_nvml(&p.bus_id),
                device_id: format!("0x{:08X}", p.pci_device_id),
                subsystem_id: p.pci_sub_system_id.map(|id| format!("0x{id:08X}")),
            })
            .unwrap_or_else(|| Pci {
                bus_id: PciBusId::unknown(),
                device_id: String::new(),
                subsystem_id: None,
            }),
        numa_node,
        power_limit_watts,
        mig,
        nvlinks: Vec::new(),
        fabric,
        health,
        remediation: None,
        device_taints: Vec::new(),
    };
    if !gpu.health.is_healthy() {
        let covering = gpu.health.clone();
        for mig in &mut gpu.mig.devices {
            mig.health = covering.clone();
        }
    }
    gpu
}

/// A GPU whose handle NVML refuses: only its index is known.
fn unreachable_gpu(index: u32, err: &E, now: SystemTime) -> Gpu {
    let health = match err {
        E::GpuLost => Health::lost(now),
        other => Health::unreadable(format!("NVML refuses a handle for it: {other}"), now),
    };
    Gpu {
        index,
        minor_number: None,
        device_node: None,
        uuid: String::new(),
        serial: None,
        name: String::new(),
        brand: None,
        architecture: None,
        family: None,
        compute_capability: None,
        memory_mib: 0,
        pci: Pci {
            bus_id: PciBusId::unknown(),
            device_id: String::new(),
            subsystem_id: None,
        },
        numa_node: None,
        power_limit_watts: None,
        mig: Mig {
            capable: false,
            enabled: false,
            pending_enabled: false,
            reconfiguring: false,
            devices: Vec::new(),
        },
        nvlinks: Vec::new(),
        fabric: None,
        health,
        remediation: None,
        device_taints: Vec::new(),
    }
}

/// The fabric registration as the inventory records it; `None` for a GPU without a fabric
/// (state `NOT_SUPPORTED`, what GPUs outside an NVL rack report) or an unknown state.
fn fabric_from(info: raw::FabricInfo) -> Option<Fabric> {
    let state = match info.state {
        1 => FabricState::NotStarted,
        2 => FabricState::InProgress,
        3 => FabricState::Completed,
        _ => return None,
    };
    Some(Fabric {
        state,
        status: info.status,
        cluster_uuid: uuid_text(&info.cluster_uuid),
        clique_id: info.clique_id,
    })
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower-case, the form GFD's labels use.
fn uuid_text(bytes: &[u8; 16]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The NUMA node the GPU's memory is closest to, from the driver's memory affinity; `None`
/// when the driver reports no node (single-node machines report node 0).
fn read_numa_node(device: &Device<'_>) -> Result<Option<u32>, E> {
    let words = device.memory_affinity(1, AFFINITY_SCOPE_NODE)?;
    let mask = words.first().copied().unwrap_or(0);
    Ok((mask != 0).then(|| mask.trailing_zeros()))
}

fn read_mig_devices(
    lib: &Lib,
    parent: &Device<'_>,
    gpu_total_bytes: u64,
    probe: &mut Probe,
) -> Vec<MigDevice> {
    let Some(max) = probe.optional(parent.mig_device_count()) else {
        return Vec::new();
    };
    let profiles = gpu_instance_profiles(parent);
    let mut devices = Vec::new();
    for index in 0..max {
        let mig = match parent.mig_device_by_index(index) {
            Ok(mig) => mig,
            Err(E::GpuLost) => {
                probe.lost = true;
                break;
            }
            // Empty slots answer NOT_FOUND; anything else also means "no device here".
            Err(_) => continue,
        };
        if let Some(device) =
            read_mig_device(lib, parent, &mig, index, gpu_total_bytes, &profiles, probe)
        {
            devices.push(device);
        }
    }
    devices
}

/// GPU-instance profiles of the GPU as `(enum value, info)`, for naming MIG devices.
fn gpu_instance_profiles(parent: &Device<'_>) -> Vec<(u32, ProfileInfo)> {
    (0..NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|p| parent.profile_info(p).ok().map(|info| (p, info)))
        .collect()
}

fn read_mig_device(
    lib: &Lib,
    parent: &Device<'_>,
    mig: &Device<'_>,
    index: u32,
    gpu_total_bytes: u64,
    profiles: &[(u32, ProfileInfo)],
    probe: &mut Probe,
) -> Option<MigDevice> {
    let uuid = probe.optional(mig.uuid())?;
    let attributes = probe.optional(mig.attributes())?;
    let gpu_instance_id = probe.optional(raw::gpu_instance_id(lib, mig))?;
    let compute_instance_id = probe
        .optional(raw::compute_instance_id(lib, mig))
        .unwrap_or(0);
    let gi_info = probe.optional(raw::gpu_instance_info(lib, parent, gpu_instance_id));
    let profile_enum = gi_info
        .and_then(|(profile_id, _)| profiles.iter().find(|(_, info)| info.id == profile_id))
        .map_or(u32::MAX, |(p, _)| *p);
    // The instance's own memory size is what NVIDIA names profiles by (the GI profile's
    // memory, which the MIG device's attributes repeat).
    let memory_mib = attributes.memory_size_mb;
    Some(MigDevice {
        index,
        uuid,
        gpu_instance_id,
        compute_instance_id,
        profile: mig_profile::profile_name(
            attributes.gpu_instance_slice_count,
            attributes.compute_instance_slice_count,
            memory_mib,
            gpu_total_bytes,
            profile_enum,
        ),
        memory_mib,
        multiprocessors: attributes.multiprocessor_count,
        gpu_slices: attributes.gpu_instance_slice_count,
        compute_slices: attributes.compute_instance_slice_count,
        engines: MigEngines {
            copy: attributes.shared_copy_engine_count,
            decoder: attributes.shared_decoder_count,
            encoder: attributes.shared_encoder_count,
            jpeg: attributes.shared_jpeg_count,
            ofa: attributes.shared_ofa_count,
        },
        gpu_instance_profile_id: gi_info.map(|(id, _)| id),
        placement: gi_info.map(|(_, p)| Placement {
            start: p.start,
            size: p.size,
        }),
        health: Health::healthy(),
    })
}

/// Every NVLink of the GPU with its state and far end. A GPU without NVLink answers
/// `NOT_SUPPORTED` for link 0; links past the GPU's count answer an error too, which ends the
/// walk.
fn read_nvlinks(
    lib: &Lib,
    device: &Device<'_>,
    bus_to_index: &HashMap<PciBusId, u32>,
) -> (Vec<NvLink>, bool) {
    let mut links = Vec::new();
    for link in 0..NVML_NVLINK_MAX_LINKS {
        let wrapper = device.link_wrapper_for(link);
        let active = match wrapper.is_active() {
            Ok(active) => active,
            Err(E::GpuLost) => return (links, true),
            Err(_) => break,
        };
        let remote = if active {
            wrapper.remote_pci_info().ok().map(|pci| {
                let bus_id = PciBusId::from_nvml(&pci.bus_id);
                let known_gpu = bus_to_index.get(&bus_id).copied();
                match (raw::nvlink_remote_kind(lib, device, link), known_gpu) {
                    (Ok(RemoteKind::Switch), _) => NvLinkRemote::Switch { bus_id },
                    (_, Some(gpu_index)) => NvLinkRemote::Gpu { bus_id, gpu_index },
                    _ => NvLinkRemote::Other { bus_id },
                }
            })
        } else {
            None
        };
        links.push(NvLink {
            link,
            active,
            remote,
        });
    }
    (links, false)
}

/// Pairwise connectivity: NVLink counts from the per-GPU link lists, PCIe levels from NVML.
fn read_topology(
    lib: &Lib,
    gpus: &[Gpu],
    handles: &[Option<Device<'_>>],
    lost: &mut Vec<u32>,
) -> Vec<PairLink> {
    let mut pairs = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate().skip(i + 1) {
            // nvml-wrapper takes the peer by value and `Device` is not `Clone`, so the peer's
            // handle is looked up again; NVML returns the same handle.
            let pcie = match (&handles[i], handles[j].is_some()) {
                (Some(da), true) => match lib
                    .device_by_index(b.index)
                    .and_then(|db| da.topology_common_ancestor(db))
                {
                    Ok(level) => pcie_level(level),
                    Err(E::GpuLost) => {
                        // NVML does not say which of the two is gone; each answers alone.
                        for gpu in [a, b] {
                            if matches!(
                                lib.device_by_index(gpu.index).and_then(|d| d.uuid()),
                                Err(E::GpuLost)
                            ) {
                                lost.push(gpu.index);
                            }
                        }
                        PcieLevel::Unknown
                    }
                    Err(_) => PcieLevel::Unknown,
                },
                _ => PcieLevel::Unknown,
            };
            pairs.push(PairLink {
                a: a.index,
                b: b.index,
                nvlinks: nvlinks_between(a, b),
                pcie,
            });
        }
    }
    pairs
}

/// NVLinks usable between two GPUs: direct links either way, plus, when both are attached to
/// the NVSwitch fabric, the bandwidth of the narrower attachment.
fn nvlinks_between(a: &Gpu, b: &Gpu) -> u32 {
    let direct = |from: &Gpu, to: &Gpu| {
        from.nvlinks
            .iter()
            .filter(|l| l.active)
            .filter(|l| matches!(l.remote, Some(NvLinkRemote::Gpu { gpu_index, .. }) if gpu_index == to.index))
            .count() as u32
    };
    let switched = |gpu: &Gpu| {
        gpu.nvlinks
            .iter()
            .filter(|l| l.active && matches!(l.remote, Some(NvLinkRemote::Switch { .. })))
            .count() as u32
    };
    // A direct link is seen from both ends; count it once.
    let direct_links = direct(a, b).max(direct(b, a));
    direct_links + switched(a).min(switched(b))
}

fn pcie_level(level: TopologyLevel) -> PcieLevel {
    match level {
        TopologyLevel::Internal => PcieLevel::SameBoard,
        TopologyLevel::Single => PcieLevel::SingleSwitch,
        TopologyLevel::Multiple => PcieLevel::MultipleSwitches,
        TopologyLevel::HostBridge => PcieLevel::HostBridge,
        TopologyLevel::Node => PcieLevel::NumaNode,
        TopologyLevel::System => PcieLevel::System,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: u8, uuid: [u8; 16]) -> raw::FabricInfo {
        raw::FabricInfo {
            cluster_uuid: uuid,
            status: 0,
            clique_id: 7,
            state,
        }
    }

    #[test]
    fn fabric_states_and_uuid_form() {
        let uuid = [
            0x3f, 0x5a, 0x0c, 0x2e, 0x9b, 0x1d, 0x4e, 0x7a, 0x8c, 0x63, 0x1d, 0x2e, 0x4f, 0x5a,
            0x6b, 0x7c,
        ];
        assert_eq!(
            fabric_from(info(3, uuid)),
            Some(Fabric {
                state: FabricState::Completed,
                status: 0,
                cluster_uuid: "3f5a0c2e-9b1d-4e7a-8c63-1d2e4f5a6b7c".into(),
                clique_id: 7,
            })
        );
        assert_eq!(
            fabric_from(info(1, [0; 16])).map(|f| (f.state, f.cluster_uuid)),
            Some((
                FabricState::NotStarted,
                crate::inventory::model::NO_CLUSTER_UUID.to_owned()
            ))
        );
        assert_eq!(
            fabric_from(info(2, uuid)).map(|f| f.state),
            Some(FabricState::InProgress)
        );
        // NOT_SUPPORTED (a GPU outside any fabric) and states NVML does not define.
        assert_eq!(fabric_from(info(0, [0; 16])), None);
        assert_eq!(fabric_from(info(9, uuid)), None);
    }
}
