//! Health queries: ECC mode and counters, retired pages, remapped rows, temperature and its
//! thresholds, NVLink error counters. Counters start at zero and move only through fault
//! injection.

use std::os::raw::{c_uint, c_ulonglong};

use super::addr;
use super::topology::link_of;
use crate::driver::{self, Runtime, Session};
use crate::faults::Faults;
use crate::ffi::{Res, export, get, put, put_slice, rc, require};
use nvml_wrapper_sys::bindings as b;
use nvml_wrapper_sys::bindings::*;

/// Resolves a GPU whose ECC is enabled and returns a copy of its fault state.
fn ecc_faults(s: &Session, rt: &mut Runtime, device: nvmlDevice_t) -> Res<Faults> {
    let gpu = rt.gpu(&s.node, addr(device))?;
    if !s.node.gpus[gpu].ecc_enabled {
        return Err(rc::NOT_SUPPORTED);
    }
    Ok(rt.faults[gpu].clone())
}

/// The counter for an error/counter type pair (SBE = corrected, DBE = uncorrected).
fn ecc_count(
    f: &Faults,
    error_type: nvmlMemoryErrorType_t,
    counter_type: nvmlEccCounterType_t,
) -> Res<u64> {
    match (error_type, counter_type) {
        (
            b::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED,
            b::nvmlEccCounterType_enum_NVML_VOLATILE_ECC,
        ) => Ok(f.sbe_volatile),
        (
            b::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED,
            b::nvmlEccCounterType_enum_NVML_AGGREGATE_ECC,
        ) => Ok(f.sbe_aggregate),
        (
            b::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            b::nvmlEccCounterType_enum_NVML_VOLATILE_ECC,
        ) => Ok(f.dbe_volatile),
        (
            b::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            b::nvmlEccCounterType_enum_NVML_AGGREGATE_ECC,
        ) => Ok(f.dbe_aggregate),
        _ => Err(rc::INVALID_ARGUMENT),
    }
}

export! {
    /// Total ECC errors of a type.
    fn nvmlDeviceGetTotalEccErrors(
        device: nvmlDevice_t,
        error_type: nvmlMemoryErrorType_t,
        counter_type: nvmlEccCounterType_t,
        ecc_counts: *mut c_ulonglong,
    ) {
        let n = driver::with(|s, rt| ecc_count(&ecc_faults(s, rt, device)?, error_type, counter_type))?;
        put!(ecc_counts, n);
        Ok(())
    }
}

export! {
    /// ECC errors at one memory location; injected errors are all in device memory (DRAM).
    fn nvmlDeviceGetMemoryErrorCounter(
        device: nvmlDevice_t,
        error_type: nvmlMemoryErrorType_t,
        counter_type: nvmlEccCounterType_t,
        location_type: nvmlMemoryLocation_t,
        count: *mut c_ulonglong,
    ) {
        let n = driver::with(|s, rt| {
            let total = ecc_count(&ecc_faults(s, rt, device)?, error_type, counter_type)?;
            match location_type {
                b::nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_DEVICE_MEMORY => Ok(total),
                l if l < b::nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_COUNT => Ok(0),
                _ => Err(rc::INVALID_ARGUMENT),
            }
        })?;
        put!(count, n);
        Ok(())
    }
}

export! {
    /// Current and pending ECC mode.
    fn nvmlDeviceGetEccMode(device: nvmlDevice_t, current: *mut nvmlEnableState_t, pending: *mut nvmlEnableState_t) {
        require!(current, pending);
        let (on, after_reboot) = driver::with(|s, rt| {
            let gpu = rt.gpu(&s.node, addr(device))?;
            let g = &s.node.gpus[gpu];
            if !g.model.ecc {
                return Err(rc::NOT_SUPPORTED);
            }
            Ok((g.ecc_enabled, rt.faults[gpu].ecc_pending.unwrap_or(g.ecc_enabled)))
        })?;
        let state = |on| if on { b::nvmlEnableState_enum_NVML_FEATURE_ENABLED } else { b::nvmlEnableState_enum_NVML_FEATURE_DISABLED };
        put!(current, state(on));
        put!(pending, state(after_reboot));
        Ok(())
    }
}

/// Retired pages of one cause as `(address, timestamp)` pairs.
fn retired(device: nvmlDevice_t, cause: nvmlPageRetirementCause_t) -> Res<Vec<(u64, u64)>> {
    if cause >= b::nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_COUNT {
        return Err(rc::INVALID_ARGUMENT);
    }
    driver::with(|s, rt| {
        let f = ecc_faults(s, rt, device)?;
        Ok(f.retired_pages
            .iter()
            .filter(|p| p.cause == cause)
            .map(|p| (p.address, p.timestamp_us))
            .collect())
    })
}

export! {
    /// Retired page addresses (count protocol: too small a `pageCount` sets it and fails
    /// with `NVML_ERROR_INSUFFICIENT_SIZE`).
    fn nvmlDeviceGetRetiredPages(
        device: nvmlDevice_t,
        cause: nvmlPageRetirementCause_t,
        page_count: *mut c_uint,
        addresses: *mut c_ulonglong,
    ) {
        let pages = retired(device, cause)?;
        let addrs: Vec<u64> = pages.iter().map(|p| p.0).collect();
        crate::ffi::put_counted!(page_count, addresses, addrs.as_slice());
        Ok(())
    }
}

export! {
    /// Retired page addresses and retirement timestamps (µs since the epoch).
    fn nvmlDeviceGetRetiredPages_v2(
        device: nvmlDevice_t,
        cause: nvmlPageRetirementCause_t,
        page_count: *mut c_uint,
        addresses: *mut c_ulonglong,
        timestamps: *mut c_ulonglong,
    ) {
        let pages = retired(device, cause)?;
        let capacity = get!(page_count) as usize;
        if capacity < pages.len() {
            put!(page_count, pages.len() as c_uint);
            return Err(rc::INSUFFICIENT_SIZE);
        }
        if !pages.is_empty() {
            require!(addresses, timestamps);
            let addrs: Vec<u64> = pages.iter().map(|p| p.0).collect();
            let times: Vec<u64> = pages.iter().map(|p| p.1).collect();
            put_slice!(addresses, addrs.as_slice());
            put_slice!(timestamps, times.as_slice());
        }
        put!(page_count, pages.len() as c_uint);
        Ok(())
    }
}

export! {
    /// Whether a page retirement awaits the next reset.
    fn nvmlDeviceGetRetiredPagesPendingStatus(device: nvmlDevice_t, is_pending: *mut nvmlEnableState_t) {
        let pending = driver::with(|s, rt| Ok(ecc_faults(s, rt, device)?.pages_pending))?;
        put!(is_pending, if pending { b::nvmlEnableState_enum_NVML_FEATURE_ENABLED } else { b::nvmlEnableState_enum_NVML_FEATURE_DISABLED });
        Ok(())
    }
}

export! {
    /// Row-remapping state: remapped rows by cause, pending remap, remap failure.
    fn nvmlDeviceGetRemappedRows(
        device: nvmlDevice_t,
        corr_rows: *mut c_uint,
        unc_rows: *mut c_uint,
        is_pending: *mut c_uint,
        failure_occurred: *mut c_uint,
    ) {
        require!(corr_rows, unc_rows, is_pending, failure_occurred);
        let f = driver::with(|s, rt| ecc_faults(s, rt, device))?;
        put!(corr_rows, f.remapped_correctable);
        put!(unc_rows, f.remapped_uncorrectable);
        put!(is_pending, f.remap_pending as c_uint);
        put!(failure_occurred, f.remap_failure as c_uint);
        Ok(())
    }
}

/// The GPU temperature now: the `temp` override when set, the simulation otherwise.
pub(crate) fn temperature_of(s: &Session, rt: &Runtime, gpu: usize) -> u32 {
    rt.faults[gpu]
        .temperature_override
        .unwrap_or_else(|| s.probe(gpu).temperature())
}

export! {
    /// Core temperature, °C.
    fn nvmlDeviceGetTemperature(device: nvmlDevice_t, sensor_type: nvmlTemperatureSensors_t, temp: *mut c_uint) {
        let t = driver::with(|s, rt| {
            let gpu = rt.gpu(&s.node, addr(device))?;
            if sensor_type != b::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
                return Err(rc::INVALID_ARGUMENT);
            }
            Ok(temperature_of(s, rt, gpu))
        })?;
        put!(temp, t);
        Ok(())
    }
}

export! {
    /// Temperature thresholds, °C.
    fn nvmlDeviceGetTemperatureThreshold(
        device: nvmlDevice_t,
        threshold_type: nvmlTemperatureThresholds_t,
        temp: *mut c_uint,
    ) {
        let t = driver::with(|s, rt| {
            let th = s.node.gpus[rt.gpu(&s.node, addr(device))?].model.temperature;
            match threshold_type {
                b::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => Ok(th.shutdown),
                b::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => Ok(th.slowdown),
                b::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_GPU_MAX => Ok(th.gpu_max),
                b::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_MEM_MAX => {
                    th.memory_max.ok_or(rc::NOT_SUPPORTED)
                }
                t if t < b::nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_COUNT => Err(rc::NOT_SUPPORTED),
                _ => Err(rc::INVALID_ARGUMENT),
            }
        })?;
        put!(temp, t);
        Ok(())
    }
}

export! {
    /// NVLink error counters (replay, recovery, CRC, ECC); always zero.
    fn nvmlDeviceGetNvLinkErrorCounter(
        device: nvmlDevice_t,
        link: c_uint,
        counter: nvmlNvLinkErrorCounter_t,
        counter_value: *mut c_ulonglong,
    ) {
        driver::with(|s, rt| link_of(s, rt, device, link))?;
        if counter >= b::nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_COUNT {
            return Err(rc::INVALID_ARGUMENT);
        }
        put!(counter_value, 0);
        Ok(())
    }
}
