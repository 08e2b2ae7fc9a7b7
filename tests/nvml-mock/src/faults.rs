//! Per-GPU health state that fault injection changes: lost/recovered, ECC counters, row
//! remapping and retired pages, NVLink states, temperature override, last XID.
//!
//! Telemetry is a pure function of time; everything here is the opposite, the accumulated
//! effect of control-file commands, so it lives in the runtime next to the MIG state.

use crate::control::ProcessUsage;
use crate::node::Gpu;

/// One retired framebuffer page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetiredPage {
    pub address: u64,
    /// Microseconds since the epoch, as NVML reports retirement times.
    pub timestamp_us: u64,
    /// `NVML_PAGE_RETIREMENT_CAUSE_*`.
    pub cause: u32,
}

/// A compute process on a GPU (`process`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    /// Memory in bytes and utilisation in percent.
    pub usage: ProcessUsage,
    /// The GPU instance it runs in (compute instance 0); `None` outside MIG.
    pub gpu_instance: Option<u32>,
}

/// Health state of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Faults {
    /// Fallen off the bus: every call on the GPU answers `NVML_ERROR_GPU_IS_LOST`.
    pub lost: bool,
    pub sbe_volatile: u64,
    pub sbe_aggregate: u64,
    pub dbe_volatile: u64,
    pub dbe_aggregate: u64,
    pub remapped_correctable: u32,
    pub remapped_uncorrectable: u32,
    /// A remap waits for the next reset.
    pub remap_pending: bool,
    /// A remap failed: the bank ran out of spare rows.
    pub remap_failure: bool,
    pub retired_pages: Vec<RetiredPage>,
    /// Some retired page only takes effect at the next reset.
    pub pages_pending: bool,
    /// Current state of each NVLink (`true` = active).
    pub link_up: Vec<bool>,
    /// Temperature forced by a `temp` command, °C.
    pub temperature_override: Option<u32>,
    /// The most recent XID injected on this GPU.
    pub last_xid: Option<u64>,
    /// ECC mode after the next reboot, when an `ecc-pending` command changed it.
    pub ecc_pending: Option<bool>,
    /// PCIe link `(generation, width)` forced by a `pcie-link` command (a degraded link).
    pub pcie_link: Option<(u32, u32)>,
    /// MIG administration calls that fail (`mig-fail`): op name → kill the caller instead.
    pub mig_fail: std::collections::BTreeMap<String, bool>,
    /// Compute processes running on the GPU, by PID (`process`).
    pub processes: std::collections::BTreeMap<u32, GpuProcess>,
    /// `nvmlDeviceGpuRecoveryAction_t` set by a `recovery-action` command (field 230); 0 none.
    pub recovery_action: u32,
}

impl Faults {
    /// A healthy GPU with the fixture's link states.
    pub fn new(gpu: &Gpu) -> Faults {
        Faults {
            lost: false,
            sbe_volatile: 0,
            sbe_aggregate: 0,
            dbe_volatile: 0,
            dbe_aggregate: 0,
            remapped_correctable: 0,
            remapped_uncorrectable: 0,
            remap_pending: false,
            remap_failure: false,
            retired_pages: Vec::new(),
            pages_pending: false,
            link_up: gpu.links.iter().map(|l| l.up).collect(),
            temperature_override: None,
            last_xid: None,
            ecc_pending: None,
            pcie_link: None,
            mig_fail: std::collections::BTreeMap::new(),
            processes: std::collections::BTreeMap::new(),
            recovery_action: 0,
        }
    }

    /// What a GPU reset clears: the lost state, volatile ECC counters, pending remaps and page
    /// retirements (which the reset applies, so their counts stay) and the recovery action
    /// asked for.
    pub fn reset(&mut self) {
        self.lost = false;
        self.sbe_volatile = 0;
        self.dbe_volatile = 0;
        self.remap_pending = false;
        self.pages_pending = false;
        self.recovery_action = 0;
    }
}
