//! The per-GPU facts `gpud doctor` judges that neither discovery nor the health poll reads:
//! persistence mode, ECC mode now and after the next reboot, the PCIe link against its maximum,
//! clock throttle reasons, the recovery action NVML asks for and the compute mode. Each is `None` when the GPU
//! does not support the query.

use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError as E;

use super::compute_mode::ComputeMode;
use super::probe::Probe;
use super::{GpuSignals, Nvml};

/// A PCIe link's trained and maximum generation and width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcieLink {
    pub generation: u32,
    pub width: u32,
    /// The highest generation both the GPU and its slot support.
    pub max_generation: u32,
    pub max_width: u32,
}

/// One GPU's preflight facts, with its polled health signals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuPreflight {
    /// The health poll's view: loss, pending retirement and remapping, temperature, NVLinks.
    pub signals: GpuSignals,
    pub persistence_mode: Option<bool>,
    /// ECC enabled `(now, after the next reboot)`.
    pub ecc_mode: Option<(bool, bool)>,
    pub pcie: Option<PcieLink>,
    /// `nvmlClocksEventReason*` bits.
    pub throttle_reasons: Option<u64>,
    /// `nvmlDeviceGpuRecoveryAction_t`: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
    /// 4 drain and reset.
    pub recovery_action: Option<u64>,
    /// The compute mode (EXCLUSIVE_PROCESS while MPS serves the GPU).
    pub compute_mode: Option<ComputeMode>,
}

impl Nvml {
    /// Reads every GPU's preflight facts. Blocks on the driver (a lost GPU can stall a call).
    pub fn preflight(&self) -> Vec<GpuPreflight> {
        self.poll_signals()
            .into_iter()
            .map(|signals| match self.lib.device_by_index(signals.gpu) {
                Ok(device) if !signals.lost => read(&device, signals),
                _ => GpuPreflight {
                    signals,
                    ..GpuPreflight::default()
                },
            })
            .collect()
    }
}

fn read(device: &Device<'_>, mut signals: GpuSignals) -> GpuPreflight {
    let mut probe = Probe::default();
    let persistence_mode = probe.optional(device.is_in_persistent_mode());
    let ecc_mode = probe
        .optional(device.is_ecc_enabled())
        .map(|state| (state.currently_enabled, state.pending_enabled));
    let pcie = (|| -> Result<PcieLink, E> {
        Ok(PcieLink {
            generation: device.current_pcie_link_gen()?,
            width: device.current_pcie_link_width()?,
            max_generation: device.max_pcie_link_gen()?,
            max_width: device.max_pcie_link_width()?,
        })
    })();
    let pcie = probe.optional(pcie);
    let throttle_reasons = probe
        .optional(device.current_throttle_reasons())
        .map(|reasons| reasons.bits());
    // Polled with the health signals already.
    let recovery_action = signals.recovery_action;
    let compute_mode = probe.optional(device.compute_mode()).map(ComputeMode::from);
    signals.lost |= probe.lost;
    GpuPreflight {
        signals,
        persistence_mode,
        ecc_mode,
        pcie,
        throttle_reasons,
        recovery_action,
        compute_mode,
    }
}
