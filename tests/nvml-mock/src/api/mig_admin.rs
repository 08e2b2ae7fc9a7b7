//! MIG, write side: changing the MIG mode and creating/destroying GPU and compute instances.
//! Every change is written to the state file (when one is configured) before returning.

use std::os::raw::c_uint;

use super::{addr, handle};
use crate::driver::{self, Runtime, Session};
use crate::ffi::{Res, export, get, put, rc, require};
use crate::profiles::MigTable;
use crate::registry::Obj;
use nvml_wrapper_sys::bindings::*;

/// An injected `mig-fail` for `op` on `gpu`: `NVML_ERROR_UNKNOWN`, or the caller SIGKILLed
/// before the change (a crash at exactly this step).
fn injected(rt: &Runtime, gpu: usize, op: &str) -> Res<()> {
    match rt.faults[gpu].mig_fail.get(op) {
        None => Ok(()),
        Some(false) => Err(rc::UNKNOWN),
        Some(true) => {
            let _ = std::process::Command::new("kill")
                .args(["-9", &std::process::id().to_string()])
                .status();
            // Not reached once the signal lands; fail the call if `kill` could not run.
            Err(rc::UNKNOWN)
        }
    }
}

/// Resolves a MIG-capable GPU and refreshes its MIG state before a change.
fn mig_gpu(s: &Session, rt: &mut Runtime, device: nvmlDevice_t) -> Res<(usize, &'static MigTable)> {
    let gpu = rt.gpu(&s.node, addr(device))?;
    let table = s.node.gpus[gpu].model.mig.ok_or(rc::NOT_SUPPORTED)?;
    rt.sync_state(&s.node);
    Ok((gpu, table))
}

export! {
    /// Requests a MIG mode. It takes effect at once (`activationStatus` = success) unless
    /// `NVML_MOCK_MIG_RESET_REQUIRED=1`, in which case it stays pending
    /// (`NVML_ERROR_RESET_REQUIRED`: a reboot applies it) until a `reset <gpu>` control line,
    /// or `NVML_MOCK_MIG_IN_USE=1`, which answers `NVML_ERROR_IN_USE` (a GPU reset applies it)
    /// the same way. Disabling while GPU instances exist is refused with `NVML_ERROR_IN_USE`.
    fn nvmlDeviceSetMigMode(device: nvmlDevice_t, mode: c_uint, activation_status: *mut nvmlReturn_t) {
        require!(activation_status);
        let status = driver::with(|s, rt| {
            let (gpu, _) = mig_gpu(s, rt, device)?;
            injected(rt, gpu, "set-mode")?;
            if mode != NVML_DEVICE_MIG_ENABLE && mode != NVML_DEVICE_MIG_DISABLE {
                return Err(rc::INVALID_ARGUMENT);
            }
            let mig = &mut rt.mig[gpu];
            if mode == NVML_DEVICE_MIG_DISABLE && !mig.gpu_instances.is_empty() {
                return Err(rc::IN_USE);
            }
            mig.pending = mode;
            let status = if mig.current == mode {
                rc::SUCCESS
            } else if s.config.mig_reset_required {
                rc::RESET_REQUIRED
            } else if s.config.mig_in_use {
                rc::IN_USE
            } else {
                mig.current = mode;
                mig.gpu_instances.clear();
                rc::SUCCESS
            };
            rt.persist(&s.node);
            Ok(status)
        })?;
        put!(activation_status, status);
        Ok(())
    }
}

/// Creates a GI and returns its handle.
fn create_gi(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: Option<nvmlGpuInstancePlacement_t>,
) -> Res<usize> {
    driver::with(|s, rt| {
        let (gpu, table) = mig_gpu(s, rt, device)?;
        injected(rt, gpu, "create-gi")?;
        if let Some(p) = placement {
            let profile = table.by_id(profile_id).ok_or(rc::INVALID_ARGUMENT)?;
            if p.size != profile.memory_slices {
                return Err(rc::INVALID_ARGUMENT);
            }
        }
        let gi = rt.mig[gpu].create_gi(table, profile_id, placement.map(|p| p.start))?;
        rt.persist(&s.node);
        Ok(rt.registry.handle(Obj::GpuInstance { gpu, gi }))
    })
}

export! {
    /// Creates a GI where the driver would put it (the highest free placement).
    fn nvmlDeviceCreateGpuInstance(device: nvmlDevice_t, profile_id: c_uint, gpu_instance: *mut nvmlGpuInstance_t) {
        require!(gpu_instance);
        let h = create_gi(device, profile_id, None)?;
        put!(gpu_instance, handle(h));
        Ok(())
    }
}

export! {
    /// Creates a GI at an explicit placement.
    fn nvmlDeviceCreateGpuInstanceWithPlacement(
        device: nvmlDevice_t,
        profile_id: c_uint,
        placement: *const nvmlGpuInstancePlacement_t,
        gpu_instance: *mut nvmlGpuInstance_t,
    ) {
        require!(gpu_instance);
        let p = get!(placement);
        let h = create_gi(device, profile_id, Some(p))?;
        put!(gpu_instance, handle(h));
        Ok(())
    }
}

export! {
    /// Destroys a GI (`NVML_ERROR_IN_USE` while it has compute instances).
    fn nvmlGpuInstanceDestroy(gpu_instance: nvmlGpuInstance_t) {
        driver::with(|s, rt| {
            let (gpu, gi) = rt.gpu_instance(&s.node, addr(gpu_instance))?;
            injected(rt, gpu, "destroy-gi")?;
            rt.mig[gpu].destroy_gi(gi)?;
            rt.persist(&s.node);
            Ok(())
        })
    }
}

/// Creates a CI (yielding a new MIG device) and returns its handle.
fn create_ci(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    placement: Option<nvmlComputeInstancePlacement_t>,
) -> Res<usize> {
    driver::with(|s, rt| {
        let (gpu, gi) = rt.gpu_instance(&s.node, addr(gpu_instance))?;
        injected(rt, gpu, "create-ci")?;
        let table = s.node.gpus[gpu].model.mig.ok_or(rc::NOT_SUPPORTED)?;
        if let Some(p) = placement {
            let g = rt.mig[gpu].gi(gi).ok_or(rc::INVALID_ARGUMENT)?;
            let gi_profile = table.by_id(g.profile_id).ok_or(rc::UNKNOWN)?;
            if p.size != crate::mig::ci_profile_in(table, gi_profile, profile_id)?.slices {
                return Err(rc::INVALID_ARGUMENT);
            }
        }
        let ci = rt.mig[gpu].create_ci(table, gi, profile_id, placement.map(|p| p.start))?;
        rt.persist(&s.node);
        Ok(rt.registry.handle(Obj::ComputeInstance { gpu, gi, ci }))
    })
}

export! {
    /// Creates a CI in the lowest free placement of a GI.
    fn nvmlGpuInstanceCreateComputeInstance(
        gpu_instance: nvmlGpuInstance_t,
        profile_id: c_uint,
        compute_instance: *mut nvmlComputeInstance_t,
    ) {
        require!(compute_instance);
        let h = create_ci(gpu_instance, profile_id, None)?;
        put!(compute_instance, handle(h));
        Ok(())
    }
}

export! {
    /// Creates a CI at an explicit placement (in compute slices of the GI).
    fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        gpu_instance: nvmlGpuInstance_t,
        profile_id: c_uint,
        placement: *const nvmlComputeInstancePlacement_t,
        compute_instance: *mut nvmlComputeInstance_t,
    ) {
        require!(compute_instance);
        let p = get!(placement);
        let h = create_ci(gpu_instance, profile_id, Some(p))?;
        put!(compute_instance, handle(h));
        Ok(())
    }
}

export! {
    /// Destroys a CI and with it its MIG device.
    fn nvmlComputeInstanceDestroy(compute_instance: nvmlComputeInstance_t) {
        driver::with(|s, rt| {
            let (gpu, gi, ci) = rt.compute_instance(&s.node, addr(compute_instance))?;
            injected(rt, gpu, "destroy-ci")?;
            rt.mig[gpu].destroy_ci(gi, ci)?;
            rt.persist(&s.node);
            Ok(())
        })
    }
}
