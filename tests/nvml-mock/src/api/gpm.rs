//! GPU Performance Monitoring: device support, sample allocation, whole-GPU and GPU-instance
//! samples, and the metrics computed from two samples (see [`crate::gpm`]).

use std::os::raw::c_uint;

use super::{addr, handle};
use crate::driver::{self, Dev};
use crate::ffi::{export, get, get_version, put, rc, require};
use crate::gpm::{self, GpmSample};
use nvml_wrapper_sys::bindings as b;
use nvml_wrapper_sys::bindings::*;

export! {
    /// Whether the GPU supports GPM (Hopper and newer); MIG device handles are refused.
    fn nvmlGpmQueryDeviceSupport(device: nvmlDevice_t, gpm_support: *mut nvmlGpmSupport_t) {
        let version = get_version!(gpm_support);
        let supported = driver::with(|s, rt| {
            let gpu = rt.gpu(&s.node, addr(device))?;
            Ok(gpm::supported(s.node.gpus[gpu].model.architecture))
        })?;
        if version != b::NVML_GPM_SUPPORT_VERSION {
            return Err(rc::ARGUMENT_VERSION_MISMATCH);
        }
        put!(gpm_support, nvmlGpmSupport_t { version, isSupportedDevice: supported as c_uint });
        Ok(())
    }
}

export! {
    /// Allocates an empty sample.
    fn nvmlGpmSampleAlloc(gpm_sample: *mut nvmlGpmSample_t) {
        require!(gpm_sample);
        let h = driver::with(|_, rt| Ok(rt.alloc_gpm_sample()))?;
        put!(gpm_sample, handle(h));
        Ok(())
    }
}

export! {
    /// Frees a sample; its handle is invalid afterwards.
    fn nvmlGpmSampleFree(gpm_sample: nvmlGpmSample_t) {
        driver::with(|_, rt| rt.free_gpm_sample(addr(gpm_sample)))
    }
}

/// Fills `sample` for GPU `device`, whole (`gi: None`) or one of its GPU instances.
fn take(device: nvmlDevice_t, gi: Option<u32>, sample: nvmlGpmSample_t) -> crate::ffi::Res {
    driver::with(|s, rt| {
        let gpu = match rt.device(&s.node, addr(device))? {
            Dev::Gpu(gpu) => gpu,
            Dev::Mig { .. } => return Err(rc::INVALID_ARGUMENT),
        };
        if !gpm::supported(s.node.gpus[gpu].model.architecture) {
            return Err(rc::NOT_SUPPORTED);
        }
        if let Some(id) = gi {
            rt.sync_state(&s.node);
            if !rt.mig[gpu].enabled() {
                return Err(rc::NOT_SUPPORTED);
            }
            rt.mig[gpu].gi(id).ok_or(rc::INVALID_ARGUMENT)?;
        }
        let t = s.now();
        *rt.gpm_sample(addr(sample))? = GpmSample::Taken { gpu, gi, t };
        Ok(())
    })
}

export! {
    /// Samples the whole GPU's performance counters now.
    fn nvmlGpmSampleGet(device: nvmlDevice_t, gpm_sample: nvmlGpmSample_t) {
        take(device, None, gpm_sample)
    }
}

export! {
    /// Samples one GPU instance's performance counters now (MIG enabled, parent handle).
    fn nvmlGpmMigSampleGet(device: nvmlDevice_t, gpu_instance_id: c_uint, gpm_sample: nvmlGpmSample_t) {
        take(device, Some(gpu_instance_id), gpm_sample)
    }
}

export! {
    /// Computes metrics between two samples of the same GPU (or GPU instance), taken in
    /// order; per-metric failures go into each entry's `nvmlReturn`.
    fn nvmlGpmMetricsGet(metrics_get: *mut nvmlGpmMetricsGet_t) {
        let mut request = get!(metrics_get);
        if request.version != b::NVML_GPM_METRICS_GET_VERSION {
            return Err(rc::ARGUMENT_VERSION_MISMATCH);
        }
        let count = request.numMetrics as usize;
        if count > request.metrics.len() {
            return Err(rc::INVALID_ARGUMENT);
        }
        let answers = driver::with(|s, rt| {
            let first = *rt.gpm_sample(addr(request.sample1))?;
            let second = *rt.gpm_sample(addr(request.sample2))?;
            let (GpmSample::Taken { gpu, gi, t: t1 }, GpmSample::Taken { gpu: gpu2, gi: gi2, t: t2 }) =
                (first, second)
            else {
                return Err(rc::INVALID_ARGUMENT);
            };
            if gpu != gpu2 || gi != gi2 || t2 < t1 {
                return Err(rc::INVALID_ARGUMENT);
            }
            if rt.faults[gpu].lost {
                return Err(rc::GPU_IS_LOST);
            }
            let probe = crate::telemetry::Probe { t: t2, ..s.probe(gpu) };
            let links = rt.links_up(&s.node, gpu);
            Ok(request.metrics[..count]
                .iter()
                .map(|m| gpm::metric(&probe, gi, &links, m.metricId))
                .collect::<Vec<_>>())
        })?;
        for (slot, answer) in request.metrics.iter_mut().zip(answers) {
            let (short, long, unit) = gpm::describe(slot.metricId);
            slot.metricInfo = nvmlGpmMetric_t__bindgen_ty_1 {
                shortName: short.as_ptr().cast_mut(),
                longName: long.as_ptr().cast_mut(),
                unit: unit.as_ptr().cast_mut(),
            };
            match answer {
                Ok(value) => {
                    slot.value = value;
                    slot.nvmlReturn = rc::SUCCESS;
                }
                Err(code) => {
                    slot.value = 0.0;
                    slot.nvmlReturn = code;
                }
            }
        }
        put!(metrics_get, request);
        Ok(())
    }
}
