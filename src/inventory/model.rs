//! The inventory's data model: an immutable picture of the node's GPUs.
//!
//! Everything here is plain data with stable, documented JSON field names (`docs/inventory.md`).
//! Subsystems read it; only discovery (`crate::nvml`) and the health overlay produce it. Fields
//! that a driver may legitimately refuse to report (`NOT_SUPPORTED` on some boards) are
//! `Option`s and serialise as `null`, so a missing value is never confused with a zero.

use serde::{Deserialize, Serialize};

use super::health::Health;
use super::pci_bus_id::PciBusId;

/// One published view of the node. Cheap to share: subscribers hold an `Arc<Snapshot>`. The
/// default is a node without GPUs or facts (the labeller's when NVML is unavailable).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Facts about the node and its driver.
    pub node: Node,
    /// Physical GPUs, ordered by NVML index.
    pub gpus: Vec<Gpu>,
    /// How every pair of GPUs is connected, ordered by `(a, b)` with `a < b`.
    pub topology: Vec<PairLink>,
}

/// Node-wide facts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// `NODE_NAME` when set (the Kubernetes node name), else the kernel host name.
    pub hostname: String,
    /// Kernel driver version, e.g. `570.133.20`.
    pub driver_version: String,
    /// CUDA driver API version as `major.minor`, e.g. `12.8`.
    pub cuda_driver_version: Option<String>,
    /// NVML library version, e.g. `12.570.133.20`.
    pub nvml_version: Option<String>,
    /// DMI product name (e.g. `DGX H100`), `None` when the file cannot be read.
    pub machine_type: Option<String>,
}

/// One physical GPU.
///
/// Identity fields are empty strings for a GPU that was already lost when gpud first saw it:
/// NVML then refuses even its handle, and only its index is known.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index (enumeration order, by PCI bus id).
    pub index: u32,
    /// Kernel minor number: the GPU is `/dev/nvidia<minor>`.
    pub minor_number: Option<u32>,
    /// The character device a container needs, e.g. `/dev/nvidia3`.
    pub device_node: Option<String>,
    /// `GPU-xxxxxxxx-…`; the stable identity used by Kubernetes device IDs.
    pub uuid: String,
    /// Board serial number.
    pub serial: Option<String>,
    /// Marketing name as NVML reports it, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Product brand, e.g. `nvidia`, `tesla`.
    pub brand: Option<String>,
    /// Architecture as NVML reports it, e.g. `hopper`.
    pub architecture: Option<String>,
    /// Family by compute capability, in GFD's words (`hopper`, `ampere`, `ada-lovelace` …).
    pub family: Option<String>,
    /// CUDA compute capability, e.g. `9.0`.
    pub compute_capability: Option<String>,
    /// Total framebuffer memory in MiB.
    pub memory_mib: u64,
    /// PCI identity.
    pub pci: Pci,
    /// NUMA node the GPU is attached to, `None` on single-node machines or when unknown.
    pub numa_node: Option<u32>,
    /// Enforced power limit in watts.
    pub power_limit_watts: Option<f64>,
    /// MIG capability, mode and instances.
    pub mig: Mig,
    /// One entry per NVLink the GPU has (up or down).
    pub nvlinks: Vec<NvLink>,
    /// Registration with a multi-node NVLink fabric (GB200 NVL racks); `None` when the GPU
    /// has no such fabric or the driver does not say.
    #[serde(default)]
    pub fabric: Option<Fabric>,
    /// Current health of the whole GPU.
    pub health: Health,
    /// Where gpud's remediation has the GPU, when it is on (`gpud run --remediation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<super::remediation::GpuRemediation>,
    /// Taints a cluster admin's `DeviceTaintRule`s put on the GPU or its MIG devices, when
    /// the DRA plugin runs (`gpud dra`, `gpud run --dra`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_taints: Vec<super::device_taints::RuleTaint>,
}

/// A GPU's registration with a multi-node NVLink fabric: the NVSwitch trays of a rack join
/// GPUs of several nodes into cliques that share memory over NVLink (IMEX).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fabric {
    /// How far the fabric manager got registering the GPU.
    pub state: FabricState,
    /// NVML's return code for the registration: 0 when it succeeded.
    pub status: u32,
    /// The fabric's cluster UUID, lower-case `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (all zeros
    /// until the GPU is registered).
    pub cluster_uuid: String,
    /// The clique (NVLink partition) of the cluster the GPU belongs to.
    pub clique_id: u32,
}

/// Progress of a GPU's fabric registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FabricState {
    NotStarted,
    InProgress,
    Completed,
}

/// The cluster UUID of a GPU that no fabric has registered.
pub const NO_CLUSTER_UUID: &str = "00000000-0000-0000-0000-000000000000";

impl Fabric {
    /// Whether the GPU is attached to a fabric, by the rule of NVIDIA's go-nvlib
    /// (`IsFabricAttached`): registration completed, successfully, with a cluster UUID.
    pub fn is_attached(&self) -> bool {
        self.state == FabricState::Completed
            && self.status == 0
            && self.cluster_uuid != NO_CLUSTER_UUID
    }
}

/// PCI identity of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pci {
    /// Bus id, spelled in NVML's form (`00000000:18:00.0`); empty when NVML refused the GPU.
    pub bus_id: PciBusId,
    /// Combined device and vendor id, e.g. `0x233010DE`.
    pub device_id: String,
    /// Combined subsystem device and vendor id, e.g. `0x16C110DE`.
    pub subsystem_id: Option<String>,
}

/// MIG capability and state of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mig {
    /// Whether the GPU supports MIG at all.
    pub capable: bool,
    /// Whether MIG mode is enabled now.
    pub enabled: bool,
    /// The mode the GPU will be in after its next reset (differs from `enabled` while a
    /// mode change waits for a reset).
    pub pending_enabled: bool,
    /// The MIG devices (compute instances) that exist now.
    pub devices: Vec<MigDevice>,
    /// The MIG applier is about to repartition this GPU or is doing so: consumers withdraw
    /// it (the device plugin reports it and its MIG devices unhealthy, the exporter stops
    /// sampling it) until the applier's rescan after the change clears the mark. Omitted
    /// from the JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reconfiguring: bool,
}

/// One MIG device: a compute instance inside a GPU instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigDevice {
    /// Index of the MIG device within its parent GPU (NVML's MIG device index).
    pub index: u32,
    /// `MIG-xxxxxxxx-…`.
    pub uuid: String,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id within the GPU instance.
    pub compute_instance_id: u32,
    /// Profile in NVIDIA's naming, e.g. `1g.10gb`, `1c.3g.40gb`, `1g.10gb+me`.
    pub profile: String,
    /// Memory of the instance in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the compute instance.
    pub multiprocessors: u32,
    /// GPU-instance slices (the `G` in `<G>g`).
    pub gpu_slices: u32,
    /// Compute-instance slices (the `C` in `<C>c`).
    pub compute_slices: u32,
    /// Engine counts shared by the instance.
    pub engines: MigEngines,
    /// Where the GPU instance sits, in memory slices.
    pub placement: Option<Placement>,
    /// NVML's id of the GPU instance's profile (`NVML_GPU_INSTANCE_PROFILE_*` resolved by the
    /// driver, e.g. 19 for A100's `1g.5gb`): part of the device's DRA name.
    #[serde(default)]
    pub gpu_instance_profile_id: Option<u32>,
    /// Health of this instance (a GPU-wide fault covers every instance).
    pub health: Health,
}

/// Engines available to a MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigEngines {
    pub copy: u32,
    pub decoder: u32,
    pub encoder: u32,
    pub jpeg: u32,
    pub ofa: u32,
}

/// A GPU instance placement: `size` memory slices starting at `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

/// One NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    /// Link number on the GPU.
    pub link: u32,
    /// Whether the link is up.
    pub active: bool,
    /// What the other end is, when the link reports it.
    pub remote: Option<NvLinkRemote>,
}

/// The far end of an NVLink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NvLinkRemote {
    /// Another GPU of this node, by NVML index.
    Gpu { bus_id: PciBusId, gpu_index: u32 },
    /// An NVSwitch: every GPU attached to the switch fabric is reachable through it.
    Switch { bus_id: PciBusId },
    /// Something NVML could not classify (an NPU, or a GPU gpud does not know).
    Other { bus_id: PciBusId },
}

/// How two GPUs are connected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairLink {
    /// Lower NVML index of the pair.
    pub a: u32,
    /// Higher NVML index of the pair.
    pub b: u32,
    /// Number of NVLinks usable between the two (direct, or through an NVSwitch fabric).
    pub nvlinks: u32,
    /// Closest common PCIe ancestor.
    pub pcie: PcieLevel,
}

/// Closest common ancestor of two GPUs in the PCIe tree, NVML's topology levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PcieLevel {
    /// Same board (multi-GPU board such as a K80).
    SameBoard,
    /// Behind one PCIe switch.
    SingleSwitch,
    /// Behind several PCIe switches, without crossing a host bridge.
    MultipleSwitches,
    /// Under one host bridge.
    HostBridge,
    /// On one NUMA node, across host bridges.
    NumaNode,
    /// Across NUMA nodes (the inter-socket link).
    System,
    /// NVML could not tell (a lost GPU, or the query is unsupported).
    Unknown,
}

impl PcieLevel {
    /// The abbreviation `nvidia-smi topo -m` prints for this level.
    pub fn abbreviation(self) -> &'static str {
        match self {
            PcieLevel::SameBoard => "PSB",
            PcieLevel::SingleSwitch => "PIX",
            PcieLevel::MultipleSwitches => "PXB",
            PcieLevel::HostBridge => "PHB",
            PcieLevel::NumaNode => "NODE",
            PcieLevel::System => "SYS",
            PcieLevel::Unknown => "?",
        }
    }
}

impl Snapshot {
    /// Marks exactly the GPUs in `indices` as being reconfigured (see [`Mig::reconfiguring`]);
    /// an empty list clears every mark.
    pub fn set_reconfiguring(&mut self, indices: &[u32]) {
        for gpu in &mut self.gpus {
            gpu.mig.reconfiguring = indices.contains(&gpu.index);
        }
    }

    /// The GPU with this NVML index.
    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|gpu| gpu.index == index)
    }

    /// How GPUs `a` and `b` are connected (in either order).
    pub fn link_between(&self, a: u32, b: u32) -> Option<&PairLink> {
        let (lo, hi) = if a < b { (a, b) } else { (b, a) };
        self.topology
            .iter()
            .find(|pair| pair.a == lo && pair.b == hi)
    }
}

/// GFD's family name for a compute capability (`getArchFamily`).
pub fn family_for(major: i32, minor: i32) -> &'static str {
    match major {
        1 => "tesla",
        2 => "fermi",
        3 => "kepler",
        5 => "maxwell",
        6 => "pascal",
        7 if minor < 5 => "volta",
        7 => "turing",
        8 if minor < 9 => "ampere",
        8 => "ada-lovelace",
        9 => "hopper",
        10 | 12 => "blackwell",
        13 => "rubin",
        _ => "undefined",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_follows_gfd_mapping() {
        let cases = [
            ((7, 0), "volta"),
            ((7, 5), "turing"),
            ((8, 0), "ampere"),
            ((8, 6), "ampere"),
            ((8, 9), "ada-lovelace"),
            ((9, 0), "hopper"),
            ((10, 0), "blackwell"),
            ((12, 0), "blackwell"),
            ((4, 0), "undefined"),
        ];
        for ((major, minor), want) in cases {
            assert_eq!(family_for(major, minor), want, "{major}.{minor}");
        }
    }
}
