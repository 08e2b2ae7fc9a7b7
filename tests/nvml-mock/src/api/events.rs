//! Event sets: create, register GPUs, wait (really blocking, fed by the control file), free.

use std::os::raw::{c_uint, c_ulonglong};

use super::{addr, handle};
use crate::driver::{self, Session};
use crate::ffi::{export, put, rc, require};
use crate::registry::Obj;
use nvml_wrapper_sys::bindings::*;

/// Event types a GPU can deliver: ECC events only with ECC enabled.
fn supported(s: &Session, gpu: usize) -> u64 {
    let ecc = if s.node.gpus[gpu].ecc_enabled {
        (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError) as u64
    } else {
        0
    };
    ecc | (nvmlEventTypePState | nvmlEventTypeXidCriticalError | nvmlEventTypeClock) as u64
}

export! {
    /// Creates an empty event set.
    fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) {
        require!(set);
        let h = driver::with(|_, rt| Ok(rt.create_event_set()))?;
        put!(set, handle(h));
        Ok(())
    }
}

export! {
    /// Adds event types of one GPU to a set; types the GPU cannot deliver are refused with
    /// `NVML_ERROR_NOT_SUPPORTED`, MIG device handles too (register the parent).
    fn nvmlDeviceRegisterEvents(device: nvmlDevice_t, event_types: c_ulonglong, set: nvmlEventSet_t) {
        driver::with(|s, rt| {
            let gpu = rt.gpu(&s.node, addr(device))?;
            let target = rt.event_set(addr(set))?;
            if event_types & !supported(s, gpu) != 0 {
                return Err(rc::NOT_SUPPORTED);
            }
            target.register(gpu, event_types);
            Ok(())
        })
    }
}

export! {
    /// Bitmask of the event types a GPU supports.
    fn nvmlDeviceGetSupportedEventTypes(device: nvmlDevice_t, event_types: *mut c_ulonglong) {
        let mask = driver::with(|s, rt| Ok(supported(s, rt.gpu(&s.node, addr(device))?)))?;
        put!(event_types, mask);
        Ok(())
    }
}

export! {
    /// Waits up to `timeoutms` for the next event; `NVML_ERROR_TIMEOUT` when none arrives.
    /// `device` is the GPU's handle; instance ids are the MIG instance the fault was
    /// attributed to, or `0xFFFFFFFF`.
    fn nvmlEventSetWait_v2(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeoutms: c_uint) {
        require!(data);
        let target = driver::with(|_, rt| rt.event_set(addr(set)))?;
        let event = target.wait(timeoutms)?;
        let device = driver::with(|_, rt| Ok(rt.registry.handle(Obj::Gpu(event.gpu))))?;
        put!(data, nvmlEventData_t {
            device: handle(device),
            eventType: event.event_type,
            eventData: event.data,
            gpuInstanceId: event.gpu_instance,
            computeInstanceId: event.compute_instance,
        });
        Ok(())
    }
}

export! {
    /// Frees a set; a thread blocked on it returns `NVML_ERROR_UNINITIALIZED`.
    fn nvmlEventSetFree(set: nvmlEventSet_t) {
        driver::with(|_, rt| rt.free_event_set(addr(set)))
    }
}
