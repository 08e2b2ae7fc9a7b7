//! GPU Performance Monitoring (GPM): the samples `nvmlGpmSampleGet` fills and the metrics
//! `nvmlGpmMetricsGet` computes from two of them.
//!
//! Real GPM counts hardware events between two samples; the simulation has no events, so a
//! metric is the telemetry of the later sample's moment (the same pure function of seed, GPU
//! and mock time as every other reading). Two samples taken at the same mock second therefore
//! give well-defined values, which keeps golden outputs exact under a pinned clock. Hopper and
//! newer GPUs support GPM, as on real hardware; GPU-instance samples (`nvmlGpmMigSampleGet`)
//! answer the engine-activity metrics of that instance and refuse the interconnect ones, which
//! the hardware only counts per GPU.

use nvml_wrapper_sys::bindings as b;

use crate::ffi::{Res, rc};
use crate::telemetry::Probe;

/// What a sample holds: nothing yet, or the moment and scope it was taken at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpmSample {
    /// Allocated, never filled.
    Empty,
    /// Filled by `nvmlGpmSampleGet` (`gi: None`) or `nvmlGpmMigSampleGet`.
    Taken { gpu: usize, gi: Option<u32>, t: u64 },
}

/// Whether a GPU of this architecture (`nvmlDeviceArchitecture_t`) supports GPM.
pub fn supported(architecture: u32) -> bool {
    architecture >= b::NVML_DEVICE_ARCH_HOPPER && architecture != b::NVML_DEVICE_ARCH_UNKNOWN
}

/// Short name, long name and unit NVML reports with each metric.
pub fn describe(
    id: u32,
) -> (
    &'static std::ffi::CStr,
    &'static std::ffi::CStr,
    &'static std::ffi::CStr,
) {
    match id {
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => {
            (c"GR_UTIL", c"Graphics engine utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => (c"SM_UTIL", c"SM utilization", c"%"),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => {
            (c"SM_OCCUPANCY", c"SM occupancy", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_INTEGER_UTIL => {
            (c"INT_UTIL", c"Integer pipe utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => {
            (c"TENSOR_UTIL", c"Any tensor pipe utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_DFMA_TENSOR_UTIL => {
            (c"DFMA_UTIL", c"DFMA tensor pipe utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_HMMA_TENSOR_UTIL => {
            (c"HMMA_UTIL", c"HMMA tensor pipe utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_IMMA_TENSOR_UTIL => {
            (c"IMMA_UTIL", c"IMMA tensor pipe utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => {
            (c"DRAM_BW_UTIL", c"DRAM bandwidth utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP64_UTIL => {
            (c"FP64_UTIL", c"FP64 pipe utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP32_UTIL => {
            (c"FP32_UTIL", c"FP32 pipe utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP16_UTIL => {
            (c"FP16_UTIL", c"FP16 pipe utilization", c"%")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC => {
            (c"PCIE_TX", c"PCIe traffic from this GPU", c"MiB/sec")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC => {
            (c"PCIE_RX", c"PCIe traffic to this GPU", c"MiB/sec")
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC => (
            c"NVLINK_RX",
            c"NVLink read bandwidth for all links",
            c"MiB/sec",
        ),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC => (
            c"NVLINK_TX",
            c"NVLink write bandwidth for all links",
            c"MiB/sec",
        ),
        _ => (c"", c"", c""),
    }
}

/// A share of an activity percentage, rounded to two decimals like the driver's readings.
fn share(percent: u32, fraction: f64) -> f64 {
    (f64::from(percent) * fraction * 100.0).round() / 100.0
}

/// The value of metric `id` for a sample taken on `probe`'s GPU at `probe.t`, for the whole
/// GPU (`gi: None`) or one GPU instance. `links_up` lists the GPU's NVLinks that are up.
pub fn metric(probe: &Probe<'_>, gi: Option<u32>, links_up: &[u32], id: u32) -> Res<f64> {
    let activity = match gi {
        None => probe.gpu_util(),
        Some(gi) => probe.mig_util(gi),
    };
    let mib_per_s = |kib_per_s: u64| (kib_per_s as f64 / 1024.0 * 100.0).round() / 100.0;
    let nvlink = |tx: bool| -> Res<f64> {
        if gi.is_some() {
            return Err(rc::NOT_SUPPORTED);
        }
        if probe.gpu.model.nvlink.is_none() {
            return Err(rc::NOT_SUPPORTED);
        }
        let busy = f64::from(probe.gpu_util()) / 100.0;
        let kib: u64 = links_up
            .iter()
            .map(|l| probe.nvlink_kib_per_s(*l, tx))
            .sum();
        Ok(mib_per_s((kib as f64 * busy) as u64))
    };
    Ok(match id {
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => share(activity, 1.0),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => share(activity, 0.92),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => share(activity, 0.61),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_INTEGER_UTIL => share(activity, 0.08),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => share(activity, 0.47),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_DFMA_TENSOR_UTIL => share(activity, 0.03),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_HMMA_TENSOR_UTIL => share(activity, 0.41),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_IMMA_TENSOR_UTIL => share(activity, 0.03),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => match gi {
            None => f64::from(probe.mem_util()),
            Some(_) => share(activity, 0.55),
        },
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP64_UTIL => share(activity, 0.02),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP32_UTIL => share(activity, 0.21),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_FP16_UTIL => share(activity, 0.12),
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC
        | b::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC => {
            if gi.is_some() {
                return Err(rc::NOT_SUPPORTED);
            }
            let tx = id == b::nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC;
            // The PCIe throughput counters are KB/s; GPM reports MiB/s.
            mib_per_s(u64::from(probe.pcie_kbps(tx)))
        }
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC => nvlink(true)?,
        b::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC => nvlink(false)?,
        id if id < b::nvmlGpmMetricId_t_NVML_GPM_METRIC_MAX => return Err(rc::NOT_SUPPORTED),
        _ => return Err(rc::INVALID_ARGUMENT),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;

    #[test]
    fn only_hopper_and_newer_support_gpm() {
        assert!(supported(b::NVML_DEVICE_ARCH_HOPPER));
        assert!(supported(b::NVML_DEVICE_ARCH_BLACKWELL));
        assert!(!supported(b::NVML_DEVICE_ARCH_AMPERE));
        assert!(!supported(b::NVML_DEVICE_ARCH_UNKNOWN));
    }

    #[test]
    fn activity_metrics_follow_utilisation_and_stay_in_range() {
        let node = fixture::load(Some("dgx-h100")).unwrap();
        for t in (0..3600).step_by(97) {
            let p = Probe {
                seed: node.seed,
                gpu: &node.gpus[2],
                t,
            };
            let gr = metric(
                &p,
                None,
                &[],
                b::nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
            )
            .unwrap();
            assert_eq!(gr, f64::from(p.gpu_util()));
            for id in [1, 2, 3, 5, 10, 11, 12, 13] {
                let v = metric(&p, Some(3), &[], id).unwrap();
                assert!((0.0..=100.0).contains(&v), "metric {id} = {v}");
            }
        }
    }

    #[test]
    fn interconnect_metrics_are_per_gpu_only() {
        let node = fixture::load(Some("dgx-h100")).unwrap();
        let p = Probe {
            seed: node.seed,
            gpu: &node.gpus[0],
            t: 1000,
        };
        let tx = b::nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC;
        assert_eq!(metric(&p, Some(1), &[0], tx), Err(rc::NOT_SUPPORTED));
        assert_eq!(metric(&p, None, &[], tx), Ok(0.0), "no link up, no traffic");
        assert!(metric(&p, None, &[0, 1], tx).unwrap() > 0.0 || p.gpu_util() == 0);
        assert_eq!(metric(&p, None, &[], 500), Err(rc::INVALID_ARGUMENT));
        assert_eq!(metric(&p, None, &[], 30), Err(rc::NOT_SUPPORTED));
    }
}
