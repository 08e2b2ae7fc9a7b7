//! NVML calls that nvml-wrapper does not wrap, made through its symbol table.
//!
//! This file and nvml-wrapper are the only places gpud crosses into C. Each call resolves the
//! symbol with `nvml_sym` (a missing symbol is an error, never a panic) and passes only
//! handles that nvml-wrapper itself produced.

use std::os::raw::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU as NVLINK_GPU,
    nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH as NVLINK_SWITCH,
    nvmlIntNvLinkDeviceType_t,
};

/// What sits at the far end of an NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteKind {
    Gpu,
    Switch,
    Other,
}

/// The GPU-instance id of a MIG device handle.
pub fn gpu_instance_id(nvml: &Nvml, mig: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let mut id: c_uint = 0;
    // SAFETY: `mig.handle()` is a device handle NVML gave us and that lives as long as `nvml`;
    // `id` is a valid, writable c_uint for the duration of the call.
    nvml_try(unsafe { sym(mig.handle(), &mut id) })?;
    Ok(id)
}

/// The compute-instance id of a MIG device handle.
pub fn compute_instance_id(nvml: &Nvml, mig: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetComputeInstanceId.as_ref())?;
    let mut id: c_uint = 0;
    // SAFETY: as in `gpu_instance_id`: a live NVML handle and a writable out-parameter.
    nvml_try(unsafe { sym(mig.handle(), &mut id) })?;
    Ok(id)
}

/// Profile id and placement of GPU instance `gi_id` on `parent`.
pub fn gpu_instance_info(
    nvml: &Nvml,
    parent: &Device<'_>,
    gi_id: u32,
) -> Result<(u32, nvmlGpuInstancePlacement_t), NvmlError> {
    let by_id = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let get_info = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `parent.handle()` is a live NVML device handle; `gi` is a writable pointer slot
    // that NVML fills with an opaque handle it owns.
    nvml_try(unsafe { by_id(parent.handle(), gi_id, &mut gi) })?;
    let mut info = nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    // SAFETY: `gi` was just returned by NVML for this device; `info` is a fully initialised,
    // writable struct of the type the C signature names.
    nvml_try(unsafe { get_info(gi, &mut info) })?;
    Ok((info.profileId, info.placement))
}

/// What is at the far end of `link` of `device`.
pub fn nvlink_remote_kind(
    nvml: &Nvml,
    device: &Device<'_>,
    link: u32,
) -> Result<RemoteKind, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref())?;
    let mut kind: nvmlIntNvLinkDeviceType_t = 0;
    // SAFETY: a live NVML device handle and a writable enum-sized out-parameter.
    nvml_try(unsafe { sym(device.handle(), link, &mut kind) })?;
    Ok(match kind {
        NVLINK_GPU => RemoteKind::Gpu,
        NVLINK_SWITCH => RemoteKind::Switch,
        _ => RemoteKind::Other,
    })
}

/// One event as NVML delivers it, with the MIG attribution nvml-wrapper's `EventData` drops.
#[derive(Debug, Clone, Copy)]
pub struct RawEventData {
    /// The device handle's address, to map back to a GPU index.
    pub device: usize,
    /// `nvmlEventType*` bit.
    pub event_type: u64,
    /// The XID for critical-XID events.
    pub event_data: u64,
    /// GPU-instance id, `u32::MAX` when the event is not attributed to a MIG instance.
    pub gpu_instance_id: u32,
    /// Compute-instance id, `u32::MAX` when not attributed.
    pub compute_instance_id: u32,
}

/// Waits up to `timeout_ms` for the next event of `set`.
pub fn event_wait(
    nvml: &Nvml,
    set: &nvml_wrapper::EventSet<'_>,
    timeout_ms: u32,
) -> Result<RawEventData, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    let mut data = nvml_wrapper_sys::bindings::nvmlEventData_t {
        device: std::ptr::null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    };
    // SAFETY: `set.handle()` is the live event set owned by `set`, which outlives the call and is
    // not freed here; `data` is a fully initialised, writable nvmlEventData_t.
    nvml_try(unsafe { sym(set.handle(), &mut data, timeout_ms) })?;
    Ok(RawEventData {
        device: data.device as usize,
        event_type: data.eventType,
        event_data: data.eventData,
        gpu_instance_id: data.gpuInstanceId,
        compute_instance_id: data.computeInstanceId,
    })
}

/// The address of a device handle, used as a key to map event devices back to indices.
pub fn handle_key(device: &Device<'_>) -> usize {
    // SAFETY: reading the handle value does not dereference it; the pointer is only compared.
    unsafe { device.handle() as usize }
}

/// Remapped rows: `(corrected, uncorrected, pending, failure)`.
pub fn remapped_rows(
    nvml: &Nvml,
    device: &Device<'_>,
) -> Result<(u32, u32, bool, bool), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corrected, mut uncorrected, mut pending, mut failure): (
        c_uint,
        c_uint,
        c_uint,
        c_uint,
    ) = (0, 0, 0, 0);
    // SAFETY: a live NVML device handle and four writable c_uint out-parameters.
    nvml_try(unsafe {
        sym(
            device.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failure,
        )
    })?;
    Ok((corrected, uncorrected, pending != 0, failure != 0))
}
