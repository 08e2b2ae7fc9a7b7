//! Polled health signals: what events do not announce, read on an interval.
//!
//! Volatile double-bit ECC counts, pending page retirement and row remapping, remap failure,
//! temperature against the slowdown threshold, NVLink states, and whether the GPU answers at
//! all. Each value is `None` when the GPU does not support the query; only
//! `NVML_ERROR_GPU_IS_LOST` from any call marks the GPU lost.

use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::error::NvmlError as E;
use nvml_wrapper_sys::bindings::NVML_NVLINK_MAX_LINKS;

use super::probe::Probe;
use super::{Nvml, raw};

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: what the driver asks for after a fault (replaces the
/// deprecated reset-status fields 226 and 227).
pub const FIELD_RECOVERY_ACTION: u32 = 230;

/// One GPU's polled signals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuSignals {
    /// NVML index.
    pub gpu: u32,
    /// The GPU answered `NVML_ERROR_GPU_IS_LOST` (or refused its handle that way).
    pub lost: bool,
    /// Uncorrected ECC errors since the last driver load or GPU reset.
    pub volatile_dbe: Option<u64>,
    /// Pages waiting to be retired at the next reset (pre-Ampere boards).
    pub retired_pages_pending: Option<bool>,
    /// A row remap waits for the next reset (Ampere and newer).
    pub remap_pending: Option<bool>,
    /// A row remap failed: the memory can no longer be repaired in the field.
    pub remap_failure: Option<bool>,
    /// GPU temperature in °C.
    pub temperature_c: Option<u32>,
    /// Temperature at which the GPU starts slowing its clocks.
    pub slowdown_c: Option<u32>,
    /// State of each NVLink by link number (`true` = up).
    pub nvlinks_up: Vec<(u32, bool)>,
    /// What NVML says the GPU needs (field 230, R550+): 0 nothing, 1 a GPU reset, 2 a node
    /// reboot, 3 a P2P drain, 4 a drain and reset. Going back to 0 is how a reset shows.
    pub recovery_action: Option<u64>,
}

impl Nvml {
    /// Polls every GPU. Blocks on the driver.
    pub fn poll_signals(&self) -> Vec<GpuSignals> {
        let count = self.lib.device_count().unwrap_or(0);
        (0..count)
            .map(|gpu| match self.lib.device_by_index(gpu) {
                Ok(device) => read(self.lib, &device, gpu),
                Err(err) => GpuSignals {
                    gpu,
                    lost: matches!(err, E::GpuLost),
                    ..GpuSignals::default()
                },
            })
            .collect()
    }
}

fn read(lib: &nvml_wrapper::Nvml, device: &Device<'_>, gpu: u32) -> GpuSignals {
    let mut probe = Probe::default();
    let volatile_dbe =
        probe.optional(device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile));
    let retired_pages_pending = probe.optional(device.are_pages_pending_retired());
    let remap = probe.optional(raw::remapped_rows(lib, device));
    let temperature_c = probe.optional(device.temperature(TemperatureSensor::Gpu));
    let slowdown_c = probe.optional(device.temperature_threshold(TemperatureThreshold::Slowdown));
    let mut nvlinks_up = Vec::new();
    for link in 0..NVML_NVLINK_MAX_LINKS {
        match device.link_wrapper_for(link).is_active() {
            Ok(up) => nvlinks_up.push((link, up)),
            Err(E::GpuLost) => {
                probe.lost = true;
                break;
            }
            Err(_) => break,
        }
    }
    let recovery_action = raw::field_values(lib, device, &[(FIELD_RECOVERY_ACTION, 0)])
        .ok()
        .and_then(|values| values.into_iter().next())
        .and_then(Result::ok);
    GpuSignals {
        gpu,
        recovery_action,
        lost: probe.lost,
        volatile_dbe,
        retired_pages_pending,
        remap_pending: remap.map(|(_, _, pending, _)| pending),
        remap_failure: remap.map(|(_, _, _, failure)| failure),
        temperature_c,
        slowdown_c,
        nvlinks_up,
    }
}
