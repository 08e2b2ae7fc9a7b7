//! The simulated machine as the rest of the crate sees it once a fixture has been validated:
//! immutable facts about the driver, the GPUs, their PCIe and NVLink wiring, and the MIG state
//! each GPU starts in.

use std::fmt;

use crate::mig::MigState;
use crate::models::Model;

/// A PCI address `domain:bus:device.function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl PciAddress {
    /// Parses `00000000:18:00.0`, `0000:18:00.0` or `18:00.0`, any hex case.
    pub fn parse(text: &str) -> Option<PciAddress> {
        let text = text.trim();
        let (rest, function) = text.rsplit_once('.')?;
        let mut parts: Vec<&str> = rest.split(':').collect();
        let device = parts.pop()?;
        let bus = parts.pop()?;
        let domain = match parts.as_slice() {
            [] => "0",
            [d] => d,
            _ => return None,
        };
        let hex = |s: &str, max: u32| {
            let v = u32::from_str_radix(s, 16).ok()?;
            (!s.is_empty() && v <= max).then_some(v)
        };
        Some(PciAddress {
            domain: hex(domain, u32::MAX)?,
            bus: hex(bus, 0xff)?,
            device: hex(device, 0x1f)?,
            function: hex(function, 0x7)?,
        })
    }

    /// `00000000:18:00.0`, the form of `nvmlPciInfo_t.busId`.
    pub fn bus_id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// `0000:18:00.0`, the form of `nvmlPciInfo_t.busIdLegacy`.
    pub fn bus_id_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.bus_id())
    }
}

/// What the far end of an NVLink is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    /// Another GPU of this node, by index.
    Gpu(usize),
    /// An NVSwitch of this node, by index into [`Node::nvswitches`].
    NvSwitch(usize),
    /// Nothing trained on this link.
    None,
}

/// One NVLink of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub remote: Remote,
    /// State at start-up; `nvlink-down`/`nvlink-up` control lines change it at run time.
    pub up: bool,
}

/// An NVSwitch chip, seen only as the remote end of links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvSwitch {
    pub address: PciAddress,
    pub pci_device_id: u32,
}

/// A GPU's registration with a multi-node NVLink fabric (an NVL72 rack's NVSwitch trays), as
/// `nvmlDeviceGetGpuFabricInfo*` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fabric {
    /// The fabric's cluster UUID, raw bytes.
    pub cluster_uuid: [u8; 16],
    /// The clique (NVLink partition) the GPU belongs to.
    pub clique_id: u32,
    /// An `nvmlGpuFabricState_t`: 1 not started, 2 in progress, 3 completed.
    pub state: u8,
    /// The registration's outcome, an `nvmlReturn_t` (0 = success).
    pub status: u32,
}

impl Fabric {
    /// What a GPU outside any multi-node fabric reports (seen on a real single H200): the call
    /// succeeds with state `NOT_SUPPORTED`, status `SUCCESS`, clique 0 and an all-zero UUID.
    pub const NONE: Fabric = Fabric {
        cluster_uuid: [0; 16],
        clique_id: 0,
        state: 0,
        status: 0,
    };
}

/// One physical GPU.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub index: usize,
    pub model: Model,
    pub uuid: String,
    pub serial: String,
    pub board_part_number: String,
    pub address: PciAddress,
    pub minor_number: u32,
    pub numa_node: u32,
    /// Logical CPUs close to the GPU, ascending.
    pub cpus: Vec<u32>,
    /// PCIe root (host bridge) the GPU hangs off, if declared.
    pub host_bridge: Option<String>,
    /// PCIe switches between the host bridge and the GPU, outermost first.
    pub switches: Vec<String>,
    pub power_limit_mw: u32,
    pub ecc_enabled: bool,
    pub persistence_mode: bool,
    pub compute_mode: u32,
    /// Exactly `model.nvlink.links` entries (empty without NVLink).
    pub links: Vec<Link>,
    /// The MIG state before any state file or runtime change (disabled on non-MIG GPUs).
    pub initial_mig: MigState,
    /// Multi-node NVLink fabric registration ([`Fabric::NONE`] outside such a fabric).
    pub fabric: Fabric,
}

impl Gpu {
    pub fn mig_capable(&self) -> bool {
        self.model.mig.is_some()
    }
}

/// The whole simulated machine.
#[derive(Debug, Clone)]
pub struct Node {
    /// Where the fixture came from (built-in name or file path), for messages.
    pub origin: String,
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_driver_version: i32,
    pub seed: u64,
    pub nvswitches: Vec<NvSwitch>,
    pub gpus: Vec<Gpu>,
}

impl Node {
    /// Finds a GPU by UUID (exact, as NVML compares).
    pub fn gpu_by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_round_trip() {
        let a = PciAddress::parse("00000000:9a:00.0").unwrap();
        assert_eq!(a.bus_id(), "00000000:9A:00.0");
        assert_eq!(a.bus_id_legacy(), "0000:9A:00.0");
        assert_eq!(PciAddress::parse("0000:9A:00.0"), Some(a));
        assert_eq!(PciAddress::parse("9a:00.0"), Some(a));
        assert_eq!(PciAddress::parse("9a:00"), None);
        assert_eq!(PciAddress::parse("1:2:3:4.0"), None);
        assert_eq!(PciAddress::parse("100:00.0"), None);
    }
}
