//! MIG, read side: mode, MIG device handles and their identity, GPU/compute instance
//! profiles, placements, capacities and instance enumeration.

use std::os::raw::c_uint;

use super::{addr, handle, mig_device};
use crate::driver::{self, Dev, Runtime, Session};
use crate::ffi::{Res, export, get_version, put, put_counted, rc, require, struct_version};
use crate::mig::ci_profile_in;
use crate::profiles::{self, GI_PROFILE_ENUM_COUNT, GiProfile, MAX_MIG_DEVICES, MigTable};
use crate::registry::Obj;
use nvml_wrapper_sys::bindings::*;

/// The MIG table of a physical GPU; `NOT_SUPPORTED` when it is not MIG capable.
fn table_of(s: &Session, gpu: usize) -> Res<&'static MigTable> {
    s.node.gpus[gpu].model.mig.ok_or(rc::NOT_SUPPORTED)
}

/// Resolves a GPU handle that must be MIG capable, refreshing MIG state from the state file.
fn mig_gpu(s: &Session, rt: &mut Runtime, device: nvmlDevice_t) -> Res<(usize, &'static MigTable)> {
    let gpu = rt.gpu(&s.node, addr(device))?;
    let table = table_of(s, gpu)?;
    rt.sync_state(&s.node);
    Ok((gpu, table))
}

export! {
    /// Current and pending MIG mode.
    fn nvmlDeviceGetMigMode(device: nvmlDevice_t, current_mode: *mut c_uint, pending_mode: *mut c_uint) {
        require!(current_mode, pending_mode);
        let (current, pending) = driver::with(|s, rt| {
            let (gpu, _) = mig_gpu(s, rt, device)?;
            Ok((rt.mig[gpu].current, rt.mig[gpu].pending))
        })?;
        put!(current_mode, current);
        put!(pending_mode, pending);
        Ok(())
    }
}

export! {
    /// Upper bound of MIG device indices: 7 on MIG-capable GPUs, 0 otherwise.
    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) {
        let n = driver::with(|s, rt| {
            let gpu = rt.gpu(&s.node, addr(device))?;
            Ok(if s.node.gpus[gpu].mig_capable() { MAX_MIG_DEVICES } else { 0 })
        })?;
        put!(count, n);
        Ok(())
    }
}

export! {
    /// The `index`th MIG device (ordered by GI id, then CI id); `NOT_FOUND` past the last.
    fn nvmlDeviceGetMigDeviceHandleByIndex(device: nvmlDevice_t, index: c_uint, mig_device_out: *mut nvmlDevice_t) {
        require!(mig_device_out);
        let h = driver::with(|s, rt| {
            let (gpu, _) = mig_gpu(s, rt, device)?;
            if index >= MAX_MIG_DEVICES {
                return Err(rc::INVALID_ARGUMENT);
            }
            let (gi, ci) = *rt.mig[gpu].mig_devices().get(index as usize).ok_or(rc::NOT_FOUND)?;
            Ok(rt.registry.handle(Obj::Mig { gpu, gi, ci }))
        })?;
        put!(mig_device_out, handle(h));
        Ok(())
    }
}

export! {
    /// The physical GPU of a MIG device.
    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_device_in: nvmlDevice_t, device: *mut nvmlDevice_t) {
        let h = driver::with(|s, rt| match rt.device(&s.node, addr(mig_device_in))? {
            Dev::Mig { gpu, .. } => Ok(rt.registry.handle(Obj::Gpu(gpu))),
            Dev::Gpu(_) => Err(rc::INVALID_ARGUMENT),
        })?;
        put!(device, handle(h));
        Ok(())
    }
}

export! {
    /// Whether a handle is a MIG device.
    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig_device: *mut c_uint) {
        let is_mig = driver::with(|s, rt| Ok(matches!(rt.device(&s.node, addr(device))?, Dev::Mig { .. })))?;
        put!(is_mig_device, is_mig as c_uint);
        Ok(())
    }
}

export! {
    /// GPU instance id of a MIG device.
    fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        let gi = driver::with(|s, rt| match rt.device(&s.node, addr(device))? {
            Dev::Mig { gi, .. } => Ok(gi),
            Dev::Gpu(_) => Err(rc::NOT_SUPPORTED),
        })?;
        put!(id, gi);
        Ok(())
    }
}

export! {
    /// Compute instance id of a MIG device.
    fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        let ci = driver::with(|s, rt| match rt.device(&s.node, addr(device))? {
            Dev::Mig { ci, .. } => Ok(ci),
            Dev::Gpu(_) => Err(rc::NOT_SUPPORTED),
        })?;
        put!(id, ci);
        Ok(())
    }
}

export! {
    /// Engine and slice counts of a MIG device (MIG handles only, as in NVML).
    fn nvmlDeviceGetAttributes_v2(device: nvmlDevice_t, attributes: *mut nvmlDeviceAttributes_t) {
        let a = driver::with(|s, rt| match rt.device(&s.node, addr(device))? {
            Dev::Mig { gpu, gi, ci } => {
                let m = mig_device(s, rt, gpu, gi, ci)?;
                Ok(nvmlDeviceAttributes_t {
                    multiprocessorCount: m.ci.sm,
                    sharedCopyEngineCount: m.gi.copy_engines,
                    sharedDecoderCount: m.gi.decoders,
                    sharedEncoderCount: m.gi.encoders,
                    sharedJpegCount: m.gi.jpegs,
                    sharedOfaCount: m.gi.ofas,
                    gpuInstanceSliceCount: m.gi.slices,
                    computeInstanceSliceCount: m.ci.slices,
                    memorySizeMB: m.gi.memory_mib,
                })
            }
            Dev::Gpu(_) => Err(rc::NOT_SUPPORTED),
        })?;
        put!(attributes, a);
        Ok(())
    }
}

/// The GI profile for an `NVML_GPU_INSTANCE_PROFILE_*` value: out-of-range values are invalid,
/// values this GPU lacks are not supported (go-nvlib skips both while probing).
fn gi_profile_by_index(
    s: &Session,
    rt: &mut Runtime,
    device: nvmlDevice_t,
    profile: c_uint,
) -> Res<GiProfile> {
    let (_, table) = mig_gpu(s, rt, device)?;
    if profile >= GI_PROFILE_ENUM_COUNT {
        return Err(rc::INVALID_ARGUMENT);
    }
    table.by_index(profile).copied().ok_or(rc::NOT_SUPPORTED)
}

fn gi_info(p: &GiProfile) -> nvmlGpuInstanceProfileInfo_t {
    nvmlGpuInstanceProfileInfo_t {
        id: p.id,
        isP2pSupported: 0,
        sliceCount: p.slices,
        instanceCount: p.instances,
        multiprocessorCount: p.sm,
        copyEngineCount: p.copy_engines,
        decoderCount: p.decoders,
        encoderCount: p.encoders,
        jpegCount: p.jpegs,
        ofaCount: p.ofas,
        memorySizeMB: p.memory_mib,
    }
}

/// `name` field of the versioned profile structs: `MIG 1g.10gb`.
fn c_name(name: &str) -> [std::os::raw::c_char; 96] {
    let mut out = [0; 96];
    crate::ffi::fill_char_array(&mut out, &format!("MIG {name}"));
    out
}

export! {
    /// GPU instance profile info, unversioned layout (what nvml-wrapper calls).
    fn nvmlDeviceGetGpuInstanceProfileInfo(device: nvmlDevice_t, profile: c_uint, info: *mut nvmlGpuInstanceProfileInfo_t) {
        let p = driver::with(|s, rt| gi_profile_by_index(s, rt, device, profile))?;
        put!(info, gi_info(&p));
        Ok(())
    }
}

export! {
    /// GPU instance profile info, versioned layout with the profile name (what pynvml calls);
    /// accepts `nvmlGpuInstanceProfileInfo_v2` and `_v3`.
    fn nvmlDeviceGetGpuInstanceProfileInfoV(device: nvmlDevice_t, profile: c_uint, info: *mut nvmlGpuInstanceProfileInfo_v2_t) {
        let version = get_version!(info);
        let p = driver::with(|s, rt| gi_profile_by_index(s, rt, device, profile))?;
        let i = gi_info(&p);
        if version == struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2) {
            put!(info, nvmlGpuInstanceProfileInfo_v2_t {
                version,
                id: i.id,
                isP2pSupported: i.isP2pSupported,
                sliceCount: i.sliceCount,
                instanceCount: i.instanceCount,
                multiprocessorCount: i.multiprocessorCount,
                copyEngineCount: i.copyEngineCount,
                decoderCount: i.decoderCount,
                encoderCount: i.encoderCount,
                jpegCount: i.jpegCount,
                ofaCount: i.ofaCount,
                memorySizeMB: i.memorySizeMB,
                name: c_name(p.name),
            });
        } else if version == struct_version::<nvmlGpuInstanceProfileInfo_v3_t>(3) {
            put!(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(), nvmlGpuInstanceProfileInfo_v3_t {
                version,
                id: i.id,
                sliceCount: i.sliceCount,
                instanceCount: i.instanceCount,
                multiprocessorCount: i.multiprocessorCount,
                copyEngineCount: i.copyEngineCount,
                decoderCount: i.decoderCount,
                encoderCount: i.encoderCount,
                jpegCount: i.jpegCount,
                ofaCount: i.ofaCount,
                memorySizeMB: i.memorySizeMB,
                name: c_name(p.name),
                capabilities: 0,
            });
        } else {
            return Err(rc::ARGUMENT_VERSION_MISMATCH);
        }
        Ok(())
    }
}

export! {
    /// Every placement a GI profile can take, whatever is already created; with a NULL array
    /// only the count is returned.
    fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        device: nvmlDevice_t,
        profile_id: c_uint,
        placements: *mut nvmlGpuInstancePlacement_t,
        count: *mut c_uint,
    ) {
        require!(count);
        let all: Vec<nvmlGpuInstancePlacement_t> = driver::with(|s, rt| {
            let (_, table) = mig_gpu(s, rt, device)?;
            let p = table.by_id(profile_id).ok_or(rc::INVALID_ARGUMENT)?;
            Ok(p.starts.iter().map(|&start| nvmlGpuInstancePlacement_t { start, size: p.memory_slices }).collect())
        })?;
        if placements.is_null() {
            put!(count, all.len() as c_uint);
            return Ok(());
        }
        put_counted!(count, placements, all.as_slice());
        Ok(())
    }
}

export! {
    /// How many more GIs of a profile can be created now.
    fn nvmlDeviceGetGpuInstanceRemainingCapacity(device: nvmlDevice_t, profile_id: c_uint, count: *mut c_uint) {
        let n = driver::with(|s, rt| {
            let (gpu, table) = mig_gpu(s, rt, device)?;
            rt.mig[gpu].remaining_gi(table, profile_id)
        })?;
        put!(count, n);
        Ok(())
    }
}

export! {
    /// The GIs of one profile. The array must hold the profile's `instanceCount` handles, as
    /// the NVML header requires; `count` is output only.
    fn nvmlDeviceGetGpuInstances(
        device: nvmlDevice_t,
        profile_id: c_uint,
        gpu_instances: *mut nvmlGpuInstance_t,
        count: *mut c_uint,
    ) {
        require!(gpu_instances, count);
        let handles: Vec<nvmlGpuInstance_t> = driver::with(|s, rt| {
            let (gpu, table) = mig_gpu(s, rt, device)?;
            table.by_id(profile_id).ok_or(rc::INVALID_ARGUMENT)?;
            if !rt.mig[gpu].enabled() {
                return Err(rc::NOT_SUPPORTED);
            }
            let ids: Vec<u32> = rt.mig[gpu].gpu_instances.iter().filter(|g| g.profile_id == profile_id).map(|g| g.id).collect();
            Ok(ids.into_iter().map(|gi| handle(rt.registry.handle(Obj::GpuInstance { gpu, gi }))).collect())
        })?;
        crate::ffi::put_slice!(gpu_instances, handles.as_slice());
        put!(count, handles.len() as c_uint);
        Ok(())
    }
}

export! {
    /// A GI by id.
    fn nvmlDeviceGetGpuInstanceById(device: nvmlDevice_t, id: c_uint, gpu_instance: *mut nvmlGpuInstance_t) {
        require!(gpu_instance);
        let h = driver::with(|s, rt| {
            let (gpu, _) = mig_gpu(s, rt, device)?;
            if !rt.mig[gpu].enabled() {
                return Err(rc::NOT_SUPPORTED);
            }
            rt.mig[gpu].gi(id).ok_or(rc::NOT_FOUND)?;
            Ok(rt.registry.handle(Obj::GpuInstance { gpu, gi: id }))
        })?;
        put!(gpu_instance, handle(h));
        Ok(())
    }
}

export! {
    /// Parent device, id, profile id and placement of a GI.
    fn nvmlGpuInstanceGetInfo(gpu_instance: nvmlGpuInstance_t, info: *mut nvmlGpuInstanceInfo_t) {
        let i = driver::with(|s, rt| {
            let (gpu, gi) = rt.gpu_instance(&s.node, addr(gpu_instance))?;
            let g = rt.mig[gpu].gi(gi).ok_or(rc::INVALID_ARGUMENT)?.clone();
            Ok(nvmlGpuInstanceInfo_t {
                device: handle(rt.registry.handle(Obj::Gpu(gpu))),
                id: g.id,
                profileId: g.profile_id,
                placement: nvmlGpuInstancePlacement_t { start: g.placement.start, size: g.placement.size },
            })
        })?;
        put!(info, i);
        Ok(())
    }
}

/// The CI profile `profile` inside the GI behind a handle, with the GI's profile.
fn ci_profile_of(
    s: &Session,
    rt: &mut Runtime,
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
) -> Res<(GiProfile, profiles::CiProfile)> {
    let (gpu, gi) = rt.gpu_instance(&s.node, addr(gpu_instance))?;
    let table = table_of(s, gpu)?;
    if eng_profile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT {
        return Err(rc::INVALID_ARGUMENT);
    }
    let gi_state = rt.mig[gpu].gi(gi).ok_or(rc::INVALID_ARGUMENT)?;
    let gi_profile = *table.by_id(gi_state.profile_id).ok_or(rc::UNKNOWN)?;
    let ci = ci_profile_in(table, &gi_profile, profile)?;
    Ok((gi_profile, ci))
}

fn ci_info(gi: &GiProfile, ci: &profiles::CiProfile) -> nvmlComputeInstanceProfileInfo_t {
    nvmlComputeInstanceProfileInfo_t {
        id: ci.id,
        sliceCount: ci.slices,
        instanceCount: ci.instances,
        multiprocessorCount: ci.sm,
        sharedCopyEngineCount: gi.copy_engines,
        sharedDecoderCount: gi.decoders,
        sharedEncoderCount: gi.encoders,
        sharedJpegCount: gi.jpegs,
        sharedOfaCount: gi.ofas,
    }
}

export! {
    /// Compute instance profile info inside a GI, unversioned layout.
    fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gpu_instance: nvmlGpuInstance_t,
        profile: c_uint,
        eng_profile: c_uint,
        info: *mut nvmlComputeInstanceProfileInfo_t,
    ) {
        let (gi, ci) = driver::with(|s, rt| ci_profile_of(s, rt, gpu_instance, profile, eng_profile))?;
        put!(info, ci_info(&gi, &ci));
        Ok(())
    }
}

export! {
    /// Compute instance profile info, versioned layout with the name (`MIG 1c.3g.40gb`);
    /// accepts `nvmlComputeInstanceProfileInfo_v2` and `_v3`.
    fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        gpu_instance: nvmlGpuInstance_t,
        profile: c_uint,
        eng_profile: c_uint,
        info: *mut nvmlComputeInstanceProfileInfo_v2_t,
    ) {
        let version = get_version!(info);
        let (gi, ci) = driver::with(|s, rt| ci_profile_of(s, rt, gpu_instance, profile, eng_profile))?;
        let i = ci_info(&gi, &ci);
        if version == struct_version::<nvmlComputeInstanceProfileInfo_v2_t>(2) {
            put!(info, nvmlComputeInstanceProfileInfo_v2_t {
                version,
                id: i.id,
                sliceCount: i.sliceCount,
                instanceCount: i.instanceCount,
                multiprocessorCount: i.multiprocessorCount,
                sharedCopyEngineCount: i.sharedCopyEngineCount,
                sharedDecoderCount: i.sharedDecoderCount,
                sharedEncoderCount: i.sharedEncoderCount,
                sharedJpegCount: i.sharedJpegCount,
                sharedOfaCount: i.sharedOfaCount,
                name: c_name(&ci.name),
            });
        } else if version == struct_version::<nvmlComputeInstanceProfileInfo_v3_t>(3) {
            put!(info.cast::<nvmlComputeInstanceProfileInfo_v3_t>(), nvmlComputeInstanceProfileInfo_v3_t {
                version,
                id: i.id,
                sliceCount: i.sliceCount,
                instanceCount: i.instanceCount,
                multiprocessorCount: i.multiprocessorCount,
                sharedCopyEngineCount: i.sharedCopyEngineCount,
                sharedDecoderCount: i.sharedDecoderCount,
                sharedEncoderCount: i.sharedEncoderCount,
                sharedJpegCount: i.sharedJpegCount,
                sharedOfaCount: i.sharedOfaCount,
                name: c_name(&ci.name),
                capabilities: 0,
            });
        } else {
            return Err(rc::ARGUMENT_VERSION_MISMATCH);
        }
        Ok(())
    }
}

export! {
    /// The CIs of one profile in a GI. The array must hold the profile's `instanceCount`
    /// handles, as the NVML header requires; `count` is output only.
    fn nvmlGpuInstanceGetComputeInstances(
        gpu_instance: nvmlGpuInstance_t,
        profile_id: c_uint,
        compute_instances: *mut nvmlComputeInstance_t,
        count: *mut c_uint,
    ) {
        require!(compute_instances, count);
        let handles: Vec<nvmlComputeInstance_t> = driver::with(|s, rt| {
            let (gpu, gi) = rt.gpu_instance(&s.node, addr(gpu_instance))?;
            let table = table_of(s, gpu)?;
            let g = rt.mig[gpu].gi(gi).ok_or(rc::INVALID_ARGUMENT)?;
            let gi_profile = table.by_id(g.profile_id).ok_or(rc::UNKNOWN)?;
            ci_profile_in(table, gi_profile, profile_id)?;
            let ids: Vec<u32> = g.compute_instances.iter().filter(|c| c.profile_id == profile_id).map(|c| c.id).collect();
            Ok(ids.into_iter().map(|ci| handle(rt.registry.handle(Obj::ComputeInstance { gpu, gi, ci }))).collect())
        })?;
        crate::ffi::put_slice!(compute_instances, handles.as_slice());
        put!(count, handles.len() as c_uint);
        Ok(())
    }
}

export! {
    /// A CI of a GI by id.
    fn nvmlGpuInstanceGetComputeInstanceById(
        gpu_instance: nvmlGpuInstance_t,
        id: c_uint,
        compute_instance: *mut nvmlComputeInstance_t,
    ) {
        require!(compute_instance);
        let h = driver::with(|s, rt| {
            let (gpu, gi) = rt.gpu_instance(&s.node, addr(gpu_instance))?;
            rt.mig[gpu].ci(gi, id).ok_or(rc::NOT_FOUND)?;
            Ok(rt.registry.handle(Obj::ComputeInstance { gpu, gi, ci: id }))
        })?;
        put!(compute_instance, handle(h));
        Ok(())
    }
}

export! {
    /// How many more CIs of a profile fit into a GI now.
    fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        gpu_instance: nvmlGpuInstance_t,
        profile_id: c_uint,
        count: *mut c_uint,
    ) {
        let n = driver::with(|s, rt| {
            let (gpu, gi) = rt.gpu_instance(&s.node, addr(gpu_instance))?;
            let table = table_of(s, gpu)?;
            rt.mig[gpu].remaining_ci(table, gi, profile_id)
        })?;
        put!(count, n);
        Ok(())
    }
}

export! {
    /// Parent device and GI, id, profile id and placement of a CI.
    fn nvmlComputeInstanceGetInfo_v2(compute_instance: nvmlComputeInstance_t, info: *mut nvmlComputeInstanceInfo_t) {
        let i = driver::with(|s, rt| {
            let (gpu, gi, ci) = rt.compute_instance(&s.node, addr(compute_instance))?;
            let c = rt.mig[gpu].ci(gi, ci).ok_or(rc::INVALID_ARGUMENT)?.clone();
            Ok(nvmlComputeInstanceInfo_t {
                device: handle(rt.registry.handle(Obj::Gpu(gpu))),
                gpuInstance: handle(rt.registry.handle(Obj::GpuInstance { gpu, gi })),
                id: c.id,
                profileId: c.profile_id,
                placement: nvmlComputeInstancePlacement_t { start: c.placement.start, size: c.placement.size },
            })
        })?;
        put!(info, i);
        Ok(())
    }
}
