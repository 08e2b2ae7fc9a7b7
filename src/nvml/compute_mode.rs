//! Reading and changing a GPU's compute mode through NVML (`nvmlDeviceGetComputeMode`,
//! `nvmlDeviceSetComputeMode`), by UUID: MPS needs EXCLUSIVE_PROCESS while its daemon runs and
//! DEFAULT back once it stops, and the doctor reads it to find a mode an MPS daemon left behind.

use nvml_wrapper::enum_wrappers::device::ComputeMode as Wrapped;

use super::mig_admin::call;
use super::{Nvml, NvmlError};

/// The compute modes the driver still supports (EXCLUSIVE_THREAD was removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    /// Any number of processes per GPU.
    Default,
    /// One process (an MPS server counts as one) per GPU.
    ExclusiveProcess,
    /// No CUDA contexts at all.
    Prohibited,
}

impl ComputeMode {
    /// NVIDIA's spelling (`nvidia-smi -c`).
    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Default => "DEFAULT",
            ComputeMode::ExclusiveProcess => "EXCLUSIVE_PROCESS",
            ComputeMode::Prohibited => "PROHIBITED",
        }
    }
}

impl From<Wrapped> for ComputeMode {
    fn from(mode: Wrapped) -> Self {
        match mode {
            Wrapped::Default => ComputeMode::Default,
            Wrapped::Prohibited => ComputeMode::Prohibited,
            // EXCLUSIVE_THREAD no longer exists; a driver that still reports it restricts
            // processes the same way.
            Wrapped::ExclusiveProcess | Wrapped::ExclusiveThread => ComputeMode::ExclusiveProcess,
        }
    }
}

impl std::fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Nvml {
    /// The compute mode of GPU `uuid`. Blocks on the driver.
    pub fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, NvmlError> {
        let device = self
            .lib
            .device_by_uuid(uuid)
            .map_err(call("nvmlDeviceGetHandleByUUID"))?;
        let mode = device
            .compute_mode()
            .map_err(call("nvmlDeviceGetComputeMode"))?;
        Ok(ComputeMode::from(mode))
    }

    /// Sets the compute mode of GPU `uuid` (needs root, as `nvidia-smi -c` does). Blocks on
    /// the driver.
    pub fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), NvmlError> {
        let mut device = self
            .lib
            .device_by_uuid(uuid)
            .map_err(call("nvmlDeviceGetHandleByUUID"))?;
        let wrapped = match mode {
            ComputeMode::Default => Wrapped::Default,
            ComputeMode::ExclusiveProcess => Wrapped::ExclusiveProcess,
            ComputeMode::Prohibited => Wrapped::Prohibited,
        };
        device
            .set_compute_mode(wrapped)
            .map_err(call("nvmlDeviceSetComputeMode"))
    }
}
