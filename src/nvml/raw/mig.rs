//! MIG administration calls nvml-wrapper lacks: profile tables, placements, and creating and
//! destroying GPU and compute instances.
//!
//! Every function takes ids, never NVML instance handles: a GPU or compute instance is looked
//! up by id for the one call that needs it, so no opaque handle escapes this file.

use std::os::raw::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t,
    nvmlComputeInstanceProfileInfo_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t,
};

/// The most placements or instances one profile can have on a GPU (8 memory slices).
const MAX_ENTRIES: usize = 8;

/// One existing GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiInfo {
    pub id: u32,
    pub profile_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
}

/// One existing compute instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CiInfo {
    pub id: u32,
    pub profile_id: u32,
}

/// Every placement (start, size in memory slices) a GPU-instance profile can take.
pub fn gi_possible_placements(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<(u32, u32)>, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    let mut placements = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; MAX_ENTRIES];
    let mut count = MAX_ENTRIES as c_uint;
    // SAFETY: a live device handle; `placements` has room for `count` entries, which NVML
    // writes at most, and `count` is a writable c_uint it updates to the number written.
    nvml_try(unsafe {
        sym(
            device.handle(),
            profile_id,
            placements.as_mut_ptr(),
            &mut count,
        )
    })?;
    Ok(placements
        .iter()
        .take(count as usize)
        .map(|p| (p.start, p.size))
        .collect())
}

/// Every GPU instance of profile `profile_id` on the GPU.
pub fn gpu_instances(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<GiInfo>, NvmlError> {
    let list = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstances.as_ref())?;
    let get_info = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let mut handles: [nvmlGpuInstance_t; MAX_ENTRIES] = [std::ptr::null_mut(); MAX_ENTRIES];
    let mut count = MAX_ENTRIES as c_uint;
    // SAFETY: a live device handle; `handles` has room for `count` pointer slots NVML fills
    // with handles it owns; `count` is updated to the number written.
    nvml_try(unsafe {
        list(
            device.handle(),
            profile_id,
            handles.as_mut_ptr(),
            &mut count,
        )
    })?;
    let mut out = Vec::with_capacity(count as usize);
    for &gi in handles.iter().take(count as usize) {
        let mut info = empty_gi_info();
        // SAFETY: `gi` was just returned by NVML for this device; `info` is writable.
        nvml_try(unsafe { get_info(gi, &mut info) })?;
        out.push(GiInfo {
            id: info.id,
            profile_id: info.profileId,
            start: info.placement.start,
            size: info.placement.size,
        });
    }
    Ok(out)
}

fn empty_gi_info() -> nvmlGpuInstanceInfo_t {
    nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    }
}

fn empty_ci_info() -> nvmlComputeInstanceInfo_t {
    nvmlComputeInstanceInfo_t {
        device: std::ptr::null_mut(),
        gpuInstance: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlComputeInstancePlacement_t { start: 0, size: 0 },
    }
}

/// The handle of GPU instance `gi_id`, valid until that instance is destroyed.
fn gi_handle(nvml: &Nvml, device: &Device<'_>, gi_id: u32) -> Result<nvmlGpuInstance_t, NvmlError> {
    let by_id = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: a live device handle and a writable pointer slot NVML fills.
    nvml_try(unsafe { by_id(device.handle(), gi_id, &mut gi) })?;
    Ok(gi)
}

/// The compute-instance profile id for NVML enum value `profile` inside GPU instance `gi_id`.
pub fn ci_profile_id(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
    profile: u32,
) -> Result<u32, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref(),
    )?;
    let gi = gi_handle(nvml, device, gi_id)?;
    let mut info = nvmlComputeInstanceProfileInfo_t {
        id: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        sharedCopyEngineCount: 0,
        sharedDecoderCount: 0,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
    };
    // SAFETY: `gi` is a live GPU-instance handle of this device; `info` is a fully
    // initialised, writable v1 struct. Engine profile 0 is the shared one, the only one.
    nvml_try(unsafe { sym(gi, profile, 0, &mut info) })?;
    Ok(info.id)
}

/// Every compute instance of profile `profile_id` in GPU instance `gi_id`.
pub fn compute_instances(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
    profile_id: u32,
) -> Result<Vec<CiInfo>, NvmlError> {
    let list = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let get_info = nvml_sym(nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
    let gi = gi_handle(nvml, device, gi_id)?;
    let mut handles: [nvmlComputeInstance_t; MAX_ENTRIES] = [std::ptr::null_mut(); MAX_ENTRIES];
    let mut count = MAX_ENTRIES as c_uint;
    // SAFETY: `gi` is a live GPU-instance handle; `handles` has room for `count` slots.
    nvml_try(unsafe { list(gi, profile_id, handles.as_mut_ptr(), &mut count) })?;
    let mut out = Vec::with_capacity(count as usize);
    for &ci in handles.iter().take(count as usize) {
        let mut info = empty_ci_info();
        // SAFETY: `ci` was just returned by NVML; `info` is a fully initialised, writable struct.
        nvml_try(unsafe { get_info(ci, &mut info) })?;
        out.push(CiInfo {
            id: info.id,
            profile_id: info.profileId,
        });
    }
    Ok(out)
}

/// Creates a GPU instance of `profile_id` at memory slice `start` (`size` slices); its id.
pub fn create_gpu_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
    start: u32,
    size: u32,
) -> Result<u32, NvmlError> {
    let create = nvml_sym(nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let get_info = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: a live device handle, a placement NVML only reads, and a writable pointer slot.
    nvml_try(unsafe { create(device.handle(), profile_id, &placement, &mut gi) })?;
    let mut info = empty_gi_info();
    // SAFETY: `gi` was just created by NVML; `info` is writable.
    nvml_try(unsafe { get_info(gi, &mut info) })?;
    Ok(info.id)
}

/// Destroys GPU instance `gi_id` (it must have no compute instances left).
pub fn destroy_gpu_instance(nvml: &Nvml, device: &Device<'_>, gi_id: u32) -> Result<(), NvmlError> {
    let destroy = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
    let gi = gi_handle(nvml, device, gi_id)?;
    // SAFETY: `gi` is a live GPU-instance handle; NVML invalidates it, and it is not used again.
    nvml_try(unsafe { destroy(gi) })
}

/// Creates a compute instance of `profile_id` in GPU instance `gi_id` where the driver puts
/// it (compute placement inside a GI does not constrain anything else); its id.
pub fn create_compute_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
    profile_id: u32,
) -> Result<u32, NvmlError> {
    let create = nvml_sym(nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let get_info = nvml_sym(nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
    let gi = gi_handle(nvml, device, gi_id)?;
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: a live GPU-instance handle and a writable pointer slot.
    nvml_try(unsafe { create(gi, profile_id, &mut ci) })?;
    let mut info = empty_ci_info();
    // SAFETY: `ci` was just created by NVML; `info` is writable.
    nvml_try(unsafe { get_info(ci, &mut info) })?;
    Ok(info.id)
}

/// Destroys compute instance `ci_id` of GPU instance `gi_id`.
pub fn destroy_compute_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    gi_id: u32,
    ci_id: u32,
) -> Result<(), NvmlError> {
    let by_id = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstanceById.as_ref())?;
    let destroy = nvml_sym(nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
    let gi = gi_handle(nvml, device, gi_id)?;
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: a live GPU-instance handle and a writable pointer slot.
    nvml_try(unsafe { by_id(gi, ci_id, &mut ci) })?;
    // SAFETY: `ci` is a live compute-instance handle; it is not used after this call.
    nvml_try(unsafe { destroy(ci) })
}
